// gpu_test_util.h — what every GPU test file needs: a fresh random seed per
// case (FO_TEST_SEED=<printed seed> replays a failed case), and the visible
// skip where the machine lacks the GPUs a test needs (CI has none: each GPU
// test reports itself as skipped, never as passed).
#pragma once
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>

#include "runtime/rt_buffer.h"

namespace flashoverlap::test {

// A fresh seed, or FO_TEST_SEED's value (decimal, as the tests print it;
// anything else is refused, not read as 0).
inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("FO_TEST_SEED"); s && *s) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE || *s == '-')
      throw std::invalid_argument(std::string("FO_TEST_SEED=") + s + ": not a decimal seed");
    return v;
  }
  return std::random_device{}() * 0x100000001ull + std::random_device{}();
}

}  // namespace flashoverlap::test

// Skips the test (visibly) unless this machine has at least n Hopper GPUs.
#define FO_REQUIRE_HOPPER_GPUS(n)                                                                  \
  do {                                                                                             \
    if (::flashoverlap::rt::hopper_device_count() < (n))                                          \
      GTEST_SKIP() << ((n) == 1 ? std::string("no Hopper (sm_90) GPU")                            \
                                : "needs " + std::to_string(n) + " Hopper (sm_90) GPUs");         \
  } while (0)
#define REQUIRE_HOPPER() FO_REQUIRE_HOPPER_GPUS(1)
