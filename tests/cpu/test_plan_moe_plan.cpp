// make_moe_plan: every rank's groups fit the All-to-All maps, the prediction
// is the model's (checked against a brute-force cost and against the maps'
// own spans), the searched partition is the best of all, the fallbacks, the
// errors and the speed.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <numeric>

#include "flashoverlap/error.h"
#include "plan/moe_plan.h"
#include "plan/search.h"
#include "plan/slot_map_alltoall.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

namespace {

// Every row of every rank (`rows` each) to a random rank, or, skewed, half
// of them to rank 0: rows interleaved, not the dispatch's blocks by source
// (make_moe_routing's; see SourceOrderedRowsSpreadOverTheLinks), as a combine
// of one row per token (numbered at its destination in (source rank, row)
// order), gate 1.
fo::MoeRouting interleaved(int32_t W, int64_t rows, uint64_t seed, bool skewed = false) {
  std::mt19937_64 rng(seed);
  fo::MoeRouting r;
  r.world = W;
  r.tokens.assign(size_t(W), 0);
  r.dest_rank.resize(size_t(W));
  r.dest_token.resize(size_t(W));
  r.gate.resize(size_t(W));
  for (int32_t src = 0; src < W; ++src)
    for (int64_t i = 0; i < rows; ++i) {
      const int32_t d = skewed && rng() % 2 == 0 ? 0 : int32_t(rng() % uint64_t(W));
      r.dest_rank[size_t(src)].push_back(d);
      r.dest_token[size_t(src)].push_back(r.tokens[size_t(d)]++);
      r.gate[size_t(src)].push_back(1.0f);
    }
  r.send_counts = fo::moe_send_counts(r);
  return r;
}

// make_moe_routing's uniform, zipf:1.2, one:0 or empty:R, top-k in [1,
// min(W, 4)] (W-1 for empty): rows in dispatch order, by source rank. Or
// interleaved rows (uniform or skewed).
fo::MoeRouting random_routing(std::mt19937_64& rng, int32_t W, int64_t max_tokens, std::string& what) {
  const int64_t kind = uniform(rng, 0, 4);
  const int64_t tokens = uniform(rng, 0, 4) == 0 ? uniform(rng, 0, 2) : uniform(rng, 0, max_tokens);
  if (kind == 4 || (kind == 3 && W == 1)) {
    const bool skewed = !uniform(rng, 0, 2);
    const int64_t rows = std::max<int64_t>(1, 2 * tokens);
    what = std::string("interleaved ") + (skewed ? "skewed" : "uniform") + " W=" + std::to_string(W) +
           " rows=" + std::to_string(rows);
    const fo::MoeRouting r = interleaved(W, rows, rng(), skewed);
    fo::validate_moe_routing(r);
    return r;
  }
  const std::string name = kind == 0   ? "uniform"
                           : kind == 1 ? "zipf:1.2"
                           : kind == 2 ? "one:0"
                                       : "empty:" + std::to_string(uniform(rng, 0, W - 1));
  const int32_t topk = int32_t(uniform(rng, 1, std::min(kind == 3 ? W - 1 : W, 4)));
  what = name + " W=" + std::to_string(W) + " tokens=" + std::to_string(tokens) + " top" + std::to_string(topk);
  return fo::make_moe_routing(name, W, tokens, topk, rng());
}

// A case that leans to overlap: interleaved rows filling the overlapped
// grid's waves (2..max_waves of 116 CTAs, no extra wave against 132), 64 tile
// columns (calls above the curve's flat ~16 MB), NCCL's 16 CTAs.
struct Lean {
  fo::MoeRouting routing;
  fo::MoePlanRequest req;
  std::string what;
};
Lean lean_case(std::mt19937_64& rng, int32_t W, int64_t max_waves) {
  const int64_t rows = 128 * (uniform(rng, 2, max_waves) * 116 / 64) - uniform(rng, 0, 64);
  Lean c{interleaved(W, rows, rng()), {}, {}};
  c.req.n = 16384;
  c.req.k = 1024 * uniform(rng, 2, 6);
  c.req.reserve_sms = 16;
  c.what = "lean W=" + std::to_string(W) + " rows=" + std::to_string(rows) + " K=" + std::to_string(c.req.k);
  return c;  // req.routing: set by the caller (the Lean may move)
}

fo::MoePlanRequest random_request(std::mt19937_64& rng, const fo::MoeRouting& routing, std::string& what) {
  fo::MoePlanRequest r;
  r.routing = &routing;
  r.n = uniform(rng, 0, 2) ? 256 * uniform(rng, 1, 32) : uniform(rng, 1, 8192);
  r.k = 64 * uniform(rng, 1, 256);
  r.tile = uniform(rng, 0, 1) ? fo::TileShape{128, 256} : fo::TileShape{128, 128};
  r.sms = uniform(rng, 0, 3) ? 132 : int32_t(uniform(rng, 2, 132));
  const int32_t reserves[] = {8, 16, 24, 32};
  r.reserve_sms = uniform(rng, 0, 5) == 0 ? int32_t(uniform(rng, 0, r.sms - 1)) : reserves[uniform(rng, 0, 3)];
  r.reserve_sms = std::min(r.reserve_sms, r.sms - 1);
  if (uniform(rng, 0, 3) == 0) r.wave_ms = std::uniform_real_distribution<double>(0.005, 0.2)(rng);
  if (uniform(rng, 0, 3) == 0) r.comm_saturating_ctas = int32_t(uniform(rng, 1, 32));
  const double gains[] = {0.0, 0.01, 0.05};
  r.min_gain = gains[uniform(rng, 0, 2)];
  what += " N=" + std::to_string(r.n) + " K=" + std::to_string(r.k) + " tile " + fo::to_string(r.tile) +
          " sms=" + std::to_string(r.sms) + " reserve=" + std::to_string(r.reserve_sms) +
          " wave_ms=" + std::to_string(r.wave_ms) + " sat=" + std::to_string(r.comm_saturating_ctas) +
          " min_gain=" + std::to_string(r.min_gain);
  return r;
}

fo::CommModel comm_of(const fo::MoePlanRequest& r) {
  return fo::CommModel(r.curve ? *r.curve : fo::BandwidthCurve::builtin_h200(fo::Collective::AllToAll),
                       r.routing->world, r.comm_saturating_ctas);
}

double wave_of(const fo::MoePlanRequest& r) { return r.wave_ms > 0 ? r.wave_ms : r.gemm.wave_ms(r.tile, r.k); }

double bytes_of(int64_t link_rows, const fo::MoePlanRequest& r) {
  const int32_t W = r.routing->world;
  return W > 1 ? double(link_rows) * r.tile.bn * 2.0 * W / (W - 1) : 0.0;
}

// With several experts the grouped GEMM's: m = its tile rows * bm
// (fo_test::brute_tile_rows), tile row tm holding its rows only.
std::vector<fo::Schedule> expected_schedules(const fo::MoePlanRequest& r, int32_t ctas) {
  std::vector<fo::Schedule> out;
  for (int32_t rank = 0; rank < r.routing->world; ++rank) {
    const auto tile_rows = fo_test::brute_tile_rows(*r.routing, rank, r.tile.bm);
    const bool grouped = r.routing->experts > 1;
    const int64_t m = grouped ? int64_t(tile_rows.size()) * r.tile.bm : r.routing->rows(rank);
    const int32_t swizzle_rows = grouped ? std::max<int32_t>(int32_t(tile_rows.size()), 1)
                                         : int32_t((m + r.tile.bm - 1) / r.tile.bm);
    out.push_back(fo::make_expert_schedule(m, r.n, r.tile, ctas, fo::Raster::AlongN,
                                           fo::default_swizzle(ctas, r.tile, swizzle_rows)));
    // The walk starts at the tile row of the first row for rank + 1 (else + 2, ...).
    const auto& dest = r.routing->dest_rank[size_t(rank)];
    auto tile_row_of = [&](int32_t row) {
      int32_t v = 0;
      while (tile_rows[size_t(v)].first + tile_rows[size_t(v)].second <= row) ++v;
      return v;
    };
    bool found = false;
    for (int32_t k = 1; k < r.routing->world && !found; ++k)
      for (size_t i = 0; i < dest.size() && !found; ++i)
        if (dest[i] == (rank + k) % r.routing->world) out.back().row_shift = tile_row_of(int32_t(i)), found = true;
    EXPECT_EQ(out.back().row_shift, fo::make_moe_schedule(*r.routing, rank, r.n, r.tile, ctas).row_shift);
  }
  return out;
}

int32_t most_waves(const std::vector<fo::Schedule>& s) {
  int32_t most = 0;
  for (const fo::Schedule& x : s) most = std::max(most, x.waves());
  return most;
}

// The overlapped grid's model from the spec, tile by tile: per wave of the
// common axis, each rank's slot rows sent to and received from other ranks.
fo::CostModel brute_cost(const fo::MoePlanRequest& r) {
  const fo::MoeRouting& routing = *r.routing;
  const int32_t W = routing.world;
  const auto sched = expected_schedules(r, r.sms - r.reserve_sms);
  const int32_t T = most_waves(sched);
  std::vector<std::vector<int64_t>> sent(size_t(W), std::vector<int64_t>(size_t(T), 0));
  auto recv = sent;
  for (int32_t src = 0; src < W; ++src) {
    const fo::Schedule& s = sched[size_t(src)];
    const auto tile_rows = fo_test::brute_tile_rows(routing, src, s.bm);
    for (int32_t idx = 0; idx < s.tiles(); ++idx) {
      const fo::TileCoord t = s.tile_of(idx);
      const auto [first, rows] = tile_rows[size_t(t.tm)];
      for (int32_t row = first; row < first + rows; ++row) {
        const int32_t d = routing.dest_rank[size_t(src)][size_t(row)];
        if (d == src) continue;
        ++sent[size_t(src)][size_t(s.round_of(idx))];
        ++recv[size_t(d)][size_t(s.round_of(idx))];
      }
    }
  }
  fo::CostModel cost;
  const double wave = wave_of(r);
  cost.wave_ms.assign(size_t(T), r.reserve_sms > 0 ? wave * r.gemm.slowdown : wave);
  if (r.reserve_sms == 0) cost.comm_not_before_ms = wave * T;
  auto comm = std::make_shared<fo::CommModel>(comm_of(r));
  cost.comm_ms = [=](int32_t w0, int32_t w1) {
    int64_t most = 0;
    for (int32_t x = 0; x < W; ++x) {
      int64_t s = 0, v = 0;
      for (int32_t w = w0; w < w1; ++w) {
        s += sent[size_t(x)][size_t(w)];
        v += recv[size_t(x)][size_t(w)];
      }
      most = std::max({most, s, v});
    }
    return comm->ms(bytes_of(most, r), r.reserve_sms);
  };
  return cost;
}

// What every plan must satisfy, whatever it chose; the slot maps of every
// rank build, and their spans give the predicted call times.
void check_plan(const fo::MoePlan& p, const fo::MoePlanRequest& r) {
  const fo::MoeRouting& routing = *r.routing;
  const int32_t W = routing.world;
  ASSERT_EQ(p.sched_of_rank.size(), size_t(W));
  ASSERT_EQ(p.groups_of_rank.size(), size_t(W));
  EXPECT_EQ(p.ctas, p.sequential ? r.sms : r.sms - r.reserve_sms);
  const auto sched = expected_schedules(r, p.ctas);
  for (int32_t rank = 0; rank < W; ++rank) {
    const fo::Schedule &s = p.sched_of_rank[size_t(rank)], &e = sched[size_t(rank)];
    EXPECT_EQ(s.m, e.m);
    EXPECT_EQ(s.n, e.n);
    EXPECT_EQ(s.bm, e.bm);
    EXPECT_EQ(s.bn, e.bn);
    EXPECT_EQ(s.ctas, e.ctas);
    EXPECT_EQ(s.raster, fo::Raster::AlongN);
    EXPECT_EQ(s.swizzle, e.swizzle);
    EXPECT_EQ(p.groups_of_rank[size_t(rank)], fo::make_clipped_groups(s, p.common));
  }
  const int32_t T = most_waves(sched);
  EXPECT_EQ(p.waves(), T);
  EXPECT_EQ(std::accumulate(p.common.begin(), p.common.end(), 0), std::max(T, 1));
  EXPECT_NO_THROW(fo::validate_alltoall_ranks(p.sched_of_rank, p.groups_of_rank, routing));
  ASSERT_EQ(p.predicted.groups.size(), p.common.size());
  if (!r.partition) {
    EXPECT_LE(p.predicted.total_ms, p.baseline_ms * (1 + 1e-12)) << "predicted slower than sequential";
    if (!p.sequential) EXPECT_LE(p.predicted.total_ms, p.baseline_ms * (1 - r.min_gain) * (1 + 1e-12));
    if (W == 1 || T < 2) EXPECT_TRUE(p.sequential);
  }
  if (T == 0) EXPECT_TRUE(p.sequential);
  if (p.sequential) {
    EXPECT_EQ(p.common.size(), 1u);
    EXPECT_DOUBLE_EQ(p.predicted.total_ms, p.baseline_ms);
  }
  for (size_t g = 0; g < p.common.size(); ++g) {
    EXPECT_GE(p.predicted.groups[g].comm_start, p.predicted.groups[g].compute_end);
    if (g > 0) EXPECT_GE(p.predicted.groups[g].comm_start, p.predicted.groups[g - 1].comm_end);
  }
  EXPECT_DOUBLE_EQ(p.predicted.total_ms, p.predicted.groups.back().comm_end);

  // Each group's busiest off-rank link, from the maps' per-peer spans.
  std::vector<int64_t> link(p.common.size(), 0);
  for (int32_t rank = 0; rank < W; ++rank) {
    fo::SlotMap map;
    ASSERT_NO_THROW(map = fo::make_alltoall_map(p.sched_of_rank, p.groups_of_rank, routing, rank)) << "rank " << rank;
    ASSERT_EQ(map.groups.size(), p.common.size());
    for (size_t g = 0; g < map.groups.size(); ++g) {
      int64_t out = 0, in = 0;
      for (int32_t peer = 0; peer < W; ++peer)
        if (peer != rank) {
          out += map.groups[g].send_to[size_t(peer)].count / map.bn;
          in += map.groups[g].recv_from[size_t(peer)].count / map.bn;
        }
      link[g] = std::max({link[g], out, in});
    }
  }
  const fo::CommModel comm = comm_of(r);
  const double wave = wave_of(r);
  if (p.sequential) {
    const double gemm = wave * T;
    EXPECT_NEAR(p.baseline_ms, gemm + comm.ms(bytes_of(link[0], r), 0), 1e-12 * p.baseline_ms);
    EXPECT_NEAR(p.predicted.groups[0].compute_end, gemm, 1e-12 * p.baseline_ms);
  } else {
    for (size_t g = 0; g < p.common.size(); ++g) {
      const fo::GroupTiming& x = p.predicted.groups[g];
      EXPECT_NEAR(x.comm_end - x.comm_start, comm.ms(bytes_of(link[g], r), r.reserve_sms), 1e-9) << "group " << g;
    }
  }
}

std::string error_of(const fo::MoePlanRequest& r) {
  try {
    fo::make_moe_plan(r);
  } catch (const flashoverlap::InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(MoePlan, RandomRoutingsGiveGroupsEveryRankMapsBuild) {
  FO_SEEDED_RNG(rng);
  int sequential = 0, overlapped = 0;
  for (int it = 0; it < 80; ++it) {
    std::string what;
    const int32_t W = int32_t(uniform(rng, 1, 8));
    const bool lean = it % 8 == 0 && W > 1;  // some overlap for sure
    Lean c = lean ? lean_case(rng, W, 40) : Lean{random_routing(rng, W, 5000, what), {}, {}};
    fo::MoePlanRequest r = lean ? c.req : random_request(rng, c.routing, what);
    r.routing = &c.routing;
    SCOPED_TRACE(lean ? c.what : what);
    const fo::MoePlan p = fo::make_moe_plan(r);
    SCOPED_TRACE(fo::describe(p));
    check_plan(p, r);
    (p.sequential ? sequential : overlapped)++;
  }
  EXPECT_GT(sequential, 0);
  EXPECT_GT(overlapped, 0);
}

TEST(MoePlan, TypicalCombineOverlaps) {
  const fo::MoeRouting routing = interleaved(8, 8192, 3);
  fo::MoePlanRequest r;
  r.routing = &routing;
  r.n = 7168;
  r.k = 2048;
  r.reserve_sms = 16;
  const fo::MoePlan p = fo::make_moe_plan(r);
  check_plan(p, r);
  EXPECT_FALSE(p.sequential) << fo::describe(p);
  EXPECT_GT(p.common.size(), 1u);
  EXPECT_EQ(p.ctas, 116);
  EXPECT_GT(p.speedup(), 1.05) << fo::describe(p);
}

// The dispatch delivers an expert's rows by source rank. Walked from row 0,
// every expert would compute the rows of the same destination at the same
// time, each group's call an incast (the first half's call measured 0.99 of
// the whole call's bandwidth term here); each rank's walk starts at the
// next rank's rows instead (make_moe_schedule), so a group's rows spread
// over the links as interleaved destinations' do, and the combine overlaps.
TEST(MoePlan, SourceOrderedRowsSpreadOverTheLinks) {
  const fo::MoeRouting blocks = fo::make_moe_routing("uniform", 8, 4096, 2, 3);
  const fo::MoeRouting mixed = interleaved(8, 8192, 3);
  fo::MoePlanRequest r;
  r.n = 7168;
  r.k = 2048;
  r.reserve_sms = 16;
  auto call_ms = [&](const fo::MoeRouting& routing, const fo::Partition& part) {
    r.routing = &routing;
    r.partition = part;
    const fo::MoePlan p = fo::make_moe_plan(r);
    return p.predicted.groups[0].comm_end - p.predicted.groups[0].comm_start;
  };
  const double overhead = fo::BandwidthCurve::builtin_h200(fo::Collective::AllToAll).overhead_ms();
  const int32_t T = 16;  // 8192 rows x 28 tile columns on 116 CTAs
  r.routing = &blocks;
  ASSERT_EQ(brute_cost(r).waves(), T);
  // Bandwidth terms of the first half's call against the whole call's.
  const double blocks_half = (call_ms(blocks, {T / 2, T / 2}) - overhead) / (call_ms(blocks, {T}) - overhead);
  const double mixed_half = (call_ms(mixed, {T / 2, T / 2}) - overhead) / (call_ms(mixed, {T}) - overhead);
  std::cout << "first half's call / whole call (bandwidth terms): source-ordered " << blocks_half
            << ", interleaved " << mixed_half << "\n";
  EXPECT_LT(blocks_half, 0.6);
  EXPECT_LT(mixed_half, 0.6);
  r.partition.reset();
  r.routing = &blocks;
  EXPECT_FALSE(fo::make_moe_plan(r).sequential);
  r.routing = &mixed;
  EXPECT_FALSE(fo::make_moe_plan(r).sequential);
}

TEST(MoePlan, ForcedPartitionIsEvaluatedOnTheModel) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 40; ++it) {
    std::string what;
    const fo::MoeRouting routing = random_routing(rng, int32_t(uniform(rng, 1, 8)), 3000, what);
    fo::MoePlanRequest r = random_request(rng, routing, what);
    const fo::CostModel cost = brute_cost(r);
    const int32_t T = cost.waves();
    if (T == 0) continue;  // below
    r.partition = fo_test::random_partition(rng, T);
    SCOPED_TRACE(what + " partition " + fo::to_string(*r.partition));
    const fo::MoePlan p = fo::make_moe_plan(r);
    check_plan(p, r);
    EXPECT_FALSE(p.sequential);  // no fallback, even on one rank
    EXPECT_EQ(p.common, *r.partition);
    const fo::Prediction want = fo::predict(cost, *r.partition);
    EXPECT_NEAR(p.predicted.total_ms, want.total_ms, 1e-12 * want.total_ms);
    ASSERT_EQ(p.predicted.groups.size(), want.groups.size());
    for (size_t g = 0; g < want.groups.size(); ++g) {
      EXPECT_NEAR(p.predicted.groups[g].compute_end, want.groups[g].compute_end, 1e-12 * want.total_ms);
      EXPECT_NEAR(p.predicted.groups[g].comm_start, want.groups[g].comm_start, 1e-12 * want.total_ms);
      EXPECT_NEAR(p.predicted.groups[g].comm_end, want.groups[g].comm_end, 1e-12 * want.total_ms);
    }
  }
}

// Several experts per rank: the grouped GEMM's schedules (virtual tile rows,
// idle rows priced as whole tiles), the maps build and their spans give the
// calls' times, and a forced partition's prediction is the brute-force model's.
TEST(MoePlan, SeveralExpertsPlanTheGroupedGemmsWaves) {
  FO_SEEDED_RNG(rng);
  int overlapped = 0;
  for (int it = 0; it < 40; ++it) {
    const int32_t W = int32_t(uniform(rng, 1, 8)), E = int32_t(uniform(rng, 2, 4));
    const int64_t kind = uniform(rng, 0, W >= 2 ? 3 : 2);
    const std::string R = std::to_string(uniform(rng, 0, W - 1));
    const std::string name = kind == 0 ? "uniform" : kind == 1 ? "zipf:1.2" : kind == 2 ? "one:" + R : "empty:" + R;
    const int32_t K = int32_t(uniform(rng, 1, std::min(kind == 3 ? (W - 1) * E : W * E, 8)));
    const int64_t tokens = uniform(rng, 0, 4) == 0 ? uniform(rng, 0, 2) : uniform(rng, 1, 3000);
    std::string what = name + " W=" + std::to_string(W) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                       " tokens=" + std::to_string(tokens);
    const fo::MoeRouting routing = fo::make_moe_routing(name, W, tokens, K, rng(), E);
    fo::MoePlanRequest r = random_request(rng, routing, what);
    SCOPED_TRACE(what);
    const fo::MoePlan p = fo::make_moe_plan(r);
    SCOPED_TRACE(fo::describe(p));
    check_plan(p, r);
    overlapped += !p.sequential;
    const fo::CostModel cost = brute_cost(r);
    if (cost.waves() == 0) continue;
    r.partition = fo_test::random_partition(rng, cost.waves());
    const fo::MoePlan forced = fo::make_moe_plan(r);
    check_plan(forced, r);
    const fo::Prediction want = fo::predict(cost, *r.partition);
    EXPECT_NEAR(forced.predicted.total_ms, want.total_ms, 1e-12 * want.total_ms);
  }
  // (random requests overlap in most runs, not all: one that must, every run)
  const fo::MoeRouting routing = fo::make_moe_routing("uniform", 4, 4096, 4, rng(), 2);
  fo::MoePlanRequest r;
  r.routing = &routing;
  r.n = 4096, r.k = 4096, r.tile = fo::TileShape{128, 256}, r.sms = 132, r.reserve_sms = 8, r.min_gain = 0.01;
  const fo::MoePlan p = fo::make_moe_plan(r);
  check_plan(p, r);
  overlapped += !p.sequential;
  EXPECT_FALSE(p.sequential) << fo::describe(p);
  EXPECT_GT(overlapped, 0);
}

// W = 2, E = 4: rank 0 holds 100 and 30 rows per expert alternately from
// each source (8 segments, 520 rows). The grouped GEMM has 8 tile rows of
// 128 (not the 5 of 520 rows), so 8 tile columns on 16 CTAs take 4 waves, not 3.
TEST(MoePlan, SeveralExpertsPayForTheirIdleRows) {
  using P = fo::MoePick;
  std::vector<std::vector<std::vector<P>>> picks(2);
  for (int32_t src = 0; src < 2; ++src)
    for (int32_t t = 0; t < 100; ++t) {  // experts 0 and 2 of rank 0: every token; 1 and 3: the first 30
      std::vector<P> p{P{0, 0.25f, 0}, P{0, 0.25f, 2}};
      if (t < 30) p.push_back(P{0, 0.25f, 1}), p.push_back(P{0, 0.25f, 3});
      picks[size_t(src)].push_back(p);
    }
  const fo::MoeRouting routing = fo::moe_routing_from_picks(2, picks, 4);
  ASSERT_EQ(routing.expert_rows[0], (std::vector<int64_t>{100, 30, 100, 30, 100, 30, 100, 30}));
  ASSERT_EQ(routing.rows(0), 520);
  ASSERT_EQ(routing.rows(1), 0);
  const fo::MoeRowCounts counts = fo::count_moe_rows(routing, 128);
  const fo::GroupedTileRows& g = counts.tile_rows[0];
  EXPECT_EQ(g.a_row0, (std::vector<int32_t>{0, 100, 130, 230, 260, 360, 390, 490}));
  EXPECT_EQ(g.rows, (std::vector<int32_t>{100, 30, 100, 30, 100, 30, 100, 30}));
  EXPECT_EQ(g.b_row0, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  // Tile rows 0-3 hold source 0's rows (back to rank 0), 4-7 source 1's.
  EXPECT_EQ(counts.counts[0], (std::vector<int64_t>{100, 0, 30, 0, 100, 0, 30, 0, 0, 100, 0, 30, 0, 100, 0, 30}));
  EXPECT_TRUE(counts.counts[1].empty());
  fo::MoePlanRequest r;
  r.routing = &routing;
  r.n = 8 * 256;
  r.k = 1024;
  r.sms = 16;
  r.min_gain = 1;  // sequential: the GEMM on all 16 SMs
  const fo::MoePlan p = fo::make_moe_plan(r);
  ASSERT_TRUE(p.sequential);
  EXPECT_EQ(p.sched_of_rank[0].m, 8 * 128);
  EXPECT_EQ(p.sched_of_rank[0].tiles(), 64);
  EXPECT_EQ(p.waves(), 4);
  EXPECT_EQ(p.sched_of_rank[0].row_shift, 4);  // the first tile row for rank 1
  EXPECT_EQ(p.sched_of_rank[1].waves(), 0);
  // The same rows as one expert: 5 tile rows, 3 waves.
  fo::MoeRouting one = routing;
  one.experts = 1;
  one.expert_rows.clear();
  EXPECT_EQ(fo::make_moe_plan({.routing = &one, .n = r.n, .k = r.k, .sms = 16, .min_gain = 1}).waves(), 3);
  EXPECT_NEAR(p.baseline_ms - fo::make_moe_plan({.routing = &one, .n = r.n, .k = r.k, .sms = 16, .min_gain = 1}).baseline_ms,
              r.gemm.wave_ms(r.tile, r.k), 1e-12);
  for (int32_t rank = 0; rank < 2; ++rank) EXPECT_NO_THROW(fo::make_alltoall_map(p.sched_of_rank, p.groups_of_rank, routing, rank));
}

// One expert: the plan is the one of the counts per row / bm (the binning
// before the grouped GEMM's tile rows), field for field.
TEST(MoePlan, OneExpertPlansAreThoseOfRowOverBmCounts) {
  FO_SEEDED_RNG(rng);
  for (int it = 0; it < 30; ++it) {
    std::string what;
    const fo::MoeRouting routing = random_routing(rng, int32_t(uniform(rng, 1, 8)), 3000, what);
    fo::MoePlanRequest r = random_request(rng, routing, what);
    SCOPED_TRACE(what);
    fo::MoeRowCounts brute;
    brute.bm = r.tile.bm;
    for (int32_t x = 0; x < routing.world; ++x) {
      const auto& dest = routing.dest_rank[size_t(x)];
      brute.counts.emplace_back((dest.size() + size_t(r.tile.bm) - 1) / size_t(r.tile.bm) * size_t(routing.world), 0);
      for (size_t i = 0; i < dest.size(); ++i) ++brute.counts.back()[i / size_t(r.tile.bm) * size_t(routing.world) + size_t(dest[i])];
    }
    EXPECT_EQ(fo::count_moe_rows(routing, r.tile.bm).counts, brute.counts);
    const fo::MoePlan mine = fo::make_moe_plan(r);
    r.counts = &brute;
    const fo::MoePlan want = fo::make_moe_plan(r);
    EXPECT_EQ(mine.sequential, want.sequential);
    EXPECT_EQ(mine.ctas, want.ctas);
    EXPECT_EQ(mine.common, want.common);
    EXPECT_EQ(mine.groups_of_rank, want.groups_of_rank);
    EXPECT_EQ(mine.predicted.total_ms, want.predicted.total_ms);
    EXPECT_EQ(mine.baseline_ms, want.baseline_ms);
    ASSERT_EQ(mine.sched_of_rank.size(), want.sched_of_rank.size());
    for (size_t x = 0; x < mine.sched_of_rank.size(); ++x) {
      EXPECT_EQ(mine.sched_of_rank[x].m, routing.rows(int32_t(x)));
      EXPECT_EQ(mine.sched_of_rank[x].row_shift, want.sched_of_rank[x].row_shift);
    }
  }
}

TEST(MoePlan, SearchedPartitionIsTheBestOfAll) {
  FO_SEEDED_RNG(rng);
  int sequential = 0, overlapped = 0;
  for (int it = 0, cases = 0; it < 400 && cases < 24; ++it) {
    std::string what;
    const bool lean = it % 2;  // else overlap is rare at T <= 10
    const int32_t W = int32_t(uniform(rng, 2, 8));
    Lean c = lean ? lean_case(rng, W, 10) : Lean{random_routing(rng, W, 800, what), {}, {}};
    fo::MoePlanRequest r = lean ? c.req : random_request(rng, c.routing, what);
    r.routing = &c.routing;
    if (lean) what = c.what;
    const fo::CostModel cost = brute_cost(r);
    const int32_t T = cost.waves();
    if (T < 2 || T > 10) continue;
    ++cases;
    SCOPED_TRACE(what + " T=" + std::to_string(T));
    const fo::MoePlan p = fo::make_moe_plan(r);
    check_plan(p, r);
    const fo::SearchResult best = fo::search_exhaustive(cost);
    const double tol = 1e-12 * p.baseline_ms;
    if (p.sequential) {
      ++sequential;
      EXPECT_GT(best.total_ms, p.baseline_ms * (1 - r.min_gain) - tol) << "a partition beats sequential";
    } else {
      ++overlapped;
      EXPECT_NEAR(p.predicted.total_ms, best.total_ms, tol);
    }
    // Through the public call: no forced partition predicts better than the
    // plan when it overlaps, or than min_gain under sequential when it does not.
    const double bound = p.sequential ? p.baseline_ms * (1 - r.min_gain) : p.predicted.total_ms;
    fo::for_each_partition(T, [&](const fo::Partition& part) {
      r.partition = part;
      EXPECT_GE(fo::make_moe_plan(r).predicted.total_ms, bound - tol) << fo::to_string(part);
    });
  }
  EXPECT_GT(sequential, 0);
  EXPECT_GT(overlapped, 0);
  std::cout << "exhaustive cases: " << overlapped << " overlapped, " << sequential << " sequential\n";
}

TEST(MoePlan, SequentialOnOneRankOrWithoutRows) {
  FO_SEEDED_RNG(rng);
  // One rank: nothing leaves it, no overlap to gain.
  const fo::MoeRouting one = fo::make_moe_routing("uniform", 1, uniform(rng, 1000, 5000), 1, rng());
  fo::MoePlanRequest r;
  r.routing = &one;
  r.n = 4096;
  r.k = 8192;
  fo::MoePlan p = fo::make_moe_plan(r);
  check_plan(p, r);
  EXPECT_TRUE(p.sequential);
  EXPECT_EQ(p.ctas, 132);
  EXPECT_EQ(p.common, fo::Partition{p.waves()});
  EXPECT_NEAR(p.baseline_ms,
              r.gemm.wave_ms(r.tile, r.k) * p.waves() + comm_of(r).ms(0, 0), 1e-12);
  EXPECT_EQ(fo::describe(p).rfind("sequential, " + std::to_string(p.waves()) + " waves (128x256, 132 CTAs)", 0), 0u)
      << fo::describe(p);

  // No rows anywhere: no waves, one empty group per rank.
  const int32_t W = int32_t(uniform(rng, 2, 8));
  const fo::MoeRouting none = fo::make_moe_routing("uniform", W, 0, int32_t(uniform(rng, 1, W)), rng());
  r.routing = &none;
  p = fo::make_moe_plan(r);
  check_plan(p, r);
  EXPECT_TRUE(p.sequential);
  EXPECT_EQ(p.waves(), 0);
  EXPECT_EQ(p.common, fo::Partition{1});
  for (const auto& groups : p.groups_of_rank) EXPECT_EQ(groups, (std::vector<fo::Group>{{0, 0, 0, 0}}));
  EXPECT_DOUBLE_EQ(p.baseline_ms, comm_of(r).ms(0, 0));
  r.partition = fo::Partition{1};  // the only partition of no waves
  check_plan(fo::make_moe_plan(r), r);
  r.partition = fo::Partition{2};
  EXPECT_NE(error_of(r).find("no rows: only {1}"), std::string::npos) << error_of(r);

  // An expert without rows among others: empty groups on that rank only.
  const int32_t R = int32_t(uniform(rng, 0, W - 1));
  const fo::MoeRouting empty = fo::make_moe_routing("empty:" + std::to_string(R), W, 4096, 1, rng());
  r.routing = &empty;
  r.partition.reset();
  p = fo::make_moe_plan(r);
  check_plan(p, r);
  EXPECT_EQ(p.sched_of_rank[size_t(R)].waves(), 0);
  for (const fo::Group& g : p.groups_of_rank[size_t(R)]) EXPECT_EQ(g.tiles(), 0);
}

TEST(MoePlan, CoarseSearchAboveMaxSearchWaves) {
  FO_SEEDED_RNG(rng);
  // ~120000 rows x 64 tile columns on 116 CTAs: ~520 waves.
  const fo::MoeRouting routing = interleaved(2, uniform(rng, 120000, 125000), rng());
  fo::MoePlanRequest r;
  r.routing = &routing;
  r.n = 16384;
  r.k = 1024;
  r.reserve_sms = 16;
  const auto t0 = std::chrono::steady_clock::now();
  const fo::MoePlan p = fo::make_moe_plan(r);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fo::describe(p) << " in " << ms << " ms\n";
  EXPECT_GT(p.waves(), 512);
  check_plan(p, r);
  EXPECT_FALSE(p.sequential);
}

TEST(MoePlan, RejectsBadRequests) {
  const fo::MoeRouting routing = fo::make_moe_routing("uniform", 4, 1000, 2, 1);
  fo::MoePlanRequest ok;
  ok.routing = &routing;
  ok.n = 4096;
  ok.k = 4096;
  EXPECT_EQ(error_of(ok), "(no error)");
  auto expect = [&](fo::MoePlanRequest r, const std::string& part) {
    const std::string e = error_of(r);
    EXPECT_NE(e.find(part), std::string::npos) << "got: " << e << "\nexpected: " << part;
  };
  fo::MoePlanRequest r = ok;
  r.routing = nullptr;
  expect(r, "no routing");
  fo::MoeRouting bad = routing;
  bad.send_counts[1] += 1;
  r = ok;
  r.routing = &bad;
  expect(r, "send_counts");
  bad = routing;
  bad.dest_rank[2][0] = 7;
  expect(r, "destination rank 7");
  r = ok;
  r.n = 0;
  expect(r, "N=0");
  r = ok;
  r.k = -1;
  expect(r, "K=-1");
  r = ok;
  r.reserve_sms = -1;
  expect(r, "reserved SMs -1");
  r.reserve_sms = 132;
  expect(r, "reserved SMs 132 must be in [0, 131]");
  r = ok;
  r.sms = 0;
  expect(r, "SM count 0");
  r = ok;
  r.tile = {64, 64};
  expect(r, "no default GEMM estimate for tile 64x64");
  r.wave_ms = 0.02;  // measured: any tile
  EXPECT_EQ(error_of(r), "(no error)");
  r.tile = {0, 64};
  expect(r, "tile 0x64");
  r = ok;
  r.wave_ms = -1;
  expect(r, "measured wave time");
  r.wave_ms = NAN;
  expect(r, "measured wave time");
  r = ok;
  r.curve = fo::BandwidthCurve::builtin_h200(fo::Collective::AllReduce);
  expect(r, "curve is for allreduce");
  r = ok;
  r.min_gain = std::nan("");
  expect(r, "min_gain");
  r = ok;
  r.comm_saturating_ctas = 0;
  expect(r, "saturating CTAs");
  r = ok;
  r.gemm.slowdown = 0.5;
  expect(r, "slowdown");
  r = ok;
  const int32_t T = brute_cost(ok).waves();  // of the overlapped grid
  r.partition = fo::Partition{T + 1};
  expect(r, "partition " + std::to_string(T + 1) + " for the " + std::to_string(T) + " waves of 124 CTAs");
  r.partition = fo::Partition{T, 0};
  expect(r, "partition");
  r.partition = fo::Partition{};
  expect(r, "partition");
}

TEST(MoePlan, DescribeSaysWhatItChose) {
  const fo::MoeRouting routing = interleaved(8, 8192, 5);
  fo::MoePlanRequest r;
  r.routing = &routing;
  r.n = 7168;
  r.k = 4096;
  const fo::MoePlan p = fo::make_moe_plan(r);
  ASSERT_FALSE(p.sequential);
  const std::string d = fo::describe(p);
  EXPECT_EQ(d.rfind("waves " + fo::to_string(p.common) + " of " + std::to_string(p.waves()) + " (128x256, 124 CTAs), predicted ", 0), 0u) << d;
  EXPECT_NE(d.find(" ms against "), std::string::npos) << d;
  EXPECT_NE(d.find(" ms sequential"), std::string::npos) << d;
  EXPECT_EQ(fo::describe(fo::MoePlan{}), "empty MoE plan");
}

// Loose: make_moe_plan is meant for every call (the routing changes each
// time); about a millisecond at these sizes, 50 ms allows a loaded CI.
TEST(MoePlan, FastEnoughToPlanEveryCall) {
  FO_SEEDED_RNG(rng);
  struct Case {
    std::string what;
    fo::MoeRouting routing;
  };
  std::vector<Case> cases;
  for (const char* kind : {"uniform", "zipf:1.2", "one:0"})
    cases.push_back({std::string(kind) + " 8192 tokens top-2", fo::make_moe_routing(kind, 8, 8192, 2, rng())});
  cases.push_back({"interleaved 100000 rows", interleaved(8, 100000, rng())});  // ~180 waves
  for (const Case& c : cases) {
    fo::MoePlanRequest r;
    r.routing = &c.routing;
    r.n = 7168;
    r.k = 2048;
    r.reserve_sms = 16;
    double best = INFINITY;
    fo::MoePlan p;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      p = fo::make_moe_plan(r);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::cout << c.what << ": " << fo::describe(p) << "; planned in " << best << " ms\n";
    EXPECT_LT(best, 50.0) << c.what;
  }
}
