// The GEMM's units of work with the tail split (kernels/work_units.h), on
// the host: coverage, the final part, the order that keeps a last part from
// waiting on a unit its CTAs reach later, and the final parts shared out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/work_units.h"
#include "plan/schedule.h"

using namespace flashoverlap;

namespace {

plan::Schedule sched(int m, int n, int ctas) {
  plan::Schedule s;
  s.m = m, s.n = n, s.bm = 128, s.bn = 256, s.ctas = ctas;
  return s;
}

}  // namespace

// The split starts at the last wave: every tile of it, and only those
// (all tiles when they fit in one wave).
TEST(WorkUnits, TailSplitStartsAtTheLastWave) {
  EXPECT_EQ(kernels::tail_split_from(sched(1024, 8192, 132)), 132);  // 256 tiles: 132 + 124
  EXPECT_EQ(kernels::tail_split_from(sched(4096, 4096, 132)), 396);  // 512 tiles: 3 x 132 + 116
  EXPECT_EQ(kernels::tail_split_from(sched(1000, 2048, 132)), 0);    // 64 tiles: one wave
  EXPECT_EQ(kernels::tail_split_from(sched(2048, 4096, 64)), 192);   // 256 tiles: 4 whole waves, the last split
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    const plan::Schedule s = sched(1 + int(rng() % 9000), 1 + int(rng() % 9000), 1 + int(rng() % 140));
    const int32_t from = kernels::tail_split_from(s), last = s.tiles() - from;
    EXPECT_GE(from, 0);
    EXPECT_EQ(from % s.ctas, 0) << "the split starts a round";
    EXPECT_GE(last, 1);
    EXPECT_LE(last, s.ctas);
    EXPECT_EQ(kernels::tail_split_ws_bytes(s.tiles(), from, 3), int64_t(last) * 2 * 128 * 256 * 4);
    EXPECT_EQ(kernels::tail_split_ws_bytes(s.tiles(), from, 1), 0);
    EXPECT_EQ(kernels::tail_split_flag_count(s.tiles(), from, 4), int64_t(last) * 2);
  }
}

// On random grids, split points, part counts and k: each (tile, k-block) is
// computed by exactly one unit; each tile has one final unit; a split
// tile's parts run on as many different CTAs, none of them in a later round
// than its final part (whose CTA waits for them); where the grid is a
// multiple of parts, the final parts are shared out (no CTA more than its
// turn: one round in `parts`); without a split the units are the tiles.
TEST(WorkUnits, UnitsCoverEveryTileAndKBlockOnceAndFinalsComeLast) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 400; ++i) {
    const int32_t tiles = 1 + int32_t(rng() % 600), ctas = 1 + int32_t(rng() % 140);
    const int32_t from = i % 2 ? int32_t(rng() % uint64_t(tiles)) : tiles <= ctas ? 0 : ctas * ((tiles - 1) / ctas);
    const int32_t k_blocks = 1 + int32_t(rng() % 200);
    const int32_t parts = 1 + int32_t(rng() % std::min<uint64_t>(4, uint64_t(k_blocks)));
    SCOPED_TRACE("tiles " + std::to_string(tiles) + " ctas " + std::to_string(ctas) + " from " + std::to_string(from) +
                 " parts " + std::to_string(parts) + " k_blocks " + std::to_string(k_blocks));
    const int32_t units = kernels::unit_count(tiles, from, parts);
    if (parts == 1) EXPECT_EQ(units, tiles);
    std::vector<std::vector<int>> covered(size_t(tiles), std::vector<int>(size_t(k_blocks), 0));
    std::vector<int32_t> final_unit(size_t(tiles), -1);
    std::vector<std::vector<int32_t>> units_of(static_cast<size_t>(tiles));  // (each unit u runs on CTA u % ctas)
    std::vector<int> finals_of_cta(size_t(ctas), 0);
    for (int32_t u = 0; u < units; ++u) {
      const kernels::WorkUnit w = kernels::unit_at(u, from, parts, ctas);
      ASSERT_GE(w.pos, 0);
      ASSERT_LT(w.pos, tiles);
      EXPECT_EQ(w.parts, w.pos >= from ? parts : 1);
      for (int32_t kb = kernels::unit_k_begin(w, k_blocks); kb < kernels::unit_k_end(w, k_blocks); ++kb)
        covered[size_t(w.pos)][size_t(kb)]++;
      EXPECT_LT(kernels::unit_k_begin(w, k_blocks), kernels::unit_k_end(w, k_blocks)) << "an empty part";
      if (kernels::unit_is_final(w)) {
        EXPECT_EQ(final_unit[size_t(w.pos)], -1) << "two final units of position " << w.pos;
        final_unit[size_t(w.pos)] = u;
        if (w.parts > 1) finals_of_cta[size_t(u % ctas)]++;
      }
      units_of[size_t(w.pos)].push_back(u);
    }
    for (int32_t t = 0; t < tiles; ++t) {
      for (int32_t kb = 0; kb < k_blocks; ++kb) ASSERT_EQ(covered[size_t(t)][size_t(kb)], 1) << "tile " << t << " kb " << kb;
      const int32_t fin = final_unit[size_t(t)];
      ASSERT_GE(fin, 0) << "position " << t << " has no final unit";
      for (const int32_t u : units_of[size_t(t)]) {
        EXPECT_LE(u / ctas, fin / ctas) << "a part in a later round than its final part (position " << t << ")";
        for (const int32_t v : units_of[size_t(t)])
          if (u != v && int32_t(units_of[size_t(t)].size()) <= ctas) EXPECT_NE(u % ctas, v % ctas) << "one CTA, two parts";
      }
    }
    if (parts > 1 && ctas % parts == 0 && from % ctas == 0) {
      const int32_t rounds = (parts * (tiles - from) + ctas - 1) / ctas;  // the tail's
      for (int32_t c = 0; c < ctas; ++c)
        EXPECT_LE(finals_of_cta[size_t(c)], (rounds + parts - 1) / parts) << "CTA " << c << " takes more final parts";
    }
  }
}
