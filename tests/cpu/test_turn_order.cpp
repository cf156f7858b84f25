// The timing rounds' orders: each a permutation, the same for the same
// round, and over a whole cycle each alternative right after each other
// one equally often (which rotating one fixed order does not give).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>

#include "runtime/tune/turn_order.h"

using flashoverlap::rt::turn_order;

TEST(TurnOrder, EveryRoundIsAPermutation) {
  for (size_t n = 0; n <= 12; ++n)
    for (size_t round = 0; round < 40; ++round) {
      std::vector<size_t> o = turn_order(n, round);
      ASSERT_EQ(o.size(), n);
      EXPECT_EQ(o, turn_order(n, round)) << "not deterministic";
      std::sort(o.begin(), o.end());
      for (size_t k = 0; k < n; ++k) EXPECT_EQ(o[k], k) << "n=" << n << " round " << round;
    }
}

TEST(TurnOrder, EachFollowsEachOtherEquallyOftenOverACycle) {
  for (size_t n = 2; n <= 12; ++n) {
    const size_t rows = n % 2 ? 2 * n : n;
    std::map<std::pair<size_t, size_t>, int> after;  // (before, after) inside a round
    std::vector<int> first(n);
    for (size_t round = 0; round < rows; ++round) {
      const std::vector<size_t> o = turn_order(n, round);
      ++first[o[0]];
      for (size_t k = 1; k < n; ++k) ++after[std::make_pair(o[k - 1], o[k])];
    }
    const int per_pair = n % 2 ? 2 : 1;
    for (size_t a = 0; a < n; ++a)
      for (size_t b = 0; b < n; ++b)
        if (a != b) EXPECT_EQ(after[std::make_pair(a, b)], per_pair) << "n=" << n << ": " << b << " after " << a;
    for (size_t a = 0; a < n; ++a) EXPECT_EQ(first[a], per_pair) << "n=" << n << ": " << a << " first";
  }
}
