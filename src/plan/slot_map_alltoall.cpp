#include "plan/slot_map_alltoall.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

Schedule make_expert_schedule(int64_t m, int64_t n, TileShape tile, int32_t ctas, Raster raster, int32_t swizzle) {
  if (m != 0) return make_schedule(m, n, tile, ctas, raster, swizzle);
  Schedule s = make_schedule(1, n, tile, ctas, raster, swizzle);  // checks the rest
  s.m = 0;
  return s;
}

namespace {

// Rank's expert counts are world x experts (several experts per rank).
void check_rank_counts(const MoeRouting& routing, int32_t rank) {
  if (rank < 0 || rank >= routing.world)
    throw InvalidArgument("MoE tile rows: rank " + std::to_string(rank) + " out of range for world size " +
                          std::to_string(routing.world));
  if (routing.expert_rows.size() != size_t(routing.world) ||
      routing.expert_rows[size_t(rank)].size() != size_t(routing.world) * routing.experts)
    throw InvalidArgument("MoE tile rows of rank " + std::to_string(rank) + ": expert_rows is not world x (world x " +
                          std::to_string(routing.experts) + " experts)");
}

// The grouped GEMM's tile rows of rank's segments, counted from its expert
// counts as make_grouped_tile_rows cuts moe_segments (neighbours of one
// expert one segment), with nothing built: the count, and the tile row
// holding row `at` of A (-1: none). The schedule's per call work.
std::pair<int64_t, int32_t> moe_tile_rows_walk(const MoeRouting& routing, int32_t rank, int32_t bm, int64_t at) {
  check_rank_counts(routing, rank);
  const std::vector<int64_t>& c = routing.expert_rows[size_t(rank)];
  int64_t tile_rows = 0, row = 0, start = 0, rows = 0;
  int32_t expert = -1, holding = -1;
  auto close = [&] {
    if (rows == 0) return;
    if (holding < 0 && at >= start && at < start + rows) holding = int32_t(tile_rows + (at - start) / bm);
    tile_rows += (rows + bm - 1) / bm;
  };
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == 0) continue;
    if (c[i] < 0) throw InvalidArgument("MoE tile rows of rank " + std::to_string(rank) + ": a negative count");
    const int32_t e = int32_t(i % size_t(routing.experts));
    if (rows > 0 && e == expert) {
      rows += c[i];
    } else {
      close();
      start = row, rows = c[i], expert = e;
    }
    row += c[i];
  }
  close();
  if (tile_rows * bm > INT32_MAX) throw InvalidArgument("MoE tile rows: 2^31 rows or more");
  return {tile_rows, holding};
}

}  // namespace

GroupedTileRows moe_tile_rows(const MoeRouting& routing, int32_t rank, int64_t n, int32_t bm) {
  if (routing.experts > 1) check_rank_counts(routing, rank);
  return make_grouped_tile_rows(moe_segments(routing, rank), routing.experts, n, bm);
}

int64_t moe_schedule_rows(const MoeRouting& routing, int32_t rank, int32_t bm) {
  if (routing.experts == 1) return routing.rows(rank);
  if (bm < 1) throw InvalidArgument("MoE schedule: tile height " + std::to_string(bm) + " must be >= 1");
  if (routing.expert_rows.size() != size_t(routing.world))
    throw InvalidArgument("MoE schedule: expert_rows has " + std::to_string(routing.expert_rows.size()) +
                          " ranks' counts, expected world " + std::to_string(routing.world));
  return moe_tile_rows_walk(routing, rank, bm, -1).first * bm;
}

Schedule make_moe_schedule(const MoeRouting& routing, int32_t rank, int64_t n, TileShape tile, int32_t ctas) {
  if (routing.experts > 1) {
    check_rank_counts(routing, rank);  // (before the send counts are read)
    // The grouped GEMM's virtual tile rows. Rows are in blocks by source
    // rank, so the next rank's first row, and the tile row holding it, come
    // from the counts alone.
    const int32_t W = routing.world;
    int64_t first = -1;
    for (int32_t k = 1; k < W; ++k) {
      const int32_t d = (rank + k) % W;
      if (routing.send_count(rank, d) == 0) continue;
      first = 0;
      for (int32_t x = 0; x < d; ++x) first += routing.send_count(rank, x);
      break;
    }
    const auto [V, holding] = moe_tile_rows_walk(routing, rank, tile.bm, first);
    Schedule s = make_expert_schedule(V * tile.bm, n, tile, ctas, Raster::AlongN,
                                      default_swizzle(ctas, tile, std::max(int32_t(V), 1)));
    if (V > 0 && holding >= 0) s.row_shift = holding;
    return s;
  }
  const int64_t m = routing.rows(rank);
  const int32_t tiles_m = int32_t(std::max<int64_t>((m + tile.bm - 1) / tile.bm, 1));
  Schedule s = make_expert_schedule(m, n, tile, ctas, Raster::AlongN, default_swizzle(ctas, tile, tiles_m));
  const auto& dest = routing.dest_rank[size_t(rank)];
  const int32_t W = routing.world;
  for (int32_t k = 1; k < W && m > 0; ++k) {
    const auto it = std::find(dest.begin(), dest.end(), (rank + k) % W);
    if (it != dest.end()) {
      s.row_shift = int32_t((it - dest.begin()) / tile.bm);
      break;
    }
  }
  return s;
}

std::vector<Group> make_clipped_groups(const Schedule& s, const Partition& common) {
  int64_t total = 0;
  for (int32_t size : common) total += size;
  if (total < s.waves())
    throw InvalidArgument("partition " + to_string(common) + " covers " + std::to_string(total) +
                          " waves, fewer than the schedule's " + std::to_string(s.waves()));
  validate_partition(common, int32_t(total));
  std::vector<Group> groups;
  int32_t w = 0;
  for (int32_t size : common) {
    groups.push_back(group_spanning(s, std::min(w, s.waves()), std::min(w + size, s.waves())));
    w += size;
  }
  return groups;
}

void validate_alltoall_ranks(const std::vector<Schedule>& sched_of_rank,
                             const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing) {
  validate_moe_routing(routing);
  validate_alltoall_plan(sched_of_rank, groups_of_rank, routing);
}

void validate_alltoall_plan(const std::vector<Schedule>& sched_of_rank,
                            const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing) {
  const int32_t W = routing.world;
  if (sched_of_rank.size() != size_t(W) || groups_of_rank.size() != size_t(W))
    throw InvalidArgument("all-to-all: " + std::to_string(sched_of_rank.size()) + " schedules and " +
                          std::to_string(groups_of_rank.size()) + " group lists for world " + std::to_string(W));
  const Schedule& first = sched_of_rank[0];
  const size_t G = groups_of_rank[0].size();
  if (G == 0) throw InvalidArgument("all-to-all: no groups (every rank needs the same number, >= 1)");
  for (int32_t r = 0; r < W; ++r) {
    const Schedule& s = sched_of_rank[size_t(r)];
    const std::string at = "all-to-all rank " + std::to_string(r) + ": ";
    const int64_t want = moe_schedule_rows(routing, r, s.bm);
    if (s.m != want)
      throw InvalidArgument(at + "schedule of " + std::to_string(s.m) + " rows, the routing gives it " +
                            std::to_string(want) +
                            (routing.experts > 1 ? " (the tile rows of its " + std::to_string(routing.rows(r)) +
                                                       " rows by expert)"
                                                 : std::string()));
    if (s.n != first.n || s.bm != first.bm || s.bn != first.bn)
      throw InvalidArgument(at + "N " + std::to_string(s.n) + " tile " + std::to_string(s.bm) + "x" +
                            std::to_string(s.bn) + " differ from rank 0's N " + std::to_string(first.n) + " tile " +
                            std::to_string(first.bm) + "x" + std::to_string(first.bn));
    Schedule check = s;
    check.m = std::max(s.m, 1);  // m = 0: an expert without rows
    validate_schedule(check);
    const auto& groups = groups_of_rank[size_t(r)];
    if (groups.size() != G)
      throw InvalidArgument(at + std::to_string(groups.size()) + " groups, rank 0 has " + std::to_string(G));
    for (size_t g = 0, w = 0; g < G; ++g) {
      const Group& x = groups[g];
      if (size_t(x.first_wave) != w || x.end_wave < x.first_wave || x.end_wave > s.waves() ||
          x != group_spanning(s, x.first_wave, x.end_wave))
        throw InvalidArgument(at + "group " + std::to_string(g) + " (waves [" + std::to_string(x.first_wave) +
                              ", " + std::to_string(x.end_wave) + "), tiles [" + std::to_string(x.first_tile) + ", " +
                              std::to_string(x.end_tile) + ")) does not continue at wave " + std::to_string(w) +
                              " within the " + std::to_string(s.waves()) + " waves");
      w = size_t(x.end_wave);
    }
    if (groups.back().end_wave != s.waves())
      throw InvalidArgument(at + "groups end at wave " + std::to_string(groups.back().end_wave) + " of " +
                            std::to_string(s.waves()));
  }
}

namespace {

// Every rank's tile rows: the counts' (made once per call) where given, else
// made into `own`.
const std::vector<GroupedTileRows>& ranks_tile_rows(const MoeRouting& routing, int32_t bm, const MoeRowCounts* counts,
                                                    std::vector<GroupedTileRows>& own) {
  if (counts && counts->bm == bm && counts->tile_rows.size() == size_t(routing.world)) return counts->tile_rows;
  own.clear();
  for (int32_t r = 0; r < routing.world; ++r) own.push_back(moe_tile_rows(routing, r, 1, bm));
  return own;
}

// counts.sum(w0, w1, b) for rank `src`'s waves: rows to destination b (bins:
// world), or only rows to `only` (1 bin) when only >= 0; rows binned by
// their tile row of g (s's tile rows).
WaveCounts dest_counts(const Schedule& s, const GroupedTileRows& g, const std::vector<int32_t>& dest, int32_t world,
                       int32_t only) {
  const int32_t bins = only >= 0 ? 1 : world;
  std::vector<int64_t> per_tile_row(size_t(s.tiles_m()) * bins, 0);
  for (int32_t v = 0; v < g.tile_rows(); ++v)
    for (int32_t row = g.a_row0[size_t(v)]; row < g.a_row0[size_t(v)] + g.rows[size_t(v)]; ++row) {
      const int32_t d = dest[size_t(row)];
      if (only < 0) ++per_tile_row[size_t(v) * bins + d];
      else per_tile_row[size_t(v)] += d == only;
    }
  return WaveCounts(s, bins, per_tile_row);
}

// The map's spans: per group, sends by destination then receives by source
// (map.send_rows, recv_rows: the buffers' sizes).
// With `counts` (count_moe_rows of the schedules' tile height), from them
// rather than from the rows.
void add_spans(SlotMap& map, const std::vector<Schedule>& sched_of_rank,
               const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing,
               const std::vector<GroupedTileRows>& tile_rows, const MoeRowCounts* counts = nullptr) {
  const int32_t W = routing.world, rank = map.rank;
  const Schedule& s = sched_of_rank[size_t(rank)];
  const std::vector<Group>& groups = groups_of_rank[size_t(rank)];
  const size_t G = groups.size();
  const int32_t bn = s.bn;
  auto column = [&](int32_t src) {  // counts[src]'s rows to this rank, per tile row
    const std::vector<int64_t>& c = counts->counts[size_t(src)];
    std::vector<int64_t> out(c.size() / size_t(W));
    for (size_t tm = 0; tm < out.size(); ++tm) out[tm] = c[tm * size_t(W) + size_t(rank)];
    return out;
  };
  const WaveCounts out_counts =
      counts ? WaveCounts(s, W, counts->counts[size_t(rank)])
             : dest_counts(s, tile_rows[size_t(rank)], routing.dest_rank[size_t(rank)], W, -1);
  std::vector<WaveCounts> in_counts;
  for (int32_t src = 0; src < W; ++src)
    in_counts.push_back(counts ? WaveCounts(sched_of_rank[size_t(src)], 1, column(src))
                               : dest_counts(sched_of_rank[size_t(src)], tile_rows[size_t(src)],
                                             routing.dest_rank[size_t(src)], W, rank));
  for (size_t g = 0; g < G; ++g) {
    const Group& x = groups[g];
    GroupCall call{x.first_tile, x.end_tile, {map.send_rows * bn, 0}, {map.recv_rows * bn, 0}, {}, {}};
    for (int32_t peer = 0; peer < W; ++peer) {
      const Group& y = groups_of_rank[size_t(peer)][g];
      const int64_t out = out_counts.sum(x.first_wave, x.end_wave, peer);
      const int64_t in = in_counts[size_t(peer)].sum(y.first_wave, y.end_wave, 0);
      call.send_to.push_back(Span{map.send_rows * bn, out * bn});
      call.recv_from.push_back(Span{map.recv_rows * bn, in * bn});
      map.send_rows += out;
      map.recv_rows += in;
    }
    call.send.count = map.send_rows * bn - call.send.offset;
    call.recv.count = map.recv_rows * bn - call.recv.offset;
    map.groups.push_back(std::move(call));
  }

}

}  // namespace

SlotMap make_alltoall_map(const std::vector<Schedule>& sched_of_rank,
                          const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing,
                          int32_t rank) {
  const int32_t W = routing.world;
  if (W >= 1 && (rank < 0 || rank >= W))
    throw InvalidArgument("rank " + std::to_string(rank) + " out of range for world size " + std::to_string(W));
  validate_alltoall_ranks(sched_of_rank, groups_of_rank, routing);
  const Schedule& s = sched_of_rank[size_t(rank)];
  const std::vector<Group>& groups = groups_of_rank[size_t(rank)];
  const size_t G = groups.size();
  const int32_t bn = s.bn;
  SlotMap map = slot_map_base(Collective::AllToAll, s, W, rank);
  std::vector<GroupedTileRows> own;
  const std::vector<GroupedTileRows>& tile_rows = ranks_tile_rows(routing, s.bm, nullptr, own);

  add_spans(map, sched_of_rank, groups_of_rank, routing, tile_rows);

  // Send side: this rank's rows by destination; place_rows_by_bucket's row
  // tm * bm + r is row r of tile row tm, A's row a_row0[tm] + r unless idle.
  const auto& my_dest = routing.dest_rank[size_t(rank)];
  const GroupedTileRows& mine_g = tile_rows[size_t(rank)];
  auto dest_of = [&](int32_t row) {
    const int32_t v = row / s.bm, r = row - v * s.bm;
    return r < mine_g.rows[size_t(v)] ? my_dest[size_t(mine_g.a_row0[size_t(v)] + r)] : -1;
  };
  for (size_t g = 0; g < G; ++g) {
    std::vector<int64_t> starts;
    for (const Span& to : map.groups[g].send_to) starts.push_back(to.offset / bn);
    place_rows_by_bucket(s, groups[g], dest_of, starts,
                         [&](int32_t, int32_t idx, TileCoord, int32_t r, int64_t slot) {
                           map.row_of[size_t(idx) * s.bm + r] = int32_t(slot);
                         });
  }

  // Receive side, one source at a time, with its schedule and groups. Its
  // rows to this rank, in row order, are its block of the output; the rows of
  // its tile row tm among them are mine[first[tm] .. first[tm+1]), received
  // in its (tile, row) order.
  map.target_of_slot.resize(size_t(map.recv_rows));
  std::vector<int32_t> mine, first;
  for (int32_t src = 0; src < W; ++src) {
    const Schedule& ss = sched_of_rank[size_t(src)];
    const GroupedTileRows& sg = tile_rows[size_t(src)];
    const auto& dest = routing.dest_rank[size_t(src)];
    mine.clear();
    first.assign(size_t(ss.tiles_m()) + 1, 0);
    for (int32_t tm = 0; tm < ss.tiles_m(); ++tm) {
      first[size_t(tm)] = int32_t(mine.size());
      for (int32_t row = sg.a_row0[size_t(tm)]; row < sg.a_row0[size_t(tm)] + sg.rows[size_t(tm)]; ++row)
        if (dest[size_t(row)] == rank) mine.push_back(row);
    }
    first[size_t(ss.tiles_m())] = int32_t(mine.size());
    for (size_t g = 0; g < G; ++g) {
      const Group& y = groups_of_rank[size_t(src)][g];
      int64_t slot = map.groups[g].recv_from[size_t(src)].offset / bn;
      for (int32_t idx = y.first_tile; idx < y.end_tile; ++idx) {
        const TileCoord t = ss.tile_of(idx);
        for (int32_t i = first[size_t(t.tm)]; i < first[size_t(t.tm) + 1]; ++i)
          map.target_of_slot[size_t(slot++)] = SlotTarget{int32_t(map.out_rows + i), t.tn};
      }
    }
    map.out_rows += int64_t(mine.size());
  }
  finish_slot_map(map);
  return map;
}

AllToAllTables make_alltoall_tables(const std::vector<Schedule>& sched_of_rank,
                                    const std::vector<std::vector<Group>>& groups_of_rank, const MoeRouting& routing,
                                    int32_t rank, const MoeRowCounts* counts) {
  const int32_t W = routing.world;
  if (W >= 1 && (rank < 0 || rank >= W))
    throw InvalidArgument("rank " + std::to_string(rank) + " out of range for world size " + std::to_string(W));
  validate_alltoall_plan(sched_of_rank, groups_of_rank, routing);  // (the routing: the caller's to validate)
  const Schedule& s = sched_of_rank[size_t(rank)];
  SlotMap spans;  // (its spans only)
  spans.op = Collective::AllToAll, spans.world = W, spans.rank = rank;
  if (counts && (counts->bm != s.bm || counts->counts.size() != size_t(W)))
    throw InvalidArgument("all-to-all tables: row counts of " + std::to_string(counts->bm) + "-row tiles for " +
                          std::to_string(counts->counts.size()) + " ranks, the schedules' tiles are " +
                          std::to_string(s.bm) + " rows and the ranks " + std::to_string(W));
  std::vector<GroupedTileRows> own;
  const std::vector<GroupedTileRows>& tile_rows = ranks_tile_rows(routing, s.bm, counts, own);
  add_spans(spans, sched_of_rank, groups_of_rank, routing, tile_rows, counts);
  if (spans.send_rows > INT32_MAX || spans.recv_rows > INT32_MAX)
    throw InvalidArgument("all-to-all rank " + std::to_string(rank) + ": " + std::to_string(spans.send_rows) +
                          " send and " + std::to_string(spans.recv_rows) + " receive slot rows, more than int32 "
                          "row indices address");
  AllToAllTables t;
  t.world = W, t.rank = rank, t.bm = s.bm, t.bn = s.bn, t.tiles_n = s.tiles_n(), t.n = s.n, t.m = routing.rows(rank);
  t.groups = std::move(spans.groups);
  t.send_rows = spans.send_rows, t.recv_rows = spans.recv_rows;

  // Send side: per tile row its rows by destination, each row's rank among them.
  const GroupedTileRows& g_mine = tile_rows[size_t(rank)];
  if (routing.experts > 1) t.a_row0 = g_mine.a_row0, t.rows_of = g_mine.rows;
  const auto& dest = routing.dest_rank[size_t(rank)];
  t.dest = dest;
  t.rrank.resize(dest.size());
  std::vector<int32_t> per_tm(size_t(s.tiles_m()) * W, 0);
  for (int32_t v = 0; v < g_mine.tile_rows(); ++v)
    for (int32_t row = g_mine.a_row0[size_t(v)]; row < g_mine.a_row0[size_t(v)] + g_mine.rows[size_t(v)]; ++row)
      t.rrank[size_t(row)] = per_tm[size_t(v) * W + dest[size_t(row)]]++;
  t.tm_of.resize(size_t(s.tiles()));
  t.sbase.resize(size_t(s.tiles()) * W);
  const auto& groups = groups_of_rank[size_t(rank)];
  std::vector<int64_t> next(static_cast<size_t>(W));
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int32_t d = 0; d < W; ++d) next[size_t(d)] = t.groups[g].send_to[size_t(d)].offset / s.bn;
    for (int32_t idx = groups[g].first_tile; idx < groups[g].end_tile; ++idx) {
      const int32_t tm = s.tile_of(idx).tm;
      t.tm_of[size_t(idx)] = tm;
      for (int32_t d = 0; d < W; ++d) {
        t.sbase[size_t(idx) * W + d] = int32_t(next[size_t(d)]);
        next[size_t(d)] += per_tm[size_t(tm) * W + d];
      }
    }
  }

  // Receive side, one source at a time: for each of its tiles (tm, cb), the
  // slot of its first row to this rank less that row's output index.
  int64_t tm_base = 0;
  std::vector<int32_t> first;
  for (int32_t src = 0; src < W; ++src) {
    const Schedule& ss = sched_of_rank[size_t(src)];
    const GroupedTileRows& sg = tile_rows[size_t(src)];
    const auto& sd = routing.dest_rank[size_t(src)];
    first.assign(size_t(ss.tiles_m()) + 1, 0);
    int32_t mine = 0;
    for (int32_t tm = 0; tm < ss.tiles_m(); ++tm) {
      first[size_t(tm)] = mine;
      if (counts) {  // (this tile row's rows to this rank, without reading them)
        const int64_t c = counts->counts[size_t(src)][size_t(tm) * W + rank];
        t.rkey.insert(t.rkey.end(), size_t(c), int32_t((tm_base + tm) * t.tiles_n));
        mine += int32_t(c);
        continue;
      }
      for (int32_t row = sg.a_row0[size_t(tm)]; row < sg.a_row0[size_t(tm)] + sg.rows[size_t(tm)]; ++row)
        if (sd[size_t(row)] == rank) {
          t.rkey.push_back(int32_t((tm_base + tm) * t.tiles_n));
          ++mine;
        }
    }
    first[size_t(ss.tiles_m())] = mine;
    t.rtab.resize(size_t(tm_base + ss.tiles_m()) * t.tiles_n);
    for (size_t g = 0; g < groups_of_rank[size_t(src)].size(); ++g) {
      const Group& y = groups_of_rank[size_t(src)][g];
      int64_t slot = t.groups[g].recv_from[size_t(src)].offset / s.bn;
      for (int32_t idx = y.first_tile; idx < y.end_tile; ++idx) {
        const TileCoord c = ss.tile_of(idx);
        t.rtab[size_t(tm_base + c.tm) * t.tiles_n + c.tn] = int32_t(slot - (t.out_rows + first[size_t(c.tm)]));
        slot += first[size_t(c.tm) + 1] - first[size_t(c.tm)];
      }
    }
    t.out_rows += mine;
    tm_base += ss.tiles_m();
  }
  return t;
}

std::vector<int32_t> expand_row_of(const AllToAllTables& t) {
  std::vector<int32_t> row_of(size_t(t.tiles()) * t.bm, -1);
  const bool grouped = !t.a_row0.empty();
  for (int32_t idx = 0; idx < t.tiles(); ++idx) {
    const int32_t tm = t.tm_of[size_t(idx)];
    for (int32_t r = 0; r < t.bm; ++r) {
      const int64_t row = grouped ? int64_t{t.a_row0[size_t(tm)]} + r : int64_t{tm} * t.bm + r;
      if (grouped ? r < t.rows_of[size_t(tm)] : row < t.m)
        row_of[size_t(idx) * t.bm + r] = t.sbase[size_t(idx) * t.world + t.dest[size_t(row)]] + t.rrank[size_t(row)];
    }
  }
  return row_of;
}

std::vector<int32_t> expand_slot_of_out(const AllToAllTables& t) {
  std::vector<int32_t> slot(size_t(t.out_rows) * t.tiles_n);
  for (int64_t i = 0; i < t.out_rows; ++i)
    for (int32_t cb = 0; cb < t.tiles_n; ++cb)
      slot[size_t(i) * t.tiles_n + cb] = t.rtab[size_t(t.rkey[size_t(i)]) + cb] + int32_t(i);
  return slot;
}

CombineTable make_combine_table(const MoeRouting& routing, int32_t rank) {
  CombineTable t;
  fill_combine_table(routing, rank, t);
  return t;
}

void fill_combine_table(const MoeRouting& routing, int32_t rank, CombineTable& t) {
  const int32_t W = routing.world;  // (the routing: the caller's to validate)
  if (rank < 0 || rank >= W)
    throw InvalidArgument("rank " + std::to_string(rank) + " out of range for world size " + std::to_string(W));
  t.src_rank.clear(), t.src_row.clear(), t.token.clear(), t.gate.clear();
  t.rank = rank;
  t.tokens = routing.tokens[size_t(rank)];
  int64_t rows = 0;
  for (int32_t src = 0; src < W; ++src) rows += routing.send_count(src, rank);
  if (rows > std::numeric_limits<int32_t>::max())
    throw InvalidArgument("combine: rank " + std::to_string(rank) + " receives " + std::to_string(rows) +
                          " rows, more than int32 row indices address");
  for (auto* v : {&t.src_rank, &t.src_row, &t.token}) v->reserve(size_t(rows));
  t.gate.reserve(size_t(rows));
  for (int32_t src = 0; src < W; ++src) {
    const auto& dest = routing.dest_rank[size_t(src)];
    for (size_t i = 0; i < dest.size(); ++i)
      if (dest[i] == rank) {
        t.src_rank.push_back(src);
        t.src_row.push_back(int32_t(i));
        t.token.push_back(routing.dest_token[size_t(src)][i]);
        t.gate.push_back(routing.gate[size_t(src)][i]);
      }
  }
  // Counting sort by token, stable: each token's rows stay in output row order.
  t.token_begin.assign(size_t(t.tokens) + 1, 0);
  for (int32_t x : t.token) ++t.token_begin[size_t(x) + 1];
  for (int32_t x = 0; x < t.tokens; ++x) t.token_begin[size_t(x) + 1] += t.token_begin[size_t(x)];
  t.token_rows.resize(t.token.size());
  // (the placement counters: token_begin shifted by one, restored after)
  for (size_t row = 0; row < t.token.size(); ++row)
    t.token_rows[size_t(t.token_begin[size_t(t.token[row])]++)] = int32_t(row);
  for (int32_t x = t.tokens; x > 0; --x) t.token_begin[size_t(x)] = t.token_begin[size_t(x) - 1];
  t.token_begin[0] = 0;
}

}  // namespace flashoverlap::plan
