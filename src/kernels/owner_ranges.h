// owner_ranges.h — which rank owns which tile in the owner layout on W ranks
// (gemm.h: Owner), the order each rank walks the tiles in, and where a
// sender's partial lands in its owner's window. Pure functions shared by the
// kernel and the host (runtime, tests); no CUDA headers.
//
// The tiles are W contiguous ranges, range q = [q T / W, (q + 1) T / W)
// (floor), owned by rank W - 1 - q; rank r walks from range (W - r) mod W
// on, cyclically, so its own range comes last and every partial it sends
// leaves before its owned tiles are computed. At W = 2 this is the 2-rank
// layout: rank 1 owns [0, T / 2) and walks from T / 2, rank 0 owns the rest
// and walks from 0.
#pragma once
#include <cstdint>

#include "plan/schedule.h"  // (FO_HD)

namespace flashoverlap::kernels {

// (32-bit arithmetic: tiles * world < 2^31; the kernel's registers are few.)
FO_HD int32_t owner_range_begin(int32_t q, int32_t tiles, int32_t world) { return q * tiles / world; }
// The rank that owns tile idx.
FO_HD int32_t owner_of_tile(int32_t idx, int32_t tiles, int32_t world) {
  const int32_t q = ((idx + 1) * world + tiles - 1) / tiles - 1;  // idx in range q
  return world - 1 - q;
}
// Rank r's tiles: [owned_begin, owned_end).
FO_HD int32_t owned_begin(int32_t rank, int32_t tiles, int32_t world) {
  return owner_range_begin(world - 1 - rank, tiles, world);
}
FO_HD int32_t owned_end(int32_t rank, int32_t tiles, int32_t world) {
  return owner_range_begin(world - rank, tiles, world);
}
// The tile in rank r's walk position i.
FO_HD int32_t owner_walk_tile(int32_t rank, int32_t i, int32_t tiles, int32_t world) {
  const int32_t j = i + owned_end(rank, tiles, world) % tiles;
  return j >= tiles ? j - tiles : j;
}
// The window slot (of its owner's W - 1) that sender s's partial of a tile
// owned by o lands in; slot 0 also takes the finals sent to a non-owner.
FO_HD int32_t owner_slot_of_sender(int32_t sender, int32_t owner, int32_t world) {
  return (sender - owner - 1 + 2 * world) % world;
}
// The sender whose partial is in slot s of owner o's window.
FO_HD int32_t owner_sender_of_slot(int32_t slot, int32_t owner, int32_t world) {
  return (owner + slot + 1) % world;
}

}  // namespace flashoverlap::kernels
