// slot_map_alltoall.h — All-to-All slot map for MoE (unit: sub-token = the rows
// of one tile that go to one destination, each a bn-wide slot row).
//
// On every source rank, group g's send region holds, for destination d = 0..W-1
// in order, the group's rows with destination d (tile idx order, then row
// order); rows past M are not stored. One grouped ncclSend/ncclRecv per peer
// per group moves them; on the receiver, group g's region holds, for source
// s = 0..W-1 in order, what s sent it in s's order. The post-reorder puts
// the rows in the order of all_to_all_single after a stable sort of each
// source's rows by destination: grouped by source rank, in source row order,
// all N columns. No padding: peers get exactly their counts (zero allowed).
// The map depends on the routing of every rank (the receive side) and
// differs between ranks.
#pragma once
#include <vector>

#include "plan/routing.h"
#include "plan/slot_map.h"

namespace flashoverlap::plan {

// What one rank moves per group: counts.sum(w0, w1, d) = slot rows the tiles
// of waves [w0, w1) on `rank` send to rank d, and counts.sum(w0, w1, W + s) =
// slot rows rank s sends to `rank` (bins: 2 * world).
WaveCounts alltoall_rank_counts(const Schedule& s, const Routing& routing, int32_t rank);

// The off-rank traffic of every rank per group, for the planner's model, in
// O(world) per group (not world^2).
class AllToAllLoad {
 public:
  // The routing's traffic per tile row of `bm` rows: the part that does not
  // depend on the schedule, to compute once per tile height (O(world * M)).
  static std::vector<int64_t> per_tile_row(const Routing& routing, int32_t bm);

  AllToAllLoad(const Schedule& s, const Routing& routing);
  AllToAllLoad(const Schedule& s, int32_t world, const std::vector<int64_t>& per_tile_row);
  // The busiest rank's off-rank traffic in waves [w0, w1), in slot rows: the
  // largest, over ranks, of rows sent to other ranks and rows received from them.
  int64_t max_link_rows(int32_t w0, int32_t w1) const;

 private:
  int32_t world_;
  // Bins: [0, W) rows rank x keeps, [W, 2W) rows all ranks send to x, 2W rows
  // of one rank's tiles (the same on every rank).
  WaveCounts counts_;
};

SlotMap make_alltoall_map(const Schedule& s, const std::vector<Group>& groups,
                          const Routing& routing, int32_t rank);

}  // namespace flashoverlap::plan
