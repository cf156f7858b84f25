// How many slots a staging ring's memory holds (runtime/core/staging_ring.h;
// host arithmetic, no CUDA call): as many whole slots as the bytes hold,
// never fewer than 2 nor more than the most asked.
#include <gtest/gtest.h>

#include <random>

#include "runtime/core/staging_ring.h"
#include "test_seed.h"

using namespace flashoverlap;

TEST(StagingRing, SlotsWithinAreTheWholeSlotsTheBytesHoldBetweenTwoAndTheMost) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 1000; ++trial) {
    const size_t slot = 1 + rng() % (size_t(1) << 22), most = 2 + rng() % 300;
    const size_t fit = rng() % (most + 4);  // (whole slots in the budget, some past the most)
    const size_t bytes = fit * slot + rng() % slot;
    const size_t got = rt::StagingRing::slots_within(bytes, slot, most);
    EXPECT_EQ(got, fit < 2 ? 2 : fit > most ? most : fit) << "slot " << slot << ", bytes " << bytes << ", most " << most;
  }
  EXPECT_EQ(rt::StagingRing::slots_within(size_t(16) << 20, 3, 256), 256u);
  EXPECT_EQ(rt::StagingRing::slots_within(0, 4096, 64), 2u);
}
