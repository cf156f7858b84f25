// The NVML power meter: the summary arithmetic on random sample runs, and
// opening it for a GPU that does not exist (no NVML on CI machines, an
// unknown bus id on GPU machines) returns no meter with a reason, not an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "runtime/power_meter.h"

using namespace flashoverlap;

TEST(PowerMeter, SummaryMatchesTheSamples) {
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + int(rng() % 40);
    std::vector<rt::PowerSample> s;
    double t = double(rng() % 1000), joules = 0, mhz = 0;
    uint64_t e = rng() % (uint64_t(1) << 40);
    int capped = 0, lo = 1 << 30;
    for (int i = 0; i < n; ++i) {
      if (i > 0) {
        t += 0.001 + double(rng() % 100) / 1000;
        const uint64_t de = rng() % 100000;  // mJ
        e += de, joules += double(de) / 1e3;
      }
      rt::PowerSample p;
      p.t_s = t, p.energy_mj = e, p.sm_mhz = 345 + int(rng() % 1700), p.power_capped = rng() % 3 == 0;
      mhz += p.sm_mhz, lo = std::min(lo, p.sm_mhz), capped += p.power_capped;
      s.push_back(p);
    }
    const rt::PowerSummary r = rt::summarize(s);
    const double secs = s.back().t_s - s.front().t_s;
    EXPECT_EQ(r.samples, n);
    EXPECT_NEAR(r.seconds, secs, 1e-9);
    EXPECT_NEAR(r.joules, joules, 1e-6);
    EXPECT_NEAR(r.mean_w, joules / secs, 1e-6);
    EXPECT_NEAR(r.sm_mhz_mean, mhz / n, 1e-9);
    EXPECT_EQ(r.sm_mhz_min, lo);
    EXPECT_NEAR(r.capped_share, double(capped) / n, 1e-12);
  }
  const rt::PowerSummary none = rt::summarize({rt::PowerSample{}});
  EXPECT_EQ(none.samples, 0);
  EXPECT_EQ(none.mean_w, 0);
}

TEST(PowerMeter, NoSuchGpuGivesNoMeterAndAReason) {
  std::string why;
  EXPECT_EQ(rt::PowerMeter::open("0000:ff:1f.7-not-a-gpu", &why), nullptr);
  EXPECT_FALSE(why.empty());
}
