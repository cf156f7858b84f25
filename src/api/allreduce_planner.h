// allreduce_planner.h — how GemmAllReduce plans each m, without a GPU: from
// what the op measured at construction (its GEMM's time per wave, the
// sequential GEMM's choice per m, rank 0's curves and tuning-cache picks),
// or the built-in model's stand-ins, to the plan of m's bucket and its text.
// The op plans with it; flashoverlap::plan_gemm_allreduce (and so
// `flashoverlap plan`) with the same object on the model's inputs.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/op_setup.h"
#include "flashoverlap/flashoverlap.h"
#include "plan/latency_model.h"
#include "plan/schedule.h"
#include "runtime/tune/tuner.h"

namespace flashoverlap::api {

struct AllReducePlanner {
  int64_t n = 0, k = 0;
  int world = 1, sms = 132;
  DType dtype = DType::BF16;
  GemmAllReduceOptions opts;
  std::vector<plan::TileShape> tiles = op_tiles();  // the shapes it plans with: op_tiles(opts.input)
  std::vector<double> wave_ms;  // our GEMM's time per wave, one per entry of tiles
  // The sequential calls' GEMM per m (ours or cuBLAS's), measured; empty:
  // not measured (the model's plan), our GEMM's time stands for it.
  SequentialGemms seq;
  std::unique_ptr<plan::BandwidthCurve> curve_default, curve_bounded;  // NCCL's default CTAs, nccl_sms CTAs
  std::map<int64_t, rt::AllReducePlan> picks;                          // the tuning cache's, by tile rows

  // Our GEMM's time for s, a schedule on one of `tiles` (throws for another tile).
  double gemm_ms(const plan::Schedule& s) const;
  plan::Schedule full_grid(int64_t m, plan::TileShape tile) const;
  rt::AllReducePlan sequential_plan(int64_t m) const;
  // The model's plan for m's bucket (the paper's online phase: nothing measured).
  rt::AllReducePlan plan_for(int64_t m) const;
  // GemmAllReduce::plan(m)'s text for p, m's plan.
  std::string describe(int64_t m, const rt::AllReducePlan& p) const;
};

// The options' inputs as the op and plan_gemm_allreduce take them
// (check_input_options, and FP8 not on the NVLink path yet).
void check_allreduce_inputs(const std::string& who, const GemmAllReduceOptions& options, int64_t k);

// The AllReduce curve of the built-in H200 model on `world` ranks and
// `ctas` CTAs (0: NCCL's default), at the model's sizes.
plan::BandwidthCurve model_allreduce_curve(int world, int ctas);

}  // namespace flashoverlap::api
