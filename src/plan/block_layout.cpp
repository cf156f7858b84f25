#include "plan/block_layout.h"

#include <algorithm>
#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

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

BlockLayout block_layout(const Schedule& s, const std::vector<Group>& groups, bool tiles, int world, int rank,
                         int parities, int fault_drop_group) {
  if (world < 1 || rank < 0 || rank >= world)
    throw InvalidArgument("block layout: rank " + std::to_string(rank) + " of a world of " + std::to_string(world));
  if (parities < 1) throw InvalidArgument("block layout: parities must be >= 1");
  BlockLayout L;
  L.tiles = tiles;
  L.width = tiles ? s.bn : s.n;
  int64_t total = 0;
  for (const Group& g : groups) {
    RankBlocks b;
    if (tiles) {
      b.row0 = g.first_tile, b.rows = g.tiles(), b.pad_rows = int64_t(g.tiles()) * s.bm;
    } else {
      b.row0 = int64_t(g.first_tile / s.tiles_n()) * s.bm;
      b.rows = std::min<int64_t>(int64_t(g.end_tile / s.tiles_n()) * s.bm, s.m) - b.row0;
      b.pad_rows = (b.rows + s.bm - 1) / s.bm * s.bm;
    }
    b.block0 = total;
    total += world * b.pad_rows;
    L.groups.push_back(b);
  }
  if (total * parities > INT32_MAX)
    throw InvalidArgument("block layout: the buffer would have " + std::to_string(total * parities) +
                          " rows (TMA coordinates are 32-bit)");
  L.rows = total;
  const size_t n = groups.size();
  const bool drop = fault_drop_group >= 0 && size_t(fault_drop_group) < n;
  for (int64_t par = 0; par < parities; ++par) {
    for (const RankBlocks& b : L.groups)
      L.row_shift.push_back(int32_t(par * total + b.block0 + rank * b.pad_rows - (tiles ? b.row0 * s.bm : b.row0)));
    L.row_shift.push_back(drop ? L.row_shift[size_t(par) * (n + 1) + size_t(fault_drop_group)] : 0);
  }
  return L;
}

}  // namespace flashoverlap::plan
