// block_layout.h — where each rank's partial of each group lives in the
// buffer of the gathered and pushed AllReduce layouts (host arithmetic; the
// runtime uploads it, the GEMM stores by it, the sum reads by it).
//
// The buffer (per parity half, for the pushed layouts' two alternating
// halves) is [group][rank][pad_rows] rows of `width` elements:
//   rows layout:  a group is whole row bands of C (rows [row0, row0 + rows));
//                 width = n; a tile of the group lands at its C rows + shift.
//   tiles layout: a group is a run of tiles in schedule order (tiles
//                 [row0, row0 + rows)); width = bn, one tile = bm rows;
//                 tile idx lands at buffer row idx * bm + shift.
// Blocks are padded to whole tiles: the GEMM's copies to the peers are not
// clipped to C's rows (kernels/gemm.h: Push).
#pragma once
#include <cstdint>
#include <vector>

#include "plan/partition.h"
#include "plan/schedule.h"

namespace flashoverlap::plan {

// Row bands: `swizzle` tile rows each, walked along N (the rows layouts).
int band_count(const Schedule& s);  // ceil(tiles_m / swizzle)
// Groups of whole bands: band_counts[g] bands in group g (they must cover
// every band). Throws InvalidArgument otherwise, or for a raster along M.
std::vector<Group> band_groups(const Schedule& s, const std::vector<int>& band_counts);

struct RankBlocks {     // one group
  int64_t row0 = 0;     // rows: first row of C; tiles: first tile
  int64_t rows = 0;     // rows: rows of C; tiles: tiles
  int64_t pad_rows = 0; // buffer rows of one rank's block (whole tiles)
  int64_t block0 = 0;   // buffer row of rank 0's block; rank w's is block0 + w * pad_rows
};

struct BlockLayout {
  bool tiles = false;
  int64_t width = 0;             // elements per buffer row
  std::vector<RankBlocks> groups;
  int64_t rows = 0;              // buffer rows of one parity half
  // [parity][groups + 1]: added to a tile's row (rows: tm * bm; tiles:
  // idx * bm) to land in this rank's block of that half; the extra last
  // entry per half is the fault sink (tests drop a group's stores there).
  std::vector<int32_t> row_shift;
};

// Throws InvalidArgument when the buffer would have 2^31 rows or more (TMA
// coordinates and the shifts are 32-bit), for world < 1 or rank outside it.
BlockLayout block_layout(const Schedule& s, const std::vector<Group>& groups, bool tiles, int world, int rank,
                         int parities, int fault_drop_group = -1);

}  // namespace flashoverlap::plan
