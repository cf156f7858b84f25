// slot_map_alltoall.h — All-to-All slot map for MoE (unit: sub-token = the rows
// of one tile that go to one destination, each a bn-wide slot row).
//
// On every source rank, group g's send region holds, for destination d = 0..W-1
// in order, the group's rows with destination d (tile idx order, then row
// order); rows past m_r are not stored. One grouped ncclSend/ncclRecv per peer
// per group moves them; on the receiver, group g's region holds, for source
// s = 0..W-1 in order, what s sent it in s's order. The post-reorder puts
// the rows in the order of all_to_all_single after a stable sort of each
// source's rows by destination: grouped by source rank, in source row order,
// all N columns. No padding: peers get exactly their counts (zero allowed).
// The map depends on the routing of every rank (the receive side) and
// differs between ranks.
//
// Every rank has its own schedule (m_r rows, possibly none; the same n and
// tile everywhere; with several experts per rank, the grouped GEMM's: its
// tile rows are the virtual ones of moe_tile_rows, whose idle rows past a
// segment's end are never stored) and the same number G of groups on every rank, group g's
// call moving group g of every rank. Groups may be EMPTY (no waves):
// a rank with fewer waves than G (m_r = 0: no waves at all) still takes part
// in every call, with zero-count spans. The output rows and the combine's
// tables depend on the routing alone, not on the schedules.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flashoverlap/error.h"
#include "plan/routing.h"
#include "plan/slot_map.h"
#include "plan/tile_grid.h"

namespace flashoverlap::plan {

// An expert's schedule: make_schedule, except that m = 0 (an expert that got
// no rows) gives a schedule of no tiles and no waves.
Schedule make_expert_schedule(int64_t m, int64_t n, TileShape tile, int32_t ctas, Raster raster,
                              int32_t swizzle);

// Rank `rank`'s tile rows of bm rows in the combine's GEMM:
// make_grouped_tile_rows of moe_segments (b_row0 = expert * n). With one
// expert, tile row v is rows v*bm .. of every row (the plain GEMM's). The
// routing must be valid; throws InvalidArgument for a rank out of range or
// expert_rows of the wrong shape.
GroupedTileRows moe_tile_rows(const MoeRouting& routing, int32_t rank, int64_t n, int32_t bm);
// The m of rank `rank`'s schedule for tiles of bm rows, in O(segments): its
// rows with one expert (the plain GEMM's), tile rows * bm with several (the
// grouped GEMM's, make_grouped_schedule).
int64_t moe_schedule_rows(const MoeRouting& routing, int32_t rank, int32_t bm);

// The schedule of rank `rank`'s expert rows in the MoE combine (what the
// runtime and the planner both use): make_expert_schedule of
// moe_schedule_rows along N with the default swizzle for `ctas`, its walk
// started (Schedule::row_shift) at the tile row of the first row for
// rank + 1 (else rank + 2, ...). With rows in
// the dispatch's order (by destination) every rank would otherwise compute
// the rows of the same destination at the same time, and each group would
// be an incast to one rank; shifted, rank r sends to r+1, r+2, ... in turn,
// all links at once.
Schedule make_moe_schedule(const MoeRouting& routing, int32_t rank, int64_t n, TileShape tile, int32_t ctas);

// Groups of a partition of a wave count common to all ranks (at least
// s.waves(), e.g. the most waves of any rank), clipped to s's waves: group g
// keeps the waves of [b_g, b_g+1) that s has, possibly none. The ranks' wave
// w then ends at about the same time on every rank (same n, k, tile, CTAs),
// so group g's data is ready together on all ranks.
std::vector<Group> make_clipped_groups(const Schedule& s, const Partition& common);

// Throws InvalidArgument unless there is one schedule and one groups vector
// per rank of the routing, schedule r has moe_schedule_rows(routing, r, bm)
// rows (routing.rows(r) with one expert), all have the
// n and tile of rank 0's, each is valid (m = 0 allowed), every rank has the
// same number (>= 1) of groups, and rank r's groups are consecutive runs of
// its waves covering [0, waves) exactly (empty runs allowed), with the tiles
// of group_spanning.
void validate_alltoall_ranks(const std::vector<Schedule>& sched_of_rank,
                             const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing);
// The same without validate_moe_routing (for a routing validated already:
// the per-call path validates it once, O(rows of every rank)).
void validate_alltoall_plan(const std::vector<Schedule>& sched_of_rank,
                            const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing);

// The map of `rank` (layout as at the top of this file, with each source's own
// schedule and groups): send side, group g of this rank's rows by
// destination, each destination's rows contiguous, in (tile idx, row) order
// (row r of virtual tile row v: A's row a_row0[v] + r, -1 past rows[v]);
// receive side, group g's region holds for s = 0..W-1 the rows of s's group g
// with destination `rank`, in s's (tile idx, row) order; output row i = the
// i-th row with destination `rank` in (source rank, source row) order (the
// sorted all_to_all_single), all n columns.
SlotMap make_alltoall_map(const std::vector<Schedule>& sched_of_rank,
                          const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing,
                          int32_t rank);

// The same map in compact form, for a runtime that builds it every call (the
// routing changes every call): O(m + tiles * world) on the send side and
// O(sources' tiles + output rows) on the receive side, where the map's
// row_of and slot_of_out are O(m * tiles_n) each. The device expands them
// (kernels::expand_alltoall_tables); expand_row_of / expand_slot_of_out
// are the same arithmetic on the host and equal the map's tables.
struct AllToAllTables {
  int32_t world = 1, rank = 0, bm = 0, bn = 0, tiles_n = 0;
  int64_t n = 0, m = 0;  // this rank's rows (of A: dest's size)
  std::vector<GroupCall> groups;  // the map's spans
  int64_t send_rows = 0, recv_rows = 0, out_rows = 0;
  // Send side: row_of[idx * bm + r] = sbase[idx * world + dest[row]] +
  // rrank[row] for row = tm_of[idx] * bm + r < m, else -1 (rrank: the rows
  // before it in its tile row with the same destination). With several
  // experts (a_row0 not empty) tm_of is the virtual tile row v and row =
  // a_row0[v] + r for r < rows_of[v], else -1: idle rows are never stored.
  std::vector<int32_t> tm_of, sbase, dest, rrank;
  std::vector<int32_t> a_row0, rows_of;  // [tile rows] of moe_tile_rows; empty with one expert (or no tiles)
  // Receive side: slot_of_out[i * tiles_n + cb] = rtab[rkey[i] + cb] + i.
  std::vector<int32_t> rtab, rkey;
  int32_t tiles() const { return int32_t(tm_of.size()); }
};
// The routing must be valid (validate_moe_routing: not checked again here).
// counts (optional: count_moe_rows of the schedules' tile height, made once
// per call for the plan too): the spans and the receive side from them, so
// that of the other ranks' rows none is read (O(m + tiles * world) in all).
AllToAllTables make_alltoall_tables(const std::vector<Schedule>& sched_of_rank,
                                    const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing,
                                    int32_t rank, const MoeRowCounts* counts = nullptr);
std::vector<int32_t> expand_row_of(const AllToAllTables& t);
std::vector<int32_t> expand_slot_of_out(const AllToAllTables& t);

// The fused combine's tables of one rank, per output row of its map (the
// same rows, the same order), and each token's rows in accumulation order.
struct CombineTable {
  int32_t rank = 0;
  int32_t tokens = 0;                      // T_rank: rows of the combine output
  std::vector<int32_t> src_rank, src_row;  // [out_rows]: where the row came from
  std::vector<int32_t> token;              // [out_rows]: its token, in [0, tokens)
  std::vector<float> gate;                 // [out_rows]: its weight
  // Token t's output rows, increasing (= (source rank, source row) order):
  // token_rows[token_begin[t] .. token_begin[t+1]). A kernel sums one token
  // per thread block in that order: no atomics, the same bits every run.
  std::vector<int32_t> token_begin;  // [tokens + 1]
  std::vector<int32_t> token_rows;   // [out_rows]
  int64_t rows() const { return int64_t(token.size()); }
};

// The routing must be valid (validate_moe_routing: not checked again here).
CombineTable make_combine_table(const MoeRouting& routing, int32_t rank);
// The same into `t`, whose vectors keep their memory: a call per routing
// grows nothing once the largest has been seen.
void fill_combine_table(const MoeRouting& routing, int32_t rank, CombineTable& t);

// Reference combine, fused into the post-reorder (what the combine kernel
// does): out (tokens x N, row-major), out[t] = sum over token t's rows of
// gate * row, accumulated in fp32 as acc = fma(gate, float(x), acc) in
// token_rows order from 0, rounded to T once. fma, not gate * x + acc: the
// kernel's fmaf (what nvcc contracts the expression to) gives the same bits.
// A token with no rows gets zeros.
template <class T>
void combine_reference(const SlotMap& map, const CombineTable& table, const T* recv, T* out) {
  if (table.rank != map.rank || table.rows() != map.out_rows)
    throw InvalidArgument("combine table of rank " + std::to_string(table.rank) + " (" +
                          std::to_string(table.rows()) + " rows) does not fit the map of rank " +
                          std::to_string(map.rank) + " (" + std::to_string(map.out_rows) + " rows)");
  std::vector<float> acc(size_t(map.n));
  for (int32_t t = 0; t < table.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int32_t i = table.token_begin[size_t(t)]; i < table.token_begin[size_t(t) + 1]; ++i) {
      const int32_t row = table.token_rows[size_t(i)];
      const float g = table.gate[size_t(row)];
      for (int32_t cb = 0; cb < map.tiles_n; ++cb) {
        const T* src = recv + int64_t{map.slot_of_out[size_t(row) * map.tiles_n + cb]} * map.bn;
        const int64_t c0 = int64_t{cb} * map.bn;
        const int64_t width = std::min<int64_t>(map.n - c0, map.bn);
        for (int64_t c = 0; c < width; ++c) acc[size_t(c0 + c)] = std::fma(g, static_cast<float>(src[c]), acc[size_t(c0 + c)]);
      }
    }
    for (int64_t c = 0; c < map.n; ++c) out[int64_t{t} * map.n + c] = static_cast<T>(acc[size_t(c)]);
  }
}

}  // namespace flashoverlap::plan
