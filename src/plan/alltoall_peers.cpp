// alltoall_peers.cpp — see alltoall_peers.h.
#include "plan/alltoall_peers.h"

#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

AllToAllTables make_alltoall_peer_tables(const Schedule& s, const MoeRouting& routing, int32_t rank,
                                         int64_t rows_per_rank) {
  const int32_t W = routing.world;
  const std::string who = "all-to-all (NVLink form) rank " + std::to_string(rank);
  if (rank < 0 || rank >= W) throw InvalidArgument(who + ": rank out of range for world size " + std::to_string(W));
  if (s.bm < 1 || s.m != moe_schedule_rows(routing, rank, s.bm) || s.n < 1)
    throw InvalidArgument(who + ": a schedule of " + std::to_string(s.m) + " rows for " +
                          std::to_string(routing.rows(rank)) + " rows" +
                          (routing.experts > 1 ? " (its tile rows by expert: " +
                                                     std::to_string(s.bm < 1 ? 0 : moe_schedule_rows(routing, rank, s.bm)) + ")"
                                               : std::string()));
  if (rows_per_rank < 1 || int64_t{W} * rows_per_rank > INT32_MAX)
    throw InvalidArgument(who + ": " + std::to_string(rows_per_rank) + " receive rows per rank (world " +
                          std::to_string(W) + "): must be >= 1 and all of them fit int32");
  AllToAllTables t;
  t.world = W, t.rank = rank, t.bm = s.bm, t.bn = s.bn, t.tiles_n = s.tiles_n(), t.n = s.n, t.m = routing.rows(rank);
  // Where this rank's block starts at each destination, and each rank's total.
  std::vector<int64_t> start(size_t(W), 0);
  for (int32_t d = 0; d < W; ++d) {
    int64_t received = 0;
    for (int32_t src = 0; src < W; ++src) {
      if (src == rank) start[size_t(d)] = received;
      received += routing.send_count(src, d);
    }
    if (received > rows_per_rank)
      throw InvalidArgument(who + ": rank " + std::to_string(d) + " receives " + std::to_string(received) +
                            " rows, more than the " + std::to_string(rows_per_rank) + " of its receive rows");
    if (d == rank) t.out_rows = received;
  }
  if (routing.experts > 1) {  // the grouped GEMM's tile rows: rrank stays A's order per destination
    GroupedTileRows g = moe_tile_rows(routing, rank, 1, s.bm);
    t.a_row0 = std::move(g.a_row0), t.rows_of = std::move(g.rows);
  }
  const auto& dest = routing.dest_rank[size_t(rank)];
  t.dest = dest;
  t.rrank.resize(dest.size());
  std::vector<int32_t> before(size_t(W), 0);
  for (size_t row = 0; row < dest.size(); ++row) t.rrank[row] = before[size_t(dest[row])]++;
  t.tm_of.resize(size_t(s.tiles()));
  t.sbase.resize(size_t(s.tiles()) * W);
  for (int32_t idx = 0; idx < s.tiles(); ++idx) {
    t.tm_of[size_t(idx)] = s.tile_of(idx).tm;
    for (int32_t d = 0; d < W; ++d)
      t.sbase[size_t(idx) * W + d] = int32_t(int64_t{d} * rows_per_rank + start[size_t(d)]);
  }
  return t;
}

}  // namespace flashoverlap::plan
