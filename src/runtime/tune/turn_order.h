// turn_order.h — the order in which alternatives are timed in each round
// (timing.h: time_interleaved). Host only, no CUDA.
//
// Why: the GPUs run at their power cap, so a run that follows a heavier one
// starts at a lower clock. Rotating one fixed order keeps every run's
// predecessor (j - 1 precedes j in all rounds but one in n); the rows of a
// Williams design put each alternative right after each other one equally
// often: once per n rounds for even n, twice per 2n rounds for odd n.
#pragma once
#include <cstddef>
#include <vector>

namespace flashoverlap::rt {

// Round `round`'s order of alternatives 0..n-1 (the same on every rank).
inline std::vector<size_t> turn_order(size_t n, size_t round) {
  std::vector<size_t> first(n);  // 0, 1, n-1, 2, n-2, ...
  for (size_t k = 0, lo = 1, hi = n - 1; k < n; ++k) first[k] = k == 0 ? 0 : (k % 2 ? lo++ : hi--);
  const size_t rows = n % 2 ? 2 * n : n;
  const size_t r = n ? round % rows : 0;
  std::vector<size_t> out(n);
  for (size_t k = 0; k < n; ++k) out[k] = (first[k] + r % n) % n;
  if (r >= n) return std::vector<size_t>(out.rbegin(), out.rend());  // odd n: the mirrored rows
  return out;
}

}  // namespace flashoverlap::rt
