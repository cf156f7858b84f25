// reducescatter_planner.h — how GemmReduceScatter plans each m, without a
// GPU: from what the op measured at construction (its GEMM's time per wave,
// the sequential GEMM's choice per m, rank 0's tuning-cache picks) to m's
// plan and its text. The op plans with it; flashoverlap::plan_gemm_reducescatter
// (and so `flashoverlap plan`) with the same object on the model's inputs.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/op_setup.h"
#include "flashoverlap/flashoverlap.h"
#include "plan/planner.h"
#include "runtime/tune/picks.h"

namespace flashoverlap::api {

struct ReduceScatterPlanner {
  int64_t n = 0, k = 0;
  int world = 1, sms = 132;
  DType dtype = DType::BF16;
  GemmReduceScatterOptions opts;
  std::vector<double> wave_ms;  // our GEMM's time per wave, one per entry of op_tiles(opts.input)
  // The sequential calls' GEMM per m (ours or cuBLAS's), measured; empty:
  // not measured (the model's plan), our GEMM's time stands for it.
  SequentialGemms seq;
  std::map<int64_t, rt::ReduceScatterPick> picks;  // the tuning cache's, by tile rows (Auto)
  bool nvlink_ready = false;                       // the NVLink form's windows connect every rank

  // A planned m: the plan, and how its op runs it (the tuning cache's picks).
  struct Planned {
    plan::Plan plan;
    bool nvlink = false, cublas = false, picked = false;
  };

  plan::RsLayout layout() const {
    return opts.layout == GemmReduceScatterOptions::Layout::Standard ? plan::RsLayout::Standard
                                                                     : plan::RsLayout::SubTile;
  }
  // The model's plan for one tile shape, NCCL on nccl_sms SMs (partition: forced).
  plan::Plan plan_with(int64_t m, size_t tile, std::optional<plan::Partition> partition, double min_gain) const;
  // The tuning cache's pick for m's tile rows, where it applies (Auto).
  std::optional<Planned> picked_for(int64_t m) const;
  Planned plan_for(int64_t m) const;
  Planned model_plan_for(int64_t m) const;
  // GemmReduceScatter::plan(m)'s text for rank `rank`'s op of p, m's plan.
  std::string describe(int64_t m, const Planned& p, int rank) const;
};

}  // namespace flashoverlap::api
