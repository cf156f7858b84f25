// Where the public ops time our GEMM against cuBLAS's, and which timing stands for an m.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "flashoverlap/error.h"
#include "plan/gemm_choice.h"
#include "test_seed.h"

namespace fo = flashoverlap::plan;

TEST(PlanGemmChoice, SamplesPowersOfTwoThenTileRows) {
  EXPECT_EQ(fo::gemm_choice_samples(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(fo::gemm_choice_samples(100), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 100}));
  EXPECT_EQ(fo::gemm_choice_samples(128), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128}));
  EXPECT_EQ(fo::gemm_choice_samples(1000), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1000}));
  const std::vector<int64_t> big = fo::gemm_choice_samples(1 << 20);
  EXPECT_EQ(big.back(), fo::kGemmChoiceMaxRows);
  EXPECT_THROW(fo::gemm_choice_samples(0), flashoverlap::InvalidArgument);
}

TEST(PlanGemmChoice, EveryMHasASampleThatStandsForIt) {
  FO_SEEDED_RNG(rng);
  for (int round = 0; round < 200; ++round) {
    const int64_t max_m = 1 + int64_t(rng() % 20000);
    const std::vector<int64_t> s = fo::gemm_choice_samples(max_m);
    ASSERT_TRUE(std::is_sorted(s.begin(), s.end())) << max_m;
    ASSERT_TRUE(std::adjacent_find(s.begin(), s.end()) == s.end()) << max_m;
    for (int j = 0; j < 50; ++j) {
      const int64_t m = 1 + int64_t(rng() % uint64_t(max_m));
      const size_t i = fo::gemm_choice_sample_of(s, m);
      ASSERT_LT(i, s.size());
      if (m <= 128 && m <= s.back()) {  // its power-of-two bucket (or max_m's sample)
        EXPECT_GE(s[i], m);
        EXPECT_TRUE(i == 0 || s[i - 1] < m) << "m " << m << " max_m " << max_m;
      } else if (m <= 256) {  // two tile rows: the sample of two (or max_m's)
        EXPECT_EQ(s[i], std::min<int64_t>(256, s.back())) << "m " << m;
      } else if (m < s.back()) {  // the nearest on a log scale, within a factor 1.5
        EXPECT_GT(s[i], 128);
        EXPECT_LE(std::fabs(std::log(double(s[i]) / double(m))), std::log(1.5) / 2 + 1e-9)
            << "m " << m << " sample " << s[i];
      } else {
        EXPECT_EQ(i, s.size() - 1);
      }
    }
  }
}
