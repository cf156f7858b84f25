#include "plan/slot_map.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

SlotMap slot_map_base(Collective op, const Schedule& s, int32_t world, int32_t rank) {
  if (world < 1 || rank < 0 || rank >= world)
    throw InvalidArgument("rank " + std::to_string(rank) + " out of range for world size " +
                          std::to_string(world));
  SlotMap map;
  map.op = op;
  map.world = world;
  map.rank = rank;
  map.bm = s.bm;
  map.bn = s.bn;
  map.tiles_n = s.tiles_n();
  map.n = s.n;
  map.row_of.assign(size_t(s.tiles()) * s.bm, -1);
  return map;
}

std::vector<int32_t> half_rows_of(const SlotMap& map) {
  if (map.bm != 2 * kStoreHalfRows) return {};
  const size_t halves = map.row_of.size() / kStoreHalfRows;
  std::vector<int32_t> first(halves);
  for (size_t h = 0; h < halves; ++h) {
    const int32_t* rows = map.row_of.data() + h * kStoreHalfRows;
    if (rows[0] < 0) return {};
    for (int32_t r = 1; r < kStoreHalfRows; ++r)
      if (rows[r] != rows[0] + r) return {};
    first[h] = rows[0];
  }
  return first;
}

ScatterTables scatter_tables(const SlotMap& map) {
  ScatterTables t;
  for (const SlotTarget& x : map.target_of_slot) {
    t.dst_row.push_back(x.row);
    t.dst_col.push_back(x.row < 0 ? 0 : x.col_block * map.bn);
  }
  return t;
}

void finish_slot_map(SlotMap& map) {
  constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();
  if (map.send_rows > kMaxRows || map.recv_rows > kMaxRows || map.out_rows > kMaxRows)
    throw InvalidArgument("slot map: " + std::to_string(std::max(map.send_rows, map.recv_rows)) +
                          " slot rows exceed int32 row indices (rank " + std::to_string(map.rank) + ")");
  map.slot_of_out.assign(size_t(map.out_rows) * map.tiles_n, -1);
  int64_t filled = 0;
  for (size_t slot = 0; slot < map.target_of_slot.size(); ++slot) {
    const SlotTarget t = map.target_of_slot[slot];
    if (t.row < 0) continue;
    if (t.row >= map.out_rows || t.col_block < 0 || t.col_block >= map.tiles_n)
      throw Error("slot map: slot row " + std::to_string(slot) + " targets (" + std::to_string(t.row) +
                  ", " + std::to_string(t.col_block) + ") outside the output");
    int32_t& dst = map.slot_of_out[size_t(t.row) * map.tiles_n + t.col_block];
    if (dst >= 0)
      throw Error("slot map: slot rows " + std::to_string(dst) + " and " + std::to_string(slot) +
                  " both target output row " + std::to_string(t.row));
    dst = int32_t(slot);
    ++filled;
  }
  if (filled != int64_t(map.slot_of_out.size()))
    throw Error("slot map: " + std::to_string(int64_t(map.slot_of_out.size()) - filled) +
                " output row segments have no source slot");
}

}  // namespace flashoverlap::plan

namespace flashoverlap::plan {

WaveCounts::WaveCounts(const Schedule& s, int32_t bins, const std::vector<int64_t>& per_tile_row)
    : bins_(bins), waves_(s.waves()), prefix_(size_t(s.waves() + 1) * bins, 0) {
  if (per_tile_row.size() != size_t(s.tiles_m()) * bins)
    throw Error("WaveCounts: expected " + std::to_string(s.tiles_m()) + " x " + std::to_string(bins) +
                " counts, got " + std::to_string(per_tile_row.size()));
  // Each wave's tiles into row w+1 (through a histogram of the wave's tile
  // rows: a wave spans few of them, and bins may be many), then prefix sums.
  // The histogram by band (Schedule::tile_of's order, without a tile_of per
  // tile: the planners' hot loop): in a band of `width` lines the index
  // walks across the lines, so a run of a band's indices gives each line
  // run / width tiles, and the rest one more from the run's first line on.
  std::vector<int32_t> per_tm(size_t(s.tiles_m()), 0), touched;
  const bool along_n = s.raster == Raster::AlongN;
  const int32_t lines = along_n ? s.tiles_m() : s.tiles_n(), length = along_n ? s.tiles_n() : s.tiles_m();
  const int32_t band_tiles = s.swizzle * length;
  auto add = [&](int32_t tm, int32_t count) {
    if (count == 0) return;
    if (s.row_shift) tm = (tm + s.row_shift) % s.tiles_m();
    if (per_tm[size_t(tm)] == 0) touched.push_back(tm);
    per_tm[size_t(tm)] += count;
  };
  for (int32_t w = 0; w < waves_; ++w) {
    const int32_t end = std::min(s.tiles(), (w + 1) * s.ctas);
    for (int32_t a = w * s.ctas; a < end;) {
      const int32_t band = a / band_tiles, first_line = band * s.swizzle;
      const int32_t width = std::min(s.swizzle, lines - first_line);
      const int32_t lo = a - band * band_tiles, hi = std::min(end - band * band_tiles, band_tiles);  // in the band
      const int32_t run = hi - lo;
      if (along_n) {  // lines are tile rows: each gets run / width, the first run % width from lo's line one more
        for (int32_t j = 0; j < width; ++j) {
          const int32_t from_lo = (j - lo % width + width) % width;  // j's place after lo's line
          add(first_line + j, run / width + (from_lo < run % width ? 1 : 0));
        }
      } else {  // lines are tile columns: tile row = in-band index / width
        for (int32_t tm = lo / width; tm <= (hi - 1) / width; ++tm)
          add(tm, std::min(hi, (tm + 1) * width) - std::max(lo, tm * width));
      }
      a += run;
    }
    int64_t* dst = &prefix_[size_t(w + 1) * bins];
    for (int32_t tm : touched) {
      const int64_t n = std::exchange(per_tm[size_t(tm)], 0);
      for (int32_t b = 0; b < bins; ++b) dst[b] += n * per_tile_row[size_t(tm) * bins + b];
    }
    touched.clear();
  }
  for (int32_t w = 1; w <= waves_; ++w)
    for (int32_t b = 0; b < bins; ++b) prefix_[size_t(w) * bins + b] += prefix_[size_t(w - 1) * bins + b];
}

}  // namespace flashoverlap::plan
