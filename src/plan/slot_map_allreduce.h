// slot_map_allreduce.h — AllReduce slot map (unit: tile).
//
// Row r of tile idx goes to slot row idx*bm + r: tiles are laid out in schedule
// order, so a group (a run of consecutive tile indices) is one contiguous range
// [first_tile*bm*bn, end_tile*bm*bn) and the kernel may compute the address
// arithmetically instead of reading row_of. Every row of every tile is stored
// (zeros past M and N). The map is the same on every rank, as it must be: the
// AllReduce sums slot i of all ranks. The output is C (M x N), in place.
#pragma once
#include <vector>

#include "plan/slot_map.h"

namespace flashoverlap::plan {

SlotMap make_allreduce_map(const Schedule& s, const std::vector<Group>& groups, int32_t world);

}  // namespace flashoverlap::plan
