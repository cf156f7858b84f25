// The share of the ideal gain (runtime/ideal_gain.h), on random times.
#include <gtest/gtest.h>

#include <random>

#include "runtime/ideal_gain.h"

using flashoverlap::rt::gain_captured;
using flashoverlap::rt::kLeastIdealGain;

TEST(IdealGain, SequentialIsZeroIdealIsOneAndLinearBetween) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 1000; ++i) {
    const double seq = 0.05 + 2 * u(rng);
    const double ideal = seq * (0.5 + 0.49 * u(rng));  // an ideal gain of 1-50% of seq
    ASSERT_DOUBLE_EQ(*gain_captured(seq, ideal, seq), 0.0);
    ASSERT_DOUBLE_EQ(*gain_captured(seq, ideal, ideal), 1.0);
    const double f = 2 * u(rng) - 0.5, ms = seq - f * (seq - ideal);  // f of the way from seq to ideal
    if (ms > 0) ASSERT_NEAR(*gain_captured(seq, ideal, ms), f, 1e-9);
    const double slower = seq * (1 + u(rng));
    ASSERT_LT(*gain_captured(seq, ideal, slower), 0.0);
  }
}

TEST(IdealGain, NoneWhereTheIdealGainIsNoise) {
  // One GPU: the AllReduce moves nothing, so ideal ~ sequential (the main job's
  // numbers: 0.747 sequential, 0.745 ideal).
  EXPECT_FALSE(gain_captured(0.747, 0.745, 0.756).has_value());
  EXPECT_FALSE(gain_captured(1.0, 1.0, 0.9).has_value());
  EXPECT_FALSE(gain_captured(1.0, 1.2, 0.9).has_value());  // ideal above sequential
  EXPECT_FALSE(gain_captured(1.0, 1.0 - 0.999 * kLeastIdealGain, 0.99).has_value());
  EXPECT_TRUE(gain_captured(1.0, 1.0 - kLeastIdealGain, 0.995).has_value());
  EXPECT_FALSE(gain_captured(0.0, 0.0, 0.1).has_value());
  EXPECT_FALSE(gain_captured(1.0, 0.5, 0.0).has_value());
  EXPECT_FALSE(gain_captured(1.0, 0.5, -1.0).has_value());
}
