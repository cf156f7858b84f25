// Block layout of the gathered and pushed AllReduce layouts (plan/block_layout.h),
// emulated on the CPU for 1 to 8 ranks: every rank's GEMM stores each tile's
// rows (all bm of them: the copies to the peers are not clipped) by the
// layout's shifts into a shared buffer, then the sum reads each group's blocks
// the way the kernels do. Every store must land inside its own rank's block
// of its group and parity, no two stores may meet, and the sum of every row
// must read exactly the ranks' copies of that row.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "flashoverlap/error.h"
#include "plan/block_layout.h"
#include "test_plan_util.h"

using namespace flashoverlap;
using fo_test::uniform;

namespace {

struct Written {  // who stored a buffer cell: rank, tile, row inside the tile
  int rank = -1;
  int32_t tile = -1, row = -1;
};

int group_of(const std::vector<plan::Group>& groups, int32_t idx) {
  for (size_t g = 0; g < groups.size(); ++g)
    if (idx >= groups[g].first_tile && idx < groups[g].end_tile) return int(g);
  return -1;
}

}  // namespace

TEST(BlockLayout, EveryRanksTilesLandInItsBlockAndEverySumReadsTheRightRows) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 300; ++it) {
    const bool tiles = uniform(rng, 0, 1);
    const int world = int(uniform(rng, 1, 8)), parities = int(uniform(rng, 1, 2));
    plan::Schedule s = fo_test::random_schedule(rng, fo_test::random_tile(rng), 200000);
    if (!tiles) s.raster = plan::Raster::AlongN;  // row bands walk along N
    const std::vector<plan::Group> groups =
        tiles ? plan::make_groups(s, fo_test::random_partition(rng, s.waves()))
              : plan::band_groups(s, [&] {
                  std::vector<int> c;
                  for (int32_t p : fo_test::random_partition(rng, plan::band_count(s))) c.push_back(p);
                  return c;
                }());
    const int G = int(groups.size());
    const int drop = uniform(rng, 0, 3) == 0 ? int(uniform(rng, 0, G - 1)) : -1;
    SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " tile " << s.bm << "x" << s.bn << " ctas "
                                      << s.ctas << " swizzle " << s.swizzle << (tiles ? " tiles" : " rows")
                                      << " world " << world << " parities " << parities << " groups " << G);
    std::vector<plan::BlockLayout> L;
    for (int r = 0; r < world; ++r) L.push_back(plan::block_layout(s, groups, tiles, world, r, parities, drop));
    const plan::BlockLayout& L0 = L[0];
    ASSERT_EQ(int(L0.groups.size()), G);
    EXPECT_EQ(L0.width, tiles ? s.bn : s.n);
    int64_t next_block = 0;
    for (const plan::RankBlocks& b : L0.groups) {  // consecutive [rank][pad_rows] blocks of whole tiles
      EXPECT_EQ(b.block0, next_block);
      EXPECT_EQ(b.pad_rows % s.bm, 0);
      EXPECT_GE(b.pad_rows, tiles ? b.rows * s.bm : b.rows);
      next_block += world * b.pad_rows;
    }
    EXPECT_EQ(L0.rows, next_block);
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(L[r].rows, L0.rows);
      for (int g = 0; g < G; ++g) EXPECT_EQ(L[r].groups[g].block0, L0.groups[g].block0);
    }
    for (int r = 0; r < world; ++r)
      for (int p = 0; p < parities; ++p)  // the fault sink keeps the dropped group's shift
        EXPECT_EQ(L[r].row_shift[size_t(p) * (G + 1) + G], drop >= 0 ? L[r].row_shift[size_t(p) * (G + 1) + drop] : 0);

    // The GEMM's stores: buffer row, and the tile column (rows layout).
    std::map<std::pair<int64_t, int32_t>, Written> buf;
    for (int r = 0; r < world; ++r)
      for (int p = 0; p < parities; ++p)
        for (int32_t idx = 0; idx < s.tiles(); ++idx) {
          const int g = group_of(groups, idx);
          ASSERT_GE(g, 0) << "tile " << idx << " in no group";
          const plan::TileCoord tc = s.tile_of(idx);
          const plan::RankBlocks& b = L0.groups[g];
          const int64_t lo = p * L0.rows + b.block0 + r * b.pad_rows, hi = lo + b.pad_rows;
          for (int32_t i = 0; i < s.bm; ++i) {
            const int64_t row = (tiles ? int64_t(idx) * s.bm : int64_t(tc.tm) * s.bm) + i +
                                L[r].row_shift[size_t(p) * (G + 1) + g];
            ASSERT_TRUE(row >= lo && row < hi) << "rank " << r << " tile " << idx << " row " << i << " -> " << row
                                               << ", its block is [" << lo << ", " << hi << ")";
            Written& w = buf[{row, tiles ? 0 : tc.tn}];
            ASSERT_EQ(w.rank, -1) << "two stores meet at buffer row " << row;
            w = {r, idx, i};
          }
        }
    // The sum of each group reads rank w's copy at block0 + w * pad_rows.
    int64_t covered = 0;
    for (int p = 0; p < parities; ++p)
      for (int g = 0; g < G; ++g) {
        const plan::RankBlocks& b = L0.groups[g];
        if (p == 0) covered += b.rows;
        for (int w = 0; w < world; ++w) {
          const int64_t base = p * L0.rows + b.block0 + w * b.pad_rows;
          if (tiles) {
            for (int64_t t = 0; t < b.rows; ++t)
              for (int32_t i = 0; i < s.bm; ++i) {
                const Written& got = buf[{base + t * s.bm + i, 0}];
                ASSERT_TRUE(got.rank == w && got.tile == b.row0 + t && got.row == i)
                    << "group " << g << " rank " << w << " tile " << b.row0 + t << " row " << i;
              }
          } else {
            for (int64_t j = 0; j < b.rows; ++j)
              for (int32_t tn = 0; tn < s.tiles_n(); ++tn) {
                const int64_t c_row = b.row0 + j;
                const Written& got = buf[{base + j, tn}];
                ASSERT_EQ(got.rank, w) << "group " << g << " C row " << c_row;
                const plan::TileCoord tc = s.tile_of(got.tile);
                ASSERT_TRUE(tc.tn == tn && int64_t(tc.tm) * s.bm + got.row == c_row)
                    << "group " << g << " rank " << w << " C row " << c_row << " column tile " << tn;
              }
          }
        }
      }
    EXPECT_EQ(covered, tiles ? s.tiles() : s.m);  // every row (tile) of C is summed once
  }
}

TEST(BlockLayout, RejectsBadRanksAndBuffersTooLargeFor32BitRows) {
  const plan::Schedule s = plan::make_schedule(4096, 8192, {128, 256}, 132, plan::Raster::AlongN, 4);
  const std::vector<plan::Group> g = plan::band_groups(s, std::vector<int>(size_t(plan::band_count(s)), 1));
  EXPECT_THROW(plan::block_layout(s, g, false, 2, 2, 2), InvalidArgument);
  EXPECT_THROW(plan::block_layout(s, g, false, 0, 0, 2), InvalidArgument);
  EXPECT_THROW(plan::block_layout(s, g, false, 2, 0, 0), InvalidArgument);
  EXPECT_NO_THROW(plan::block_layout(s, g, false, 8, 7, 2));
  const plan::Schedule big = plan::make_schedule(int64_t(1) << 28, 256, {128, 256}, 132, plan::Raster::AlongN, 4);
  const std::vector<plan::Group> bg = plan::band_groups(big, {plan::band_count(big)});
  EXPECT_THROW(plan::block_layout(big, bg, false, 8, 0, 2), InvalidArgument);  // 2^28 rows x 8 ranks x 2
  EXPECT_THROW(plan::band_groups(s, {1, 2}), InvalidArgument);                  // 3 of 8 bands
  EXPECT_THROW(plan::band_groups(s, {0, 8}), InvalidArgument);
}
