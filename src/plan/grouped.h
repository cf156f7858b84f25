// grouped.h — the grouped GEMM's tile rows (host arithmetic; the kernel reads
// the tables): C's rows = for every run of A's rows that one expert computes
// (a segment: consecutive rows of A, their expert), those rows times that
// expert's weight, B[e] of a stack [E, n, k] seen as one (E·n) x k matrix.
//
// Each segment is cut into tile rows of bm rows, the last one ragged: a tile
// row never straddles two segments, so each tile reads one expert's weight
// and its rows past the segment's end are computed but never stored (the
// cost: the ragged tile rows' idle rows, at most bm - 1 per segment). The
// schedule walks these tile rows (virtual tile row v: A's rows a_row0[v] ..
// a_row0[v] + rows[v], B's rows b_row0[v] = expert · n ..) as a plain GEMM
// walks C's, so waves, groups and signals are the plain GEMM's.
#pragma once
#include <cstdint>
#include <vector>

#include "plan/schedule.h"
#include "plan/tile_grid.h"

namespace flashoverlap::plan {

struct RowSegment {
  int64_t a_row0 = 0;  // first row of A (and of C)
  int64_t rows = 0;    // 0 allowed: no tile rows
  int32_t expert = 0;  // its weight: rows expert * n .. of B
};

struct GroupedTileRows {
  int32_t bm = 128;
  std::vector<int32_t> a_row0;  // [tile rows]: first row of A and of C
  std::vector<int32_t> b_row0;  // [tile rows]: first row of B (expert * n)
  std::vector<int32_t> rows;    // [tile rows]: rows of it to store, 1..bm
  int32_t tile_rows() const { return int32_t(a_row0.size()); }
};

// Throws InvalidArgument (naming the segment) for a negative row count or
// start, an expert outside [0, experts), segments that overlap, rows or the
// (E·n) rows of B past int32, or bm < 1.
GroupedTileRows make_grouped_tile_rows(const std::vector<RowSegment>& segments, int32_t experts, int64_t n,
                                       int32_t bm);

// Segments of `counts[e]` rows per expert, expert after expert from row 0 (a
// stack of experts' inputs, as the dispatch sorts a rank's rows).
std::vector<RowSegment> expert_segments(const std::vector<int64_t>& counts);

// The counts a calibration times for `mean` rows per expert: mean + h and
// mean - h in turns (h = min(mean / 2, 64), the last of an odd count mean),
// summing to experts x mean: ragged, as counts drawn from a routing are,
// where mean each would fill whole 128-row tile rows.
std::vector<int64_t> ragged_counts(int32_t experts, int64_t mean);

// The schedule of the grouped GEMM: m = tile_rows * bm (no rows anywhere:
// m = 0, as make_expert_schedule), n columns, on `ctas` CTAs.
Schedule make_grouped_schedule(const GroupedTileRows& g, int64_t n, TileShape tile, int32_t ctas, Raster raster,
                               int32_t swizzle);

}  // namespace flashoverlap::plan
