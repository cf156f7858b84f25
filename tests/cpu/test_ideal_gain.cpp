// The share of the ideal gain (runtime/ideal_gain.h), on random times.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>

#include "runtime/tune/ideal_gain.h"
#include "test_seed.h"

using flashoverlap::rt::gain_captured;
using flashoverlap::rt::kLeastIdealGain;

TEST(IdealGain, SequentialIsZeroIdealIsOneAndLinearBetween) {
  FO_SEEDED_RNG(rng);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 1000; ++i) {
    const double seq = 0.05 + 2 * u(rng);
    const double ideal = seq * (0.5 + 0.48 * u(rng));  // an ideal gain of 2-50% of seq
    const auto at = [&](double ms) {
      const std::optional<double> g = gain_captured(seq, ideal, ms);
      EXPECT_TRUE(g.has_value()) << "seq " << seq << " ideal " << ideal << " ms " << ms;
      return g.value_or(-1e9);
    };
    ASSERT_DOUBLE_EQ(at(seq), 0.0);
    ASSERT_DOUBLE_EQ(at(ideal), 1.0);
    const double f = 2 * u(rng) - 0.5, ms = seq - f * (seq - ideal);  // f of the way from seq to ideal
    ASSERT_GT(ms, 0);  // (f <= 1.5 of a gap under seq / 2)
    ASSERT_NEAR(at(ms), f, 1e-9);
    ASSERT_LT(at(seq * (1 + u(rng))), 0.0);  // slower than sequential
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
