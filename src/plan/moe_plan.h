// moe_plan.h — the planner of the MoE combine (docs/design.md §11): every
// rank's expert GEMM (its own m_r rows, the same n, k, tile and grid) then an
// All-to-All back to the tokens, overlapped group by group.
//
// One common wave axis: it has the most waves of any rank, and since every
// rank's wave takes the same time, wave w ends at about the same time on all
// of them. A partition of that axis, clipped to each rank's own waves
// (make_clipped_groups), gives every rank the same number of groups; group
// g's call moves group g of every rank (slot_map_alltoall.h).
//
// The model (docs/design.md §2.4, as make_plan's): compute per wave is the
// wave time (x GemmModel::slowdown beside NCCL); a group's call costs
// CommModel::ms of the busiest rank's off-rank traffic in that group — the
// larger of the slot rows it sends to other ranks and those it receives from
// them — as the send buffer of a uniform all-to-all with that link load
// (x W/(W-1), make_plan's convention), on the reserve_sms CTAs left to NCCL.
//
// Typical use:
//   MoePlan p = make_moe_plan({.routing = &routing, .n = N, .k = K});
//   SlotMap map = make_alltoall_map(p.sched_of_rank, p.groups_of_rank, routing, rank);
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/collective.h"
#include "plan/latency_model.h"
#include "plan/partition.h"
#include "plan/predictor.h"
#include "plan/routing.h"
#include "plan/schedule.h"
#include "plan/tile_grid.h"

namespace flashoverlap::plan {

struct MoePlanRequest {
  const MoeRouting* routing = nullptr;  // every rank's routing (required)
  int64_t n = 0, k = 0;
  DType dtype = DType::BF16;
  TileShape tile{128, 256};
  int32_t sms = 132;            // the GPU's SMs: the sequential GEMM's grid
  int32_t reserve_sms = 8;      // SMs left to NCCL when overlapping: the overlapped GEMM's grid is sms - reserve_sms
                                // (0: the GEMM holds every SM, so no call starts before it ends)
  double wave_ms = 0;           // measured time of one GEMM wave of this tile (0: GemmModel's estimate)
  std::optional<BandwidthCurve> curve;  // unset: BandwidthCurve::builtin_h200(Collective::AllToAll)
  // Optional: count_moe_rows(*routing, tile.bm), made once for several plans
  // of a call (it is the routing's one pass, and its check); of another bm
  // or unset: counted here.
  const MoeRowCounts* counts = nullptr;
  int32_t comm_saturating_ctas = 16;
  GemmModel gemm;
  // Set: evaluate this partition of the overlapped grid's common wave axis
  // instead of searching, with no fallback to sequential (as make_plan). It
  // must sum to the most waves of any rank on sms - reserve_sms CTAs; with no
  // rows anywhere (no waves) only {1} is accepted, and the plan is sequential.
  std::optional<Partition> partition;
  double min_gain = 0.01;       // overlap must be predicted this much (fraction) faster than sequential, else
                                // sequential; < 0: the best overlap however slow; >= 1: sequential
};

struct MoePlan {
  bool sequential = false;      // one group, GEMM on all sms, then one all-to-all
  int32_t ctas = 0;             // the GEMM's grid (sms when sequential, else sms - reserve_sms)
  // make_moe_schedule(routing, r, n, tile, ctas) per rank: with several
  // experts the grouped GEMM's, whose waves count its virtual tile rows.
  std::vector<Schedule> sched_of_rank;
  // Of the common wave axis: sums to waves(), or is {1} when no rank has
  // rows (every rank then has one empty group).
  Partition common;
  std::vector<std::vector<Group>> groups_of_rank;  // make_clipped_groups(sched_of_rank[r], common)
  Prediction predicted;         // sequential: one group, {0, gemm, gemm, gemm + call}
  double baseline_ms = 0;       // sequential prediction

  int32_t waves() const;        // the most waves of any rank (0: no rows anywhere)
  double speedup() const { return predicted.total_ms > 0 ? baseline_ms / predicted.total_ms : 1.0; }
};

// Throws InvalidArgument for a missing or invalid routing (what
// validate_moe_routing rejects), n or k < 1, reserve_sms outside [0, sms), a
// tile GemmModel has no estimate for (unless wave_ms > 0), wave_ms < 0,
// a min_gain that is not finite, a curve of another collective, or a partition of
// the wrong wave count. Linear in the routing's rows and the tiles, plus the
// search's O(T^2 W): made on the host for every call.
MoePlan make_moe_plan(const MoePlanRequest& req);

// One line: "waves 3,2,2 of 7 (128x256, 124 CTAs), predicted 0.410 ms against
// 0.520 ms sequential" or "sequential, 7 waves (128x256, 132 CTAs), predicted 0.520 ms".
std::string describe(const MoePlan& p);

}  // namespace flashoverlap::plan
