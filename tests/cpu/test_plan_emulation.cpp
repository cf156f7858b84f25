// CPU emulation of a whole overlapped call for every collective: each rank's
// GEMM writes its tiles into send slots through row_of (zeros past M/N, the
// rest of the buffer poisoned), the collective runs group by group on exactly
// the spans of the map, the reference post-reorder produces the output, which
// must equal the collective's reference semantics exactly (integer data).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "flashoverlap/error.h"
#include "plan/slot_map_allreduce.h"
#include "plan/slot_map_alltoall.h"
#include "plan/slot_map_reducescatter.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;
using Buffer = std::vector<int64_t>;

namespace {

constexpr int kCases = 200;
constexpr int64_t kMaxElemsPerRank = 60000;

Buffer random_buffer(std::mt19937_64& rng, int64_t size) {
  Buffer b(size_t(std::max<int64_t>(size, 0)));
  for (auto& v : b) v = int64_t(rng() >> 24) - (int64_t(1) << 39);  // |v| < 2^40: sums of 8 fit
  return b;
}

// Structural invariants of one rank's map.
void check_structure(const fo::SlotMap& map, const fo::Schedule& s, const std::vector<fo::Group>& groups) {
  ASSERT_EQ(map.row_of.size(), size_t(s.tiles()) * s.bm);
  ASSERT_EQ(map.groups.size(), groups.size());
  ASSERT_EQ(map.target_of_slot.size(), size_t(map.recv_rows));
  int64_t send_at = 0, recv_at = 0;
  std::vector<char> used(size_t(map.send_rows), 0);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const fo::GroupCall& call = map.groups[gi];
    EXPECT_EQ(call.first_tile, groups[gi].first_tile);
    EXPECT_EQ(call.end_tile, groups[gi].end_tile);
    // Groups tile each buffer in order, contiguously, without overlap, in whole slot rows.
    EXPECT_EQ(call.send.offset, send_at) << "group " << gi;
    EXPECT_EQ(call.recv.offset, recv_at) << "group " << gi;
    EXPECT_EQ(call.send.count % map.bn, 0);
    EXPECT_EQ(call.recv.count % map.bn, 0);
    send_at = call.send.end();
    recv_at = call.recv.end();
    if (map.op == fo::Collective::AllToAll) {  // per-peer spans tile the group's span in peer order
      ASSERT_EQ(call.send_to.size(), size_t(map.world));
      ASSERT_EQ(call.recv_from.size(), size_t(map.world));
      int64_t s_at = call.send.offset, r_at = call.recv.offset;
      for (int32_t p = 0; p < map.world; ++p) {
        EXPECT_EQ(call.send_to[p].offset, s_at);
        EXPECT_EQ(call.recv_from[p].offset, r_at);
        s_at = call.send_to[p].end();
        r_at = call.recv_from[p].end();
      }
      EXPECT_EQ(s_at, call.send.end());
      EXPECT_EQ(r_at, call.recv.end());
    }
    if (map.op == fo::Collective::ReduceScatter) {
      EXPECT_EQ(call.send.count, map.world * call.recv.count);
    }
    if (map.op == fo::Collective::AllReduce) {
      EXPECT_EQ(call.send, call.recv);
    }
    // Every stored row of the group's tiles lies in the group's send span, once.
    for (int32_t idx = call.first_tile; idx < call.end_tile; ++idx)
      for (int32_t r = 0; r < s.bm; ++r) {
        const int32_t slot = map.slot_row(idx, r);
        if (slot < 0) {
          EXPECT_GE(s.tile_of(idx).tm * s.bm + r, s.m) << "a row inside M is not stored";
          continue;
        }
        ASSERT_GE(int64_t{slot} * map.bn, call.send.offset) << "tile " << idx << " row " << r;
        ASSERT_LE(int64_t{slot + 1} * map.bn, call.send.end()) << "tile " << idx << " row " << r;
        ASSERT_FALSE(used[size_t(slot)]) << "slot row " << slot << " written twice";
        used[size_t(slot)] = 1;
        if (map.op == fo::Collective::AllReduce) {
          EXPECT_EQ(slot, idx * s.bm + r);  // the kernel's fast path
        }
      }
  }
  EXPECT_EQ(send_at, map.send_elements());
  EXPECT_EQ(recv_at, map.recv_elements());
  // Send slots nothing writes are exactly the padding (none but in the standard RS layout).
  EXPECT_EQ(map.padding_rows, int64_t(std::count(used.begin(), used.end(), 0))) << "padding rows miscounted";
  // The two inverses agree.
  ASSERT_EQ(map.slot_of_out.size(), size_t(map.out_rows) * map.tiles_n);
  for (size_t slot = 0; slot < map.target_of_slot.size(); ++slot) {
    const fo::SlotTarget t = map.target_of_slot[slot];
    if (t.row >= 0) {
      EXPECT_EQ(map.slot_of_out[size_t(t.row) * map.tiles_n + t.col_block], int32_t(slot));
    }
  }
}

// Each rank's GEMM output C_r stored into its send buffer; unwritten slots poisoned.
Buffer gemm_into_slots(std::mt19937_64& rng, const fo::SlotMap& map, const fo::Schedule& s, const Buffer& c) {
  Buffer send = random_buffer(rng, map.send_elements());
  for (int32_t idx = 0; idx < s.tiles(); ++idx) {
    const fo::TileCoord t = s.tile_of(idx);
    for (int32_t r = 0; r < s.bm; ++r) {
      const int32_t slot = map.slot_row(idx, r);
      if (slot < 0) continue;
      const int64_t row = int64_t{t.tm} * s.bm + r;
      for (int32_t col = 0; col < s.bn; ++col) {
        const int64_t gc = int64_t{t.tn} * s.bn + col;
        send[size_t(slot) * s.bn + col] = row < s.m && gc < s.n ? c[size_t(row * s.n + gc)] : 0;
      }
    }
  }
  return send;
}

Buffer post_reorder(std::mt19937_64& rng, const fo::SlotMap& map, const Buffer& recv) {
  Buffer out = random_buffer(rng, map.out_rows * map.n);
  fo::post_reorder(map, recv.data(), out.data());
  return out;
}

struct World {
  fo::Schedule s;
  std::vector<fo::Group> groups;
  int32_t W = 1;
  std::vector<Buffer> c;  // each rank's GEMM output, M x N
  std::string what;
};

World random_world(std::mt19937_64& rng, int32_t W, fo::Schedule s) {
  World w{s, fo::make_groups(s, fo_test::random_partition(rng, s.waves())), W, {}, fo_test::describe(s)};
  for (int32_t r = 0; r < W; ++r) w.c.push_back(random_buffer(rng, int64_t{s.m} * s.n));
  w.what += " world=" + std::to_string(W) + " groups=" + std::to_string(w.groups.size());
  return w;
}

Buffer sum_rows(const World& w, const std::vector<int32_t>& rows) {
  Buffer out;
  for (int32_t row : rows)
    for (int64_t col = 0; col < w.s.n; ++col) {
      int64_t v = 0;
      for (const Buffer& c : w.c) v += c[size_t(row * w.s.n + col)];
      out.push_back(v);
    }
  return out;
}

}  // namespace

TEST(PlanEmulation, AllReduceEqualsSumOfAllRanks) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < kCases; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 8));
    World w = random_world(rng, W, fo_test::random_schedule(rng, fo_test::random_tile(rng), kMaxElemsPerRank));
    SCOPED_TRACE(w.what);
    const fo::SlotMap map = fo::make_allreduce_map(w.s, w.groups, W);
    check_structure(map, w.s, w.groups);
    if (HasFatalFailure()) return;
    std::vector<Buffer> send;
    for (int32_t r = 0; r < W; ++r) send.push_back(gemm_into_slots(rng, map, w.s, w.c[r]));
    std::vector<Buffer> recv = send;  // in place
    for (const fo::GroupCall& g : map.groups)
      for (int64_t e = g.send.offset; e < g.send.end(); ++e) {
        int64_t v = 0;
        for (const Buffer& b : send) v += b[size_t(e)];
        for (Buffer& b : recv) b[size_t(e)] = v;
      }
    std::vector<int32_t> all(size_t(w.s.m));
    for (int32_t i = 0; i < w.s.m; ++i) all[i] = i;
    const Buffer expect = sum_rows(w, all);
    for (int32_t r = 0; r < W; ++r) ASSERT_EQ(post_reorder(rng, map, recv[r]), expect) << "rank " << r;
  }
}

TEST(PlanEmulation, ReduceScatterGivesEachRankItsRowsSummed) {
  FO_SEEDED_RNG(rng);
  int tested[2] = {0, 0}, refused = 0;
  for (int it = 0; it < kCases; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 8));
    fo::Schedule s = fo_test::random_schedule(rng, fo_test::random_tile(rng), kMaxElemsPerRank);
    if (uniform(rng, 0, 1) && s.m % W) s = fo::make_schedule(s.m + W - s.m % W, s.n, {s.bm, s.bn}, s.ctas, s.raster, s.swizzle);
    std::vector<fo::RsLayout> layouts;
    for (fo::RsLayout l : {fo::RsLayout::SubTile, fo::RsLayout::Standard})
      if (fo::rs_layout_applies(s, W, l)) layouts.push_back(l);
    if (layouts.empty()) {
      EXPECT_THROW(fo::make_reducescatter_map(s, fo::make_groups(s, {s.waves()}), W, 0, fo::RsLayout::SubTile),
                   flashoverlap::InvalidArgument);
      ++refused;
      continue;
    }
    const fo::RsLayout layout = layouts[uniform(rng, 0, layouts.size() - 1)];
    ++tested[int(layout)];
    World w = random_world(rng, W, s);
    SCOPED_TRACE(w.what + " layout=" + std::string(fo::to_string(layout)));
    std::vector<fo::SlotMap> maps;
    std::vector<Buffer> send, recv;
    for (int32_t k = 0; k < W; ++k) {
      maps.push_back(fo::make_reducescatter_map(s, w.groups, W, k, layout));
      check_structure(maps[k], s, w.groups);
      if (HasFatalFailure()) return;
      ASSERT_EQ(maps[k].row_of, maps[0].row_of) << "send layout differs between ranks";
      send.push_back(gemm_into_slots(rng, maps[k], s, w.c[k]));
      recv.push_back(random_buffer(rng, maps[k].recv_elements()));
    }
    for (size_t g = 0; g < w.groups.size(); ++g) {
      const fo::GroupCall& call = maps[0].groups[g];
      for (int32_t k = 0; k < W; ++k) {
        ASSERT_EQ(maps[k].groups[g].send, call.send);
        ASSERT_EQ(maps[k].groups[g].recv.count, call.recv.count);
        for (int64_t e = 0; e < call.recv.count; ++e) {
          int64_t v = 0;
          for (const Buffer& b : send) v += b[size_t(call.send.offset + k * call.recv.count + e)];
          recv[k][size_t(maps[k].groups[g].recv.offset + e)] = v;
        }
      }
    }
    // Which rows each rank holds, from the definition of the layout.
    std::vector<int32_t> owner(size_t(s.m), -1);
    for (int32_t k = 0; k < W; ++k) {
      std::vector<int32_t> rows;
      for (int32_t row = 0; row < s.m; ++row) {
        const bool mine = layout == fo::RsLayout::Standard ? row / (s.m / W) == k : (row % s.bm) / (s.bm / W) == k;
        if (mine) rows.push_back(row);
      }
      ASSERT_EQ(fo::rs_rows_of_rank(s, W, k, layout), rows);
      ASSERT_EQ(maps[k].out_rows, int64_t(rows.size()));
      ASSERT_EQ(post_reorder(rng, maps[k], recv[k]), sum_rows(w, rows)) << "rank " << k;
      for (int32_t row : rows) owner[row] = k;
    }
    EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << "a row is held by no rank";
  }
  EXPECT_GT(tested[0], kCases / 10);
  EXPECT_GT(tested[1], kCases / 10);
  EXPECT_GT(refused, kCases / 20);  // (~22% of the cases: the refusal is tested too)
}

TEST(PlanEmulation, AllToAllMatchesSortedAllToAllSingle) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < kCases; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 8));
    World w = random_world(rng, W, fo_test::random_schedule(rng, fo_test::random_tile(rng), kMaxElemsPerRank));
    const fo::Schedule& s = w.s;
    static const char* kinds[] = {"uniform", "skewed", "empty", "one", "mixed"};
    const std::string kind = kinds[uniform(rng, 0, 4)];
    fo::Routing routing = fo::make_routing(kind == "skewed" ? "skewed" : "uniform", W, s.m, rng());
    if (kind == "empty" && W >= 2) routing = fo::make_routing("empty:" + std::to_string(uniform(rng, 0, W - 1)), W, s.m, rng());
    if (kind == "one")  // everything to one rank: every other rank receives nothing
      for (auto& d : routing.dest) std::fill(d.begin(), d.end(), int32_t(uniform(rng, 0, W - 1)));
    if (kind == "mixed")  // each source its own skew
      for (auto& d : routing.dest)
        for (auto& x : d) x = uniform(rng, 0, 3) ? int32_t(uniform(rng, 0, W - 1)) : x;
    SCOPED_TRACE(w.what + " routing=" + kind);
    std::vector<fo::SlotMap> maps;
    std::vector<Buffer> send, recv;
    for (int32_t k = 0; k < W; ++k) {
      maps.push_back(fo::make_alltoall_map(s, w.groups, routing, k));
      check_structure(maps[k], s, w.groups);
      if (HasFatalFailure()) return;
      send.push_back(gemm_into_slots(rng, maps[k], s, w.c[k]));
      recv.push_back(random_buffer(rng, maps[k].recv_elements()));
    }
    for (size_t g = 0; g < w.groups.size(); ++g)
      for (int32_t src = 0; src < W; ++src)
        for (int32_t dst = 0; dst < W; ++dst) {
          const fo::Span from = maps[src].groups[g].send_to[dst], to = maps[dst].groups[g].recv_from[src];
          ASSERT_EQ(from.count, to.count) << "group " << g << " " << src << "->" << dst;
          std::copy_n(send[src].begin() + from.offset, from.count, recv[dst].begin() + to.offset);
        }
    for (int32_t k = 0; k < W; ++k) {
      Buffer expect;
      for (int32_t src = 0; src < W; ++src)
        for (int64_t row = 0; row < s.m; ++row)
          if (routing.dest[src][row] == k)
            expect.insert(expect.end(), w.c[src].begin() + row * s.n, w.c[src].begin() + (row + 1) * s.n);
      ASSERT_EQ(post_reorder(rng, maps[k], recv[k]), expect) << "rank " << k;
    }
  }
}
