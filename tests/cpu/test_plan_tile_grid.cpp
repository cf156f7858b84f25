// The persistent schedule (schedule.h) and its checked construction.
#include <gtest/gtest.h>

#include <set>

#include "flashoverlap/error.h"
#include "plan/tile_grid.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

TEST(PlanTileGrid, TileOrderIsABijectionAndIndexOfTileInvertsIt) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 400; ++it) {
    const fo::Schedule s = fo_test::random_schedule(rng, fo_test::random_tile(rng), 200000);
    SCOPED_TRACE(fo_test::describe(s));
    std::vector<char> seen(size_t(s.tiles()), 0);
    for (int32_t idx = 0; idx < s.tiles(); ++idx) {
      const fo::TileCoord t = s.tile_of(idx);
      ASSERT_GE(t.tm, 0);
      ASSERT_LT(t.tm, s.tiles_m());
      ASSERT_GE(t.tn, 0);
      ASSERT_LT(t.tn, s.tiles_n());
      ASSERT_FALSE(seen[size_t(t.tm) * s.tiles_n() + t.tn]++) << "tile visited twice at idx " << idx;
      ASSERT_EQ(s.index_of_tile(t), idx);
      // Bands: along N, index idx lies in the band of `swizzle` tile rows holding t.tm.
      const bool along_n = s.raster == fo::Raster::AlongN;
      const int32_t line = along_n ? t.tm : t.tn, length = along_n ? s.tiles_n() : s.tiles_m();
      ASSERT_EQ(idx / (s.swizzle * length), line / s.swizzle);
      // CTA and round.
      ASSERT_EQ(s.index_of(s.cta_of(idx), s.round_of(idx)), idx);
      ASSERT_LT(s.round_of(idx), s.waves());
    }
    EXPECT_GT(int64_t{s.waves()} * s.ctas, s.tiles() - 1);
    EXPECT_LE(int64_t{s.waves() - 1} * s.ctas, s.tiles() - 1);
    EXPECT_EQ(s.rows_of(s.tile_of(0)) + 0, std::min(s.bm, s.m - s.tile_of(0).tm * s.bm));
  }
}

TEST(PlanTileGrid, RaggedEdgesCoverExactlyTheMatrix) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 100; ++it) {
    const fo::Schedule s = fo_test::random_schedule(rng, fo_test::random_tile(rng), 200000);
    SCOPED_TRACE(fo_test::describe(s));
    int64_t covered = 0;
    for (int32_t idx = 0; idx < s.tiles(); ++idx) {
      const fo::TileCoord t = s.tile_of(idx);
      ASSERT_GE(s.rows_of(t), 1);
      ASSERT_GE(s.cols_of(t), 1);
      covered += int64_t{s.rows_of(t)} * s.cols_of(t);
    }
    EXPECT_EQ(covered, int64_t{s.m} * s.n);
  }
}

TEST(PlanTileGrid, ParsesTileShapes) {
  EXPECT_EQ(fo::parse_tile("128x256"), (fo::TileShape{128, 256}));
  EXPECT_EQ(fo::parse_tile("16x8"), (fo::TileShape{16, 8}));
  EXPECT_EQ(fo::to_string(fo::TileShape{128, 128}), "128x128");
  for (const char* bad : {"", "128", "128x", "x256", "0x128", "-1x2", "128x256x", "abc", "128 x 256", "128X256"})
    EXPECT_THROW(fo::parse_tile(bad), flashoverlap::InvalidArgument) << bad;
}

TEST(PlanTileGrid, RejectsInvalidSchedulesWithContext) {
  const fo::TileShape t{128, 256};
  EXPECT_THROW(fo::make_schedule(0, 10, t, 1, fo::Raster::AlongN, 1), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::make_schedule(10, -1, t, 1, fo::Raster::AlongN, 1), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::make_schedule(int64_t(1) << 32, 10, t, 1, fo::Raster::AlongN, 1), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::make_schedule(10, 10, t, 0, fo::Raster::AlongN, 1), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::make_schedule(10, 10, t, 1, fo::Raster::AlongN, 0), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::make_schedule(10, 10, {0, 8}, 1, fo::Raster::AlongN, 1), flashoverlap::InvalidArgument);
  // 2^31-1 rows x 2^20 columns: slot rows overflow int32.
  EXPECT_THROW(fo::make_schedule(2147483647, 1 << 20, t, 1, fo::Raster::AlongN, 1), flashoverlap::InvalidArgument);
  try {
    fo::make_schedule(10, 10, t, 0, fo::Raster::AlongN, 1);
  } catch (const flashoverlap::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ctas"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(fo::make_schedule(1, 1, t, 1, fo::Raster::AlongM, 7));
}

TEST(PlanTileGrid, DefaultSwizzleBalancesTheWaveFootprint) {
  EXPECT_EQ(fo::default_swizzle(116, {128, 256}, 32), 16);  // sqrt(232) ~ 15.2
  EXPECT_EQ(fo::default_swizzle(116, {128, 128}, 64), 8);   // sqrt(116) ~ 10.8
  EXPECT_EQ(fo::default_swizzle(116, {128, 256}, 4), 4);    // never wider than the grid
  EXPECT_EQ(fo::default_swizzle(1, {256, 8}, 9), 1);
}

// A shifted walk (Schedule::row_shift, the MoE combine's) visits every tile
// once, starts at tile row row_shift, and index_of_tile inverts it; the
// shift only renames tile rows, so each index keeps its column and CTA.
TEST(PlanTileGrid, RowShiftRotatesTheTileRowsOfTheWalk) {
  using namespace flashoverlap::plan;
  for (Raster raster : {Raster::AlongN, Raster::AlongM})
    for (int32_t m : {1, 300, 1000, 1281})
      for (int32_t swizzle : {1, 3, 8}) {
        Schedule s = make_schedule(m, 700, {128, 256}, 7, raster, swizzle);
        const Schedule plain = s;
        for (int32_t shift = 0; shift < s.tiles_m(); ++shift) {
          s.row_shift = shift;
          EXPECT_NO_THROW(validate_schedule(s));
          std::vector<int> seen(size_t(s.tiles()), 0);
          for (int32_t idx = 0; idx < s.tiles(); ++idx) {
            const TileCoord t = s.tile_of(idx), u = plain.tile_of(idx);
            EXPECT_EQ(t.tn, u.tn);
            EXPECT_EQ(t.tm, (u.tm + shift) % s.tiles_m());
            EXPECT_EQ(s.index_of_tile(t), idx);
            ++seen[size_t(t.tm) * s.tiles_n() + t.tn];
          }
          for (int v : seen) EXPECT_EQ(v, 1);
          if (raster == Raster::AlongN) EXPECT_EQ(s.tile_of(0).tm, shift);
        }
        s.row_shift = s.tiles_m();
        EXPECT_THROW(validate_schedule(s), flashoverlap::InvalidArgument);
      }
}
