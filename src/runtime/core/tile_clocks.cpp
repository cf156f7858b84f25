#include "runtime/core/tile_clocks.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace flashoverlap::rt {
namespace {
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, size_t(q * double(v.size())));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(i), v.end());
  return v[i];
}
}  // namespace

TileClocks summarize_tile_clocks(const std::vector<uint64_t>& mma, int64_t tiles, int ctas) {
  if (tiles < 0 || ctas <= 0 || mma.size() < size_t(tiles) * 2)
    throw std::invalid_argument("summarize_tile_clocks: " + std::to_string(mma.size()) + " values for " +
                                std::to_string(tiles) + " tiles, " + std::to_string(ctas) + " CTAs");
  struct Interval {
    uint64_t end_ns, ns, cycles;
  };
  std::vector<Interval> iv;
  for (int64_t idx = ctas; idx < tiles; ++idx) {
    const uint64_t t0 = mma[size_t(idx - ctas) * 2], c0 = mma[size_t(idx - ctas) * 2 + 1];
    const uint64_t t1 = mma[size_t(idx) * 2], c1 = mma[size_t(idx) * 2 + 1];
    if (t0 != 0 && t1 > t0 && c1 > c0) iv.push_back({t1, t1 - t0, c1 - c0});
  }
  TileClocks r;
  r.intervals = int(iv.size());
  if (iv.empty()) return r;
  double ns = 0, cyc = 0;
  std::vector<double> kc, us;
  uint64_t lo = iv[0].end_ns, hi = lo;
  for (const auto& i : iv) {
    ns += double(i.ns), cyc += double(i.cycles);
    kc.push_back(double(i.cycles) * 1e-3), us.push_back(double(i.ns) * 1e-3);
    lo = std::min(lo, i.end_ns), hi = std::max(hi, i.end_ns);
  }
  r.mhz = cyc / ns * 1e3;
  r.kcycles_median = quantile(kc, 0.5), r.kcycles_p90 = quantile(kc, 0.9), r.us_median = quantile(us, 0.5);
  double qns[4] = {}, qcyc[4] = {};
  for (const auto& i : iv) {
    const int q = hi > lo ? std::min(3, int(4 * double(i.end_ns - lo) / double(hi - lo + 1))) : 0;
    qns[q] += double(i.ns), qcyc[q] += double(i.cycles);
  }
  for (int q = 0; q < 4; ++q) r.mhz_by_quarter.push_back(qns[q] > 0 ? qcyc[q] / qns[q] * 1e3 : 0);
  return r;
}

GemmPhases summarize_phases(const std::vector<uint64_t>& ph, int ctas) {
  constexpr size_t S = kPhaseSlots;
  if (ctas <= 0 || ph.size() < size_t(ctas) * S)
    throw std::invalid_argument("summarize_phases: " + std::to_string(ph.size()) + " values for " +
                                std::to_string(ctas) + " CTAs");
  uint64_t start = 0;
  for (int c = 0; c < ctas; ++c)
    if (ph[size_t(c) * S + 3] && ph[size_t(c) * S] && (!start || ph[size_t(c) * S + 3] < start))
      start = ph[size_t(c) * S + 3];
  GemmPhases r;
  if (!start) return r;
  auto us = [&](uint64_t t) { return t > start ? double(t - start) * 1e-3 : 0.0; };
  std::vector<double> staged, mma_first, mma_last;
  for (int c = 0; c < ctas; ++c) {
    const uint64_t* q = ph.data() + size_t(c) * S;
    if (!q[3]) continue;
    r.copied_max_us = std::max(r.copied_max_us, us(q[2]));  // a CTA without tiles may copy
    if (!q[0]) continue;
    ++r.ctas;
    staged.push_back(us(q[0]));
    r.staged_max_us = std::max(r.staged_max_us, us(q[0]));
    r.stored_max_us = std::max(r.stored_max_us, us(q[1]));
    if (q[4]) mma_first.push_back(us(q[4]));
    if (q[5]) mma_last.push_back(us(q[5])), r.mma_last_max_us = std::max(r.mma_last_max_us, us(q[5]));
  }
  r.staged_median_us = quantile(staged, 0.5);
  r.mma_first_median_us = quantile(mma_first, 0.5);
  r.mma_last_median_us = quantile(mma_last, 0.5);
  r.end_us = std::max({r.staged_max_us, r.stored_max_us, r.copied_max_us});
  return r;
}

}  // namespace flashoverlap::rt
