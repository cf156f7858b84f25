// The stream-K walk (plan/stream_k.h) on fresh random grids: every k-block
// of every tile computed exactly once; one finisher per tile, holding its
// k-block 0 and the contributors the kernel waits for, in k order; a CTA
// leaves at most one partial (its share's first piece) and waits only at
// its last piece, for CTAs of lower index (no wait cycle); the split
// rule: on where a wave is mostly idle, off where waves are full; and the
// in-step grid, whose shares start at the same k-block in every tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "plan/stream_k.h"
#include "test_seed.h"

namespace fp = flashoverlap::plan;

namespace {

struct Seen {
  std::vector<fp::Piece> pieces;  // of one CTA, in walk order
};

void check_walks(const fp::StreamK& sk) {
  SCOPED_TRACE(::testing::Message() << "tiles " << sk.tiles << ", whole " << sk.whole << ", k-blocks " << sk.k_blocks
                                    << ", ctas " << sk.ctas);
  std::vector<std::vector<int>> covered(sk.tiles, std::vector<int>(sk.k_blocks, 0));
  std::vector<int> finisher(sk.tiles, -1);
  std::map<int, std::vector<std::pair<int, int>>> partials;  // tile -> (kb0, cta) of pieces that do not finish
  std::vector<Seen> seen(sk.ctas);
  for (int c = 0; c < sk.ctas; ++c) {
    fp::PieceWalk walk(sk, c);
    for (fp::Piece w; walk.next(w);) {
      ASSERT_GE(w.idx, 0);
      ASSERT_LT(w.idx, sk.tiles);
      ASSERT_LT(w.kb0, w.kb1);
      ASSERT_LE(w.kb1, sk.k_blocks);
      EXPECT_EQ(w.finishes, w.kb0 == 0);
      EXPECT_EQ(w.whole, w.kb0 == 0 && w.kb1 == sk.k_blocks);
      if (w.idx < sk.whole) {
        EXPECT_TRUE(w.whole);
        EXPECT_EQ(w.idx % sk.ctas, c);  // (whole tiles: the schedule's CTA)
      }
      for (int kb = w.kb0; kb < w.kb1; ++kb) ++covered[w.idx][kb];
      if (w.finishes) {
        EXPECT_EQ(finisher[w.idx], -1);
        finisher[w.idx] = c;
      } else {
        partials[w.idx].push_back({w.kb0, c});
      }
      seen[c].pieces.push_back(w);
    }
  }
  for (int t = 0; t < sk.tiles; ++t)
    for (int kb = 0; kb < sk.k_blocks; ++kb) ASSERT_EQ(covered[t][kb], 1) << "tile " << t << ", k-block " << kb;
  for (int t = 0; t < sk.tiles; ++t) {
    ASSERT_GE(finisher[t], 0) << "tile " << t;
    const int c = finisher[t];
    std::vector<std::pair<int, int>> parts = partials[t];
    std::sort(parts.begin(), parts.end());
    std::vector<int> listed;  // the kernel's waits, in its order
    for (int j = 1, n = sk.contributors(t, c); j <= n; ++j)
      if (sk.has_share(c - j)) listed.push_back(c - j);
    ASSERT_EQ(listed.size(), parts.size()) << "tile " << t;
    for (size_t j = 0; j < listed.size(); ++j) EXPECT_EQ(parts[j].second, listed[j]) << "tile " << t << ": contributor " << j;
    if (!listed.empty()) EXPECT_FALSE(seen[c].pieces.back().whole);
  }
  for (int c = 0; c < sk.ctas; ++c) {
    const std::vector<fp::Piece>& ps = seen[c].pieces;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].finishes) {  // a partial: the CTA's first split piece
        EXPECT_TRUE(i == 0 || ps[i - 1].idx < sk.whole) << "cta " << c;
      }
      if (ps[i].finishes && !ps[i].whole) EXPECT_EQ(i + 1, ps.size()) << "cta " << c << ": a finisher waits last";
    }
  }
  EXPECT_FALSE((fp::StreamK{sk.tiles, sk.tiles, sk.k_blocks, sk.ctas}.on()));
}

}  // namespace

TEST(PlanStreamK, EveryKBlockOnceOneFinisherPerTileAndWaitsOnlyOnLowerCtas) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 400; ++trial) {
    const int ctas = std::uniform_int_distribution<int>(1, 140)(rng);
    const int tiles = std::uniform_int_distribution<int>(1, 3 * ctas + 5)(rng);
    const int kbs = std::uniform_int_distribution<int>(1, 80)(rng);
    const int whole = std::uniform_int_distribution<int>(0, tiles)(rng);
    check_walks(fp::StreamK{tiles, whole, kbs, ctas});
    if (HasFatalFailure()) return;
    check_walks(fp::stream_k_split(tiles, ctas, kbs));
    if (HasFatalFailure()) return;
    check_walks(fp::stream_k_tail_split(tiles, ctas, kbs));
    if (HasFatalFailure()) return;
  }
}

TEST(PlanStreamK, TheTailSplitSpreadsTheLastWaveAndTheFullOneBeforeIt) {
  // 688 tiles on 132 CTAs (2048 x 8192 on 128 x 192): 4 waves whole, 160 tiles split.
  EXPECT_EQ(fp::stream_k_tail_split(688, 132, 8).whole, 528);
  EXPECT_EQ(fp::stream_k_tail_split(133, 132, 8).whole, 0);
  EXPECT_FALSE(fp::stream_k_tail_split(264, 132, 8).on());  // (whole waves)
  EXPECT_FALSE(fp::stream_k_tail_split(100, 132, 8).on());  // (one wave: stream_k_split's)
  EXPECT_FALSE(fp::stream_k_tail_split(688, 132, 1).on());  // (nothing to cut)
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 2000; ++trial) {
    const int ctas = std::uniform_int_distribution<int>(1, 140)(rng);
    const int tiles = std::uniform_int_distribution<int>(1, 8 * ctas)(rng);
    const int kbs = std::uniform_int_distribution<int>(1, 128)(rng);
    const fp::StreamK s = fp::stream_k_tail_split(tiles, ctas, kbs);
    SCOPED_TRACE(::testing::Message() << "tiles " << tiles << ", ctas " << ctas << ", k-blocks " << kbs);
    ASSERT_EQ(s.tiles, tiles);
    if (!s.on()) {
      EXPECT_TRUE(tiles <= ctas || tiles % ctas == 0 || kbs < 2 || ctas == 1);
      continue;
    }
    EXPECT_EQ(s.whole % ctas, 0);  // (every CTA the same whole tiles)
    EXPECT_GT(tiles - s.whole, ctas);
    EXPECT_LT(tiles - s.whole, 2 * ctas);
    // Every CTA ends within a k-block of the others: the same whole tiles, shares of even length.
    for (int c = 0; c < ctas; ++c) {
      const int64_t share = s.end(c) - s.begin(c);
      EXPECT_LE(share * ctas, s.iterations() + ctas);
      EXPECT_GE(share * ctas, s.iterations() - ctas);
    }
  }
}

TEST(PlanStreamK, SplitOnlyWhereTheTilesFillAtMostHalfTheCtas) {
  // 20 tiles of 64 k-blocks on 132 CTAs, 60 of 56: every tile split.
  EXPECT_EQ(fp::stream_k_split(20, 132, 64).whole, 0);
  EXPECT_EQ(fp::stream_k_split(60, 132, 56).whole, 0);
  EXPECT_FALSE(fp::stream_k_split(72, 132, 56).on());  // (more than half)
  // A wave mostly full, a last wave, full waves: whole tiles (measured: splitting them lost).
  EXPECT_FALSE(fp::stream_k_split(112, 132, 64).on());
  EXPECT_FALSE(fp::stream_k_split(232, 132, 64).on());
  EXPECT_FALSE(fp::stream_k_split(264, 132, 64).on());
  EXPECT_FALSE(fp::stream_k_split(20, 132, 1).on());  // nothing to cut
  EXPECT_FALSE(fp::stream_k_split(20, 132, 4).on());  // the partials' cost outweighs the gain
  EXPECT_FALSE(fp::stream_k_split(1, 1, 64).on());    // one CTA
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 2000; ++trial) {
    const int ctas = std::uniform_int_distribution<int>(1, 140)(rng);
    const int tiles = std::uniform_int_distribution<int>(1, 3 * ctas)(rng);
    const int kbs = std::uniform_int_distribution<int>(1, 128)(rng);
    const fp::StreamK s = fp::stream_k_split(tiles, ctas, kbs);
    ASSERT_EQ(s.tiles, tiles);
    ASSERT_EQ(s.k_blocks, kbs);
    ASSERT_EQ(s.ctas, ctas);
    if (!s.on()) continue;
    EXPECT_EQ(s.whole, 0);
    EXPECT_LE(2 * tiles, ctas);
    // Each CTA's share and the partials' cost stay 5% under a whole tile's k-blocks.
    // (in integers: 17 tiles of 6 k-blocks on 60 CTAs sit on the boundary, 5.7 against 5.7)
    EXPECT_LE(100 * s.iterations() + 400 * int64_t(ctas), 95 * int64_t(ctas) * kbs)
        << tiles << " tiles, " << ctas << " ctas, " << kbs;
  }
}

TEST(PlanStreamK, TheInStepGridStartsEachTilesJthShareAtTheSameKBlock) {
  EXPECT_EQ(fp::stream_k_in_step_ctas(20, 132), 120);
  EXPECT_EQ(fp::stream_k_in_step_ctas(60, 132), 120);
  EXPECT_EQ(fp::stream_k_in_step_ctas(132, 132), 132);
  EXPECT_EQ(fp::stream_k_in_step_ctas(133, 132), 132);  // (no split fits: the grid as given)
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 500; ++trial) {
    const int ctas = std::uniform_int_distribution<int>(1, 140)(rng);
    const int tiles = std::uniform_int_distribution<int>(1, ctas)(rng);
    const int kbs = std::uniform_int_distribution<int>(1, 80)(rng);
    const int grid = fp::stream_k_in_step_ctas(tiles, ctas);
    SCOPED_TRACE(::testing::Message() << "tiles " << tiles << ", ctas " << ctas << ", k-blocks " << kbs);
    ASSERT_LE(grid, ctas);
    ASSERT_EQ(grid % tiles, 0);
    ASSERT_GT(grid + tiles, ctas);  // (as many shares a tile as fit)
    const fp::StreamK sk{tiles, 0, kbs, grid};
    check_walks(sk);
    if (HasFatalFailure()) return;
    // Each CTA's first piece: (tile, its k-block); CTAs in reverse order
    // take the shares, so share n is CTA grid - 1 - n.
    const int shares = grid / tiles;
    for (int n = 0; n < grid; ++n) {
      fp::PieceWalk walk(sk, grid - 1 - n);
      fp::Piece w;
      if (!walk.next(w)) continue;  // (an empty share: more CTAs than k-blocks)
      EXPECT_EQ(w.idx, n / shares) << "share " << n;
      EXPECT_EQ(w.kb0, int64_t(kbs) * (n % shares) / shares) << "share " << n;
    }
  }
}
