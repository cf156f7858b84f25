#include "plan/slot_map_alltoall.h"

#include <algorithm>

namespace flashoverlap::plan {

WaveCounts alltoall_counts(const Schedule& s, const Routing& routing) {
  const int32_t W = routing.world;
  validate_routing(routing, W, s.m);
  std::vector<int64_t> per_tile_row(size_t(s.tiles_m()) * W * W, 0);
  for (int32_t src = 0; src < W; ++src)
    for (int32_t row = 0; row < s.m; ++row)
      ++per_tile_row[(size_t(row / s.bm) * W + src) * W + routing.dest[src][row]];
  return WaveCounts(s, W * W, per_tile_row);
}

int64_t alltoall_max_link_rows(const WaveCounts& counts, int32_t W, int32_t w0, int32_t w1) {
  int64_t most = 0;
  for (int32_t x = 0; x < W; ++x) {
    int64_t sent = 0, received = 0;
    for (int32_t y = 0; y < W; ++y) {
      if (y == x) continue;
      sent += counts.sum(w0, w1, x * W + y);
      received += counts.sum(w0, w1, y * W + x);
    }
    most = std::max({most, sent, received});
  }
  return most;
}

SlotMap make_alltoall_map(const Schedule& s, const std::vector<Group>& groups, const Routing& routing,
                          int32_t rank) {
  const int32_t W = routing.world;
  SlotMap map = slot_map_base(Collective::AllToAll, s, W, rank);
  const WaveCounts counts = alltoall_counts(s, routing);

  // Output row of each source row that comes to this rank: sources in rank
  // order, rows in source order.
  std::vector<std::vector<int32_t>> out_row(W, std::vector<int32_t>(size_t(s.m), -1));
  for (int32_t src = 0; src < W; ++src)
    for (int32_t row = 0; row < s.m; ++row)
      if (routing.dest[src][row] == rank) out_row[src][row] = int32_t(map.out_rows++);

  const auto& my_dest = routing.dest[rank];
  for (const Group& g : groups) {
    GroupCall call{g.first_tile, g.end_tile, {map.send_rows * s.bn, 0}, {map.recv_rows * s.bn, 0}, {}, {}};
    std::vector<int64_t> starts(W);
    for (int32_t d = 0; d < W; ++d) {
      const int64_t rows = counts.sum(g.first_wave, g.end_wave, rank * W + d);
      starts[d] = map.send_rows;
      call.send_to.push_back(Span{map.send_rows * s.bn, rows * s.bn});
      map.send_rows += rows;
    }
    place_rows_by_bucket(s, g, [&](int32_t row) { return my_dest[row]; }, starts,
                         [&](int32_t, int32_t idx, TileCoord, int32_t r, int64_t slot) {
                           map.row_of[size_t(idx) * s.bm + r] = int32_t(slot);
                         });
    for (int32_t src = 0; src < W; ++src) {
      const int64_t rows = counts.sum(g.first_wave, g.end_wave, src * W + rank);
      call.recv_from.push_back(Span{map.recv_rows * s.bn, rows * s.bn});
      map.target_of_slot.resize(size_t(map.recv_rows + rows));
      place_rows_by_bucket(
          s, g, [&](int32_t row) { return routing.dest[src][row] == rank ? 0 : -1; }, {map.recv_rows},
          [&](int32_t, int32_t, TileCoord t, int32_t r, int64_t slot) {
            map.target_of_slot[size_t(slot)] = SlotTarget{out_row[src][t.tm * s.bm + r], t.tn};
          });
      map.recv_rows += rows;
    }
    call.send.count = map.send_rows * s.bn - call.send.offset;
    call.recv.count = map.recv_rows * s.bn - call.recv.offset;
    map.groups.push_back(std::move(call));
  }
  finish_slot_map(map);
  return map;
}

}  // namespace flashoverlap::plan
