#include "plan/slot_map_allreduce.h"

namespace flashoverlap::plan {

SlotMap make_allreduce_map(const Schedule& s, const std::vector<Group>& groups, int32_t world) {
  SlotMap map = slot_map_base(Collective::AllReduce, s, world, 0);
  map.in_place = true;
  map.out_rows = s.m;
  map.send_rows = map.recv_rows = int64_t{s.tiles()} * s.bm;
  map.target_of_slot.resize(size_t(map.recv_rows));
  for (int32_t idx = 0; idx < s.tiles(); ++idx) {
    const TileCoord t = s.tile_of(idx);
    for (int32_t r = 0; r < s.bm; ++r) {
      const int32_t slot = idx * s.bm + r;
      map.row_of[size_t(slot)] = slot;
      const int32_t row = t.tm * s.bm + r;
      map.target_of_slot[size_t(slot)] = row < s.m ? SlotTarget{row, t.tn} : SlotTarget{};
    }
  }
  const int64_t tile_elems = int64_t{s.bm} * s.bn;
  for (const Group& g : groups) {
    const Span span{g.first_tile * tile_elems, g.tiles() * tile_elems};
    map.groups.push_back(GroupCall{g.first_tile, g.end_tile, span, span, {}, {}});
  }
  finish_slot_map(map);
  return map;
}

}  // namespace flashoverlap::plan
