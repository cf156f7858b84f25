#include "plan/partition.h"

#include <algorithm>
#include <charconv>
#include <numeric>
#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

void for_each_partition(int32_t waves, const std::function<void(const Partition&)>& f) {
  if (waves < 1 || waves > kMaxEnumerableWaves)
    throw InvalidArgument("cannot enumerate the partitions of " + std::to_string(waves) +
                          " waves: T must be in [1, " + std::to_string(kMaxEnumerableWaves) +
                          "] (2^(T-1) partitions; use the dynamic programme for larger T)");
  Partition p;
  p.reserve(waves);
  const uint32_t count = uint32_t{1} << (waves - 1);
  for (uint32_t mask = 0; mask < count; ++mask) {
    p.clear();
    int32_t size = 1;
    for (int32_t b = 0; b + 1 < waves; ++b, ++size) {
      if (mask >> b & 1u) {
        p.push_back(size);
        size = 0;
      }
    }
    p.push_back(size);
    f(p);
  }
}

std::vector<Partition> enumerate_partitions(int32_t waves) {
  std::vector<Partition> all;
  for_each_partition(waves, [&](const Partition& p) { all.push_back(p); });
  return all;
}

void validate_partition(const Partition& p, int32_t waves) {
  if (p.empty()) throw InvalidArgument("empty partition (expected group sizes summing to " +
                                       std::to_string(waves) + " waves)");
  int64_t sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0)
      throw InvalidArgument("partition " + to_string(p) + ": group " + std::to_string(i) +
                            " has " + std::to_string(p[i]) + " waves (must be >= 1)");
    sum += p[i];
  }
  if (sum != waves)
    throw InvalidArgument("partition " + to_string(p) + " sums to " + std::to_string(sum) +
                          " waves but the schedule has T = " + std::to_string(waves) + " waves");
}

Partition parse_partition(std::string_view s) {
  Partition p;
  size_t pos = 0;
  while (true) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string_view item = s.substr(pos, comma - pos);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw InvalidArgument("bad partition '" + std::string(s) +
                            "' (expected comma-separated wave counts, e.g. 1,2,2)");
    p.push_back(v);
    if (comma == s.size()) break;
    pos = comma + 1;
  }
  return p;
}

std::string to_string(const Partition& p) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(p[i]);
  }
  return out;
}

Group group_spanning(const Schedule& s, int32_t first_wave, int32_t end_wave) {
  const int64_t T = s.tiles();
  return Group{first_wave, end_wave, int32_t(std::min<int64_t>(int64_t{first_wave} * s.ctas, T)),
               int32_t(std::min<int64_t>(int64_t{end_wave} * s.ctas, T))};
}

int band_count(const Schedule& s) { return (s.tiles_m() + s.swizzle - 1) / s.swizzle; }

std::vector<Group> band_groups(const Schedule& s, const std::vector<int>& band_counts) {
  if (s.raster != Raster::AlongN) throw InvalidArgument("row-band groups need the AlongN raster");
  const int bands = band_count(s), band_tiles = s.swizzle * s.tiles_n();
  std::vector<Group> out;
  int b = 0;
  for (int c : band_counts) {
    if (c < 1) throw InvalidArgument("row-band groups: a group of " + std::to_string(c) + " bands");
    Group g;
    g.first_tile = b * band_tiles;
    b += c;
    g.end_tile = std::min(b * band_tiles, s.tiles());
    g.first_wave = s.round_of(g.first_tile);
    g.end_wave = s.round_of(g.end_tile - 1) + 1;
    out.push_back(g);
  }
  if (b != bands)
    throw InvalidArgument("row-band groups cover " + std::to_string(b) + " bands, the schedule has " +
                          std::to_string(bands));
  return out;
}

std::vector<Group> make_groups(const Schedule& s, const Partition& p) {
  validate_partition(p, s.waves());
  std::vector<Group> groups;
  int32_t w = 0;
  for (int32_t size : p) {
    groups.push_back(group_spanning(s, w, w + size));
    w += size;
  }
  return groups;
}

void require_tile_groups(const std::vector<Group>& groups, int32_t tiles, const std::string& who) {
  if (groups.empty()) throw InvalidArgument(who + ": no groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    const int32_t expect = g == 0 ? 0 : groups[g - 1].end_tile;
    if (groups[g].first_tile != expect || groups[g].end_tile <= groups[g].first_tile)
      throw InvalidArgument(who + ": groups must be consecutive non-empty tile ranges (group " + std::to_string(g) +
                            ")");
  }
  if (groups.back().end_tile != tiles) throw InvalidArgument(who + ": the groups do not cover all tiles");
}

std::vector<int32_t> group_of_tiles(const std::vector<Group>& groups, int32_t tiles, int32_t sink) {
  std::vector<int32_t> got(size_t(std::max(tiles, 0)));
  for (size_t g = 0; g < groups.size(); ++g)
    std::fill(got.begin() + groups[g].first_tile, got.begin() + groups[g].end_tile,
              int32_t(g) == sink ? int32_t(groups.size()) : int32_t(g));
  return got;
}

std::vector<int32_t> group_of_wave(const std::vector<Group>& groups) {
  std::vector<int32_t> g(groups.empty() ? 0 : size_t(groups.back().end_wave));
  for (size_t i = 0; i < groups.size(); ++i)
    std::fill(g.begin() + groups[i].first_wave, g.begin() + groups[i].end_wave, int32_t(i));
  return g;
}

}  // namespace flashoverlap::plan
