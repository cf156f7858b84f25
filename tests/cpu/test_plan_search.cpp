// The predictor and the two searches: the O(T^2) DP must find the optimum of
// the exhaustive enumeration on random cost models.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>

#include "flashoverlap/error.h"
#include "plan/latency_model.h"
#include "plan/search.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

namespace {

double real(std::mt19937_64& rng, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }

// Random models of three kinds: a random bandwidth curve on tile bytes (as the
// planner builds), a random arbitrary cost per (j, i), and constant costs.
fo::CostModel random_model(std::mt19937_64& rng, int32_t T, std::string& what) {
  fo::CostModel m;
  const double wave = real(rng, 0.01, 0.2);
  const bool uneven = uniform(rng, 0, 1);
  for (int32_t w = 0; w < T; ++w) m.wave_ms.push_back(uneven ? real(rng, 0.01, 0.2) : wave);
  switch (uniform(rng, 0, 2)) {
    case 0: {
      std::vector<fo::CurveSample> samples;
      double bytes = real(rng, 1e3, 1e5), ms = real(rng, 0.01, 0.1);
      for (int i = 0, n = int(uniform(rng, 2, 14)); i < n; ++i) {
        samples.push_back({bytes, ms});
        bytes *= real(rng, 1.5, 4);
        ms = std::max(0.001, ms + real(rng, -0.02, 0.2));  // not monotone
      }
      auto curve = std::make_shared<fo::BandwidthCurve>(fo::Collective::AllReduce, 2, samples);
      const double tile_bytes = real(rng, 1e3, 1e7), last = real(rng, 0.1, 1);
      m.comm_ms = [curve, tile_bytes, last, T](int32_t j, int32_t i) {
        return curve->latency_ms(tile_bytes * (i - j - (i == T ? 1 - last : 0)));
      };
      what = "curve with " + std::to_string(samples.size()) + " samples";
      break;
    }
    case 1: {
      auto table = std::make_shared<std::vector<double>>();
      for (int32_t k = 0; k < (T + 1) * (T + 1); ++k) table->push_back(real(rng, 0, 0.3));
      m.comm_ms = [table, T](int32_t j, int32_t i) { return (*table)[size_t(j) * (T + 1) + i]; };
      what = "arbitrary costs";
      break;
    }
    default: {
      const double c = real(rng, 0, 0.1);
      m.comm_ms = [c](int32_t, int32_t) { return c; };
      what = "constant cost";
    }
  }
  if (uniform(rng, 0, 4) == 0) m.comm_not_before_ms = std::accumulate(m.wave_ms.begin(), m.wave_ms.end(), 0.0);
  return m;
}

}  // namespace

TEST(PlanSearch, PredictorFollowsThePaperRecurrence) {
  fo::CostModel m{{1, 1, 1}, [](int32_t j, int32_t i) { return 0.5 * (i - j) + 0.2; }, 0};
  const fo::Prediction a = fo::predict(m, {1, 2});
  ASSERT_EQ(a.groups.size(), 2u);
  EXPECT_DOUBLE_EQ(a.groups[0].compute_end, 1);
  EXPECT_DOUBLE_EQ(a.groups[0].comm_start, 1);
  EXPECT_DOUBLE_EQ(a.groups[0].comm_end, 1.7);
  EXPECT_DOUBLE_EQ(a.groups[1].compute_start, 1);
  EXPECT_DOUBLE_EQ(a.groups[1].comm_start, 3);
  EXPECT_DOUBLE_EQ(a.total_ms, 4.2);
  EXPECT_DOUBLE_EQ(fo::predict(m, {1, 1, 1}).total_ms, 3.7);
  // A call waits for the previous one: comm 1.0 per wave, longer than compute.
  fo::CostModel slow{{1, 1}, [](int32_t j, int32_t i) { return 2.0 * (i - j); }, 0};
  EXPECT_DOUBLE_EQ(fo::predict(slow, {1, 1}).groups[1].comm_start, 3);
  EXPECT_DOUBLE_EQ(fo::predict(slow, {1, 1}).total_ms, 5);
  // Nothing before comm_not_before.
  m.comm_not_before_ms = 3;
  EXPECT_DOUBLE_EQ(fo::predict(m, {1, 1, 1}).groups[0].comm_start, 3);
  EXPECT_THROW(fo::predict(m, {1, 1}), flashoverlap::InvalidArgument);
}

TEST(PlanSearch, DynamicProgrammeMatchesExhaustiveSearch) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 400; ++it) {
    const int32_t T = int32_t(it % 40 == 0 ? uniform(rng, 16, 18) : uniform(rng, 1, 13));
    std::string what;
    const fo::CostModel m = random_model(rng, T, what);
    SCOPED_TRACE("case " + std::to_string(it) + ": T=" + std::to_string(T) + " " + what);
    const fo::SearchResult dp = fo::search_dp(m), ex = fo::search_exhaustive(m);
    ASSERT_NEAR(dp.total_ms, ex.total_ms, 1e-9 * ex.total_ms) << "dp " << fo::to_string(dp.partition) << " exhaustive "
                                                            << fo::to_string(ex.partition);
    EXPECT_NEAR(fo::predict(m, dp.partition).total_ms, dp.total_ms, 1e-12 * dp.total_ms);
    EXPECT_NEAR(fo::predict(m, ex.partition).total_ms, ex.total_ms, 1e-12 * ex.total_ms);
  }
}

TEST(PlanSearch, TiesGoToFewerGroups) {
  // Free communication: every partition finishes with the GEMM; one group wins.
  fo::CostModel free{std::vector<double>(9, 0.1), [](int32_t, int32_t) { return 0.0; }, 0};
  EXPECT_EQ(fo::search_dp(free).partition, fo::Partition{9});
  EXPECT_EQ(fo::search_exhaustive(free).partition, fo::Partition{9});
  // Per-call cost only (no bandwidth term), comm after the GEMM: one call.
  fo::CostModel after{std::vector<double>(6, 0.1), [](int32_t, int32_t) { return 0.05; }, 0.6};
  EXPECT_EQ(fo::search_dp(after).partition, fo::Partition{6});
}

TEST(PlanSearch, ExhaustiveRefusesLargeT) {
  fo::CostModel m{std::vector<double>(21, 0.1), [](int32_t, int32_t) { return 0.01; }, 0};
  EXPECT_THROW(fo::search_exhaustive(m), flashoverlap::InvalidArgument);
  EXPECT_EQ(fo::search_dp(m).partition.size() > 0, true);
  EXPECT_THROW(fo::search_dp(fo::CostModel{{}, m.comm_ms, 0}), flashoverlap::InvalidArgument);
}

// The coarsened search every planner calls: the DP itself up to max_waves;
// above, groups of whole runs of ceil(T / max_waves) waves (the last what is
// left) summing to T, and never worse than the coarse DP's own optimum on
// the fine model (the coarse model prices exactly those partitions).
TEST(PlanSearch, CoarsenedSearchIsTheDpOrWholeRuns) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 200; ++it) {
    const int32_t T = int32_t(uniform(rng, 1, 60)), max_waves = int32_t(uniform(rng, 1, 20));
    std::string what;
    const fo::CostModel m = random_model(rng, T, what);
    SCOPED_TRACE("case " + std::to_string(it) + ": T=" + std::to_string(T) + " max " + std::to_string(max_waves) +
                 " " + what);
    const fo::Partition p = fo::search_coarsened(m, max_waves);
    EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0), T) << fo::to_string(p);
    if (T <= max_waves) {
      EXPECT_EQ(p, fo::search_dp(m).partition);
      continue;
    }
    const int32_t step = (T + max_waves - 1) / max_waves;
    EXPECT_LE(int32_t(p.size()), max_waves) << fo::to_string(p);
    for (size_t g = 0; g + 1 < p.size(); ++g) EXPECT_EQ(p[g] % step, 0) << fo::to_string(p);
    // One group of everything is among the coarse partitions: the pick is no slower than it.
    EXPECT_LE(fo::predict(m, p).total_ms, fo::predict(m, fo::Partition{T}).total_ms * (1 + 1e-12));
  }
  EXPECT_THROW(fo::search_coarsened(fo::CostModel{{0.1}, [](int32_t, int32_t) { return 0.0; }, 0}, 0),
               flashoverlap::InvalidArgument);
}
