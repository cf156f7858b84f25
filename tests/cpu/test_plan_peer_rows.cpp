// The NVLink forms' row tables, where each row of C lands in its rank's
// window: the All-to-All's (make_alltoall_peer_tables: at its destination's
// receive row in (source rank, source row) order, the order of the combine's
// tables there; random routings, rows in the dispatch's order or shuffled)
// and the ReduceScatter's (rs_peer_row_of: each row at its owner, in the
// block of its source); random tiles and grids; and their refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "flashoverlap/error.h"
#include "plan/alltoall_peers.h"
#include "plan/routing.h"
#include "plan/slot_map_alltoall.h"
#include "plan/slot_map_reducescatter.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

namespace {

// A dispatch's routing of E experts per rank, its rows shuffled on some
// ranks with one expert (the op takes any order; with several, A's rows are
// by (source, expert)).
fo::MoeRouting random_routing(std::mt19937_64& rng, int32_t W, int32_t E = 1) {
  static const char* kinds[] = {"uniform", "zipf:1.2", "one:0", "empty:0"};
  const int kind = int(uniform(rng, 0, W >= 2 ? 3 : 2));
  const int32_t topk = int32_t(uniform(rng, 1, std::min(kind == 3 ? (W - 1) * E : W * E, 4)));
  fo::MoeRouting r = fo::make_moe_routing(kinds[kind], W, uniform(rng, 0, 300), topk, rng(), E);
  for (int32_t s = 0; s < W; ++s) {
    if (E > 1 || uniform(rng, 0, 1)) continue;
    std::vector<size_t> perm(r.dest_rank[size_t(s)].size());
    std::iota(perm.begin(), perm.end(), size_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    auto apply = [&](auto& v) {
      auto old = v;
      for (size_t i = 0; i < perm.size(); ++i) v[i] = old[perm[i]];
    };
    apply(r.dest_rank[size_t(s)]), apply(r.dest_token[size_t(s)]), apply(r.gate[size_t(s)]);
  }
  fo::validate_moe_routing(r);
  return r;
}

}  // namespace

TEST(AllToAllPeerTables, EveryRowLandsWhereTheCombineReadsIt) {
  const uint64_t seed = fo_test::test_seed();
  FO_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    const int32_t W = int32_t(uniform(rng, 1, 8)), E = iter % 3 == 2 ? int32_t(uniform(rng, 2, 4)) : 1;
    const fo::MoeRouting routing = random_routing(rng, W, E);
    const fo::TileShape tile = uniform(rng, 0, 1) ? fo::TileShape{128, 256} : fo::TileShape{16, 8};
    const int64_t n = tile.bn * uniform(rng, 1, 3) - uniform(rng, 0, 1) * 3;
    int64_t most = 1;  // the most rows any rank receives, plus slack
    for (int32_t d = 0; d < W; ++d) {
      int64_t got = 0;
      for (int32_t s = 0; s < W; ++s) got += routing.send_count(s, d);
      most = std::max(most, got);
    }
    const int64_t rpr = most + uniform(rng, 0, 5);
    // Each destination's receive rows: who filled them (source, row), once each.
    std::vector<std::vector<std::pair<int32_t, int32_t>>> landed(static_cast<size_t>(W));
    for (int32_t d = 0; d < W; ++d) landed[size_t(d)].assign(size_t(rpr), {-1, -1});
    for (int32_t src = 0; src < W; ++src) {
      const fo::Schedule s = fo::make_moe_schedule(routing, src, n, tile, int32_t(uniform(rng, 1, 132)));
      const fo::AllToAllTables t = fo::make_alltoall_peer_tables(s, routing, src, rpr);
      ASSERT_EQ(t.tiles(), s.tiles());
      int64_t received = 0;
      for (int32_t x = 0; x < W; ++x) received += routing.send_count(x, src);
      EXPECT_EQ(t.out_rows, received);
      const std::vector<int32_t> row_of = fo::expand_row_of(t);
      // Tile row tm holds rows a .. a + k - 1 (with several experts the grouped GEMM's; the rest idle).
      const auto tile_rows = fo_test::brute_tile_rows(routing, src, s.bm);
      ASSERT_EQ(size_t(s.tiles_m()), tile_rows.size());
      EXPECT_EQ(t.a_row0.size(), E == 1 ? 0 : tile_rows.size());
      for (int32_t idx = 0; idx < s.tiles(); ++idx) {
        const fo::TileCoord c = s.tile_of(idx);
        for (int32_t r = 0; r < s.bm; ++r) {
          const int64_t row = int64_t{tile_rows[size_t(c.tm)].first} + r;
          const int32_t dst = row_of[size_t(idx) * s.bm + r];
          if (r >= tile_rows[size_t(c.tm)].second) {
            EXPECT_EQ(dst, -1);
            continue;
          }
          ASSERT_GE(dst, 0);
          const int32_t d = int32_t(dst / rpr), local = int32_t(dst % rpr);
          ASSERT_EQ(d, routing.dest_rank[size_t(src)][size_t(row)]) << "iter " << iter;
          auto& slot = landed[size_t(d)][size_t(local)];
          if (c.tn == 0) {  // (every column tile of the row stores to the same row)
            EXPECT_EQ(slot.first, -1) << "receive row " << local << " of rank " << d << " written twice";
            slot = {src, int32_t(row)};
          } else {
            EXPECT_EQ(slot, std::make_pair(src, int32_t(row)));
          }
        }
      }
    }
    for (int32_t d = 0; d < W; ++d) {
      const fo::CombineTable ct = fo::make_combine_table(routing, d);
      for (int64_t i = 0; i < rpr; ++i) {
        const auto& slot = landed[size_t(d)][size_t(i)];
        if (i < ct.rows()) {
          EXPECT_EQ(slot.first, ct.src_rank[size_t(i)]) << "iter " << iter << " rank " << d << " row " << i;
          EXPECT_EQ(slot.second, ct.src_row[size_t(i)]) << "iter " << iter << " rank " << d << " row " << i;
        } else {
          EXPECT_EQ(slot.first, -1) << "a row past the received ones";
        }
      }
    }
  }
}

TEST(AllToAllPeerTables, Refusals) {
  // Expert 1 holds every rank's 50 tokens' rows (150) and returns 50 to each.
  const fo::MoeRouting routing = fo::make_moe_routing("one:1", 3, 50, 1, 7);
  const fo::Schedule s = fo::make_moe_schedule(routing, 1, 256, {128, 256}, 132);
  ASSERT_EQ(s.m, 150);
  EXPECT_NO_THROW(fo::make_alltoall_peer_tables(s, routing, 1, 50));
  EXPECT_THROW(fo::make_alltoall_peer_tables(s, routing, 1, 49), flashoverlap::InvalidArgument);  // receive rows
  EXPECT_THROW(fo::make_alltoall_peer_tables(s, routing, 3, 50), flashoverlap::InvalidArgument);  // no rank 3
  EXPECT_THROW(fo::make_alltoall_peer_tables(s, routing, 0, 50), flashoverlap::InvalidArgument);  // rank 1's schedule
  EXPECT_THROW(fo::make_alltoall_peer_tables(s, routing, 1, int64_t{1} << 30), flashoverlap::InvalidArgument);
  // With 2 experts the schedule is the grouped GEMM's (a tile row per (source, expert) here), not the rows'.
  const fo::MoeRouting two = fo::make_moe_routing("one:1", 3, 50, 1, 7, 2);
  const fo::Schedule g = fo::make_moe_schedule(two, 1, 256, {128, 256}, 132);
  ASSERT_EQ(g.m, 128 * int32_t(fo::moe_segments(two, 1).size()));
  ASSERT_GT(g.m, 256);
  EXPECT_NO_THROW(fo::make_alltoall_peer_tables(g, two, 1, 50));
  const fo::Schedule plain = fo::make_expert_schedule(two.rows(1), 256, {128, 256}, 132, fo::Raster::AlongN, 1);
  EXPECT_THROW(fo::make_alltoall_peer_tables(plain, two, 1, 50), flashoverlap::InvalidArgument);
}

TEST(ReduceScatterPeerRows, EveryRowGoesToItsOwnerInItsSourcesBlock) {
  const uint64_t seed = fo_test::test_seed();
  FO_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const int32_t W = int32_t(uniform(rng, 1, 8));
    const fo::TileShape tile = uniform(rng, 0, 1) ? fo::TileShape{128, 256} : fo::TileShape{8, 16};
    const int64_t m = W * uniform(rng, 1, 90), n = uniform(rng, 1, 600), q = m / W;
    const fo::Schedule s = fo::make_schedule(m, n, tile, int32_t(uniform(rng, 1, 140)),
                                             uniform(rng, 0, 1) ? fo::Raster::AlongN : fo::Raster::AlongM,
                                             int32_t(uniform(rng, 1, 8)));
    // landed[d][slot]: (source, row of C) stored there; every slot exactly once.
    std::vector<std::vector<std::pair<int32_t, int64_t>>> landed(static_cast<size_t>(W));
    for (auto& l : landed) l.assign(static_cast<size_t>(W * q), {-1, -1});
    for (int32_t src = 0; src < W; ++src) {
      const std::vector<int32_t> row_of = fo::rs_peer_row_of(s, W, src);
      ASSERT_EQ(row_of.size(), size_t(s.tiles()) * s.bm);
      for (int32_t idx = 0; idx < s.tiles(); ++idx) {
        const fo::TileCoord c = s.tile_of(idx);
        for (int32_t r = 0; r < s.bm; ++r) {
          const int64_t row = int64_t{c.tm} * s.bm + r;
          const int32_t dst = row_of[size_t(idx) * s.bm + r];
          if (row >= m) {
            EXPECT_EQ(dst, -1);
            continue;
          }
          ASSERT_GE(dst, 0);
          const int64_t d = dst / (W * q), slot = dst % (W * q);
          ASSERT_LT(d, W);
          auto& at = landed[size_t(d)][size_t(slot)];
          if (c.tn == 0) {
            EXPECT_EQ(at.first, -1) << "slot " << slot << " of rank " << d << " written twice";
            at = {src, row};
          } else {
            EXPECT_EQ(at, std::make_pair(src, row));
          }
        }
      }
    }
    // Rank d's block s, row i: source s's row d * q + i (what rank d's output row i sums).
    for (int32_t d = 0; d < W; ++d)
      for (int32_t src = 0; src < W; ++src)
        for (int64_t i = 0; i < q; ++i)
          EXPECT_EQ(landed[size_t(d)][size_t(src * q + i)], std::make_pair(src, int64_t{d} * q + i))
              << "iter " << iter << " W " << W << " m " << m;
  }
}

TEST(ReduceScatterPeerRows, Refusals) {
  const fo::Schedule s = fo::make_schedule(300, 256, {128, 256}, 132, fo::Raster::AlongN, 1);
  EXPECT_NO_THROW(fo::rs_peer_row_of(s, 3, 2));
  EXPECT_THROW(fo::rs_peer_row_of(s, 7, 0), flashoverlap::InvalidArgument);  // 300 % 7 != 0
  EXPECT_THROW(fo::rs_peer_row_of(s, 3, 3), flashoverlap::InvalidArgument);  // no rank 3
}
