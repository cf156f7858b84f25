// gpu_test_util.h — what every GPU test file needs: a fresh random seed per
// case (FO_TEST_SEED=<printed seed> replays a failed case), the visible skip
// where the machine lacks the GPUs a test needs (CI has none: each GPU test
// reports itself as skipped, never as passed) unless FO_REQUIRE_GPUS says it
// has them, and the assertions of a comparison that print what differs.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashoverlap/error.h"
#include "kernels/check.h"
#include "runtime/core/buffer.h"

namespace flashoverlap::test {

// A decimal unsigned value of environment variable `name`, or `fallback`
// when it is unset or empty; anything else is refused, not read as 0.
inline uint64_t env_decimal(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  const char* end = s + std::strlen(s);
  uint64_t v = 0;
  const auto [at, ec] = std::from_chars(s, end, v);  // (digits only: no sign, space or junk)
  if (ec != std::errc() || at != end)
    throw std::invalid_argument(std::string(name) + "=" + s + ": not a decimal number (0.." +
                                std::to_string(UINT64_MAX) + ")");
  return v;
}

// A fresh seed, or FO_TEST_SEED's value (decimal, as the tests print it).
inline uint64_t fresh_seed() {
  return env_decimal("FO_TEST_SEED", std::random_device{}() * 0x100000001ull + std::random_device{}());
}

// A test that means the full grid of a persistent GEMM (one CTA per SM, the
// most the launcher takes) asks rt::current_device_sms() after
// REQUIRE_HOPPER, never assumes a count (132 on an H100 SXM or H200, 114 on
// an H100 PCIe). In a static table of cases: kFullGrid (grid_ctas gives its
// size on the device where the case runs).
inline constexpr int kFullGrid = 0;
// A case's grid on this device: kFullGrid, the device's SMs; any other count
// at most that (a grid of 120 is 114 CTAs on an H100 PCIe).
inline int grid_ctas(int ctas) {
  const int sms = rt::current_device_sms();
  return ctas == kFullGrid ? sms : std::min(ctas, sms);
}

// FO_REQUIRE_GPUS=N: this machine has N Hopper GPUs (scripts/gpu_all.sh sets
// it to the machine's count), so a test that needs n <= N GPUs and finds
// fewer — or finds CUDA not starting — fails instead of skipping. 0 (unset):
// such tests skip, saying why.
inline int required_gpus() { return int(env_decimal("FO_REQUIRE_GPUS", 0)); }

// "" when this machine has n Hopper GPUs, else why not.
inline std::string missing_gpus(int n) {
  const rt::GpuProbe p = rt::probe_gpus();
  if (p.hopper >= n) return "";
  const std::string need = n == 1 ? "needs a Hopper (sm_90) GPU" : "needs " + std::to_string(n) + " Hopper (sm_90) GPUs";
  return need + ", found " + std::to_string(p.hopper) + (p.reason.empty() ? "" : ": " + p.reason);
}

// Comparisons that print what differs (kernels::CompareResult::describe):
// EXPECT_TRUE(test::bitwise(r)) << where;  EXPECT_TRUE(test::within(r)) << where;
inline ::testing::AssertionResult bitwise(const kernels::CompareResult& r) {
  if (r.bitwise()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "not bitwise equal: " << r.describe();
}
// (FO_TEST_MARGINS=1 prints every passing comparison too: how close to its bound it came.)
inline ::testing::AssertionResult within(const kernels::CompareResult& r) {
  if (r.within()) {
    if (env_decimal("FO_TEST_MARGINS", 0)) std::fprintf(stderr, "within: %s\n", r.describe().c_str());
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "beyond the tolerance: " << r.describe();
}

// Every rank's check() (check(r), r < world) throws Error naming that rank
// ("rank r:") and holding each of `parts`; `what` is what it was to report.
inline void expect_every_check_reports(int world, const std::function<void(int)>& check,
                                       const std::vector<std::string>& parts, const std::string& what) {
  for (int r = 0; r < world; ++r) {
    try {
      check(r);
      ADD_FAILURE() << "rank " << r << ": " << what << " was not reported";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("rank " + std::to_string(r) + ":"), std::string::npos) << msg;
      for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    }
  }
}

// Bitwise, 16-bit elements on the device: output row i (ld elements apart)
// equals row rows[i] of `full` (m x n, n per row): a ReduceScatter's rows of
// the whole result, in the order its layout gives them.
template <class Row>
::testing::AssertionResult rows_equal(const void* out, int64_t ld, const void* full, int64_t m, int64_t n,
                                      const std::vector<Row>& rows) {
  std::vector<uint16_t> o(rows.size() * size_t(ld)), f(size_t(m) * size_t(n));
  if (cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(f.data(), full, f.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
    return ::testing::AssertionFailure() << "cudaMemcpy of the rows failed";
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < n; ++c)
      if (o[i * size_t(ld) + size_t(c)] != f[size_t(rows[i]) * size_t(n) + size_t(c)]) {
        if (first < 0) first = int64_t(i) * n + c;
        ++bad;
      }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << rows.size() * n << " elements differ, first at output row "
                                       << first / n << " (C row " << rows[size_t(first / n)] << "), column " << first % n;
}

}  // namespace flashoverlap::test

// Skips the test (visibly, saying why) unless this machine has at least n
// Hopper GPUs; fails instead where FO_REQUIRE_GPUS promises them.
#define FO_REQUIRE_HOPPER_GPUS(n)                                                                  \
  do {                                                                                             \
    const std::string fo_missing_ = ::flashoverlap::test::missing_gpus(n);                         \
    if (!fo_missing_.empty()) {                                                                    \
      if (::flashoverlap::test::required_gpus() >= (n))                                            \
        FAIL() << "FO_REQUIRE_GPUS=" << ::flashoverlap::test::required_gpus() << ": " << fo_missing_; \
      GTEST_SKIP() << fo_missing_;                                                                 \
    }                                                                                              \
  } while (0)
#define REQUIRE_HOPPER() FO_REQUIRE_HOPPER_GPUS(1)
