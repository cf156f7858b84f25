// The seed helper of the CPU tests (test_seed.h): FO_TEST_SEED replays what
// a failure printed, and anything that is not a decimal seed is an error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "test_seed.h"

namespace {

// The message parse_seed gives for `text`, or "" when it accepts it.
std::string refusal(const std::string& text) {
  try {
    fo_test::parse_seed(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Sets FO_TEST_SEED for its scope, restoring what was there.
struct SeedVariable {
  std::string saved;
  bool had;
  explicit SeedVariable(const char* value) : had(std::getenv("FO_TEST_SEED") != nullptr) {
    if (had) saved = std::getenv("FO_TEST_SEED");
    ::setenv("FO_TEST_SEED", value, 1);
  }
  ~SeedVariable() { had ? ::setenv("FO_TEST_SEED", saved.c_str(), 1) : ::unsetenv("FO_TEST_SEED"); }
};

}  // namespace

TEST(TestSeed, DecimalSeedsRoundTrip) {
  FO_SEEDED_RNG(rng);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t bits = rng(), shift = rng() % 64;  // every magnitude
    const uint64_t v = i == 0 ? 0 : i == 1 ? UINT64_MAX : bits >> shift;
    EXPECT_EQ(fo_test::parse_seed(std::to_string(v)), v);
  }
  EXPECT_EQ(fo_test::parse_seed("007"), 7u);
}

TEST(TestSeed, AnythingElseIsRefusedWithTheValue) {
  for (const char* bad : {"", "abc", "0x1f", "-1", "+5", " 12", "12 ", "12x", "1.5", "1e9",
                          "18446744073709551616", "99999999999999999999999"}) {
    const std::string why = refusal(bad);
    EXPECT_NE(why.find(std::string("FO_TEST_SEED=") + bad + ": not a decimal seed"), std::string::npos)
        << "'" << bad << "': " << why;
  }
}

TEST(TestSeed, TheVariableIsReadAndAMalformedOneThrows) {
  {
    SeedVariable v("12345");
    EXPECT_EQ(fo_test::test_seed(), 12345u);
  }
  {
    SeedVariable v("12345abc");
    EXPECT_THROW(fo_test::test_seed(), std::invalid_argument);
  }
  {
    SeedVariable v("");  // empty counts as unset: a fresh seed
    EXPECT_NO_THROW(fo_test::test_seed());
  }
}
