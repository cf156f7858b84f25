// alltoall_planner.h — how GemmAllToAll plans a call, without a GPU: from
// what the op measured at construction (its GEMM's time per wave, the
// sequential GEMM's choice per m) and the call's routing (every rank's) to
// the plan, its tile and its text. The op plans with it;
// flashoverlap::plan_gemm_alltoall (and so `flashoverlap plan --op alltoall`)
// with the same object on the model's inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "api/op_setup.h"
#include "flashoverlap/flashoverlap.h"
#include "plan/moe_plan.h"
#include "plan/routing.h"
#include "plan/slot_map_alltoall.h"

namespace flashoverlap::api {

struct AllToAllPlanner {
  int64_t n = 0, k = 0;
  int world = 1, sms = 132;
  DType dtype = DType::BF16;
  GemmAllToAllOptions opts;
  std::vector<double> wave_ms;  // our GEMM's time per wave, one per entry of op_tiles(opts.input)
  // The sequential calls' GEMM per m (ours or cuBLAS's), measured; empty:
  // not measured (the model's plan, or the NVLink path), our GEMM.
  SequentialGemms seq;

  // A planned call: the plan, its tile (op_tiles(opts.input) index), and whether this
  // rank's sequential call runs cuBLAS's GEMM (rows in the dispatch's order
  // on every rank, n % 8 == 0, and cuBLAS's measured faster for its rows).
  struct Planned {
    plan::MoePlan plan;
    size_t tile = 0;
    bool cublas = false;
  };
  // counts: plan::count_moe_rows(routing, kBm) (the routing's check).
  Planned plan_for(const plan::MoeRouting& routing, const plan::MoeRowCounts& counts, int rank) const;
  // GemmAllToAll::last_plan()'s text for rank `rank`'s call of p.
  std::string describe(const Planned& p, int rank) const;

 private:
  plan::MoePlan plan_with(const plan::MoeRouting& routing, const plan::MoeRowCounts& counts, size_t tile,
                          const plan::Partition* partition, double min_gain) const;
};

// The options' inputs as the op and plan_gemm_alltoall take them
// (check_input_options, and FP8 with one expert per rank only).
void check_alltoall_inputs(const std::string& who, const GemmAllToAllOptions& options, int64_t k);

}  // namespace flashoverlap::api
