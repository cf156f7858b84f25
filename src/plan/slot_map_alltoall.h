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

// bins = world*world: sum(w0, w1, src*world + dst) = slot rows that the tiles
// of waves [w0, w1) on rank src send to rank dst.
WaveCounts alltoall_counts(const Schedule& s, const Routing& routing);

// The busiest rank's off-rank traffic in waves [w0, w1), in slot rows: the
// largest, over ranks, of rows sent to other ranks and rows received from them.
int64_t alltoall_max_link_rows(const WaveCounts& counts, int32_t world, int32_t w0, int32_t w1);

SlotMap make_alltoall_map(const Schedule& s, const std::vector<Group>& groups,
                          const Routing& routing, int32_t rank);

}  // namespace flashoverlap::plan
