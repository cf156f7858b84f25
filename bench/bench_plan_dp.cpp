// The partition search's cost: search_dp over T waves with the built-in H200
// AllReduce curve, one curve evaluation per candidate group (O(T^2), the
// planner's worst case: ReduceScatter standard layout and All-to-All, whose
// group bytes are not a function of the group's length), and make_plan's
// whole search for a shape of ~T waves. The bar: well under 1 ms at T = 256.
#include <benchmark/benchmark.h>

#include "plan/latency_model.h"
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
