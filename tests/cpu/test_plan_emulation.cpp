// CPU emulation of a whole overlapped call for every collective: each rank's
// GEMM writes its tiles into send slots through row_of (zeros past M/N, the
// rest of the buffer poisoned), the collective runs group by group on exactly
// the spans of the map, the reference post-reorder produces the output, which
// must equal the collective's reference semantics exactly (integer data).
// The MoE combine (All-to-All with every rank its own rows and schedule) also
// runs the fused combine from the tables, bitwise against a direct fp32 sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

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

// bfloat16 for the combine's one rounding (round to nearest even; finite values).
struct Bf16 {
  uint16_t bits = 0;
  Bf16() = default;
  explicit Bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  explicit operator float() const {
    const uint32_t u = uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  friend bool operator==(Bf16, Bf16) = default;
};

template <class V>
std::vector<V> random_values(std::mt19937_64& rng, int64_t size) {
  std::vector<V> b(size_t(std::max<int64_t>(size, 0)));
  for (auto& v : b) {
    if constexpr (std::is_same_v<V, int64_t>) {
      v = int64_t(rng() >> 24) - (int64_t(1) << 39);  // |v| < 2^40: sums of 8 fit
    } else {  // in [-4, 4), 24 random bits
      v = V(float(int64_t(rng() >> 40) - (int64_t(1) << 23)) * 0x1p-21f);
    }
  }
  return b;
}

Buffer random_buffer(std::mt19937_64& rng, int64_t size) { return random_values<int64_t>(rng, size); }

// Bitwise equality (floats: -0 and NaN too), with the first difference.
template <class V>
::testing::AssertionResult same_bits(const std::vector<V>& got, const std::vector<V>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(V)) != 0)
      return ::testing::AssertionFailure() << "element " << i << " differs: " << double(float(got[i])) << " vs "
                                           << double(float(want[i]));
  return ::testing::AssertionSuccess();
}

// Structural invariants of one rank's map.
// rows_of (several experts): the rows of each tile row that are stored, the
// rest idle; else every row inside M.
void check_structure(const fo::SlotMap& map, const fo::Schedule& s, const std::vector<fo::Group>& groups,
                     const std::vector<int32_t>* rows_of = nullptr) {
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
          if (rows_of) EXPECT_GE(r, (*rows_of)[size_t(s.tile_of(idx).tm)]) << "a row of a segment is not stored";
          else EXPECT_GE(s.tile_of(idx).tm * s.bm + r, s.m) << "a row inside M is not stored";
          continue;
        }
        if (rows_of) EXPECT_LT(r, (*rows_of)[size_t(s.tile_of(idx).tm)]) << "an idle row is stored";
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

// Each rank's GEMM output C_r stored into its send buffer; unwritten slots
// poisoned. a_row0 (several experts): row r of tile row tm is C's row
// a_row0[tm] + r (C has rows, not s.m, rows).
template <class V>
std::vector<V> gemm_into_slots(std::mt19937_64& rng, const fo::SlotMap& map, const fo::Schedule& s,
                               const std::vector<V>& c, const std::vector<int32_t>* a_row0 = nullptr) {
  std::vector<V> send = random_values<V>(rng, map.send_elements());
  for (int32_t idx = 0; idx < s.tiles(); ++idx) {
    const fo::TileCoord t = s.tile_of(idx);
    for (int32_t r = 0; r < s.bm; ++r) {
      const int32_t slot = map.slot_row(idx, r);
      if (slot < 0) continue;
      const int64_t row = a_row0 ? int64_t{(*a_row0)[size_t(t.tm)]} + r : int64_t{t.tm} * s.bm + r;
      for (int32_t col = 0; col < s.bn; ++col) {
        const int64_t gc = int64_t{t.tn} * s.bn + col;
        send[size_t(slot) * s.bn + col] = (a_row0 || row < s.m) && gc < s.n ? c[size_t(row * s.n + gc)] : V{};
      }
    }
  }
  return send;
}

template <class V>
std::vector<V> post_reorder(std::mt19937_64& rng, const fo::SlotMap& map, const std::vector<V>& recv) {
  std::vector<V> out = random_values<V>(rng, map.out_rows * map.n);
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

namespace {

// Destinations alone as a combine that changes nothing: every row a token of
// its own at its destination (numbered in (source rank, row) order), gate 1.
fo::MoeRouting one_row_tokens(int32_t W, const std::vector<std::vector<int32_t>>& dest) {
  fo::MoeRouting r;
  r.world = W;
  r.tokens.assign(size_t(W), 0);
  r.dest_rank = dest;
  r.dest_token.resize(size_t(W));
  r.gate.resize(size_t(W));
  for (int32_t src = 0; src < W; ++src) {
    for (int32_t d : dest[size_t(src)]) r.dest_token[size_t(src)].push_back(r.tokens[size_t(d)]++);
    r.gate[size_t(src)].assign(dest[size_t(src)].size(), 1.0f);
  }
  r.send_counts = fo::moe_send_counts(r);
  return r;
}

}  // namespace

// A regular all-to-all: every rank the same m, schedule and groups (of any
// raster and swizzle, not the MoE's own), rows to destinations in any order
// through the per-rank maps. With one-row tokens of gate 1 the combine is
// the unweighted output, bit for bit.
TEST(PlanEmulation, AllToAllMatchesSortedAllToAllSingle) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < kCases; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 8));
    World w = random_world(rng, W, fo_test::random_schedule(rng, fo_test::random_tile(rng), kMaxElemsPerRank));
    const fo::Schedule& s = w.s;
    static const char* kinds[] = {"uniform", "skewed", "empty", "one", "mixed"};
    const std::string kind = kinds[uniform(rng, 0, 4)];
    const int32_t empty = kind == "empty" && W >= 2 ? int32_t(uniform(rng, 0, W - 1)) : -1;
    const int32_t one = int32_t(uniform(rng, 0, W - 1));
    std::vector<std::vector<int32_t>> dest(size_t(W), std::vector<int32_t>(size_t(s.m)));
    for (auto& row_dest : dest) {
      const int32_t skew = int32_t(uniform(rng, 0, W - 1));  // "mixed": each source its own
      for (int32_t& d : row_dest) {
        d = int32_t(uniform(rng, 0, W - 1));
        if (kind == "skewed" && uniform(rng, 0, 1)) d = 0;
        if (empty >= 0) d = d == empty ? (d + 1) % W : d;  // rank `empty` receives nothing
        if (kind == "one") d = one;  // every other rank receives nothing
        if (kind == "mixed" && uniform(rng, 0, 3) == 0) d = skew;
      }
    }
    const fo::MoeRouting routing = one_row_tokens(W, dest);
    const std::vector<fo::Schedule> sched(size_t(W), s);
    const std::vector<std::vector<fo::Group>> groups(size_t(W), w.groups);
    SCOPED_TRACE(w.what + " routing=" + kind);
    std::vector<fo::SlotMap> maps;
    std::vector<Buffer> send, recv;
    for (int32_t k = 0; k < W; ++k) {
      maps.push_back(fo::make_alltoall_map(sched, groups, routing, k));
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
          if (dest[src][row] == k)
            expect.insert(expect.end(), w.c[src].begin() + row * s.n, w.c[src].begin() + (row + 1) * s.n);
      ASSERT_EQ(post_reorder(rng, maps[k], recv[k]), expect) << "rank " << k;
      if (empty >= 0 && k == empty) EXPECT_EQ(maps[k].out_rows, 0);
      if (it % 4) continue;  // (the combine of one-row tokens: a quarter of the cases)
      const fo::CombineTable table = fo::make_combine_table(routing, k);
      ASSERT_EQ(table.tokens, maps[k].out_rows);
      const std::vector<float> fr = random_values<float>(rng, maps[k].recv_elements());
      std::vector<float> out(size_t(maps[k].out_rows * maps[k].n)), rows = out;
      fo::post_reorder(maps[k], fr.data(), rows.data());
      fo::combine_reference(maps[k], table, fr.data(), out.data());
      ASSERT_TRUE(same_bits(out, rows)) << "rank " << k;
    }
  }
}

// ---------------------------------------------------------------------------
// MoE combine: All-to-All with per-rank schedules, then the fused combine.

namespace {

constexpr int64_t kMoeElems = 150000;  // rows x N over all ranks, per case

// A routing no dispatch produces: each rank its own token count (0 allowed),
// tokens no row goes to (whole ranks of them too), rows in any order, several
// rows of one token from one rank, any finite gate.
fo::MoeRouting arbitrary_moe_routing(std::mt19937_64& rng, int32_t W, int64_t max_rows) {
  fo::MoeRouting r;
  r.world = W;
  std::vector<int32_t> targets;
  for (int32_t d = 0; d < W; ++d) {
    r.tokens.push_back(uniform(rng, 0, 3) ? int32_t(uniform(rng, 1, 40)) : 0);
    if (r.tokens.back() > 0 && uniform(rng, 0, 2)) targets.push_back(d);
  }
  r.dest_rank.resize(size_t(W));
  r.dest_token.resize(size_t(W));
  r.gate.resize(size_t(W));
  for (int32_t src = 0; src < W; ++src) {
    const int64_t m = targets.empty() || uniform(rng, 0, 3) == 0 ? 0 : uniform(rng, 0, max_rows);
    for (int64_t i = 0; i < m; ++i) {
      const int32_t d = targets[size_t(uniform(rng, 0, int64_t(targets.size()) - 1))];
      r.dest_rank[size_t(src)].push_back(d);
      r.dest_token[size_t(src)].push_back(int32_t(uniform(rng, 0, r.tokens[size_t(d)] - 1)));
      r.gate[size_t(src)].push_back(float(uniform(rng, -(1 << 20), 1 << 20)) * 0x1p-20f);
    }
  }
  r.send_counts = fo::moe_send_counts(r);
  return r;
}

struct MoeCase {
  fo::MoeRouting routing;
  std::vector<fo::Schedule> sched;
  std::vector<std::vector<fo::Group>> groups;
  int64_t n = 0;
  std::string what;
};

MoeCase random_moe_case(std::mt19937_64& rng) {
  MoeCase c;
  const int32_t W = int32_t(uniform(rng, 1, 8));
  const fo::TileShape tile = fo_test::random_tile(rng);
  c.n = uniform(rng, 0, 2) == 0 ? uniform(rng, 1, tile.bn) : tile.bn * uniform(rng, 0, 6) + uniform(rng, 1, tile.bn);
  // Several experts per rank in a third of the cases: the grouped GEMM's tile rows.
  const int32_t E = uniform(rng, 0, 2) == 0 ? int32_t(uniform(rng, 2, 4)) : 1;
  const int32_t K = uniform(rng, 0, 1) ? 1 : int32_t(uniform(rng, 1, std::min(W * E, 8)));
  const int64_t rows = std::max<int64_t>(1, kMoeElems / c.n);  // over all ranks
  const int64_t T = uniform(rng, 0, 6) == 0 ? 0 : uniform(rng, 1, std::max<int64_t>(1, rows / (int64_t{W} * K)));
  static const char* kinds[] = {"uniform", "zipf:1.2", "zipf:3", "one:", "empty:", "arbitrary"};
  std::string kind = kinds[uniform(rng, 0, 5)];
  if (kind == "one:" || kind == "empty:") kind += std::to_string(uniform(rng, 0, W - 1));
  if (kind.rfind("empty:", 0) == 0 && K > (W - 1) * E) kind = "uniform";  // (K distinct experts off one rank)
  if (kind == "arbitrary" && E > 1) kind = "zipf:1.2";  // (rows by source block: a dispatch's)
  c.routing = kind == "arbitrary" ? arbitrary_moe_routing(rng, W, rows / W)
                                  : fo::make_moe_routing(kind, W, T, K, rng(), E);
  std::vector<int64_t> ms;  // the schedules' m: the tile rows * bm with several experts
  for (int32_t r = 0; r < W; ++r) ms.push_back(fo::moe_schedule_rows(c.routing, r, tile.bm));
  c.sched = fo_test::random_rank_schedules(rng, tile, c.n, ms);
  int32_t most = 1;
  for (const fo::Schedule& s : c.sched) most = std::max(most, s.waves());
  const bool clipped = uniform(rng, 0, 1);
  const fo::Partition common = fo_test::random_partition(rng, most);
  const int32_t G = int32_t(uniform(rng, 1, 6));
  for (const fo::Schedule& s : c.sched)
    c.groups.push_back(clipped ? fo::make_clipped_groups(s, common) : fo_test::random_groups_with_empty(rng, s, G));
  c.what = "world=" + std::to_string(W) + " E=" + std::to_string(E) + " routing=" + kind + " T=" + std::to_string(T) + " K=" + std::to_string(K) +
           " N=" + std::to_string(c.n) + " tile " + fo::to_string(tile) + (clipped ? " clipped" : " random") +
           " groups=" + std::to_string(c.groups[0].size()) + " rows:";
  for (int32_t r = 0; r < W; ++r)
    c.what += " " + std::to_string(c.routing.rows(r)) + "/" + std::to_string(c.sched[size_t(r)].waves()) + "w";
  return c;
}

// The data path of every rank through the maps: GEMM rows into the send
// slots, per group and pair the spans (counts checked against the sender's
// tiles), the post-reorder against the sorted all_to_all_single, the combine
// tables against the routing and the fused combine against a direct sum.
template <class V>
void run_moe_case(std::mt19937_64& rng, const MoeCase& c) {
  const fo::MoeRouting& routing = c.routing;
  const int32_t W = routing.world;
  const int64_t n = c.n;
  std::vector<std::vector<V>> C, send, recv;
  std::vector<fo::SlotMap> maps;
  // Each rank's tile rows (with one expert row r of tile row tm is tm * bm + r).
  std::vector<fo::GroupedTileRows> tiles;
  for (int32_t r = 0; r < W; ++r) tiles.push_back(fo::moe_tile_rows(routing, r, n, c.sched[0].bm));
  const bool grouped = routing.experts > 1;
  for (int32_t r = 0; r < W; ++r) C.push_back(random_values<V>(rng, routing.rows(r) * n));
  for (int32_t k = 0; k < W; ++k) {
    maps.push_back(fo::make_alltoall_map(c.sched, c.groups, routing, k));
    const fo::SlotMap& map = maps.back();
    check_structure(map, c.sched[size_t(k)], c.groups[size_t(k)], grouped ? &tiles[size_t(k)].rows : nullptr);
    if (::testing::Test::HasFatalFailure()) return;
    int64_t in = 0;
    for (int32_t s = 0; s < W; ++s) in += routing.send_count(s, k);
    ASSERT_EQ(map.send_rows, routing.rows(k) * map.tiles_n);
    ASSERT_EQ(map.out_rows, in);
    ASSERT_EQ(map.recv_rows, in * map.tiles_n);
    send.push_back(gemm_into_slots(rng, map, c.sched[size_t(k)], C[size_t(k)], grouped ? &tiles[size_t(k)].a_row0 : nullptr));
    recv.push_back(random_values<V>(rng, map.recv_elements()));
  }
  const int32_t bn = c.sched[0].bn;
  for (size_t g = 0; g < c.groups[0].size(); ++g)
    for (int32_t src = 0; src < W; ++src) {
      const fo::Schedule& s = c.sched[size_t(src)];
      const fo::Group& x = c.groups[size_t(src)][g];
      std::vector<int64_t> rows(size_t(W), 0);  // src's group g slot rows per destination
      for (int32_t idx = x.first_tile; idx < x.end_tile; ++idx) {
        const fo::TileCoord t = s.tile_of(idx);
        const fo::GroupedTileRows& g = tiles[size_t(src)];
        for (int32_t r = 0; r < g.rows[size_t(t.tm)]; ++r)
          ++rows[size_t(routing.dest_rank[size_t(src)][size_t(g.a_row0[size_t(t.tm)] + r)])];
      }
      for (int32_t dst = 0; dst < W; ++dst) {
        const fo::Span from = maps[size_t(src)].groups[g].send_to[size_t(dst)];
        const fo::Span to = maps[size_t(dst)].groups[g].recv_from[size_t(src)];
        ASSERT_EQ(from.count, rows[size_t(dst)] * bn) << "group " << g << " " << src << "->" << dst;
        ASSERT_EQ(from.count, to.count) << "group " << g << " " << src << "->" << dst;
        std::copy_n(send[size_t(src)].begin() + from.offset, from.count, recv[size_t(dst)].begin() + to.offset);
      }
    }
  for (int32_t k = 0; k < W; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const int32_t T = routing.tokens[size_t(k)];
    std::vector<V> expect;
    std::vector<int32_t> srcs, src_rows, tokens;
    std::vector<float> gates, acc(size_t(T) * size_t(n), 0.0f);
    for (int32_t src = 0; src < W; ++src)
      for (int64_t row = 0; row < routing.rows(src); ++row) {
        if (routing.dest_rank[size_t(src)][size_t(row)] != k) continue;
        const V* y = C[size_t(src)].data() + row * n;
        expect.insert(expect.end(), y, y + n);
        const int32_t t = routing.dest_token[size_t(src)][size_t(row)];
        const float g = routing.gate[size_t(src)][size_t(row)];
        srcs.push_back(src);
        src_rows.push_back(int32_t(row));
        tokens.push_back(t);
        gates.push_back(g);
        for (int64_t col = 0; col < n; ++col)
          acc[size_t(t * n + col)] = std::fma(g, float(y[col]), acc[size_t(t * n + col)]);
      }
    ASSERT_TRUE(same_bits(post_reorder(rng, maps[size_t(k)], recv[size_t(k)]), expect)) << "unweighted output";
    const fo::CombineTable table = fo::make_combine_table(routing, k);
    ASSERT_EQ(table.rank, k);
    ASSERT_EQ(table.tokens, T);
    ASSERT_EQ(table.src_rank, srcs);
    ASSERT_EQ(table.src_row, src_rows);
    ASSERT_EQ(table.token, tokens);
    ASSERT_TRUE(same_bits(table.gate, gates));
    ASSERT_EQ(table.token_begin.size(), size_t(T) + 1);
    ASSERT_EQ(table.token_begin.back(), int32_t(tokens.size()));
    for (int32_t t = 0; t < T; ++t)
      for (int32_t i = table.token_begin[size_t(t)]; i < table.token_begin[size_t(t) + 1]; ++i) {
        ASSERT_EQ(table.token[size_t(table.token_rows[size_t(i)])], t);
        if (i > table.token_begin[size_t(t)]) ASSERT_LT(table.token_rows[size_t(i) - 1], table.token_rows[size_t(i)]);
      }
    std::vector<V> out = random_values<V>(rng, int64_t{T} * n), want;
    fo::combine_reference(maps[size_t(k)], table, recv[size_t(k)].data(), out.data());
    for (float a : acc) want.push_back(V(a));
    ASSERT_TRUE(same_bits(out, want)) << "combine";
  }
}

template <class F>
void expect_invalid(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one saying '" << needle << "')";
  } catch (const flashoverlap::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(PlanEmulation, MoeCombineMatchesAllToAllSingleAndDirectSum) {
  FO_SEEDED_RNG(rng);
  int no_rows = 0, receives_nothing = 0, idle_tokens = 0, empty_groups = 0, fewer_waves_than_groups = 0, worlds[9] = {};
  int experts = 0, idle_rows = 0;
  for (int it = 0; it < kCases; ++it) {
    const MoeCase c = random_moe_case(rng);
    SCOPED_TRACE(c.what);
    const int32_t W = c.routing.world;
    ++worlds[W];
    experts += c.routing.experts > 1;
    for (int32_t r = 0; r < W; ++r) {
      if (c.routing.experts > 1) idle_rows += c.sched[size_t(r)].m > c.routing.rows(r);
      no_rows += c.routing.rows(r) == 0;
      int64_t in = 0;
      for (int32_t s = 0; s < W; ++s) in += c.routing.send_count(s, r);
      receives_nothing += in == 0;
      idle_tokens += in == 0 && c.routing.tokens[size_t(r)] > 0;  // its combine output: zeros
      fewer_waves_than_groups += c.sched[size_t(r)].waves() < int32_t(c.groups[0].size());
      for (const fo::Group& g : c.groups[size_t(r)]) empty_groups += g.first_wave == g.end_wave;
    }
    if (it % 2) run_moe_case<float>(rng, c);
    else run_moe_case<Bf16>(rng, c);
    if (HasFatalFailure()) return;
  }
  // (Per seed: each world ~25 times, the rest well above their bounds.)
  for (int32_t W = 2; W <= 8; ++W) EXPECT_GT(worlds[W], kCases / 50) << "world " << W;
  EXPECT_GT(no_rows, kCases / 4);
  EXPECT_GT(receives_nothing, kCases / 10);
  EXPECT_GT(idle_tokens, kCases / 40);
  EXPECT_GT(empty_groups, kCases / 4);
  EXPECT_GT(fewer_waves_than_groups, kCases / 10);
  EXPECT_GT(experts, kCases / 5);
  EXPECT_GT(idle_rows, kCases / 10);
}

// World 2; rank 0: 3 rows (2x2 tiles, one CTA: two waves), rank 1 none (two
// empty groups). Rank 0 sends row 1 to itself, rows 0 and 2 to rank 1.
TEST(PlanEmulation, MoeCombineSmallCaseIsHandChecked) {
  fo::MoeRouting r;
  r.world = 2;
  r.tokens = {1, 2};
  r.dest_rank = {{1, 0, 1}, {}};
  r.dest_token = {{0, 0, 1}, {}};
  r.gate = {{0.5f, 1.0f, 0.25f}, {}};
  r.send_counts = {1, 2, 0, 0};
  const std::vector<fo::Schedule> sched{fo::make_expert_schedule(3, 2, {2, 2}, 1, fo::Raster::AlongN, 1),
                                        fo::make_expert_schedule(0, 2, {2, 2}, 1, fo::Raster::AlongN, 1)};
  ASSERT_EQ(sched[0].waves(), 2);
  ASSERT_EQ(sched[1].waves(), 0);
  const std::vector<std::vector<fo::Group>> groups{fo::make_clipped_groups(sched[0], {1, 1}),
                                                   fo::make_clipped_groups(sched[1], {1, 1})};
  ASSERT_EQ(groups[1], (std::vector<fo::Group>{{0, 0, 0, 0}, {0, 0, 0, 0}}));
  using S = fo::Span;
  const fo::SlotMap m0 = fo::make_alltoall_map(sched, groups, r, 0);
  EXPECT_EQ(m0.row_of, (std::vector<int32_t>{1, 0, 2, -1}));  // tile 0: row 1 (to 0), row 0 (to 1)
  EXPECT_EQ(m0.groups[0].send_to, (std::vector<S>{{0, 2}, {2, 2}}));
  EXPECT_EQ(m0.groups[1].send_to, (std::vector<S>{{4, 0}, {4, 2}}));
  EXPECT_EQ(m0.groups[0].recv_from, (std::vector<S>{{0, 2}, {2, 0}}));
  EXPECT_EQ(m0.groups[1].recv_from, (std::vector<S>{{2, 0}, {2, 0}}));
  EXPECT_EQ(m0.out_rows, 1);
  const fo::SlotMap m1 = fo::make_alltoall_map(sched, groups, r, 1);
  EXPECT_TRUE(m1.row_of.empty());
  EXPECT_EQ(m1.send_rows, 0);
  EXPECT_EQ(m1.groups[0].recv_from, (std::vector<S>{{0, 2}, {2, 0}}));
  EXPECT_EQ(m1.groups[1].recv_from, (std::vector<S>{{2, 2}, {4, 0}}));
  EXPECT_EQ(m1.target_of_slot, (std::vector<fo::SlotTarget>{{0, 0}, {1, 0}}));
  const fo::CombineTable t1 = fo::make_combine_table(r, 1);
  EXPECT_EQ(t1.src_row, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(t1.token_begin, (std::vector<int32_t>{0, 1, 2}));
  // Rank 1's receive buffer: rows 0 and 2 of rank 0 = {1, 2}, {3, 4}.
  const std::vector<float> recv{1, 2, 3, 4};
  std::vector<float> out(4, -1);
  fo::combine_reference(m1, t1, recv.data(), out.data());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 1.0f, 0.75f, 1.0f}));
  // Rank 0 has a token and a row for it: 1.0 * its row.
  std::vector<float> out0(2, -1);
  fo::combine_reference(m0, fo::make_combine_table(r, 0), std::vector<float>{7, 8}.data(), out0.data());
  EXPECT_EQ(out0, (std::vector<float>{7, 8}));
}

TEST(PlanEmulation, MoeRoutingGeneratorsAreDispatchShaped) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 60; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 8)), K = int32_t(uniform(rng, 1, W));
    const int64_t T = uniform(rng, 0, 300);
    std::vector<std::string> kinds{"uniform", "zipf:1.2", "zipf:0", "zipf:50", "one:" + std::to_string(uniform(rng, 0, W - 1))};
    if (K < W) kinds.push_back("empty:" + std::to_string(uniform(rng, 0, W - 1)));
    for (const std::string& kind : kinds) {
      SCOPED_TRACE(kind + " world " + std::to_string(W) + " T " + std::to_string(T) + " K " + std::to_string(K));
      const fo::MoeRouting r = fo::make_moe_routing(kind, W, T, K, rng());
      fo::validate_moe_routing(r);
      ASSERT_EQ(r.tokens, std::vector<int32_t>(size_t(W), int32_t(T)));
      ASSERT_EQ(r.send_counts, fo::moe_send_counts(r));
      // Each token: exactly K rows, on distinct ranks, gates positive summing to ~1.
      std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<int32_t, float>>> rows_of;  // (rank, token) -> (expert, gate)
      for (int32_t e = 0; e < W; ++e) {
        for (int64_t i = 0; i < r.rows(e); ++i) {
          const int32_t s = r.dest_rank[size_t(e)][size_t(i)], t = r.dest_token[size_t(e)][size_t(i)];
          rows_of[{s, t}].push_back({e, r.gate[size_t(e)][size_t(i)]});
          if (i > 0) {  // dispatch order: by source rank, then token
            const auto prev = std::pair(r.dest_rank[size_t(e)][size_t(i) - 1], r.dest_token[size_t(e)][size_t(i) - 1]);
            ASSERT_LT(prev, std::pair(s, t)) << "rank " << e << " row " << i;
          }
        }
        int64_t out = 0, in = 0;
        for (int64_t x : r.input_splits(e)) out += x;
        for (int64_t x : r.output_splits(e)) in += x;
        EXPECT_EQ(out, r.rows(e));  // the expert's rows go out
        EXPECT_EQ(in, T * K);       // each of its tokens' K rows come back
      }
      ASSERT_EQ(int64_t(rows_of.size()), W * T);
      for (const auto& [token, picks] : rows_of) {
        ASSERT_EQ(picks.size(), size_t(K));
        std::set<int32_t> ranks;
        double sum = 0;
        for (const auto& [e, g] : picks) {
          ranks.insert(e);
          EXPECT_GT(g, 0.0f);
          sum += g;
          if (kind.rfind("empty:", 0) == 0) EXPECT_NE(e, std::stoi(kind.substr(6)));
        }
        EXPECT_EQ(ranks.size(), size_t(K)) << "a token picked a rank twice";
        EXPECT_NEAR(sum, 1.0, 1e-5);
        if (kind.rfind("one:", 0) == 0) EXPECT_TRUE(ranks.count(std::stoi(kind.substr(4))));
      }
    }
  }
}

TEST(PlanEmulation, MoeRoutingZipfIsSkewedAndUniformIsNot) {
  const int32_t W = 8, K = 2;
  const int64_t T = 4096;
  const fo::MoeRouting u = fo::make_moe_routing("uniform", W, T, K, 3);
  for (int32_t e = 0; e < W; ++e) EXPECT_NEAR(double(u.rows(e)), double(T * K), 0.1 * T * K) << "rank " << e;
  const fo::MoeRouting z = fo::make_moe_routing("zipf:1.2", W, T, K, 3);
  EXPECT_GT(z.rows(0), z.rows(1));
  EXPECT_GT(z.rows(1), z.rows(3));
  EXPECT_GT(z.rows(3), z.rows(7));
  EXPECT_GT(z.rows(0), 3 * z.rows(7));
  // Top-1 all to one rank: every other expert has no rows.
  const fo::MoeRouting one = fo::make_moe_routing("one:5", W, T, 1, 3);
  for (int32_t e = 0; e < W; ++e) EXPECT_EQ(one.rows(e), e == 5 ? W * T : 0);
  EXPECT_EQ(fo::make_moe_routing("empty:2", W, T, K, 3).rows(2), 0);
}

TEST(PlanEmulation, MoeRoutingIsDeterministicPerSeed) {
  for (const char* kind : {"uniform", "zipf:1.2", "one:1", "empty:0"}) {
    const fo::MoeRouting a = fo::make_moe_routing(kind, 5, 200, 2, 11), b = fo::make_moe_routing(kind, 5, 200, 2, 11);
    const fo::MoeRouting c = fo::make_moe_routing(kind, 5, 200, 2, 12);
    EXPECT_EQ(a.dest_rank, b.dest_rank) << kind;
    EXPECT_EQ(a.dest_token, b.dest_token) << kind;
    EXPECT_EQ(a.gate, b.gate) << kind;
    EXPECT_EQ(a.send_counts, b.send_counts) << kind;
    EXPECT_NE(a.gate, c.gate) << kind;
  }
}

TEST(PlanEmulation, MoeRoutingErrorsSayWhatIsWrong) {
  using fo::make_moe_routing;
  expect_invalid([] { make_moe_routing("uniform", 4, 10, 5); }, "top-k 5 outside [1, world = 4]");
  expect_invalid([] { make_moe_routing("uniform", 4, 10, 0); }, "top-k 0");
  expect_invalid([] { make_moe_routing("uniform", 0, 10, 1); }, "world >= 1");
  expect_invalid([] { make_moe_routing("uniform", 4, -1, 1); }, "tokens per rank -1");
  expect_invalid([] { make_moe_routing("empty:1", 4, 10, 4); }, "needs world > top-k");
  expect_invalid([] { make_moe_routing("file:/tmp/x.json", 4, 10, 1); }, "read with read_moe_routing_file");
  for (const char* bad : {"zipf", "zipf:", "zipf:-1", "zipf:x", "zipf:1.2x", "zipf:inf", "one:4", "one:", "empty:-1", "skewed", ""})
    EXPECT_THROW(make_moe_routing(bad, 4, 10, 1), flashoverlap::InvalidArgument) << bad;

  const fo::MoeRouting good = make_moe_routing("uniform", 3, 20, 2, 5);
  auto broken = [&](auto edit, const std::string& needle) {
    fo::MoeRouting r = good;
    edit(r);
    expect_invalid([&] { fo::validate_moe_routing(r); }, needle);
  };
  broken([](fo::MoeRouting& r) { r.dest_rank[1][3] = 3; }, "rank 1 row 3: destination rank 3 outside [0, 3)");
  broken([](fo::MoeRouting& r) { r.dest_rank[1][3] = -1; }, "destination rank -1");
  broken([](fo::MoeRouting& r) { r.dest_token[2][0] = 20; }, "rank 2 row 0: token 20 outside [0, 20)");
  broken([](fo::MoeRouting& r) { r.dest_token[0][0] = -2; }, "token -2");
  broken([](fo::MoeRouting& r) { r.send_counts[1] += 1; }, "send_counts says rank 0 sends");
  broken([](fo::MoeRouting& r) { r.send_counts.pop_back(); }, "send_counts has 8 entries");
  broken([](fo::MoeRouting& r) { r.gate[0].pop_back(); }, "must be equal");
  broken([](fo::MoeRouting& r) { r.gate[0][1] = std::nanf(""); }, "gate weight is not finite");
  broken([](fo::MoeRouting& r) { r.tokens = {20, 20}; }, "tokens has 2 entries, expected world 3");
  broken([](fo::MoeRouting& r) { r.tokens[1] = -1; }, "rank 1 has -1 tokens");
  broken([](fo::MoeRouting& r) { r.world = 0; }, "world 0");
}

namespace {
// Each row's local expert, from the (source, expert) blocks of expert_rows
// (every row expert 0 with one expert per rank).
std::vector<int32_t> experts_of_rows(const fo::MoeRouting& r, int32_t rank) {
  std::vector<int32_t> e(size_t(r.rows(rank)), 0);
  if (r.experts == 1) return e;
  size_t row = 0;
  for (size_t i = 0; i < r.expert_rows[size_t(rank)].size(); ++i)
    for (int64_t j = 0; j < r.expert_rows[size_t(rank)][i]; ++j) e.at(row++) = int32_t(i % size_t(r.experts));
  EXPECT_EQ(row, e.size());
  return e;
}
}  // namespace

// With E experts per rank each token picks K distinct experts of the world's
// W * E (K may pass W: several rows of one token go to one rank), and each
// rank's rows come by (source rank, local expert), then token: the blocks
// of expert_rows, whose segments (moe_segments) cover the rows in order.
TEST(PlanEmulation, MoeRoutingWithExpertsIsDispatchShaped) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 60; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 6)), E = int32_t(uniform(rng, 1, 5));
    const int32_t K = int32_t(uniform(rng, 1, std::min(W * E, 9)));
    const int64_t T = uniform(rng, 0, 120);
    std::vector<std::string> kinds{"uniform", "zipf:1.2", "one:" + std::to_string(uniform(rng, 0, W - 1))};
    if (K <= (W - 1) * E) kinds.push_back("empty:" + std::to_string(uniform(rng, 0, W - 1)));
    for (const std::string& kind : kinds) {
      SCOPED_TRACE(kind + " W " + std::to_string(W) + " E " + std::to_string(E) + " T " + std::to_string(T) + " K " +
                   std::to_string(K));
      const fo::MoeRouting r = fo::make_moe_routing(kind, W, T, K, rng(), E);
      fo::validate_moe_routing(r);
      ASSERT_EQ(r.experts, E);
      ASSERT_EQ(r.expert_rows.size(), E == 1 ? 0u : size_t(W));
      std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<int32_t, float>>> picks;  // (home, token) -> (g, gate)
      for (int32_t rank = 0; rank < W; ++rank) {
        const std::vector<int32_t> expert = experts_of_rows(r, rank);
        for (int64_t i = 0; i < r.rows(rank); ++i) {
          const int32_t s = r.dest_rank[size_t(rank)][size_t(i)], t = r.dest_token[size_t(rank)][size_t(i)];
          picks[{s, t}].push_back({rank * E + expert[size_t(i)], r.gate[size_t(rank)][size_t(i)]});
          if (i > 0) {  // by source, then expert, then token
            const auto key = [&](int64_t j) {
              return std::tuple(r.dest_rank[size_t(rank)][size_t(j)], expert[size_t(j)], r.dest_token[size_t(rank)][size_t(j)]);
            };
            ASSERT_LT(key(i - 1), key(i)) << "rank " << rank << " row " << i;
          }
        }
        // The segments: A's rows in order, one expert each, none empty, neighbours of one expert merged.
        const std::vector<fo::RowSegment> seg = fo::moe_segments(r, rank);
        int64_t row = 0;
        for (size_t j = 0; j < seg.size(); ++j) {
          ASSERT_EQ(seg[j].a_row0, row);
          ASSERT_GT(seg[j].rows, 0);
          if (j > 0) EXPECT_NE(seg[j].expert, seg[j - 1].expert);
          for (int64_t i = row; i < row + seg[j].rows; ++i) ASSERT_EQ(expert[size_t(i)], seg[j].expert);
          row += seg[j].rows;
        }
        EXPECT_EQ(row, r.rows(rank));
      }
      ASSERT_EQ(int64_t(picks.size()), W * T);
      for (const auto& [token, mine] : picks) {
        ASSERT_EQ(mine.size(), size_t(K));
        std::set<int32_t> experts;
        double sum = 0;
        for (const auto& [g, gate] : mine) {
          experts.insert(g);
          EXPECT_GT(gate, 0.0f);
          sum += gate;
          if (kind.rfind("empty:", 0) == 0) EXPECT_NE(g / E, std::stoi(kind.substr(6)));
        }
        EXPECT_EQ(experts.size(), size_t(K)) << "a token picked an expert twice";
        EXPECT_NEAR(sum, 1.0, 1e-5);
        if (kind.rfind("one:", 0) == 0)
          EXPECT_TRUE(std::any_of(experts.begin(), experts.end(), [&](int32_t g) { return g / E == std::stoi(kind.substr(4)); }));
      }
      if (T > 0) EXPECT_EQ(fo::moe_topk(r), K);
    }
  }
}

TEST(PlanEmulation, MoeRoutingWithExpertsErrorsSayWhatIsWrong) {
  using fo::make_moe_routing;
  expect_invalid([] { make_moe_routing("uniform", 2, 10, 9, 1, 4); }, "top-k 9 outside [1, world x experts = 8]");
  expect_invalid([] { make_moe_routing("empty:0", 3, 10, 5, 1, 2); }, "needs (world - 1) x experts >= top-k");
  expect_invalid([] { make_moe_routing("uniform", 2, 10, 1, 1, 0); }, "0 experts per rank");
  EXPECT_NO_THROW(make_moe_routing("empty:0", 3, 10, 4, 1, 2));
  // Top-1 to one rank with experts: every row on it, spread over its experts.
  const fo::MoeRouting one = make_moe_routing("one:1", 3, 300, 1, 5, 4);
  EXPECT_EQ(one.rows(1), 900);
  for (int32_t e = 0; e < 4; ++e) {
    int64_t rows = 0;
    for (int32_t s = 0; s < 3; ++s) rows += one.expert_rows[1][size_t(s) * 4 + e];
    EXPECT_GT(rows, 100) << "expert " << e;
  }
  // Several rows of one token to one rank are fine; one expert twice is not.
  using P = fo::MoePick;
  const fo::MoeRouting two = fo::moe_routing_from_picks(2, {{{P{1, 0.5f, 0}, P{1, 0.5f, 1}}}, {}}, 2);
  EXPECT_EQ(two.rows(1), 2);
  EXPECT_EQ(two.expert_rows[1], (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(fo::moe_topk(two), 2);
  expect_invalid([] { fo::moe_routing_from_picks(2, {{{P{1, 0.5f, 1}, P{1, 0.5f, 1}}}, {}}, 2); },
                 "rank 0 token 0 picks expert 1 of rank 1 twice");
  expect_invalid([] { fo::moe_routing_from_picks(2, {{{P{1, 0.5f, 2}}}, {}}, 2); }, "picks expert 2 of rank 1, outside [0, 2)");
  // The All-to-All's counts take several experts: rank 1's two rows are one
  // tile row each (two experts' segments).
  const fo::MoeRowCounts counted = fo::count_moe_rows(two, 128);
  EXPECT_EQ(counted.counts[1], (std::vector<int64_t>{1, 0, 1, 0}));
  EXPECT_EQ(counted.tile_rows[1].a_row0, (std::vector<int32_t>{0, 1}));

  const fo::MoeRouting good = make_moe_routing("uniform", 3, 30, 4, 5, 3);
  auto broken = [&](auto edit, const std::string& needle) {
    fo::MoeRouting r = good;
    edit(r);
    expect_invalid([&] { fo::validate_moe_routing(r); }, needle);
  };
  broken([](fo::MoeRouting& r) { r.expert_rows.pop_back(); }, "expert_rows has 2 ranks' counts, expected world 3");
  broken([](fo::MoeRouting& r) { r.expert_rows[2].pop_back(); }, "rank 2: expert_rows has 8 counts, expected world x experts = 9");
  broken([](fo::MoeRouting& r) { r.expert_rows[0][0] += 1; }, "rank 0: expert_rows gives");
  broken([](fo::MoeRouting& r) { r.expert_rows[0][1] = -1 - r.expert_rows[0][1]; }, "rows from rank 0 for expert 1");
  broken([](fo::MoeRouting& r) { r.experts = 0; }, "0 experts per rank");
  broken([](fo::MoeRouting& r) {  // a row of source 2's block swapped with one of source 0's: the counts still add up
        auto& d = r.dest_rank[1];
        const size_t first = 0, last = d.size() - 1;
        std::swap(d[first], d[last]), std::swap(r.dest_token[1][first], r.dest_token[1][last]);
      },
      "rank 1 row 0: in rank 0's block of expert_rows");
}

TEST(PlanEmulation, MoeMapInputsAreValidated) {
  const fo::MoeRouting r = fo::make_moe_routing("uniform", 3, 40, 2, 9);
  auto sched_of = [&](int64_t n, fo::TileShape t) {
    std::vector<fo::Schedule> out;
    for (int32_t k = 0; k < 3; ++k) out.push_back(fo::make_expert_schedule(r.rows(k), n, t, 2, fo::Raster::AlongN, 1));
    return out;
  };
  const std::vector<fo::Schedule> sched = sched_of(64, {16, 32});
  std::vector<std::vector<fo::Group>> groups;
  for (const fo::Schedule& s : sched) groups.push_back(fo::make_clipped_groups(s, {1, 2, 100}));
  fo::validate_alltoall_ranks(sched, groups, r);
  auto bad = [&](auto edit, const std::string& needle) {
    std::vector<fo::Schedule> s = sched;
    std::vector<std::vector<fo::Group>> g = groups;
    edit(s, g);
    expect_invalid([&] { fo::make_alltoall_map(s, g, r, 0); }, needle);
  };
  using Sv = std::vector<fo::Schedule>;
  using Gv = std::vector<std::vector<fo::Group>>;
  bad([](Sv& s, Gv&) { s.pop_back(); }, "2 schedules and 3 group lists for world 3");
  bad([&](Sv& s, Gv&) { s[1] = fo::make_expert_schedule(r.rows(1) + 1, 64, {16, 32}, 2, fo::Raster::AlongN, 1); },
      "rank 1: schedule of");
  bad([&](Sv& s, Gv&) { s[2] = sched_of(65, {16, 32})[2]; }, "rank 2: N 65");
  bad([&](Sv& s, Gv&) { s[2] = sched_of(64, {16, 16})[2]; }, "differ from rank 0's");
  bad([](Sv&, Gv& g) { g[1].pop_back(); }, "rank 1: 2 groups, rank 0 has 3");
  bad([](Sv&, Gv& g) { g = Gv(3); }, "no groups");
  bad([](Sv&, Gv& g) { std::swap(g[2][0], g[2][1]); }, "rank 2: group 0");
  bad([&](Sv&, Gv& g) {
        const fo::Schedule& s = sched[0];
        g[0] = {fo::group_spanning(s, 0, 1), fo::group_spanning(s, 1, 2), fo::group_spanning(s, 2, 2)};
      },
      "groups end at wave 2 of " + std::to_string(sched[0].waves()));
  bad([](Sv&, Gv& g) { g[0][0].end_tile += 1; }, "rank 0: group 0");
  expect_invalid([&] { fo::make_alltoall_map(sched, groups, r, 3); }, "rank 3 out of range");
  expect_invalid([&] { fo::make_combine_table(r, -1); }, "rank -1 out of range");
  expect_invalid([&] { fo::make_clipped_groups(sched[0], {1}); }, "fewer than the schedule's");
  expect_invalid([&] { fo::make_clipped_groups(sched[0], {sched[0].waves(), 0}); }, "");
  expect_invalid([] { fo::make_expert_schedule(-1, 64, {16, 32}, 2, fo::Raster::AlongN, 1); }, "out of range");
  expect_invalid([] { fo::make_expert_schedule(0, 0, {16, 32}, 2, fo::Raster::AlongN, 1); }, "out of range");
  // A table of another rank does not fit the map.
  const fo::SlotMap map = fo::make_alltoall_map(sched, groups, r, 0);
  std::vector<float> recv(size_t(map.recv_elements())), out(size_t(r.tokens[1]) * 64);
  expect_invalid([&] { fo::combine_reference(map, fo::make_combine_table(r, 1), recv.data(), out.data()); },
                 "does not fit the map of rank 0");
}

// A recorded routing (bench --routing file:PATH) reads back as the routing it
// records: every kind's routing written as its tokens' picks, read, equal;
// its top-K counted; and the file's mistakes named.
TEST(PlanEmulation, RecordedMoeRoutingsReadBackAndSayWhatIsWrong) {
  FO_SEEDED_RNG(rng);
  const fo_test::TempDir dir;
  static const char* kinds[] = {"uniform", "zipf:1.2", "one:0", "empty:1"};
  for (int trial = 0; trial < 12; ++trial) {
    const int32_t W = int32_t(uniform(rng, 2, 6)), K = int32_t(uniform(rng, 1, W - 1));
    const std::string kind = kinds[trial % 4];
    const fo::MoeRouting r = fo::make_moe_routing(kind, W, uniform(rng, 0, 300), K, rng());
    // Its picks: token t of rank s picked expert e with gate g, for each row of e.
    nlohmann::json picks = nlohmann::json::array();
    for (int32_t s = 0; s < W; ++s) picks.push_back(nlohmann::json(std::vector<nlohmann::json>(size_t(r.tokens[size_t(s)]), nlohmann::json::array())));
    for (int32_t e = 0; e < W; ++e)
      for (size_t i = 0; i < r.dest_rank[size_t(e)].size(); ++i)
        picks[size_t(r.dest_rank[size_t(e)][i])][size_t(r.dest_token[size_t(e)][i])].push_back(
            nlohmann::json::array({e, r.gate[size_t(e)][i]}));
    const nlohmann::json file = {{"format", "flashoverlap.moe_routing"}, {"schema", 1}, {"world", W}, {"picks", picks}};
    const fo::MoeRouting back = fo::read_moe_routing_file(dir.write("r.json", file.dump()));
    SCOPED_TRACE(kind + " W=" + std::to_string(W) + " K=" + std::to_string(K));
    EXPECT_EQ(back.tokens, r.tokens);
    EXPECT_EQ(back.dest_rank, r.dest_rank);
    EXPECT_EQ(back.dest_token, r.dest_token);
    EXPECT_EQ(back.gate, r.gate);
    EXPECT_EQ(back.send_counts, r.send_counts);
    if (r.tokens[0] > 0) EXPECT_EQ(fo::moe_topk(back), K);
  }
  auto bad = [&](const std::string& text, const std::string& needle) {
    expect_invalid([&] { fo::read_moe_routing_file(dir.write("bad.json", text)); }, needle);
  };
  const std::string head = R"({"format": "flashoverlap.moe_routing", "schema": 1, )";
  bad("[1, 2]", "not a flashoverlap.moe_routing file");
  bad(head + R"("world": 2, "picks": [[]]})", "one entry per rank (2)");
  bad(head + R"("world": 2, "picks": [[[[2, 0.5]]], []]})", "rank 0 token 0 picks rank 2, outside [0, 2)");
  bad(head + R"("world": 2, "picks": [[[[1, 0.5], [1, 0.5]]], []]})", "picks rank 1 twice");
  bad(head + R"("world": 2, "picks": [[[[1]]], []]})", "a pick must be [rank, gate]");
  bad(head + R"("world": 0, "picks": []})", "\"world\" must be an integer in [1, 1024]");
  expect_invalid([&] { fo::read_moe_routing_file(dir.file("missing.json")); }, "missing.json");
}

// With experts per rank a recorded routing is schema 2: [rank, expert, gate]
// picks, read back as the routing they record.
TEST(PlanEmulation, RecordedMoeRoutingsWithExpertsReadBack) {
  FO_SEEDED_RNG(rng);
  const fo_test::TempDir dir;
  for (int trial = 0; trial < 8; ++trial) {
    const int32_t W = int32_t(uniform(rng, 1, 4)), E = int32_t(uniform(rng, 2, 4)), K = int32_t(uniform(rng, 1, W * E));
    const fo::MoeRouting r = fo::make_moe_routing(trial % 2 ? "zipf:1.2" : "uniform", W, uniform(rng, 0, 100), K, rng(), E);
    nlohmann::json picks = nlohmann::json::array();
    for (int32_t s = 0; s < W; ++s)
      picks.push_back(nlohmann::json(std::vector<nlohmann::json>(size_t(r.tokens[size_t(s)]), nlohmann::json::array())));
    // (each token's picks in the order the rows list them: by rank, then expert; the rows come back in that order)
    for (int32_t rank = 0; rank < W; ++rank) {
      const std::vector<int32_t> expert = experts_of_rows(r, rank);
      for (size_t i = 0; i < r.dest_rank[size_t(rank)].size(); ++i)
        picks[size_t(r.dest_rank[size_t(rank)][i])][size_t(r.dest_token[size_t(rank)][i])].push_back(
            nlohmann::json::array({rank, expert[i], r.gate[size_t(rank)][i]}));
    }
    const nlohmann::json file = {{"format", "flashoverlap.moe_routing"}, {"schema", 2}, {"world", W}, {"experts", E},
                                 {"picks", picks}};
    const fo::MoeRouting back = fo::read_moe_routing_file(dir.write("r.json", file.dump()));
    EXPECT_EQ(back.experts, E);
    EXPECT_EQ(back.expert_rows, r.expert_rows);
    EXPECT_EQ(back.dest_rank, r.dest_rank);
    EXPECT_EQ(back.dest_token, r.dest_token);
    EXPECT_EQ(back.gate, r.gate);
  }
  auto bad = [&](const std::string& text, const std::string& needle) {
    expect_invalid([&] { fo::read_moe_routing_file(dir.write("bad.json", text)); }, needle);
  };
  const std::string head = R"({"format": "flashoverlap.moe_routing", "schema": 2, "world": 2, )";
  bad(head + R"("picks": [[], []]})", "\"experts\" must be an integer");
  bad(head + R"("experts": 2, "picks": [[[[1, 0.5]]], []]})", "a pick must be [rank, expert, gate]");
  bad(head + R"("experts": 2, "picks": [[[[1, 2, 0.5]]], []]})", "picks expert 2 of rank 1, outside [0, 2)");
  bad(head + R"("experts": 2, "picks": [[[[1, 1, 0.5], [1, 1, 0.5]]], []]})", "picks expert 1 of rank 1 twice");
  bad(R"({"format": "flashoverlap.moe_routing", "schema": 3, "world": 1, "picks": [[]]})", "schema must be 1");
}
