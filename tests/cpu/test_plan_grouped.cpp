// The grouped GEMM's tile rows (plan/grouped.h) on random segments: every
// row of every segment is in exactly one tile row, of its own segment and
// expert, at its offset; no tile row straddles two segments; the schedule
// walks them as a plain GEMM of tile rows x bm rows.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <vector>

#include "flashoverlap/error.h"
#include "plan/grouped.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

TEST(PlanGrouped, EveryRowInOneTileRowOfItsSegment) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t experts = int32_t(uniform(rng, 1, 40)), bm = uniform(rng, 0, 1) ? 128 : 64;
    const int64_t n = uniform(rng, 1, 8192);
    // Segments in any order over A, with gaps, some empty, each with a random expert.
    std::vector<fo::RowSegment> segs;
    int64_t row = 0;
    const int count = int(uniform(rng, 0, 60));
    for (int i = 0; i < count; ++i) {
      const int64_t rows = uniform(rng, 0, 3) == 0 ? 0 : uniform(rng, 1, 700);
      row += uniform(rng, 0, 2) == 0 ? uniform(rng, 0, 50) : 0;
      segs.push_back({row, rows, int32_t(uniform(rng, 0, experts - 1))});
      row += rows;
    }
    std::shuffle(segs.begin(), segs.end(), rng);
    SCOPED_TRACE(testing::Message() << segs.size() << " segments, " << experts << " experts, n " << n << ", bm " << bm);
    const fo::GroupedTileRows g = fo::make_grouped_tile_rows(segs, experts, n, bm);
    ASSERT_EQ(g.b_row0.size(), g.a_row0.size());
    ASSERT_EQ(g.rows.size(), g.a_row0.size());
    std::map<int64_t, std::pair<int32_t, int32_t>> covered;  // row of A -> (tile row, offset)
    for (int32_t v = 0; v < g.tile_rows(); ++v) {
      ASSERT_GE(g.rows[v], 1);
      ASSERT_LE(g.rows[v], bm);
      for (int32_t r = 0; r < g.rows[v]; ++r)
        ASSERT_TRUE(covered.emplace(int64_t(g.a_row0[v]) + r, std::make_pair(v, r)).second) << "row stored twice";
    }
    int64_t want_rows = 0, want_tile_rows = 0;
    for (const fo::RowSegment& s : segs) {
      want_rows += s.rows;
      want_tile_rows += (s.rows + bm - 1) / bm;
      for (int64_t r = 0; r < s.rows; ++r) {
        const auto it = covered.find(s.a_row0 + r);
        ASSERT_NE(it, covered.end()) << "row " << s.a_row0 + r << " in no tile row";
        const int32_t v = it->second.first;
        // In a tile row of its own segment (it starts in the segment) and expert, at whole bm steps from its start.
        EXPECT_GE(g.a_row0[v], s.a_row0);
        EXPECT_LE(int64_t(g.a_row0[v]) + g.rows[v], s.a_row0 + s.rows);
        EXPECT_EQ((g.a_row0[v] - s.a_row0) % bm, 0);
        EXPECT_EQ(g.b_row0[v], int64_t(s.expert) * n);
      }
    }
    EXPECT_EQ(int64_t(covered.size()), want_rows);
    EXPECT_EQ(g.tile_rows(), want_tile_rows);  // (a segment's ragged end costs one tile row, no more)
    if (g.tile_rows() > 0 && bm == 128) {
      const fo::Schedule s = fo::make_grouped_schedule(g, n, {128, 256}, 132, fo::Raster::AlongN, 2);
      EXPECT_EQ(s.m, g.tile_rows() * 128);
      EXPECT_EQ(s.tiles_m(), g.tile_rows());
    }
  }
}

TEST(PlanGrouped, ExpertSegmentsFollowEachOtherAndBadInputIsRefused) {
  const std::vector<fo::RowSegment> segs = fo::expert_segments({3, 0, 300, 129});
  ASSERT_EQ(segs.size(), 4u);
  EXPECT_EQ(segs[1].a_row0, 3);
  EXPECT_EQ(segs[2].a_row0, 3);
  EXPECT_EQ(segs[3].a_row0, 303);
  EXPECT_EQ(segs[3].expert, 3);
  const fo::GroupedTileRows g = fo::make_grouped_tile_rows(segs, 4, 1000, 128);
  EXPECT_EQ(g.a_row0, (std::vector<int32_t>{0, 3, 131, 259, 303, 431}));
  EXPECT_EQ(g.rows, (std::vector<int32_t>{3, 128, 128, 44, 128, 1}));
  EXPECT_EQ(g.b_row0, (std::vector<int32_t>{0, 2000, 2000, 2000, 3000, 3000}));
  const fo::GroupedTileRows none = fo::make_grouped_tile_rows(fo::expert_segments({0, 0}), 2, 64, 128);
  EXPECT_EQ(none.tile_rows(), 0);
  EXPECT_EQ(fo::make_grouped_schedule(none, 64, {128, 128}, 8, fo::Raster::AlongN, 1).m, 0);
  using flashoverlap::InvalidArgument;
  EXPECT_THROW(fo::make_grouped_tile_rows({{0, 10, 2}}, 2, 64, 128), InvalidArgument);  // expert 2 of 2
  EXPECT_THROW(fo::make_grouped_tile_rows({{0, -1, 0}}, 1, 64, 128), InvalidArgument);
  EXPECT_THROW(fo::make_grouped_tile_rows({{0, 10, 0}, {5, 10, 0}}, 1, 64, 128), InvalidArgument);  // overlap
  EXPECT_THROW(fo::make_grouped_tile_rows({{0, 10, 0}}, 70000, 70000, 128), InvalidArgument);  // B past 2^31 rows
  EXPECT_THROW(fo::make_grouped_schedule(g, 1000, {64, 64}, 8, fo::Raster::AlongN, 1), InvalidArgument);  // bm 128
}

// The calibration's counts: experts x mean rows in all, none negative, and
// ragged like drawn counts (about half a tile row per expert past whole tile
// rows), where mean each would fill whole tile rows.
TEST(PlanGrouped, RaggedCountsKeepTheRowsAndCostRaggedTileRows) {
  for (int32_t experts : {1, 2, 5, 16, 32})
    for (int64_t mean : {int64_t(1), int64_t(16), int64_t(127), int64_t(128), int64_t(512), int64_t(4096)}) {
      SCOPED_TRACE(std::to_string(experts) + " experts, mean " + std::to_string(mean));
      const std::vector<int64_t> c = fo::ragged_counts(experts, mean);
      ASSERT_EQ(c.size(), size_t(experts));
      int64_t sum = 0;
      for (int64_t x : c) {
        EXPECT_GE(x, 0);
        sum += x;
      }
      EXPECT_EQ(sum, experts * mean);
      if (mean % 128 == 0 && experts > 1) {
        const fo::GroupedTileRows g = fo::make_grouped_tile_rows(fo::expert_segments(c), experts, 64, 128);
        EXPECT_EQ(g.tile_rows(), experts * mean / 128 + experts / 2);  // (mean + 64: one ragged tile row more)
      }
    }
}
