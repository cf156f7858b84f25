// Wave partitions and groups.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "flashoverlap/error.h"
#include "plan/partition.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const flashoverlap::InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(PlanPartition, EnumeratesEveryCompositionOnce) {
  for (int32_t T = 1; T <= 14; ++T) {
    const auto all = fo::enumerate_partitions(T);
    ASSERT_EQ(all.size(), size_t(1) << (T - 1)) << "T=" << T;
    std::set<fo::Partition> unique(all.begin(), all.end());
    EXPECT_EQ(unique.size(), all.size());
    for (const auto& p : all) {
      EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0), T);
      for (int32_t g : p) EXPECT_GE(g, 1);
    }
  }
  size_t count = 0;
  fo::for_each_partition(fo::kMaxEnumerableWaves, [&](const fo::Partition&) { ++count; });
  EXPECT_EQ(count, size_t(1) << (fo::kMaxEnumerableWaves - 1));
  EXPECT_THROW(fo::enumerate_partitions(0), flashoverlap::InvalidArgument);
  EXPECT_NE(error_of([] { fo::enumerate_partitions(21); }).find("21 waves"), std::string::npos);
}

TEST(PlanPartition, ValidationSaysWhatIsWrong) {
  EXPECT_NO_THROW(fo::validate_partition({1, 2, 2}, 5));
  const std::string sum = error_of([] { fo::validate_partition({1, 2}, 5); });
  EXPECT_NE(sum.find("sums to 3"), std::string::npos) << sum;
  EXPECT_NE(sum.find("T = 5"), std::string::npos) << sum;
  const std::string neg = error_of([] { fo::validate_partition({3, 0, 2}, 5); });
  EXPECT_NE(neg.find("group 1"), std::string::npos) << neg;
  EXPECT_NE(error_of([] { fo::validate_partition({}, 5); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([] { fo::validate_partition({6, -1}, 5); }).find("group 1"), std::string::npos);
}

TEST(PlanPartition, ParsesCommaSeparatedSizes) {
  EXPECT_EQ(fo::parse_partition("1,2,2"), (fo::Partition{1, 2, 2}));
  EXPECT_EQ(fo::parse_partition("7"), (fo::Partition{7}));
  EXPECT_EQ(fo::parse_partition("-1,2"), (fo::Partition{-1, 2}));  // syntax only; validation rejects it
  EXPECT_EQ(fo::to_string(fo::Partition{3, 1}), "3,1");
  for (const char* bad : {"", ",", "1,,2", "1,2,", ",1", "a", "1.5", " 1", "1 ,2", "99999999999"})
    EXPECT_THROW(fo::parse_partition(bad), flashoverlap::InvalidArgument) << "'" << bad << "'";
}

TEST(PlanPartition, GroupsAreConsecutiveWaveRunsOfTiles) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 300; ++it) {
    const fo::Schedule s = fo_test::random_schedule(rng, fo_test::random_tile(rng), 100000);
    const fo::Partition p = fo_test::random_partition(rng, s.waves());
    SCOPED_TRACE(fo_test::describe(s) + " partition " + fo::to_string(p));
    const auto groups = fo::make_groups(s, p);
    ASSERT_EQ(groups.size(), p.size());
    int32_t wave = 0, tile = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      EXPECT_EQ(groups[g].first_wave, wave);
      EXPECT_EQ(groups[g].end_wave, wave + p[g]);
      EXPECT_EQ(groups[g].first_tile, tile);
      EXPECT_EQ(groups[g].end_tile, std::min(groups[g].end_wave * s.ctas, s.tiles()));
      EXPECT_GT(groups[g].tiles(), 0);
      wave = groups[g].end_wave;
      tile = groups[g].end_tile;
    }
    EXPECT_EQ(tile, s.tiles());
    const auto of_wave = fo::group_of_wave(groups);
    ASSERT_EQ(of_wave.size(), size_t(s.waves()));
    for (int32_t idx = 0; idx < s.tiles(); ++idx) {
      const fo::Group& g = groups[size_t(of_wave[size_t(s.round_of(idx))])];
      EXPECT_TRUE(idx >= g.first_tile && idx < g.end_tile) << "tile " << idx;
    }
    EXPECT_THROW(fo::make_groups(s, {s.waves() + 1}), flashoverlap::InvalidArgument);
  }
}

// What the overlapped ops accept as groups, and the group of each tile.
TEST(PlanPartition, TileGroupsAreCheckedAndIndexed) {
  const std::vector<fo::Group> ok = {fo::Group{0, 1, 0, 3}, fo::Group{1, 2, 3, 5}};
  EXPECT_NO_THROW(fo::require_tile_groups(ok, 5, "op"));
  auto message = [](const std::vector<fo::Group>& g, int32_t tiles) -> std::string {
    try {
      fo::require_tile_groups(g, tiles, "op");
    } catch (const flashoverlap::InvalidArgument& e) {
      return e.what();
    }
    return "(nothing thrown)";
  };
  EXPECT_EQ(message({}, 5), "op: no groups");
  EXPECT_EQ(message(ok, 6), "op: the groups do not cover all tiles");
  EXPECT_EQ(message({fo::Group{0, 1, 0, 3}, fo::Group{1, 2, 4, 5}}, 5),
            "op: groups must be consecutive non-empty tile ranges (group 1)");
  EXPECT_EQ(message({fo::Group{0, 1, 0, 0}, fo::Group{0, 1, 0, 5}}, 5),
            "op: groups must be consecutive non-empty tile ranges (group 0)");
  EXPECT_EQ(fo::group_of_tiles(ok, 5), (std::vector<int32_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(fo::group_of_tiles(ok, 5, 0), (std::vector<int32_t>{2, 2, 2, 1, 1}));  // (group 0 to the sink)
}

// Row-band groups (the AllReduce's row-band and owner layouts): each group is
// whole bands of `swizzle` tile rows, so its tiles are whole rows of C; the
// groups cover every tile once, in order, and their waves are those of their
// first and last tiles.
TEST(PlanPartition, BandGroupsAreWholeRowsOfC) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 300; ++trial) {
    fo::Schedule s = fo_test::random_schedule(rng, fo_test::random_tile(rng), 1 << 22);
    s = fo::make_schedule(s.m, s.n, {s.bm, s.bn}, s.ctas, fo::Raster::AlongN, s.swizzle);
    SCOPED_TRACE(fo_test::describe(s));
    const int bands = fo::band_count(s);
    ASSERT_EQ(bands, (s.tiles_m() + s.swizzle - 1) / s.swizzle);
    const fo::Partition part = fo_test::random_partition(rng, bands);
    const std::vector<fo::Group> groups = fo::band_groups(s, part);
    ASSERT_EQ(groups.size(), part.size());
    int32_t tile = 0, band = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const fo::Group& x = groups[g];
      EXPECT_EQ(x.first_tile, tile);
      band += part[g];
      EXPECT_EQ(x.end_tile, std::min(band * s.swizzle * s.tiles_n(), s.tiles()));
      // whole tile rows: every tile of the group has its row's other tiles with it
      EXPECT_EQ(x.first_tile % s.tiles_n(), 0);
      EXPECT_TRUE(x.end_tile % s.tiles_n() == 0 || x.end_tile == s.tiles());
      for (int32_t t = x.first_tile; t < x.end_tile; ++t) {
        const fo::TileCoord c = s.tile_of(t);
        EXPECT_GE(c.tm, (band - part[g]) * s.swizzle);
        EXPECT_LT(c.tm, band * s.swizzle);
      }
      EXPECT_EQ(x.first_wave, s.round_of(x.first_tile));
      EXPECT_EQ(x.end_wave, s.round_of(x.end_tile - 1) + 1);
      tile = x.end_tile;
    }
    EXPECT_EQ(tile, s.tiles());
  }
  const fo::Schedule s = fo::make_schedule(1000, 512, {128, 256}, 8, fo::Raster::AlongN, 2);  // 8 tile rows: 4 bands
  EXPECT_NE(error_of([&] { fo::band_groups(s, {1, 2}); }).find("cover 3 bands, the schedule has 4"), std::string::npos);
  EXPECT_NE(error_of([&] { fo::band_groups(s, {2, 0, 2}); }).find("a group of 0 bands"), std::string::npos);
  const fo::Schedule m = fo::make_schedule(1000, 512, {128, 256}, 8, fo::Raster::AlongM, 2);
  EXPECT_NE(error_of([&] { fo::band_groups(m, {4}); }).find("AlongN"), std::string::npos);
}
