// Exact layouts of the slot maps on small hand-checked cases, the counting
// helpers against brute force, and the errors. The end-to-end correctness
// of every map is in test_plan_emulation.cpp.
#include <gtest/gtest.h>

#include <numeric>

#include "flashoverlap/error.h"
#include "plan/slot_map_allreduce.h"
#include "plan/slot_map_alltoall.h"
#include "plan/slot_map_reducescatter.h"
#include "test_plan_util.h"
#include "test_seed.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

TEST(PlanSlotMaps, ReduceScatterSubTileLayoutIsPartsThenTilesThenRows) {
  // 2 tile rows x 1 tile column of 4x2 tiles, world 2 (h = 2), one group of both tiles:
  // send rows [part 0: tile 0 rows 0-1, tile 1 rows 0-1][part 1: tile 0 rows 2-3, tile 1 rows 2-3].
  const fo::Schedule s = fo::make_schedule(8, 2, {4, 2}, 2, fo::Raster::AlongN, 1);
  const auto groups = fo::make_groups(s, {1});
  const fo::SlotMap map = fo::make_reducescatter_map(s, groups, 2, 1, fo::RsLayout::SubTile);
  EXPECT_EQ(map.row_of, (std::vector<int32_t>{0, 1, 4, 5, 2, 3, 6, 7}));
  EXPECT_EQ(map.groups[0].send, (fo::Span{0, 16}));
  EXPECT_EQ(map.groups[0].recv, (fo::Span{0, 8}));
  // Rank 1 holds rows 2, 3 (tile 0) and 6, 7 (tile 1), i.e. output rows 0..3.
  EXPECT_EQ(fo::rs_rows_of_rank(s, 2, 1, fo::RsLayout::SubTile), (std::vector<int32_t>{2, 3, 6, 7}));
  EXPECT_EQ(map.slot_of_out, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(PlanSlotMaps, ReduceScatterStandardPaddingDependsOnTileOrder) {
  // M = 8: 4 tile rows of 2 (rank 0 owns tile rows 0-1, rank 1 rows 2-3), 2 tile
  // columns, one group per wave.
  //  - AlongN, swizzle 1, 2 CTAs: a wave is one tile row (both columns), all
  //    one rank's: each group pads the other rank's part with 4 rows -> 16.
  //  - AlongM, swizzle 1, 4 CTAs: a wave is one tile column, half of it each
  //    rank's -> no padding.
  struct Case {
    fo::Raster raster;
    int32_t ctas;
    int64_t padding;
  };
  for (const Case c : {Case{fo::Raster::AlongN, 2, 16}, Case{fo::Raster::AlongM, 4, 0}}) {
    const fo::Schedule s = fo::make_schedule(8, 4, {2, 2}, c.ctas, c.raster, 1);
    SCOPED_TRACE(fo_test::describe(s));
    const auto groups = fo::make_groups(s, std::vector<int32_t>(size_t(s.waves()), 1));
    const fo::SlotMap map = fo::make_reducescatter_map(s, groups, 2, 0, fo::RsLayout::Standard);
    EXPECT_EQ(map.padding_rows, c.padding);
    EXPECT_EQ(map.send_rows - map.padding_rows, 8 * 2);  // 8 rows x 2 column blocks of data
    const fo::WaveCounts counts = fo::rs_standard_counts(s, 2);
    int64_t rows = 0;
    for (const fo::Group& g : groups) rows += fo::rs_standard_padded_rows(counts, g.first_wave, g.end_wave);
    EXPECT_EQ(rows, map.send_rows);
  }
}

// The counts the MoE planner prices a group by and the maps size its spans
// by: WaveCounts of a rank's rows by destination per tile row, on its own
// schedule (make_moe_schedule: its walk shifted to the next rank's rows),
// against the rows of the tiles of waves [w0, w1) counted one by one.
TEST(PlanSlotMaps, AllToAllCountsEqualBruteForceCounts) {
  FO_SEEDED_RNG(rng);
  static const char* kinds[] = {"uniform", "zipf:1.2", "one:0"};
  static const fo::TileShape tiles[] = {{128, 256}, {128, 128}, {64, 64}, {16, 8}};
  int checked = 0;
  for (int it = 0; it < 100; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 6)), K = int32_t(uniform(rng, 1, W));
    const std::string kind = kinds[uniform(rng, 0, 2)];
    const fo::MoeRouting routing = fo::make_moe_routing(kind, W, uniform(rng, 0, 600), K, rng());
    const fo::TileShape tile = tiles[uniform(rng, 0, 3)];
    const int64_t n = uniform(rng, 1, 2000);
    const int32_t ctas = int32_t(uniform(rng, 1, 40));
    for (int32_t x = 0; x < W; ++x) {
      const fo::Schedule s = fo::make_moe_schedule(routing, x, n, tile, ctas);
      SCOPED_TRACE(kind + " world " + std::to_string(W) + " rank " + std::to_string(x) + " " + fo_test::describe(s));
      if (s.waves() == 0) {
        EXPECT_EQ(routing.rows(x), 0);
        continue;
      }
      const auto& dest = routing.dest_rank[size_t(x)];
      std::vector<int64_t> per_tile_row(size_t(s.tiles_m()) * W, 0);
      for (size_t i = 0; i < dest.size(); ++i) ++per_tile_row[i / size_t(s.bm) * W + dest[i]];
      const fo::WaveCounts counts(s, W, per_tile_row);
      const int32_t w0 = int32_t(uniform(rng, 0, s.waves() - 1)), w1 = int32_t(uniform(rng, w0 + 1, s.waves()));
      std::vector<int64_t> brute(size_t(W), 0);  // slot rows to each rank of waves [w0, w1)
      const fo::Group g = fo::group_spanning(s, w0, w1);
      for (int32_t idx = g.first_tile; idx < g.end_tile; ++idx) {
        const fo::TileCoord t = s.tile_of(idx);
        for (int32_t r = 0; r < s.rows_of(t); ++r) ++brute[size_t(dest[size_t(t.tm * s.bm + r)])];
      }
      for (int32_t d = 0; d < W; ++d) {
        EXPECT_EQ(counts.sum(w0, w1, d), brute[size_t(d)]) << "to rank " << d;
        EXPECT_EQ(counts.sum(0, s.waves(), d), routing.send_count(x, d) * s.tiles_n()) << "to rank " << d;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(PlanSlotMaps, ScatterTablesMatchTheTargets) {
  const fo::Schedule s = fo::make_schedule(300, 70, {64, 64}, 3, fo::Raster::AlongM, 2);
  const fo::SlotMap map = fo::make_allreduce_map(s, fo::make_groups(s, {s.waves()}), 2);
  const fo::ScatterTables t = fo::scatter_tables(map);
  ASSERT_EQ(t.dst_row.size(), size_t(map.recv_rows));
  for (size_t i = 0; i < t.dst_row.size(); ++i) {
    EXPECT_EQ(t.dst_row[i], map.target_of_slot[i].row);
    if (t.dst_row[i] >= 0) {
      EXPECT_EQ(t.dst_col[i], map.target_of_slot[i].col_block * 64);
    }
  }
}

TEST(PlanSlotMaps, ReduceScatterLayoutsSayWhatTheyNeed) {
  const fo::Schedule s = fo::make_schedule(4000, 256, {128, 256}, 8, fo::Raster::AlongN, 1);
  const auto groups = fo::make_groups(s, {s.waves()});
  EXPECT_TRUE(fo::rs_layout_applies(s, 2, fo::RsLayout::SubTile));
  EXPECT_FALSE(fo::rs_layout_applies(s, 3, fo::RsLayout::SubTile));
  EXPECT_FALSE(fo::rs_layout_applies(s, 3, fo::RsLayout::Standard));
  try {
    fo::make_reducescatter_map(s, groups, 3, 0, fo::RsLayout::SubTile);
    ADD_FAILURE() << "no error";
  } catch (const flashoverlap::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bm=128, world=3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fo::make_reducescatter_map(s, groups, 3, 0, fo::RsLayout::Standard), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::make_reducescatter_map(s, groups, 2, 2, fo::RsLayout::SubTile), flashoverlap::InvalidArgument);
  EXPECT_EQ(fo::parse_rs_layout("standard"), fo::RsLayout::Standard);
  EXPECT_THROW(fo::parse_rs_layout("rows"), flashoverlap::InvalidArgument);
}

// half_rows_of: each 64-row half's first slot row where every half of every
// tile is one run of stored rows (the GEMM's TMA store), nothing where one is not.
TEST(PlanSlotMaps, HalfRowsOfRunsOfWholeHalvesOnly) {
  auto consistent = [](const fo::SlotMap& map, const std::vector<int32_t>& first) {
    ASSERT_EQ(first.size(), map.row_of.size() / 64);
    for (size_t h = 0; h < first.size(); ++h)
      for (int32_t r = 0; r < 64; ++r) ASSERT_EQ(map.row_of[h * 64 + size_t(r)], first[h] + r) << "half " << h;
  };
  // 128-row tiles, world 2: M = 512 (R = 256: whole tile rows), 384 (R = 192:
  // tile row 1 split at its halves), 300 (a ragged bottom tile: rows past M
  // are not stored).
  for (int32_t m : {512, 384, 300}) {
    const fo::Schedule s = fo::make_schedule(m, 512, {128, 256}, 3, fo::Raster::AlongM, 1);
    SCOPED_TRACE(fo_test::describe(s));
    const auto groups = fo::make_groups(s, std::vector<int32_t>(size_t(s.waves()), 1));
    for (int32_t rank : {0, 1}) {
      const fo::SlotMap map = fo::make_reducescatter_map(s, groups, 2, rank, fo::RsLayout::Standard);
      const std::vector<int32_t> first = fo::half_rows_of(map);
      EXPECT_EQ(first.empty(), m == 300);
      if (!first.empty()) consistent(map, first);
      // The sub-tile layout on 2 ranks: each half is one rank's part (a
      // ragged tile's rows past M too: zeros, sent and dropped).
      const fo::SlotMap sub = fo::make_reducescatter_map(s, groups, 2, rank, fo::RsLayout::SubTile);
      const std::vector<int32_t> sub_first = fo::half_rows_of(sub);
      EXPECT_FALSE(sub_first.empty());
      if (!sub_first.empty()) consistent(sub, sub_first);
    }
    // On 4 ranks a sub-tile part is a quarter tile: halves are split.
    EXPECT_TRUE(fo::half_rows_of(fo::make_reducescatter_map(s, groups, 4, 0, fo::RsLayout::SubTile)).empty());
  }
  // A half split between two parts that are not adjacent (padding between):
  // AlongN, one group per wave of 2 tiles of one tile row split at row 160.
  const fo::Schedule s = fo::make_schedule(320, 512, {128, 256}, 2, fo::Raster::AlongN, 1);
  const auto groups = fo::make_groups(s, std::vector<int32_t>(size_t(s.waves()), 1));
  EXPECT_TRUE(fo::half_rows_of(fo::make_reducescatter_map(s, groups, 2, 0, fo::RsLayout::Standard)).empty());
  // Tiles of other heights: never.
  const fo::Schedule t = fo::make_schedule(16, 4, {4, 2}, 3, fo::Raster::AlongM, 1);
  EXPECT_TRUE(fo::half_rows_of(fo::make_reducescatter_map(t, fo::make_groups(t, {t.waves()}), 2, 0,
                                                          fo::RsLayout::Standard)).empty());
}

// The compact tables the runtime builds every call expand to the map's own
// row_of and slot_of_out, exactly, with the same spans: random routings of
// every kind, W = 1-8, top-K, experts without rows, random common
// partitions, both tile shapes, ragged n.
TEST(AllToAllTables, ExpandToTheMapsTables) {
  using namespace flashoverlap::plan;
  FO_SEEDED_RNG(rng);
  static const char* kinds[] = {"uniform", "zipf:1.2", "one:0", "empty:0"};
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t world = 1 + int32_t(rng() % 8), topk = 1 + int32_t(rng() % uint64_t(std::min(world, 4)));
    std::string kind = kinds[rng() % 4];
    if (kind == "empty:0" && topk >= world) kind = "uniform";  // (no rank left out: K distinct of W)
    const int64_t tokens = int64_t(rng() % 700), n = trial % 3 == 0 ? 1000 : 768;
    MoeRouting routing = make_moe_routing(kind, world, tokens, topk, rng());
    if (trial % 2) {  // every rank's rows shuffled: destinations interleaved within tile rows
      for (int32_t r = 0; r < world; ++r) {
        std::vector<size_t> perm(routing.dest_rank[size_t(r)].size());
        std::iota(perm.begin(), perm.end(), size_t{0});
        std::shuffle(perm.begin(), perm.end(), rng);
        auto apply = [&](auto& v) {
          auto old = v;
          for (size_t i = 0; i < perm.size(); ++i) v[i] = old[perm[i]];
        };
        apply(routing.dest_rank[size_t(r)]), apply(routing.dest_token[size_t(r)]), apply(routing.gate[size_t(r)]);
      }
    }
    const TileShape tile = rng() % 2 ? TileShape{128, 256} : TileShape{128, 128};
    const int32_t ctas = 1 + int32_t(rng() % 20);
    const MoeRowCounts counts = count_moe_rows(routing, tile.bm);
    std::vector<Schedule> scheds;
    int32_t most = 0;
    for (int32_t r = 0; r < world; ++r) {
      scheds.push_back(make_expert_schedule(routing.rows(r), n, tile, ctas, Raster::AlongN,
                                                  1 + int32_t(rng() % 4)));
      most = std::max(most, scheds.back().waves());
    }
    Partition common;
    for (int32_t left = std::max(most, 1); left > 0;) {
      const int32_t g = 1 + int32_t(rng() % uint64_t(std::min(left, 4)));
      common.push_back(g);
      left -= g;
    }
    std::vector<std::vector<Group>> groups;
    for (const Schedule& s : scheds) groups.push_back(make_clipped_groups(s, common));
    for (int32_t rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(kind + ", world " + std::to_string(world) + ", top-" + std::to_string(topk) + ", rank " +
                   std::to_string(rank));
      const SlotMap map = make_alltoall_map(scheds, groups, routing, rank);
      const AllToAllTables t = make_alltoall_tables(scheds, groups, routing, rank);
      EXPECT_EQ(t.send_rows, map.send_rows);
      EXPECT_EQ(t.recv_rows, map.recv_rows);
      EXPECT_EQ(t.out_rows, map.out_rows);
      ASSERT_EQ(t.groups.size(), map.groups.size());
      for (size_t g = 0; g < t.groups.size(); ++g) {
        EXPECT_EQ(t.groups[g].send_to, map.groups[g].send_to);
        EXPECT_EQ(t.groups[g].recv_from, map.groups[g].recv_from);
      }
      EXPECT_EQ(expand_row_of(t), map.row_of);
      EXPECT_EQ(expand_slot_of_out(t), map.slot_of_out);
      // One expert: the plain form (no virtual tile rows), rows binned by row / bm.
      EXPECT_TRUE(t.a_row0.empty() && t.rows_of.empty());
      EXPECT_EQ(t.m, routing.rows(rank));
      {
        const auto& dest = routing.dest_rank[size_t(rank)];
        std::vector<int32_t> before(size_t(scheds[size_t(rank)].tiles_m()) * world, 0), rrank;
        for (size_t i = 0; i < dest.size(); ++i) rrank.push_back(before[i / size_t(tile.bm) * world + dest[i]]++);
        EXPECT_EQ(t.rrank, rrank);
      }
      // From the row counts (no other rank's rows read): the same tables.
      const AllToAllTables c = make_alltoall_tables(scheds, groups, routing, rank, &counts);
      EXPECT_EQ(c.send_rows, t.send_rows);
      EXPECT_EQ(c.recv_rows, t.recv_rows);
      EXPECT_EQ(c.out_rows, t.out_rows);
      ASSERT_EQ(c.groups.size(), t.groups.size());
      for (size_t g = 0; g < c.groups.size(); ++g) {
        EXPECT_EQ(c.groups[g].send_to, t.groups[g].send_to);
        EXPECT_EQ(c.groups[g].recv_from, t.groups[g].recv_from);
      }
      EXPECT_EQ(c.tm_of, t.tm_of);
      EXPECT_EQ(c.sbase, t.sbase);
      EXPECT_EQ(c.rrank, t.rrank);
      EXPECT_EQ(c.rtab, t.rtab);
      EXPECT_EQ(c.rkey, t.rkey);
    }
    // Counts of another tile height are refused.
    const MoeRowCounts other = count_moe_rows(routing, 64);
    EXPECT_THROW(make_alltoall_tables(scheds, groups, routing, 0, &other), flashoverlap::InvalidArgument);
  }
}

TEST(MoeRowCounts, CountEveryRowOnceAndValidateTheRouting) {
  using namespace flashoverlap::plan;
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 50; ++trial) {
    const int32_t world = 1 + int32_t(rng() % 8), bm = 1 + int32_t(rng() % 200);
    const MoeRouting routing = make_moe_routing("zipf:1.2", world, int64_t(rng() % 500), 1, rng());
    const MoeRowCounts c = count_moe_rows(routing, bm);
    ASSERT_EQ(c.bm, bm);
    ASSERT_EQ(c.counts.size(), size_t(world));
    for (int32_t r = 0; r < world; ++r) {
      const auto& dest = routing.dest_rank[size_t(r)];
      std::vector<int64_t> want((dest.size() + size_t(bm) - 1) / size_t(bm) * size_t(world), 0);
      for (size_t i = 0; i < dest.size(); ++i) ++want[i / size_t(bm) * size_t(world) + size_t(dest[i])];
      EXPECT_EQ(c.counts[size_t(r)], want) << "rank " << r;
    }
    if (routing.rows(0) > 0) {  // a routing that does not add up: validate_moe_routing's message
      MoeRouting bad = routing;
      bad.dest_token[0][0] = -1;
      try {
        (void)count_moe_rows(bad, bm);
        ADD_FAILURE() << "a negative token was not refused";
      } catch (const flashoverlap::InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("row 0"), std::string::npos) << e.what();
      }
    }
  }
}

// WaveCounts (its histogram by band, not by tile_of) against a count of
// every tile through tile_of: random schedules of both rasters, swizzles,
// ragged edges, walks shifted by rows, grids from 1 CTA to more than the tiles.
TEST(WaveCounts, EqualTheCountThroughTileOf) {
  using namespace flashoverlap::plan;
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 400; ++trial) {
    Schedule s;
    s.bm = 1 + int32_t(rng() % 8), s.bn = 1 + int32_t(rng() % 8);
    s.m = 1 + int32_t(rng() % 200), s.n = 1 + int32_t(rng() % 200);
    s.ctas = 1 + int32_t(rng() % 300);
    s.raster = rng() % 2 ? Raster::AlongN : Raster::AlongM;
    s.swizzle = 1 + int32_t(rng() % 9);
    if (rng() % 2) s.row_shift = int32_t(rng() % uint64_t(s.tiles_m()));
    const int32_t bins = 1 + int32_t(rng() % 4);
    std::vector<int64_t> per_tile_row(size_t(s.tiles_m()) * bins);
    for (int64_t& v : per_tile_row) v = int64_t(rng() % 50);
    const WaveCounts wc(s, bins, per_tile_row);
    ASSERT_EQ(wc.waves(), s.waves());
    std::vector<int64_t> want(size_t(s.waves()) * bins, 0);
    for (int32_t idx = 0; idx < s.tiles(); ++idx)
      for (int32_t b = 0; b < bins; ++b)
        want[size_t(s.round_of(idx)) * bins + b] += per_tile_row[size_t(s.tile_of(idx).tm) * bins + b];
    for (int32_t w = 0; w < s.waves(); ++w)
      for (int32_t b = 0; b < bins; ++b)
        ASSERT_EQ(wc.sum(w, w + 1, b), want[size_t(w) * bins + b])
            << "trial " << trial << " wave " << w << " bin " << b << " (m " << s.m << " n " << s.n << " tile "
            << s.bm << "x" << s.bn << " ctas " << s.ctas << " swizzle " << s.swizzle << " shift " << s.row_shift
            << (s.raster == Raster::AlongN ? " along N)" : " along M)");
  }
}

namespace {

// A routing of E experts per rank as a dispatch delivers it, the ragged
// cases among them: uniform, zipf:1.2, one:R (top-1: every row to R),
// empty:R (R gets no rows), no tokens, or one local expert no token picks.
fo::MoeRouting random_expert_routing(std::mt19937_64& rng, int32_t W, int32_t E, std::string& what) {
  const int64_t T = uniform(rng, 0, 5) == 0 ? uniform(rng, 0, 2) : uniform(rng, 1, 300);
  const int64_t kind = uniform(rng, 0, W >= 2 ? 4 : 3);
  if (kind == 3) {  // local expert `skip` of every rank gets no rows
    const int32_t skip = int32_t(uniform(rng, 0, E - 1));
    const int32_t K = int32_t(uniform(rng, 1, std::min(W * (E - 1), 4)));
    std::vector<std::vector<std::vector<fo::MoePick>>> picks(static_cast<size_t>(W));
    for (auto& tokens : picks)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<fo::MoePick> p;
        while (int32_t(p.size()) < K) {
          const fo::MoePick x{int32_t(uniform(rng, 0, W - 1)), 1.0f / float(K), int32_t(uniform(rng, 0, E - 1))};
          if (x.expert == skip) continue;
          if (std::none_of(p.begin(), p.end(), [&](const fo::MoePick& y) { return y.rank == x.rank && y.expert == x.expert; }))
            p.push_back(x);
        }
        tokens.push_back(p);
      }
    what = "skip expert " + std::to_string(skip) + " W=" + std::to_string(W) + " E=" + std::to_string(E) +
           " T=" + std::to_string(T) + " K=" + std::to_string(K);
    return fo::moe_routing_from_picks(W, picks, E);
  }
  const std::string R = std::to_string(uniform(rng, 0, W - 1));
  const std::string name = kind == 0 ? "uniform" : kind == 1 ? "zipf:1.2" : kind == 2 ? "one:" + R : "empty:" + R;
  const int32_t most = kind == 4 ? (W - 1) * E : W * E;
  const int32_t K = kind == 2 && uniform(rng, 0, 1) ? 1 : int32_t(uniform(rng, 1, std::min(most, 4)));
  what = name + " W=" + std::to_string(W) + " E=" + std::to_string(E) + " T=" + std::to_string(T) +
         " K=" + std::to_string(K);
  return fo::make_moe_routing(name, W, T, K, rng(), E);
}

}  // namespace

// With one expert the tile rows are the plain GEMM's (v*bm, make_grouped_tile_rows
// of one segment from row 0) and the schedule is the plain one, shifted to
// the first row for the next rank: the tables are what row / bm gave.
TEST(MoeRowCounts, OneExpertTileRowsAreThePlainOnes) {
  FO_SEEDED_RNG(rng);
  static const char* kinds[] = {"uniform", "zipf:1.2", "one:0"};
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t W = int32_t(uniform(rng, 1, 6)), bm = int32_t(uniform(rng, 1, 200));
    const fo::MoeRouting routing =
        fo::make_moe_routing(kinds[uniform(rng, 0, 2)], W, uniform(rng, 0, 400), int32_t(uniform(rng, 1, W)), rng());
    const fo::MoeRowCounts c = fo::count_moe_rows(routing, bm);
    ASSERT_EQ(c.tile_rows.size(), size_t(W));
    const int64_t n = uniform(rng, 1, 3000);
    const fo::TileShape tile{bm, int32_t(uniform(rng, 1, 256))};
    const int32_t ctas = int32_t(uniform(rng, 1, 140));
    for (int32_t r = 0; r < W; ++r) {
      SCOPED_TRACE("world " + std::to_string(W) + " rank " + std::to_string(r) + " bm " + std::to_string(bm));
      const int64_t m = routing.rows(r);
      const fo::GroupedTileRows& g = c.tile_rows[size_t(r)];
      ASSERT_EQ(g.tile_rows(), (m + bm - 1) / bm);
      for (int32_t v = 0; v < g.tile_rows(); ++v) {
        EXPECT_EQ(g.a_row0[size_t(v)], v * bm);
        EXPECT_EQ(g.rows[size_t(v)], std::min<int64_t>(bm, m - int64_t{v} * bm));
        EXPECT_EQ(g.b_row0[size_t(v)], 0);
      }
      const fo::GroupedTileRows one = fo::make_grouped_tile_rows({{0, m, 0}}, 1, n, bm);
      const fo::GroupedTileRows mine = fo::moe_tile_rows(routing, r, n, bm);
      EXPECT_EQ(mine.a_row0, one.a_row0);
      EXPECT_EQ(mine.b_row0, one.b_row0);
      EXPECT_EQ(mine.rows, one.rows);
      EXPECT_EQ(g.a_row0, one.a_row0);
      EXPECT_EQ(fo::moe_schedule_rows(routing, r, bm), m);
      // The schedule: plain, its walk at the tile row (row / bm) of the first row for r + 1, r + 2, ...
      fo::Schedule want = fo::make_expert_schedule(m, n, tile, ctas, fo::Raster::AlongN,
                                                   fo::default_swizzle(ctas, tile, int32_t(std::max<int64_t>((m + bm - 1) / bm, 1))));
      const auto& dest = routing.dest_rank[size_t(r)];
      for (int32_t k = 1; k < W && want.row_shift == 0; ++k) {
        const auto it = std::find(dest.begin(), dest.end(), (r + k) % W);
        if (it != dest.end()) {
          want.row_shift = int32_t(it - dest.begin()) / bm;
          break;
        }
      }
      const fo::Schedule s = fo::make_moe_schedule(routing, r, n, tile, ctas);
      EXPECT_EQ(s.m, want.m);
      EXPECT_EQ(s.swizzle, want.swizzle);
      EXPECT_EQ(s.row_shift, want.row_shift);
      EXPECT_EQ(s.tiles(), want.tiles());
    }
  }
}

// With several experts the rows are binned by the grouped GEMM's tile rows
// (a tile row never holds two experts' rows), against the rows walked one
// by one: every row in exactly one tile row, the counts per (tile row,
// destination), and the schedule's m = tile rows * bm.
TEST(MoeRowCounts, SeveralExpertsCountByVirtualTileRow) {
  FO_SEEDED_RNG(rng);
  int ragged = 0, more_than_plain = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int32_t W = int32_t(uniform(rng, 1, 6)), E = int32_t(uniform(rng, 2, 4));
    const int32_t bm = uniform(rng, 0, 2) ? 128 : int32_t(uniform(rng, 1, 64));
    std::string what;
    const fo::MoeRouting routing = random_expert_routing(rng, W, E, what);
    SCOPED_TRACE(what + " bm " + std::to_string(bm));
    const fo::MoeRowCounts c = fo::count_moe_rows(routing, bm);
    ASSERT_EQ(c.bm, bm);
    ASSERT_EQ(c.tile_rows.size(), size_t(W));
    for (int32_t r = 0; r < W; ++r) {
      const auto brute = fo_test::brute_tile_rows(routing, r, bm);
      const fo::GroupedTileRows& g = c.tile_rows[size_t(r)];
      ASSERT_EQ(size_t(g.tile_rows()), brute.size()) << "rank " << r;
      std::vector<int64_t> want(brute.size() * size_t(W), 0);
      std::vector<int> seen(size_t(routing.rows(r)), 0);
      for (size_t v = 0; v < brute.size(); ++v) {
        EXPECT_EQ(g.a_row0[v], brute[v].first) << "rank " << r << " tile row " << v;
        EXPECT_EQ(g.rows[v], brute[v].second) << "rank " << r << " tile row " << v;
        ragged += brute[v].second < bm;
        for (int32_t row = brute[v].first; row < brute[v].first + brute[v].second; ++row) {
          ++seen[size_t(row)];
          ++want[v * size_t(W) + size_t(routing.dest_rank[size_t(r)][size_t(row)])];
        }
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; })) << "rank " << r;
      EXPECT_EQ(c.counts[size_t(r)], want) << "rank " << r;
      EXPECT_EQ(fo::moe_schedule_rows(routing, r, bm), int64_t(brute.size()) * bm);
      more_than_plain += int64_t(brute.size()) > (routing.rows(r) + bm - 1) / bm;
      EXPECT_EQ(fo::moe_tile_rows(routing, r, 1, bm).a_row0, g.a_row0);
    }
  }
  EXPECT_GT(ragged, 100);
  EXPECT_GT(more_than_plain, 50);
  // The routing's checks with experts: a count that does not add up, a row in another rank's block.
  const fo::MoeRouting good = fo::make_moe_routing("uniform", 3, 30, 4, 5, 3);
  fo::MoeRouting bad = good;
  bad.expert_rows[0][0] += 1;
  EXPECT_THROW(fo::count_moe_rows(bad, 128), flashoverlap::InvalidArgument);
  bad = good;
  std::swap(bad.dest_rank[1].front(), bad.dest_rank[1].back());
  try {
    (void)fo::count_moe_rows(bad, 128);
    ADD_FAILURE() << "a row in another rank's block was not refused";
  } catch (const flashoverlap::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("block of expert_rows"), std::string::npos) << e.what();
  }
  bad = good;
  bad.expert_rows.pop_back();
  EXPECT_THROW(fo::count_moe_rows(bad, 128), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::moe_tile_rows(bad, 2, 1, 128), flashoverlap::InvalidArgument);
}

// The compact tables with several experts: virtual tile rows, idle rows of a
// ragged tile row -1, every real row stored once per tile column into its
// destination's span of its group, the same as the map's, and from the
// counts the same again.
TEST(AllToAllTables, SeveralExpertsExpandToTheMapsTables) {
  FO_SEEDED_RNG(rng);
  static const fo::TileShape tiles[] = {{128, 256}, {128, 128}, {16, 8}, {5, 3}};
  int idle = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int32_t W = int32_t(uniform(rng, 1, 6)), E = int32_t(uniform(rng, 2, 4));
    std::string what;
    const fo::MoeRouting routing = random_expert_routing(rng, W, E, what);
    const fo::TileShape tile = tiles[uniform(rng, 0, 3)];
    const int64_t n = uniform(rng, 1, 700);
    const int32_t ctas = int32_t(uniform(rng, 1, 30));
    const bool own = uniform(rng, 0, 1);  // make_moe_schedule, or any raster and swizzle
    SCOPED_TRACE(what + " tile " + fo::to_string(tile) + " n " + std::to_string(n) + (own ? " moe" : " any"));
    std::vector<fo::Schedule> scheds;
    int32_t most = 1;
    for (int32_t r = 0; r < W; ++r) {
      scheds.push_back(own ? fo::make_moe_schedule(routing, r, n, tile, ctas)
                           : fo::make_grouped_schedule(fo::moe_tile_rows(routing, r, n, tile.bm), n, tile, ctas,
                                                       uniform(rng, 0, 1) ? fo::Raster::AlongM : fo::Raster::AlongN,
                                                       int32_t(uniform(rng, 1, 4))));
      most = std::max(most, scheds.back().waves());
    }
    const fo::Partition common = fo_test::random_partition(rng, most);
    std::vector<std::vector<fo::Group>> groups;
    for (const fo::Schedule& s : scheds) groups.push_back(fo::make_clipped_groups(s, common));
    const fo::MoeRowCounts counts = fo::count_moe_rows(routing, tile.bm);
    for (int32_t rank = 0; rank < W; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const fo::Schedule& s = scheds[size_t(rank)];
      const fo::SlotMap map = fo::make_alltoall_map(scheds, groups, routing, rank);
      const fo::AllToAllTables t = fo::make_alltoall_tables(scheds, groups, routing, rank);
      const fo::AllToAllTables c = fo::make_alltoall_tables(scheds, groups, routing, rank, &counts);
      const auto brute = fo_test::brute_tile_rows(routing, rank, tile.bm);
      EXPECT_EQ(t.m, routing.rows(rank));
      ASSERT_EQ(t.a_row0.size(), brute.size());
      ASSERT_EQ(t.rows_of.size(), brute.size());
      for (size_t v = 0; v < brute.size(); ++v) {
        EXPECT_EQ(t.a_row0[v], brute[v].first);
        EXPECT_EQ(t.rows_of[v], brute[v].second);
      }
      const std::vector<int32_t> row_of = fo::expand_row_of(t);
      EXPECT_EQ(row_of, map.row_of);
      EXPECT_EQ(fo::expand_row_of(c), map.row_of);
      EXPECT_EQ(fo::expand_slot_of_out(t), map.slot_of_out);
      EXPECT_EQ(fo::expand_slot_of_out(c), map.slot_of_out);
      EXPECT_EQ(t.send_rows, map.send_rows);
      EXPECT_EQ(t.recv_rows, map.recv_rows);
      EXPECT_EQ(c.recv_rows, map.recv_rows);
      EXPECT_EQ(t.out_rows, map.out_rows);
      EXPECT_EQ(c.rkey, t.rkey);
      EXPECT_EQ(c.rtab, t.rtab);
      EXPECT_EQ(c.rrank, t.rrank);
      ASSERT_EQ(map.groups.size(), groups[size_t(rank)].size());
      for (size_t g = 0; g < map.groups.size(); ++g) {
        EXPECT_EQ(t.groups[g].send_to, map.groups[g].send_to);
        EXPECT_EQ(c.groups[g].recv_from, map.groups[g].recv_from);
      }
      // Brute force: each tile's rows by destination into that destination's span of its group, once.
      EXPECT_EQ(map.send_rows, routing.rows(rank) * s.tiles_n());
      std::vector<int> used(size_t(map.send_rows), 0);
      for (size_t g = 0; g < map.groups.size(); ++g) {
        const fo::Group& x = groups[size_t(rank)][g];
        std::vector<int64_t> per_dest(size_t(W), 0);
        for (int32_t idx = x.first_tile; idx < x.end_tile; ++idx) {
          const int32_t v = s.tile_of(idx).tm;
          ASSERT_EQ(t.tm_of[size_t(idx)], v);
          for (int32_t r = 0; r < s.bm; ++r) {
            const int32_t slot = row_of[size_t(idx) * s.bm + r];
            if (r >= brute[size_t(v)].second) {
              EXPECT_EQ(slot, -1) << "idle row " << r << " of tile row " << v;
              ++idle;
              continue;
            }
            const int32_t d = routing.dest_rank[size_t(rank)][size_t(brute[size_t(v)].first + r)];
            ++per_dest[size_t(d)];
            const fo::Span to = map.groups[g].send_to[size_t(d)];
            ASSERT_GE(int64_t{slot} * s.bn, to.offset) << "tile " << idx << " row " << r;
            ASSERT_LT(int64_t{slot} * s.bn, to.end()) << "tile " << idx << " row " << r;
            ASSERT_EQ(used[size_t(slot)]++, 0) << "slot row " << slot << " twice";
          }
        }
        for (int32_t d = 0; d < W; ++d) EXPECT_EQ(map.groups[g].send_to[size_t(d)].count, per_dest[size_t(d)] * s.bn);
      }
      EXPECT_TRUE(std::all_of(used.begin(), used.end(), [](int u) { return u == 1; })) << "a slot row not stored";
    }
  }
  EXPECT_GT(idle, 1000);
}
