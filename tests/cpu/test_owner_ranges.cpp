// The owner layout's ranges, walks and window slots on W ranks
// (kernels/owner_ranges.h), on the host.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kernels/owner_ranges.h"

using namespace flashoverlap::kernels;

// Every tile has one owner, whose range holds it; each rank's walk visits
// every tile once and ends with its own range; at W = 2 the layout is the
// 2-rank one (rank 1 owns [0, T / 2) and walks from T / 2; rank 0 owns the
// rest and walks from 0).
TEST(OwnerRanges, EveryTileOwnedOnceAndEachWalkEndsWithItsOwnRange) {
  for (int32_t world = 2; world <= 8; ++world)
    for (int32_t tiles = 1; tiles <= 300; tiles += (tiles < 40 ? 1 : 7)) {
      SCOPED_TRACE("world " + std::to_string(world) + " tiles " + std::to_string(tiles));
      std::vector<int> owned(size_t(tiles), 0);
      for (int32_t r = 0; r < world; ++r) {
        const int32_t lo = owned_begin(r, tiles, world), hi = owned_end(r, tiles, world);
        EXPECT_LE(lo, hi);
        for (int32_t idx = lo; idx < hi; ++idx) {
          owned[size_t(idx)]++;
          EXPECT_EQ(owner_of_tile(idx, tiles, world), r) << "tile " << idx;
        }
        std::set<int32_t> seen;
        for (int32_t i = 0; i < tiles; ++i) {
          const int32_t t = owner_walk_tile(r, i, tiles, world);
          ASSERT_GE(t, 0);
          ASSERT_LT(t, tiles);
          seen.insert(t);
          const bool own = t >= lo && t < hi;
          EXPECT_EQ(own, i >= tiles - (hi - lo)) << "rank " << r << " position " << i << ": its own range comes last";
        }
        EXPECT_EQ(seen.size(), size_t(tiles)) << "rank " << r << "'s walk is not a permutation";
        if (world == 2) {
          const int32_t split = tiles / 2;
          for (int32_t idx = 0; idx < tiles; ++idx)
            EXPECT_EQ(owner_of_tile(idx, tiles, 2) == 0, idx >= split) << "tile " << idx;
          EXPECT_EQ(owner_walk_tile(1, 0, tiles, 2), tiles == 1 ? 0 : split % tiles);
          EXPECT_EQ(owner_walk_tile(0, 0, tiles, 2), 0);
        }
      }
      for (int32_t idx = 0; idx < tiles; ++idx) EXPECT_EQ(owned[size_t(idx)], 1) << "tile " << idx;
    }
}

// An owner's W - 1 window slots take one sender each (every rank but the
// owner), and slot_of_sender and sender_of_slot are inverse; at W = 2 the
// one slot is 0.
TEST(OwnerRanges, WindowSlotsTakeEachOtherRankOnce) {
  for (int32_t world = 2; world <= 8; ++world)
    for (int32_t owner = 0; owner < world; ++owner) {
      std::set<int32_t> slots;
      for (int32_t s = 0; s < world; ++s) {
        if (s == owner) continue;
        const int32_t slot = owner_slot_of_sender(s, owner, world);
        EXPECT_GE(slot, 0);
        EXPECT_LT(slot, world - 1) << "sender " << s << " owner " << owner << " world " << world;
        EXPECT_EQ(owner_sender_of_slot(slot, owner, world), s);
        slots.insert(slot);
      }
      EXPECT_EQ(slots.size(), size_t(world - 1));
      if (world == 2) EXPECT_EQ(owner_slot_of_sender(1 - owner, owner, 2), 0);
    }
}
