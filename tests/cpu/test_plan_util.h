// test_plan_util.h — shared helpers of the planner tests: the seeded random
// generator (test_seed.h), random schedules and partitions (one rank's, or
// every rank's own for the MoE All-to-All), temporary directories.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "plan/partition.h"
#include "plan/schedule.h"
#include "plan/slot_map_alltoall.h"
#include "plan/tile_grid.h"
#include "test_seed.h"

namespace fo_test {

inline int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

inline flashoverlap::plan::TileShape random_tile(std::mt19937_64& rng) {
  static const flashoverlap::plan::TileShape tiles[] = {{128, 256}, {128, 128}, {64, 64}, {16, 8},
                                                        {24, 40},   {8, 16},    {1, 1},   {5, 3}};
  return tiles[uniform(rng, 0, std::size(tiles) - 1)];
}

// A random schedule with at most ~max_elems elements of C: M and N ragged or
// not, M = 1 sometimes, any raster/swizzle, CTAs from 1 to more than the tiles.
inline flashoverlap::plan::Schedule random_schedule(std::mt19937_64& rng, flashoverlap::plan::TileShape t,
                                                    int64_t max_elems) {
  auto side = [&](int32_t b) -> int64_t {
    switch (uniform(rng, 0, 4)) {
      case 0: return 1;
      case 1: return b * uniform(rng, 1, 40);                       // whole tiles
      case 2: return uniform(rng, 1, b);                            // less than a tile
      default: return b * uniform(rng, 0, 40) + uniform(rng, 1, b);  // ragged
    }
  };
  int64_t m = side(t.bm), n = side(t.bn);
  while (m * n > max_elems) (m > n ? m : n) = (m > n ? m : n) / 2 + 1;  // shrink the longer side
  const int64_t tiles = ((m + t.bm - 1) / t.bm) * ((n + t.bn - 1) / t.bn);
  const int32_t ctas = int32_t(uniform(rng, 0, 3) == 0 ? uniform(rng, 1, tiles + 3)
                                                       : std::max<int64_t>(1, tiles / uniform(rng, 1, 12)));
  const auto raster = uniform(rng, 0, 1) ? flashoverlap::plan::Raster::AlongM : flashoverlap::plan::Raster::AlongN;
  return flashoverlap::plan::make_schedule(m, n, t, ctas, raster, int32_t(uniform(rng, 1, 6)));
}

// A random composition of `waves`: each gap is a boundary with probability p,
// p itself random (so single groups and the finest partition both occur).
inline flashoverlap::plan::Partition random_partition(std::mt19937_64& rng, int32_t waves) {
  const double p = std::uniform_real_distribution<double>(0, 1)(rng);
  flashoverlap::plan::Partition part{1};
  for (int32_t w = 1; w < waves; ++w) {
    if (std::bernoulli_distribution(p)(rng)) part.push_back(1);
    else ++part.back();
  }
  return part;
}

// Every rank's schedule of an expert-parallel call: rank r has ms[r] rows
// (0 allowed: no tiles, no waves), all the same n and tile; the CTAs either
// shared (as on one kind of GPU) or each rank's own, raster and swizzle each
// rank's own.
inline std::vector<flashoverlap::plan::Schedule> random_rank_schedules(std::mt19937_64& rng,
                                                                        flashoverlap::plan::TileShape t, int64_t n,
                                                                        const std::vector<int64_t>& ms) {
  const bool shared_ctas = uniform(rng, 0, 1);
  const int32_t ctas = int32_t(uniform(rng, 1, 40));
  std::vector<flashoverlap::plan::Schedule> out;
  for (int64_t m : ms) {
    const int64_t tiles = ((m + t.bm - 1) / t.bm) * ((n + t.bn - 1) / t.bn);
    const int32_t own = int32_t(uniform(rng, 0, 2) == 0 ? uniform(rng, 1, tiles + 3)
                                                        : std::max<int64_t>(1, tiles / uniform(rng, 1, 12)));
    const auto raster = uniform(rng, 0, 1) ? flashoverlap::plan::Raster::AlongM : flashoverlap::plan::Raster::AlongN;
    out.push_back(flashoverlap::plan::make_expert_schedule(m, n, t, shared_ctas ? ctas : own, raster,
                                                           int32_t(uniform(rng, 1, 6))));
  }
  return out;
}

// `count` groups of s's waves, any of them empty (first_wave == end_wave):
// count - 1 cut points drawn from [0, waves] (repeats allowed).
inline std::vector<flashoverlap::plan::Group> random_groups_with_empty(std::mt19937_64& rng,
                                                                       const flashoverlap::plan::Schedule& s,
                                                                       int32_t count) {
  std::vector<int32_t> cuts{0, s.waves()};
  for (int32_t i = 1; i < count; ++i) cuts.push_back(int32_t(uniform(rng, 0, s.waves())));
  std::sort(cuts.begin() + 1, cuts.end());  // 0 stays first, waves sorts last
  std::vector<flashoverlap::plan::Group> groups;
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    groups.push_back(flashoverlap::plan::group_spanning(s, cuts[i], cuts[i + 1]));
  return groups;
}

// A fresh directory, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fo_plan_test.XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return file(name);
  }
};

// Rank `rank`'s tile rows of the combine's GEMM from the rows themselves (not
// moe_segments): a tile row ends after bm rows or where the next row's local
// expert differs (empty blocks and neighbours of one expert join). With one
// expert: rows v*bm .. v*bm+bm-1. {first row, rows} per tile row.
inline std::vector<std::pair<int32_t, int32_t>> brute_tile_rows(const flashoverlap::plan::MoeRouting& r,
                                                                int32_t rank, int32_t bm) {
  std::vector<int32_t> expert(size_t(r.rows(rank)), 0);
  if (r.experts > 1) {
    size_t row = 0;
    for (size_t i = 0; i < r.expert_rows[size_t(rank)].size(); ++i)
      for (int64_t k = 0; k < r.expert_rows[size_t(rank)][i]; ++k) expert[row++] = int32_t(i % size_t(r.experts));
  }
  std::vector<std::pair<int32_t, int32_t>> out;
  for (int32_t row = 0; row < int32_t(expert.size()); ++row) {
    if (out.empty() || out.back().second == bm || expert[size_t(row)] != expert[size_t(row) - 1])
      out.push_back({row, 0});
    ++out.back().second;
  }
  return out;
}

inline std::string describe(const flashoverlap::plan::Schedule& s) {
  std::ostringstream o;
  o << "M=" << s.m << " N=" << s.n << " tile " << s.bm << "x" << s.bn << " ctas=" << s.ctas
    << " raster=" << int(s.raster) << " swizzle=" << s.swizzle << " tiles=" << s.tiles()
    << " waves=" << s.waves();
  return o.str();
}

}  // namespace fo_test
