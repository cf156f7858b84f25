// The partition search's cost: search_dp over T waves with the built-in H200
// AllReduce curve, one curve evaluation per candidate group (O(T^2), the
// planner's worst case: ReduceScatter standard layout and All-to-All, whose
// group bytes are not a function of the group's length), and make_plan's
// whole search for a shape of ~T waves. The bar: well under 1 ms at T = 256.
// And the host work of one MoE combine call (BM_MoeCallHost).
#include <benchmark/benchmark.h>

#include "plan/latency_model.h"
#include "plan/moe_plan.h"
#include "plan/routing.h"
#include "plan/slot_map_alltoall.h"
#include "plan/planner.h"
#include "plan/search.h"

namespace fp = flashoverlap::plan;

namespace {

fp::CostModel allreduce_model(int32_t waves) {
  static const fp::CommModel comm(fp::BandwidthCurve::builtin_h200(fp::Collective::AllReduce), 2);
  const double tile_bytes = 128.0 * 256 * 2, wave_tiles = 116;
  fp::CostModel m;
  m.wave_ms.assign(size_t(waves), fp::GemmModel{}.wave_ms({128, 256}, 8192) * 1.1);
  m.comm_ms = [tile_bytes, wave_tiles](int32_t j, int32_t i) { return comm.ms((i - j) * wave_tiles * tile_bytes, 16); };
  return m;
}

void BM_SearchDp(benchmark::State& state) {
  const fp::CostModel m = allreduce_model(int32_t(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(fp::search_dp(m));
  state.counters["groups"] = double(fp::search_dp(m).partition.size());
  state.SetComplexityN(state.range(0));
}
BENCHMARK(BM_SearchDp)->Arg(8)->Arg(32)->Arg(64)->Arg(128)->Arg(256)->Unit(benchmark::kMicrosecond)->Complexity();

// make_plan for an AllReduce whose 128x256 grid has about T waves on 116 CTAs:
// 2 tiles x 4 reserves x DP, plus the slot-free bookkeeping.
void BM_MakePlanAllReduce(benchmark::State& state) {
  fp::PlanRequest r;
  r.m = 128 * 29 * state.range(0) / 8;  // 29*T/8 tile rows x 32 tile columns ~ T waves of 116
  r.n = 8192;
  r.k = 8192;
  r.world = 2;
  for (auto _ : state) benchmark::DoNotOptimize(fp::make_plan(r));
}
BENCHMARK(BM_MakePlanAllReduce)->Arg(8)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();

// The host's work per call of the public GemmAllToAll (the MoE combine), for
// a routing of W ranks, T tokens each, top-2 (N 4096; with E experts per
// rank, E > 1, top-8, as DeepSeek-V3's and Qwen3's): the routing's check,
// the MoE plan for each of the two tile shapes, and the runtime op's tables
// (every rank's schedule and clipped groups, the compact slot tables, the
// combine's table). The routing changes every call, so all of it is per call.
void BM_MoeCallHost(benchmark::State& state) {
  const int32_t W = int32_t(state.range(0));
  const int64_t T = state.range(1);
  const int32_t E = int32_t(state.range(3));
  const fp::MoeRouting routing = fp::make_moe_routing("uniform", W, T, E > 1 ? 8 : 2, 7, E);
  const int32_t rank = 0;
  const bool counted = state.range(2) != 0;  // as the public op now: the routing counted once, the plans and tables from that
  for (auto _ : state) {
    fp::MoeRowCounts counts;
    if (counted) counts = fp::count_moe_rows(routing, 128);
    else fp::validate_moe_routing(routing);
    fp::MoePlan best;
    for (const fp::TileShape tile : {fp::TileShape{128, 256}, fp::TileShape{128, 128}}) {
      fp::MoePlanRequest req;
      req.routing = &routing, req.n = 4096, req.k = 14336, req.tile = tile, req.min_gain = -1;
      if (counted) req.counts = &counts;
      fp::MoePlan p = fp::make_moe_plan(req);
      if (best.sched_of_rank.empty() || p.predicted.total_ms < best.predicted.total_ms) best = std::move(p);
    }
    std::vector<fp::Schedule> scheds;
    std::vector<std::vector<fp::Group>> groups;
    for (int32_t r = 0; r < W; ++r) {
      scheds.push_back(fp::make_moe_schedule(routing, r, 4096, {best.sched_of_rank[0].bm, best.sched_of_rank[0].bn},
                                             best.ctas));
      groups.push_back(fp::make_clipped_groups(scheds.back(), best.common));
    }
    benchmark::DoNotOptimize(fp::make_alltoall_tables(scheds, groups, routing, rank, counted ? &counts : nullptr));
    benchmark::DoNotOptimize(fp::make_combine_table(routing, rank));
  }
  state.counters["rows_rank0"] = double(routing.rows(0));
}
BENCHMARK(BM_MoeCallHost)
    ->ArgNames({"world", "tokens", "counted", "experts"})
    ->ArgsProduct({{2, 8}, {256, 4096, 8192}, {0, 1}, {1}})
    ->ArgsProduct({{8}, {256, 4096}, {1}, {8, 32}})
    ->Unit(benchmark::kMicrosecond);
