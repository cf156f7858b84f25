#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

namespace {

// a better than b: lower latency, or the same latency with fewer groups.
bool better(double a_ms, size_t a_groups, double b_ms, size_t b_groups) {
  if (std::isinf(b_ms)) return a_ms < b_ms;
  const double tol = 1e-12 * std::max(std::abs(a_ms), std::abs(b_ms));
  if (a_ms < b_ms - tol) return true;
  return a_ms <= b_ms + tol && a_groups < b_groups;
}

void require_waves(const CostModel& model) {
  if (model.waves() < 1) throw InvalidArgument("search: the cost model has no waves");
}

}  // namespace

SearchResult search_dp(const CostModel& model) {
  require_waves(model);
  const int32_t T = model.waves();
  std::vector<double> prefix(size_t(T) + 1, 0.0), best(size_t(T) + 1, std::numeric_limits<double>::infinity());
  std::vector<int32_t> from(size_t(T) + 1, 0), groups(size_t(T) + 1, 0);
  for (int32_t i = 0; i < T; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + model.wave_ms[size_t(i)];
  best[0] = model.comm_not_before_ms;
  for (int32_t i = 1; i <= T; ++i)
    for (int32_t j = 0; j < i; ++j) {
      const double t = std::max(prefix[size_t(i)], best[size_t(j)]) + model.comm_ms(j, i);
      if (better(t, size_t(groups[size_t(j)]) + 1, best[size_t(i)], size_t(groups[size_t(i)]))) {
        best[size_t(i)] = t;
        from[size_t(i)] = j;
        groups[size_t(i)] = groups[size_t(j)] + 1;
      }
    }
  SearchResult r{Partition(size_t(groups[size_t(T)])), best[size_t(T)]};
  for (int32_t i = T, g = groups[size_t(T)]; i > 0; i = from[size_t(i)]) r.partition[size_t(--g)] = i - from[size_t(i)];
  return r;
}

SearchResult search_exhaustive(const CostModel& model) {
  require_waves(model);
  const int32_t T = model.waves();
  // Every group's cost once, then each partition is a walk over its groups.
  std::vector<double> prefix(size_t(T) + 1, 0.0), comm(size_t(T + 1) * (T + 1), 0.0);
  for (int32_t i = 0; i < T; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + model.wave_ms[size_t(i)];
  for (int32_t j = 0; j < T; ++j)
    for (int32_t i = j + 1; i <= T; ++i) comm[size_t(j) * (T + 1) + i] = model.comm_ms(j, i);
  SearchResult r{{}, std::numeric_limits<double>::infinity()};
  for_each_partition(T, [&](const Partition& p) {
    double t_m = model.comm_not_before_ms;
    int32_t w = 0;
    for (int32_t size : p) {
      t_m = std::max(prefix[size_t(w + size)], t_m) + comm[size_t(w) * (T + 1) + w + size];
      w += size;
    }
    if (better(t_m, p.size(), r.total_ms, r.partition.size())) r = {p, t_m};
  });
  return r;
}

Partition search_coarsened(const CostModel& fine, int32_t max_waves) {
  if (max_waves < 1) throw InvalidArgument("search_coarsened: max_waves " + std::to_string(max_waves) + " < 1");
  const int32_t T = fine.waves(), step = (T + max_waves - 1) / max_waves;
  if (step <= 1) return search_dp(fine).partition;
  CostModel coarse;
  coarse.comm_not_before_ms = fine.comm_not_before_ms;
  for (int32_t w = 0; w < T; w += step)
    coarse.wave_ms.push_back(
        std::accumulate(fine.wave_ms.begin() + w, fine.wave_ms.begin() + std::min(w + step, T), 0.0));
  coarse.comm_ms = [&fine, step, T](int32_t c0, int32_t c1) { return fine.comm_ms(c0 * step, std::min(c1 * step, T)); };
  Partition p = search_dp(coarse).partition;
  for (int32_t& size : p) size *= step;
  p.back() -= int32_t(coarse.wave_ms.size()) * step - T;
  return p;
}

}  // namespace flashoverlap::plan
