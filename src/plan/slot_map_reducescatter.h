// slot_map_reducescatter.h — ReduceScatter slot maps. Two layouts:
//
// SUB-TILE (needs bm % W == 0; any M). The unit is a sub-tile: part p of a
// tile is its rows [p*h, (p+1)*h), h = bm/W, and goes to rank p. Group g
// (tiles j = 0..tg-1 in schedule order) owns send slot rows
// [first_tile*bm, end_tile*bm), laid out [W parts][tg tiles][h rows], so one
// ncclReduceScatter per group with recvcount = tg*h*bn hands part k of every
// tile of the group to rank k. Rank k's receive buffer is [T tiles][h][bn]
// (group g at first_tile*h*bn) and holds global rows tm*bm + k*h + [0, h)
// (those < M): an interleaved ("tile-strided") row set, not the usual one. No
// padding beyond the ragged bottom tile (its rows past M are zeros, sent and
// dropped). Works for every schedule and partition.
//
// STANDARD (needs M % W == 0; any bm). Rank k ends with rows [k*R, (k+1)*R),
// R = M/W, exactly what ncclReduceScatter on row-major C gives. The unit is
// the rows of one tile that go to one destination (a tile straddling a rank
// boundary splits in two; when M % (W*bm) == 0 the unit is the whole tile).
// Group g's send region is [W destinations][P_g slot rows]: destination d's
// part holds the group's rows with destination d, in (tile, row) order, padded
// to P_g = the largest of those counts, because ReduceScatter sends equal
// counts to every rank. Padding slot rows are never written (row_of never
// points there) and their received sums are never read (target row -1).
// Cost: W*P_g - rows_g padding rows per group, sent and reduced for nothing.
// It is zero when every group holds equal rows for each destination, and
// large when a group's tiles sit in one rank's rows: with Raster::AlongN a
// group covers a few bands of tile rows, mostly one destination, and may
// nearly W-fold its bytes. With the column-major walk (Raster::AlongM,
// swizzle 1: each tile column runs down all of M) every whole tile column
// holds R rows per destination, so a group's imbalance is at most part of
// one column at each end. The planner charges the padding in the predicted
// bytes of every candidate group, tries both tile orders, and reports it.
//
// Choice (planner.h): standard when it applies and its best plan is predicted
// within 3% of the best sub-tile plan (i.e. its padding is cheap), else
// sub-tile; when only one applies, that one. Not done: W grouped ncclReduce
// calls with per-destination counts would avoid padding altogether, at the
// price of W calls per group and Reduce's different algorithm choice.
#pragma once
#include <string_view>
#include <vector>

#include "plan/slot_map.h"

namespace flashoverlap::plan {

enum class RsLayout : int32_t { SubTile = 0, Standard = 1 };
std::string_view to_string(RsLayout l);  // "subtile" | "standard"
RsLayout parse_rs_layout(std::string_view s);

bool rs_layout_applies(const Schedule& s, int32_t world, RsLayout l);
// Throws InvalidArgument saying what the layout needs, when it does not apply.
void require_rs_layout(const Schedule& s, int32_t world, RsLayout l);

// Rows per destination rank of each group under the standard layout:
// counts.sum(w0, w1, d) = slot rows the tiles of waves [w0, w1) send to rank d.
WaveCounts rs_standard_counts(const Schedule& s, int32_t world);
// Send slot rows of a standard-layout group: world * max_d rows (with padding),
// and how many of them are padding.
int64_t rs_standard_padded_rows(const WaveCounts& counts, int32_t w0, int32_t w1);
int64_t rs_standard_padding_rows(const WaveCounts& counts, int32_t w0, int32_t w1);

SlotMap make_reducescatter_map(const Schedule& s, const std::vector<Group>& groups,
                               int32_t world, int32_t rank, RsLayout layout);

// The global rows rank `rank` holds after the collective, in output order.
std::vector<int32_t> rs_rows_of_rank(const Schedule& s, int32_t world, int32_t rank, RsLayout layout);

// The NVLink form (standard layout, m % world == 0, q = m / world rows per
// rank): the GEMM's row table ([tiles * bm], -1 past m) of rank `rank`,
// each row of C sent to its owner d = row / q, into block `rank` of d's
// window (world blocks of q rows, n wide: block s holds rank s's partial of
// d's rows, in row order), encoded d * (world * q) + rank * q + row % q.
// The owner sums its blocks in rank order. Throws InvalidArgument where the
// layout does not apply or the window rows do not fit int32.
std::vector<int32_t> rs_peer_row_of(const Schedule& s, int32_t world, int32_t rank);

}  // namespace flashoverlap::plan
