// test_seed.h — the seed of every randomized CPU test: fresh each run, printed
// on failure with the way to replay it (FO_TEST_SEED=<seed>).
#pragma once
#include <gtest/gtest.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>

namespace fo_test {

// FO_TEST_SEED's text as a seed: decimal digits only, as the tests print it.
// Anything else (hex, a sign, spaces, trailing junk, more than 2^64 - 1) is
// refused with a message rather than read as 0 or as some other number.
inline uint64_t parse_seed(const std::string& text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || at != end)
    throw std::invalid_argument("FO_TEST_SEED=" + text + ": not a decimal seed (0.." +
                                std::to_string(UINT64_MAX) + ")");
  return v;
}

// FO_TEST_SEED's value when set (and not empty), else a fresh random seed.
inline uint64_t test_seed() {
  if (const char* s = std::getenv("FO_TEST_SEED"); s && *s) return parse_seed(s);
  return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
}

}  // namespace fo_test

// Every failure in the scope names the seed and how to replay it. gtest's
// traces are per thread: repeat it in each thread that asserts.
#define FO_SEED_TRACE(seed) \
  SCOPED_TRACE(::testing::Message() << "seed " << (seed) << " (replay: FO_TEST_SEED=" << (seed) << ")")

// Use at the top of a randomized test: `rng` seeded, the seed in every failure.
#define FO_SEEDED_RNG(rng)                        \
  const uint64_t fo_seed_ = ::fo_test::test_seed(); \
  FO_SEED_TRACE(fo_seed_);                        \
  std::mt19937_64 rng(fo_seed_)
