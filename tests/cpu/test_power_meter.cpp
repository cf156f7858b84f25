// The NVML power meter: the summary arithmetic on random sample runs, and
// opening it for a GPU that does not exist (no NVML on CI machines, an
// unknown bus id on GPU machines) returns no meter with a reason, not an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "runtime/tune/power_meter.h"
#include "test_seed.h"

using namespace flashoverlap;

TEST(PowerMeter, SummaryMatchesTheSamples) {
  FO_SEEDED_RNG(rng);
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

// The energy bound of bench --power: one shape measured on 2xH200
// (docs/results.md §2.5, 4096x8192x8192), then its properties on random input.
TEST(PowerMeter, EnergyBoundOfAMeasuredShape) {
  const rt::EnergyBound b = rt::energy_bound(119, {0.883, 607.4, 697}, {0.278, 77.4, 278}, 1.092, {1.021, 748.8, 733});
  EXPECT_NEAR(b.ideal_ms, 0.883, 1e-12);
  EXPECT_NEAR(b.least_mj, 607.4 + 77.4 - 119 * 0.278, 1e-9);  // 651.7 mJ
  EXPECT_NEAR(b.bound_ms, 0.935, 5e-4);
  EXPECT_NEAR(b.bound_gain, 0.75, 5e-3);
  EXPECT_NEAR(b.gain, 0.34, 5e-3);
  EXPECT_NEAR(b.excess_mj, 97.1, 0.05);
}

TEST(PowerMeter, EnergyBoundProperties) {
  FO_SEEDED_RNG(rng);
  auto uni = [&](double lo, double hi) { return lo + (hi - lo) * double(rng() % 1000001) / 1e6; };
  int gains = 0, none = 0;  // trials of each branch below
  for (int trial = 0; trial < 1000; ++trial) {
    const double idle = uni(50, 200);
    const rt::CallEnergy gemm{uni(0.05, 2), 0, uni(300, 800)};
    const rt::CallEnergy comm{uni(0.01, 1), 0, uni(100, 400)};
    rt::CallEnergy g = gemm, c = comm;
    g.mj = g.ms * g.w, c.mj = c.ms * c.w;
    // Every 8th: sequential no slower than the ideal (nothing to gain), else
    // near the sum of the parts (below the ideal now and then too).
    const double seq = trial % 8 == 0 ? std::max(g.ms, c.ms) - uni(0, 0.05) : g.ms + c.ms + uni(-0.1, 0.1);
    const rt::CallEnergy fo{uni(0.01, 3), uni(10, 2000), uni(300, 800)};
    const rt::EnergyBound b = rt::energy_bound(idle, g, c, seq, fo);
    const double above_idle = std::max(0.0, c.mj - idle * c.ms);
    EXPECT_DOUBLE_EQ(b.ideal_ms, std::max(g.ms, c.ms));
    EXPECT_NEAR(b.least_mj, g.mj + above_idle, 1e-9);
    EXPECT_GE(b.bound_ms, b.ideal_ms);
    EXPECT_GE(b.bound_ms, b.least_mj / g.w - 1e-12);
    EXPECT_NEAR(b.excess_mj, fo.mj - b.least_mj, 1e-9);
    if (seq > b.ideal_ms) {
      ++gains;
      EXPECT_LE(b.bound_gain, 1.0 + 1e-12);  // never more than the ideal
      EXPECT_NEAR(b.gain, (seq - fo.ms) / (seq - b.ideal_ms), 1e-9);
      const rt::EnergyBound at = rt::energy_bound(idle, g, c, seq, {b.bound_ms, b.least_mj, g.w});
      EXPECT_NEAR(at.gain, at.bound_gain, 1e-9);  // a call at the bound captures the bound's share
      EXPECT_NEAR(at.excess_mj, 0, 1e-9);
    } else {
      ++none;
      EXPECT_EQ(b.bound_gain, 0);
      EXPECT_EQ(b.gain, 0);
    }
  }
  EXPECT_GT(gains, 800);
  EXPECT_GE(none, 1000 / 8);
  // A collective drawing less than idle adds no energy: the bound is the GEMM's own.
  const rt::EnergyBound low = rt::energy_bound(150, {1.0, 700, 700}, {0.5, 50, 100}, 1.5, {1.2, 800, 700});
  EXPECT_NEAR(low.least_mj, 700, 1e-12);
  EXPECT_NEAR(low.bound_ms, 1.0, 1e-12);
}
