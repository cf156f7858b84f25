// routing.h — MoE token routing for the All-to-All (the combine: expert GEMM
// -> All-to-All back to the tokens): per-rank row counts, each row's
// destination rank, token and gate weight (the slot map and the combine
// tables of slot_map_alltoall.h, the planner of moe_plan.h). The maps need
// all ranks' routings (they are exchanged before the GEMM): the groups'
// per-peer counts depend on them.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "plan/grouped.h"

namespace flashoverlap::plan {

// The combine's routing. Rank r's experts hold m_r = rows(r) rows of A_r
// (one per (token, expert) it was dispatched; m_r = 0 is valid); row i of
// rank r goes back to rank dest_rank[r][i], token dest_token[r][i] of that
// rank's tokens[d], weighted by gate[r][i]. The parallel arrays are what the
// op takes (dest_rank, dest_token, gate_weight); send_counts are the host
// integers of all_to_all_single, as the dispatch produced them.
//
// With E = experts > 1 per rank, A_r's rows are by (source rank s, local
// expert e), s-major: expert_rows[r][s * E + e] rows from s for expert e, in
// that order (what all_to_all_single delivers when every sender sorts its
// rows by global expert r * E + e): each source's block is its rows' own
// (dest_rank s), and a token may send several rows to one rank. With E = 1
// expert_rows is empty (each source's block is the one expert's, in any
// order).
struct MoeRouting {
  int32_t world = 1;
  int32_t experts = 1;                            // E: experts per rank
  std::vector<std::vector<int64_t>> expert_rows;  // [world][world * E] (E > 1), as above
  std::vector<int32_t> tokens;                   // [world]: T_d, rows of d's combine output
  std::vector<std::vector<int32_t>> dest_rank;   // [world][m_r]
  std::vector<std::vector<int32_t>> dest_token;  // [world][m_r], in [0, tokens[dest_rank])
  std::vector<std::vector<float>> gate;          // [world][m_r]
  std::vector<int64_t> send_counts;              // [src * world + dst]: rows src sends dst

  int64_t rows(int32_t r) const { return int64_t(dest_rank[size_t(r)].size()); }
  int64_t send_count(int32_t src, int32_t dst) const { return send_counts[size_t(src) * world + dst]; }
  // all_to_all_single's split sizes on `rank`: input (rows to each d) and
  // output (rows from each s).
  std::vector<int64_t> input_splits(int32_t rank) const;
  std::vector<int64_t> output_splits(int32_t rank) const;
};

// Every rank's rows sorted by destination (the dispatch's order): the
// sequential call then sends each destination's block of C as it is.
bool in_dispatch_order(const MoeRouting& r);

// send_counts from dest_rank alone (what validate_moe_routing compares with).
std::vector<int64_t> moe_send_counts(const MoeRouting& r);

// Throws InvalidArgument naming the rank and row: array sizes other than
// world (or m_r), negative token counts, a destination rank or token out of
// range, a non-finite gate, or send_counts that disagree with dest_rank;
// with experts > 1, expert_rows not [world][world * experts], a negative
// count, a source's counts that do not sum to the rows it sent, or a row of
// a source's block whose dest_rank is another rank.
void validate_moe_routing(const MoeRouting& r);

// Rank `rank`'s segments of A (consecutive rows, one local expert each), in
// A's order, for the grouped GEMM (grouped.h): empty ones left out,
// neighbours of one expert merged; with one expert, one segment of every row
// (none without rows). The routing is validate_moe_routing's to check.
std::vector<RowSegment> moe_segments(const MoeRouting& r, int32_t rank);

// Every rank's rows per tile row and destination: counts[r][v * world + d] =
// rows of rank r's virtual tile row v with destination d (the same for every
// grid and tile width). The tile rows are the grouped GEMM's (grouped.h) of
// moe_segments: each segment cut into tile rows of bm rows, the last ragged;
// with one expert, tile row v is rows v*bm .. v*bm+bm-1 (row / bm). Made in
// one pass that validates the routing as validate_moe_routing does (its
// message where it fails): what the MoE planner and the All-to-All's tables
// need, made once per call.
struct MoeRowCounts {
  int32_t bm = 0;
  std::vector<std::vector<int64_t>> counts;
  // [world]: rank r's tile rows (b_row0 = the expert: made with n = 1, so
  // times n for B's first row); counts[r] has tile_rows[r].tile_rows() * world.
  std::vector<GroupedTileRows> tile_rows;
};
MoeRowCounts count_moe_rows(const MoeRouting& r, int32_t bm);

// Synthetic MoE routings as a dispatch produces them: each of the T tokens of
// every rank picks K distinct experts of the world * E (E per rank, global
// expert g on rank g / E, its local expert g % E), with gates random,
// positive, summing to 1 per token (in fp32). A_r's rows are in the order the
// dispatch's all_to_all_single delivers them: by source rank, then local
// expert, then token, then k slot. Deterministic for a seed (own arithmetic
// on mt19937_64, not the library's distributions; E = 1 draws as it always
// did). Kinds:
//   "uniform"   every expert equally likely;
//   "zipf:S"    global expert g drawn with weight 1/(g+1)^S (S >= 0), K draws
//               without replacement: rank 0's first expert the most popular;
//   "one:R"     every token picks one of R's experts (uniform among them),
//               its other K-1 experts uniform (top-1: all rows to R);
//   "empty:R"   uniform over every expert not on R (K <= (world-1) * E): R
//               gets no rows (m_R = 0), its tokens still get their K rows back.
// ("file:PATH", a recorded routing, is read_moe_routing_file's, not this.)
// Throws InvalidArgument for world < 1, E < 1, T < 0, K outside [1, world *
// E], or a bad kind.
MoeRouting make_moe_routing(std::string_view kind, int32_t world, int64_t tokens_per_rank, int32_t topk,
                            uint64_t seed = 1, int32_t experts = 1);

// The combine's routing from the tokens' picks, as a dispatch delivers the
// rows (make_moe_routing's order): picks[src][t] = the (rank, gate, local
// expert) picks token t of rank src made, distinct experts. Throws
// InvalidArgument naming the rank and token: a rank or expert out of range,
// an expert picked twice, a gate that is not finite.
struct MoePick {
  int32_t rank = 0;
  float gate = 0;
  int32_t expert = 0;  // of rank's experts, in [0, experts)
};
MoeRouting moe_routing_from_picks(int32_t world, const std::vector<std::vector<std::vector<MoePick>>>& picks,
                                  int32_t experts = 1);

// A recorded routing (`bench --op alltoall --routing file:PATH`):
//   {"format": "flashoverlap.moe_routing", "schema": 1, "world": W,
//    "picks": [rank 0: [token 0: [[rank, gate], ...], token 1: ...], rank 1: ...]}
// or, with E experts per rank, "schema": 2, "experts": E and picks of
// [rank, expert, gate]. Throws InvalidArgument "<path>: <problem>".
MoeRouting read_moe_routing_file(const std::string& path);
// The most rows any token gets back (the routing's top-K: the experts it picked).
int32_t moe_topk(const MoeRouting& r);

}  // namespace flashoverlap::plan
