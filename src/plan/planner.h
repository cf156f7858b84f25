// planner.h — the planner's top level: for one shape and collective, pick the
// tile shape, the SMs left to NCCL, the tile order and the wave partition
// that the model predicts fastest, or fall back to sequential when nothing
// beats it (docs/design.md §5.6: never slower than sequential). AllReduce and
// ReduceScatter only: the All-to-All (the MoE combine, every rank its own
// rows, a new routing every call) is planned per call by make_moe_plan
// (plan/moe_plan.h).
//
// Typical use (runtime):
//   PlanRequest req{.op = Collective::AllReduce, .m = M, .n = N, .k = K, .world = W};
//   Plan plan = make_plan(req);
//   SlotMap map = make_slot_map(plan, rank);
//   GEMM: plan.schedule, map.row_of (or the AllReduce fast path),
//         group_of_wave(plan.groups); NCCL: map.groups[g].send/recv/send_to/recv_from;
//   post-reorder: map.slot_of_out or scatter_tables(map), map.out_rows x N.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/collective.h"
#include "plan/latency_model.h"
#include "plan/partition.h"
#include "plan/predictor.h"
#include "plan/slot_map.h"
#include "plan/slot_map_reducescatter.h"
#include "plan/tile_grid.h"

namespace flashoverlap::plan {

inline constexpr TileShape kTileCandidates[] = {{128, 256}, {128, 128}};
// SMs left to NCCL that the search tries (0 is the sequential fallback), plus,
// for each wave count w, the largest reserve that still fits the tiles in w
// waves (sms - ceil(tiles / w)) within [kMinReserve, kMaxReserve]: among
// reserves with the same waves it gives NCCL the most SMs for the same GEMM.
// A heuristic keeps the search small: a reserve that another beats on both
// summary counts (no more GEMM waves, at least as many NCCL CTAs up to
// saturating_ctas) is not searched. It is not a proof of dominance (group
// tile sets differ with the CTA count), so the plan is optimal over the
// remaining candidates only.
inline constexpr int32_t kReserveCandidates[] = {8, 16, 24, 32};
inline constexpr int32_t kMinReserve = 2, kMaxReserve = 40;
// Above this many waves the DP runs on runs of ceil(T/kMaxSearchWaves) waves.
inline constexpr int32_t kMaxSearchWaves = 512;
// Largest world size planned for (a sanity bound; make_moe_plan's too: its
// maps read every rank's routing).
inline constexpr int32_t kMaxWorld = 1024;
// ReduceScatter: standard layout unless predicted slower than sub-tile by more.
inline constexpr double kStandardLayoutTolerance = 0.03;

struct PlanRequest {
  Collective op = Collective::AllReduce;
  int64_t m = 0, n = 0, k = 0;
  int32_t world = 2;
  DType dtype = DType::BF16;
  std::optional<TileShape> tile;        // unset: try kTileCandidates
  int32_t sms = 132;
  int32_t reserve_sms = -1;             // SMs left to NCCL; -1: search (see kReserveCandidates)
  std::optional<Raster> raster;         // unset: AlongN (and, for the standard
  int32_t swizzle = 0;                  //   ReduceScatter layout, AlongM/1); 0: default_swizzle
  std::optional<BandwidthCurve> curve;  // unset: BandwidthCurve::builtin_h200(op)
  int32_t comm_saturating_ctas = 16;
  GemmModel gemm;
  std::vector<double> measured_wave_ms; // non-empty: per-wave GEMM times (needs tile and reserve set)
  std::optional<Partition> partition;   // set: evaluate it instead of searching (no fallback)
  std::optional<RsLayout> rs_layout;    // ReduceScatter; unset: choose (slot_map_reducescatter.h)
  double min_gain = 0.01;               // overlap must be predicted this much faster than sequential
};

struct Plan {
  Collective op = Collective::AllReduce;
  DType dtype = DType::BF16;
  int32_t world = 1;
  int64_t k = 0;
  int32_t sms = 0, reserve_sms = 0;  // schedule.ctas == sms - reserve_sms
  Schedule schedule;
  // No overlap predicted to pay: one group, GEMM on all SMs, then one call.
  // The slot layout still applies (same output); for AllReduce the runtime
  // may as well run the plain GEMM and one ncclAllReduce on C.
  bool sequential = false;
  RsLayout rs_layout = RsLayout::SubTile;  // ReduceScatter only
  Partition partition;
  std::vector<Group> groups;
  std::vector<double> group_bytes;   // send buffer of each group's call
  Prediction predicted;
  double baseline_gemm_ms = 0, baseline_comm_ms = 0;  // sequential: GEMM on all SMs, one call on C
  double padding_bytes = 0;          // ReduceScatter standard layout: bytes sent only to align parts
  std::vector<std::string> notes;    // the model's assumptions, in words

  double baseline_ms() const { return baseline_gemm_ms + baseline_comm_ms; }
  double speedup() const { return baseline_ms() / predicted.total_ms; }
};

// Throws InvalidArgument for bad requests (shape, world, tile, partition that
// fits no candidate, curve of another collective, op AllToAll or AllGather, ...).
Plan make_plan(const PlanRequest& req);

// The runtime's view of a plan on one rank (AllReduce, ReduceScatter; the
// All-to-All's maps are make_alltoall_map's, of a MoePlan).
SlotMap make_slot_map(const Plan& plan, int32_t rank);

// {"format": "flashoverlap.plan", "schema": 1, ...}; from_json validates
// everything (the schedule, the partition against its waves, the groups) and
// throws InvalidArgument "<source>: <problem>".
nlohmann::json to_json(const Plan& plan);
Plan plan_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace flashoverlap::plan
