#include "plan/slot_map_alltoall.h"

#include <algorithm>

namespace flashoverlap::plan {

WaveCounts alltoall_rank_counts(const Schedule& s, const Routing& routing, int32_t rank) {
  const int32_t W = routing.world;
  validate_routing(routing, W, s.m);
  std::vector<int64_t> per_tile_row(size_t(s.tiles_m()) * 2 * W, 0);
  for (int32_t row = 0; row < s.m; ++row) ++per_tile_row[size_t(row / s.bm) * 2 * W + routing.dest[rank][row]];
  for (int32_t src = 0; src < W; ++src)  // source-major: each routing read in order
    for (int32_t row = 0; row < s.m; ++row)
      per_tile_row[size_t(row / s.bm) * 2 * W + W + src] += routing.dest[src][row] == rank;
  return WaveCounts(s, 2 * W, per_tile_row);
}

std::vector<int64_t> AllToAllLoad::per_tile_row(const Routing& routing, int32_t bm) {
  const int32_t W = routing.world, bins = 2 * W + 1;
  const int64_t tiles_m = (routing.m + bm - 1) / bm;
  std::vector<int64_t> counts(size_t(tiles_m) * bins, 0);
  for (int32_t src = 0; src < W; ++src)  // source-major: each routing read in order
    for (int64_t row = 0; row < routing.m; ++row) {
      int64_t* b = &counts[size_t(row / bm) * bins];
      const int32_t d = routing.dest[src][size_t(row)];
      b[d] += d == src;
      ++b[W + d];
    }
  for (int64_t row = 0; row < routing.m; ++row) ++counts[size_t(row / bm) * bins + 2 * W];
  return counts;
}

AllToAllLoad::AllToAllLoad(const Schedule& s, int32_t world, const std::vector<int64_t>& per_tile_row)
    : world_(world), counts_(s, 2 * world + 1, per_tile_row) {}

namespace {
std::vector<int64_t> validated_row_load(const Schedule& s, const Routing& routing) {
  validate_routing(routing, routing.world, s.m);
  return AllToAllLoad::per_tile_row(routing, s.bm);
}
}  // namespace

AllToAllLoad::AllToAllLoad(const Schedule& s, const Routing& routing)
    : AllToAllLoad(s, routing.world, validated_row_load(s, routing)) {}

int64_t AllToAllLoad::max_link_rows(int32_t w0, int32_t w1) const {
  const int64_t rows = counts_.sum(w0, w1, 2 * world_);
  int64_t most = 0;
  for (int32_t x = 0; x < world_; ++x) {
    const int64_t kept = counts_.sum(w0, w1, x);
    most = std::max({most, rows - kept, counts_.sum(w0, w1, world_ + x) - kept});
  }
  return most;
}

SlotMap make_alltoall_map(const Schedule& s, const std::vector<Group>& groups, const Routing& routing,
                          int32_t rank) {
  const int32_t W = routing.world;
  SlotMap map = slot_map_base(Collective::AllToAll, s, W, rank);
  const WaveCounts counts = alltoall_rank_counts(s, routing, rank);

  // Spans: per group, sends by destination then receives by source.
  for (const Group& g : groups) {
    GroupCall call{g.first_tile, g.end_tile, {map.send_rows * s.bn, 0}, {map.recv_rows * s.bn, 0}, {}, {}};
    for (int32_t peer = 0; peer < W; ++peer) {
      const int64_t out = counts.sum(g.first_wave, g.end_wave, peer), in = counts.sum(g.first_wave, g.end_wave, W + peer);
      call.send_to.push_back(Span{map.send_rows * s.bn, out * s.bn});
      call.recv_from.push_back(Span{map.recv_rows * s.bn, in * s.bn});
      map.send_rows += out;
      map.recv_rows += in;
    }
    call.send.count = map.send_rows * s.bn - call.send.offset;
    call.recv.count = map.recv_rows * s.bn - call.recv.offset;
    map.groups.push_back(std::move(call));
  }

  // Send side: this rank's rows by destination.
  const auto& my_dest = routing.dest[rank];
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int64_t> starts;
    for (const Span& to : map.groups[g].send_to) starts.push_back(to.offset / s.bn);
    place_rows_by_bucket(s, groups[g], [&](int32_t row) { return my_dest[row]; }, starts,
                         [&](int32_t, int32_t idx, TileCoord, int32_t r, int64_t slot) {
                           map.row_of[size_t(idx) * s.bm + r] = int32_t(slot);
                         });
  }

  // Receive side, one source at a time. Its rows to this rank, in row order,
  // are its block of the output; the rows of tile row tm among them are
  // mine[first[tm] .. first[tm+1]), received in the sender's (tile, row) order.
  map.target_of_slot.resize(size_t(map.recv_rows));
  std::vector<int32_t> mine, first(size_t(s.tiles_m()) + 1);
  for (int32_t src = 0; src < W; ++src) {
    mine.clear();
    for (int32_t tm = 0, row = 0; tm < s.tiles_m(); ++tm) {
      first[size_t(tm)] = int32_t(mine.size());
      for (; row < std::min<int64_t>(int64_t{tm + 1} * s.bm, s.m); ++row)
        if (routing.dest[src][row] == rank) mine.push_back(row);
    }
    first[size_t(s.tiles_m())] = int32_t(mine.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      int64_t slot = map.groups[g].recv_from[size_t(src)].offset / s.bn;
      for (int32_t idx = groups[g].first_tile; idx < groups[g].end_tile; ++idx) {
        const TileCoord t = s.tile_of(idx);
        for (int32_t i = first[size_t(t.tm)]; i < first[size_t(t.tm) + 1]; ++i)
          map.target_of_slot[size_t(slot++)] = SlotTarget{int32_t(map.out_rows + i), t.tn};
      }
    }
    map.out_rows += int64_t(mine.size());
  }
  finish_slot_map(map);
  return map;
}

}  // namespace flashoverlap::plan
