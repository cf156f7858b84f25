#include "plan/slot_map_reducescatter.h"

#include <algorithm>
#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

std::string_view to_string(RsLayout l) { return l == RsLayout::Standard ? "standard" : "subtile"; }

RsLayout parse_rs_layout(std::string_view s) {
  if (s == "standard") return RsLayout::Standard;
  if (s == "subtile") return RsLayout::SubTile;
  throw InvalidArgument("unknown reducescatter layout '" + std::string(s) +
                        "' (expected standard or subtile)");
}

bool rs_layout_applies(const Schedule& s, int32_t world, RsLayout l) {
  return world >= 1 && (l == RsLayout::SubTile ? s.bm % world == 0 : s.m % world == 0);
}

void require_rs_layout(const Schedule& s, int32_t world, RsLayout l) {
  if (rs_layout_applies(s, world, l)) return;
  if (l == RsLayout::SubTile)
    throw InvalidArgument("reducescatter sub-tile layout needs tile rows % world == 0 (bm=" +
                          std::to_string(s.bm) + ", world=" + std::to_string(world) + ")");
  throw InvalidArgument("reducescatter standard layout needs M % world == 0 (M=" +
                        std::to_string(s.m) + ", world=" + std::to_string(world) + ")");
}

WaveCounts rs_standard_counts(const Schedule& s, int32_t world) {
  require_rs_layout(s, world, RsLayout::Standard);
  const int64_t R = s.m / world;
  std::vector<int64_t> per_tile_row(size_t(s.tiles_m()) * world, 0);
  for (int32_t tm = 0; tm < s.tiles_m(); ++tm) {
    const int64_t r0 = int64_t{tm} * s.bm, r1 = std::min<int64_t>(r0 + s.bm, s.m);
    for (int32_t d = 0; d < world; ++d)
      per_tile_row[size_t(tm) * world + d] = std::max<int64_t>(0, std::min(r1, (d + 1) * R) - std::max(r0, d * R));
  }
  return WaveCounts(s, world, per_tile_row);
}

int64_t rs_standard_padded_rows(const WaveCounts& counts, int32_t w0, int32_t w1) {
  int64_t most = 0;
  for (int32_t d = 0; d < counts.bins(); ++d) most = std::max(most, counts.sum(w0, w1, d));
  return most * counts.bins();
}

int64_t rs_standard_padding_rows(const WaveCounts& counts, int32_t w0, int32_t w1) {
  int64_t padding = rs_standard_padded_rows(counts, w0, w1);
  for (int32_t d = 0; d < counts.bins(); ++d) padding -= counts.sum(w0, w1, d);
  return padding;
}

namespace {

SlotMap subtile_map(const Schedule& s, const std::vector<Group>& groups, int32_t world, int32_t rank) {
  SlotMap map = slot_map_base(Collective::ReduceScatter, s, world, rank);
  const int32_t h = s.bm / world;
  map.send_rows = int64_t{s.tiles()} * s.bm;
  map.recv_rows = int64_t{s.tiles()} * h;
  map.target_of_slot.resize(size_t(map.recv_rows));
  for (const Group& g : groups) {
    const int32_t tg = g.tiles();
    for (int32_t idx = g.first_tile; idx < g.end_tile; ++idx) {
      const int32_t j = idx - g.first_tile;
      const TileCoord t = s.tile_of(idx);
      for (int32_t r = 0; r < s.bm; ++r)
        map.row_of[size_t(idx) * s.bm + r] = g.first_tile * s.bm + (r / h) * tg * h + j * h + r % h;
      for (int32_t rr = 0; rr < h; ++rr) {
        const bool valid = t.tm * s.bm + rank * h + rr < s.m;
        map.target_of_slot[size_t(idx) * h + rr] = valid ? SlotTarget{t.tm * h + rr, t.tn} : SlotTarget{};
      }
    }
    map.groups.push_back(GroupCall{g.first_tile, g.end_tile,
                                   Span{int64_t{g.first_tile} * s.bm * s.bn, int64_t{tg} * s.bm * s.bn},
                                   Span{int64_t{g.first_tile} * h * s.bn, int64_t{tg} * h * s.bn}, {}, {}});
  }
  map.out_rows = int64_t(rs_rows_of_rank(s, world, rank, RsLayout::SubTile).size());
  return map;
}

SlotMap standard_map(const Schedule& s, const std::vector<Group>& groups, int32_t world, int32_t rank) {
  SlotMap map = slot_map_base(Collective::ReduceScatter, s, world, rank);
  const int32_t R = s.m / world;
  const WaveCounts counts = rs_standard_counts(s, world);
  auto dest = [R](int32_t row) { return row / R; };
  for (const Group& g : groups) {
    const int64_t padded = rs_standard_padded_rows(counts, g.first_wave, g.end_wave);
    const int64_t part = padded / world, send0 = map.send_rows, recv0 = map.recv_rows;
    std::vector<int64_t> starts(world);
    for (int32_t d = 0; d < world; ++d) starts[d] = send0 + d * part;
    place_rows_by_bucket(s, g, dest, starts, [&](int32_t, int32_t idx, TileCoord, int32_t r, int64_t slot) {
      map.row_of[size_t(idx) * s.bm + r] = int32_t(slot);
    });
    map.target_of_slot.resize(size_t(recv0 + part));
    place_rows_by_bucket(
        s, g, [&](int32_t row) { return dest(row) == rank ? 0 : -1; }, {recv0},
        [&](int32_t, int32_t, TileCoord t, int32_t r, int64_t slot) {
          map.target_of_slot[size_t(slot)] = SlotTarget{t.tm * s.bm + r - rank * R, t.tn};
        });
    map.padding_rows += rs_standard_padding_rows(counts, g.first_wave, g.end_wave);
    map.groups.push_back(GroupCall{g.first_tile, g.end_tile, Span{send0 * s.bn, padded * s.bn},
                                   Span{recv0 * s.bn, part * s.bn}, {}, {}});
    map.send_rows += padded;
    map.recv_rows += part;
  }
  map.out_rows = R;
  return map;
}

}  // namespace

SlotMap make_reducescatter_map(const Schedule& s, const std::vector<Group>& groups, int32_t world,
                               int32_t rank, RsLayout layout) {
  require_rs_layout(s, world, layout);
  SlotMap map = layout == RsLayout::SubTile ? subtile_map(s, groups, world, rank)
                                            : standard_map(s, groups, world, rank);
  finish_slot_map(map);
  return map;
}

std::vector<int32_t> rs_rows_of_rank(const Schedule& s, int32_t world, int32_t rank, RsLayout layout) {
  require_rs_layout(s, world, layout);
  std::vector<int32_t> rows;
  if (layout == RsLayout::Standard) {
    for (int32_t i = 0; i < s.m / world; ++i) rows.push_back(rank * (s.m / world) + i);
    return rows;
  }
  const int32_t h = s.bm / world;
  for (int32_t tm = 0; tm < s.tiles_m(); ++tm)
    for (int32_t rr = 0; rr < h && tm * s.bm + rank * h + rr < s.m; ++rr) rows.push_back(tm * s.bm + rank * h + rr);
  return rows;
}

std::vector<int32_t> rs_peer_row_of(const Schedule& s, int32_t world, int32_t rank) {
  require_rs_layout(s, world, RsLayout::Standard);
  if (rank < 0 || rank >= world)
    throw InvalidArgument("rank " + std::to_string(rank) + " out of range for world size " + std::to_string(world));
  const int64_t q = s.m / world;
  if (int64_t{world} * world * q > INT32_MAX)
    throw InvalidArgument("reducescatter (NVLink form): " + std::to_string(world) + " windows of " +
                          std::to_string(world * q) + " rows do not fit int32 row indices");
  std::vector<int32_t> row_of(size_t(s.tiles()) * s.bm, -1);
  for (int32_t idx = 0; idx < s.tiles(); ++idx) {
    const int64_t tm = s.tile_of(idx).tm;
    for (int32_t r = 0; r < s.bm; ++r) {
      const int64_t row = tm * s.bm + r;
      if (row >= s.m) break;
      const int64_t d = row / q;
      row_of[size_t(idx) * s.bm + r] = int32_t(d * world * q + rank * q + row % q);
    }
  }
  return row_of;
}

}  // namespace flashoverlap::plan
