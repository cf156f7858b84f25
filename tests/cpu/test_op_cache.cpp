// api::OpCache (src/api/op_cache.h): the public ops keep at most `capacity`
// runtime ops, the least recently used going first, never one captured into
// a CUDA graph or pinned; a refusal to let one go (going() throws) keeps it.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "api/op_cache.h"
#include "test_seed.h"

namespace {

struct FakeOp {
  int64_t m = 0;
  bool graph = false;
  std::set<int64_t>* alive = nullptr;
  FakeOp(int64_t m_, std::set<int64_t>* a) : m(m_), alive(a) { alive->insert(m); }
  ~FakeOp() { alive->erase(m); }
  bool captured() const { return graph; }
};

}  // namespace

TEST(OpCache, KeepsTheMostRecentlyUsedAndNeverACapturedOrPinnedOne) {
  FO_SEEDED_RNG(rng);
  std::set<int64_t> alive;
  const size_t cap = 8;
  flashoverlap::api::OpCache<FakeOp> cache(cap);
  std::vector<int64_t> order;  // most recent last (the reference LRU)
  std::set<int64_t> held;      // captured or pinned
  std::vector<int64_t> gone;
  for (int step = 0; step < 2000; ++step) {
    const int64_t m = int64_t(rng() % 40);
    FakeOp* op = cache.find(m);
    if (!op) {
      op = &cache.add(m, std::make_unique<FakeOp>(m, &alive), [&](int64_t g, FakeOp& x) {
        EXPECT_EQ(g, x.m);
        gone.push_back(g);
      });
      // The reference: drop least recent evictable ones while at capacity.
      while (order.size() >= cap) {
        auto it = order.begin();
        while (it != order.end() && held.count(*it)) ++it;
        if (it == order.end()) break;
        ASSERT_FALSE(gone.empty());
        EXPECT_EQ(gone.front(), *it) << "step " << step;
        gone.erase(gone.begin());
        order.erase(it);
      }
      EXPECT_TRUE(gone.empty());
    }
    order.erase(std::remove(order.begin(), order.end(), m), order.end());
    order.push_back(m);
    if (rng() % 25 == 0) op->graph = true, held.insert(m);
    if (rng() % 40 == 0) cache.pin(m), held.insert(m);
    EXPECT_EQ(cache.size(), order.size());
    EXPECT_EQ(alive, std::set<int64_t>(order.begin(), order.end()));
  }
  EXPECT_GE(cache.size(), cap - 1);
}

TEST(OpCache, AnOpThatRefusesToGoStaysAndNothingIsAdded) {
  std::set<int64_t> alive;
  flashoverlap::api::OpCache<FakeOp> cache(2);
  cache.add(1, std::make_unique<FakeOp>(1, &alive));
  cache.add(2, std::make_unique<FakeOp>(2, &alive));
  EXPECT_THROW(cache.add(3, std::make_unique<FakeOp>(3, &alive),
                         [](int64_t, FakeOp&) { throw std::runtime_error("its last call failed"); }),
               std::runtime_error);
  EXPECT_NE(cache.find(1), nullptr);
  EXPECT_NE(cache.find(2), nullptr);
  EXPECT_EQ(cache.find(3), nullptr);
  EXPECT_EQ(alive, (std::set<int64_t>{1, 2}));
}
