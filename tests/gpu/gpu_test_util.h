// gpu_test_util.h — what every GPU test file needs: a fresh random seed per
// case (FO_TEST_SEED=<printed seed> replays a failed case), the visible skip
// where the machine lacks the GPUs a test needs (CI has none: each GPU test
// reports itself as skipped, never as passed) unless FO_REQUIRE_GPUS says it
// has them, and the assertions of a comparison that print what differs.
#pragma once
#include <gtest/gtest.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

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
