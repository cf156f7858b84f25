// The GEMM tile monitor's summary: on random persistent-CTA timelines with a
// known clock per phase, the clock, cycles per tile and per-quarter clocks
// come back; bad sizes are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "runtime/core/tile_clocks.h"
#include "test_seed.h"

using namespace flashoverlap;

TEST(TileClocks, RecoversTheClockAndCyclesPerTile) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 50; ++trial) {
    const int ctas = 1 + int(rng() % 16);
    const int64_t tiles = ctas * (8 + int64_t(rng() % 8)) + int64_t(rng() % ctas);
    // Every tile costs exactly `cyc` cycles; the clock is mhz[0] during the
    // first half of the run (by time) and mhz[1] after, one switch per CTA at
    // a tile boundary, so the cycles-over-time answer is exact.
    const uint64_t cyc = 50000 + rng() % 100000;
    const double mhz[2] = {1200.0 + double(rng() % 800), 1200.0 + double(rng() % 800)};
    std::vector<uint64_t> mma(size_t(tiles) * 2);
    double total_ns = 0, total_cyc = 0;
    for (int c = 0; c < ctas; ++c) {
      const int64_t mine = (tiles - c + ctas - 1) / ctas;
      uint64_t t = 1000000 + rng() % 1000, clk = rng() % (uint64_t(1) << 40);
      for (int64_t j = 0; j < mine; ++j) {
        const int64_t idx = c + j * ctas;
        if (j > 0) {
          const uint64_t ns = uint64_t(double(cyc) / mhz[j * 2 >= mine] * 1e3);  // exact enough: 1 ns of ~1e5
          t += ns, clk += cyc, total_ns += double(ns), total_cyc += double(cyc);
        }
        mma[size_t(idx) * 2] = t, mma[size_t(idx) * 2 + 1] = clk;
      }
    }
    const rt::TileClocks r = rt::summarize_tile_clocks(mma, tiles, ctas);
    EXPECT_EQ(r.intervals, tiles - ctas);
    EXPECT_NEAR(r.mhz, total_cyc / total_ns * 1e3, 1e-9 * r.mhz);
    EXPECT_NEAR(r.kcycles_median, double(cyc) * 1e-3, 1e-9);
    EXPECT_NEAR(r.kcycles_p90, double(cyc) * 1e-3, 1e-9);
    ASSERT_EQ(r.mhz_by_quarter.size(), 4u);
    EXPECT_LE(std::min(mhz[0], mhz[1]) - 1, r.mhz);
    EXPECT_GE(std::max(mhz[0], mhz[1]) + 1, r.mhz);
    // The first quarter holds only early intervals, the last only late ones:
    // every CTA has at least 8 tiles (see `tiles`), so its halves separate in time.
    ASSERT_GE(tiles, int64_t(ctas) * 8);
    EXPECT_NEAR(r.mhz_by_quarter.front(), mhz[0], 0.01 * mhz[0]);
    EXPECT_NEAR(r.mhz_by_quarter.back(), mhz[1], 0.01 * mhz[1]);
  }
}

TEST(TileClocks, SkipsUnrecordedTilesAndBackwardIntervals) {
  // Two CTAs, three tiles each; CTA 1's middle tile was never written (zeros).
  std::vector<uint64_t> mma = {1000, 5000, 2000, 9000, 3000, 7000, 0, 0, 5000, 11000, 6000, 15000};
  const rt::TileClocks r = rt::summarize_tile_clocks(mma, 6, 2);
  // CTA 0 (tiles 0, 2, 4): 2000 ns and 2000 cycles, then 2000 ns and 4000.
  // CTA 1: 1 -> 3 ends at an unrecorded tile, 3 -> 5 starts at one.
  EXPECT_EQ(r.intervals, 2);
  EXPECT_NEAR(r.mhz, 6000.0 / 4000.0 * 1e3, 1e-9);
  EXPECT_NEAR(r.kcycles_p90, 4.0, 1e-12);
}

TEST(TileClocks, RefusesTooFewValues) {
  EXPECT_THROW(rt::summarize_tile_clocks(std::vector<uint64_t>(5), 3, 1), std::invalid_argument);
  EXPECT_THROW(rt::summarize_tile_clocks(std::vector<uint64_t>(6), 3, 0), std::invalid_argument);
  EXPECT_EQ(rt::summarize_tile_clocks({}, 0, 4).intervals, 0);
}

// The phases' summary: times from the earliest start of a CTA with tiles,
// maxima and the medians (staged, MMAs done) over the CTAs that recorded a last tile, copies of
// every CTA (those without tiles copy too), on random per-CTA timelines.
TEST(TileClocks, PhasesFromTheFirstStart) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 50; ++trial) {
    const int ctas = 1 + int(rng() % 200);
    std::vector<uint64_t> ph(size_t(ctas) * rt::kPhaseSlots);
    const uint64_t t0 = (uint64_t(1) << 40) + rng() % 1000000;
    std::vector<double> staged, mma_first, mma_last;
    double stored = 0, copied = 0;
    uint64_t start = ~uint64_t(0);
    int idle = 0;
    for (int c = 0; c < ctas; ++c) {
      uint64_t* q = ph.data() + size_t(c) * rt::kPhaseSlots;
      q[3] = t0 + rng() % 5000;  // starts within 5 µs
      if (c > 0 && rng() % 8 == 0) {  // no tiles: nothing staged; maybe copies
        ++idle;
        if (rng() % 2) {
          q[2] = q[3] + 100000 + rng() % 90000;
          copied = std::max(copied, double(q[2]));
        }
        continue;
      }
      start = std::min(start, q[3]);
      q[4] = q[3] + 40000 + rng() % 40000;
      const uint64_t one_tile = rng() % 2, second = 40000 + rng() % 40000;  // (declarators: drawn in order)
      q[5] = q[4] + (one_tile ? 0 : second);  // one tile: the first is the last
      q[0] = q[5] + rng() % 30000;
      q[1] = q[0] + rng() % 30000;
      q[2] = rng() % 2 ? q[1] + rng() % 30000 : 0;
      staged.push_back(double(q[0]));
      mma_first.push_back(double(q[4])), mma_last.push_back(double(q[5]));
      stored = std::max(stored, double(q[1]));
      copied = std::max(copied, double(q[2]));
    }
    const rt::GemmPhases r = rt::summarize_phases(ph, ctas);
    EXPECT_EQ(r.ctas, ctas - idle);
    std::sort(staged.begin(), staged.end());
    const double s0 = double(start);
    EXPECT_NEAR(r.staged_max_us, (staged.back() - s0) * 1e-3, 1e-9);
    std::sort(mma_first.begin(), mma_first.end());
    std::sort(mma_last.begin(), mma_last.end());
    EXPECT_NEAR(r.mma_first_median_us, (mma_first[mma_first.size() / 2] - s0) * 1e-3, 1e-9);
    EXPECT_NEAR(r.mma_last_median_us, (mma_last[mma_last.size() / 2] - s0) * 1e-3, 1e-9);
    EXPECT_NEAR(r.mma_last_max_us, (mma_last.back() - s0) * 1e-3, 1e-9);
    EXPECT_NEAR(r.staged_median_us, (staged[staged.size() / 2] - s0) * 1e-3, 1e-9);
    EXPECT_NEAR(r.stored_max_us, (stored - s0) * 1e-3, 1e-9);
    EXPECT_NEAR(r.copied_max_us, copied > 0 ? (copied - s0) * 1e-3 : 0.0, 1e-9);
    EXPECT_NEAR(r.end_us, (std::max({staged.back(), stored, copied}) - s0) * 1e-3, 1e-9);
  }
  EXPECT_THROW(rt::summarize_phases(std::vector<uint64_t>(2 * rt::kPhaseSlots - 1), 2), std::invalid_argument);
  EXPECT_EQ(rt::summarize_phases(std::vector<uint64_t>(2 * rt::kPhaseSlots), 2).ctas, 0);
}
