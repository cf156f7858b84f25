// gemm_choice.cpp — see gemm_choice.h.
#include "plan/gemm_choice.h"

#include <algorithm>
#include <cmath>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

std::vector<int64_t> gemm_choice_samples(int64_t max_m) {
  if (max_m < 1) throw InvalidArgument("gemm_choice_samples: max_m must be >= 1");
  const int64_t last = std::min(max_m, kGemmChoiceMaxRows);
  std::vector<int64_t> out;
  for (int64_t m = 1; m <= 128 && m < last; m *= 2) out.push_back(m);
  // Tile rows 2, 3, 4, 6, 8, 12, ...: each power of two and 1.5 times it.
  for (int64_t p = 2; p * 128 < last; p *= 2)
    for (int64_t rows : {p * 128, p * 192})
      if (rows < last && rows > out.back()) out.push_back(rows);
  out.push_back(last);
  return out;
}

size_t gemm_choice_sample_of(const std::vector<int64_t>& samples, int64_t m) {
  if (samples.empty() || m < 1) throw InvalidArgument("gemm_choice_sample_of: no samples, or m < 1");
  if (m >= samples.back()) return samples.size() - 1;
  const auto above = std::lower_bound(samples.begin(), samples.end(), m);  // (exists: m < the last)
  const size_t i = size_t(above - samples.begin());
  if (m <= 128 || *above == m || i == 0 || samples[i - 1] <= 128) return i;
  // Between two samples above 128: the nearer on a log scale.
  return std::log(double(m) / double(samples[i - 1])) <= std::log(double(*above) / double(m)) ? i - 1 : i;
}

}  // namespace flashoverlap::plan
