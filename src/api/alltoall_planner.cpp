// alltoall_planner.cpp — AllToAllPlanner (GemmAllToAll's planning) and
// flashoverlap::plan_gemm_alltoall, the same planning on the model's inputs.
#include "api/alltoall_planner.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace flashoverlap::api {

// (partition: none, the search's; a pointer, not a moved optional, which GCC 12 misreads as uninitialized)
plan::MoePlan AllToAllPlanner::plan_with(const plan::MoeRouting& routing, const plan::MoeRowCounts& counts,
                                         size_t tile, const plan::Partition* partition, double min_gain) const {
  plan::MoePlanRequest req;
  req.routing = &routing;
  req.n = n, req.k = k;
  req.dtype = dtype == DType::BF16 ? plan::DType::BF16 : plan::DType::FP16;
  req.tile = op_tiles(opts.input)[tile];
  req.sms = sms, req.reserve_sms = opts.nccl_sms, req.wave_ms = wave_ms[tile];
  if (partition) req.partition = *partition;
  req.min_gain = min_gain;
  req.counts = &counts;
  return plan::make_moe_plan(req);
}

AllToAllPlanner::Planned AllToAllPlanner::plan_for(const plan::MoeRouting& routing, const plan::MoeRowCounts& counts,
                                                   int rank) const {
  using Path = GemmAllToAllOptions::Path;
  std::optional<Planned> best;
  // (NVLink: the sequential plan's tile and grid, the whole GPU's; its rows go as the tiles finish.)
  const double gain = opts.path == Path::Auto ? 0.01 : opts.path == Path::Slots ? -1e9 : 1e9;
  const std::vector<plan::TileShape>& tiles = op_tiles(opts.input);
  for (size_t t = 0; t < tiles.size(); ++t) {
    if (opts.path == Path::NVLink && !scatter_takes_tile(opts.input, tiles[t])) continue;
    plan::MoePlan p = plan_with(routing, counts, t, nullptr, gain);
    if (opts.path == Path::Slots && p.common.size() < 2) {  // two groups at least, where the overlap grid has 2 waves
      int32_t waves = 0;
      for (int r = 0; r < world; ++r)
        waves = std::max(waves, plan::make_moe_schedule(routing, r, n, tiles[t], sms - opts.nccl_sms).waves());
      const plan::Partition two{waves - 1, 1};
      if (waves >= 2) p = plan_with(routing, counts, t, &two, gain);
    }
    if (!best || p.predicted.total_ms < best->plan.predicted.total_ms) best = Planned{std::move(p), t, false};
  }
  // The direct sequential call (rows in the dispatch's order everywhere) runs the faster GEMM for this rank's rows.
  // (Several experts: the grouped GEMM, ours.)
  best->cublas = best->plan.sequential && opts.path != Path::NVLink && routing.experts == 1 && !seq.samples.empty() &&
                 n % 8 == 0 &&
                 plan::in_dispatch_order(routing) && seq.cublas(std::max<int64_t>(routing.rows(rank), 1));
  return std::move(*best);
}

void check_alltoall_inputs(const std::string& who, const GemmAllToAllOptions& options, int64_t k) {
  check_input_options(who, options.input, options.scales, k);
  if (options.input == InputType::E4M3 && options.experts > 1)
    throw InvalidArgument(who + ": FP8 inputs take one expert per rank (the grouped GEMM's inputs are 16-bit)");
}

std::string AllToAllPlanner::describe(const Planned& p, int rank) const {
  if (opts.path == GemmAllToAllOptions::Path::NVLink) {
    const plan::Schedule& s = p.plan.sched_of_rank[size_t(rank)];
    return "nvlink: " + std::to_string(p.plan.waves()) + " waves (" + std::to_string(s.bm) + "x" +
           std::to_string(s.bn) + ", " + std::to_string(p.plan.ctas) +
           " CTAs), each row stored into its rank's window as its tile finishes, counted there";
  }
  return p.plan.sequential ? plan::describe(p.plan) + (p.cublas ? "; cuBLAS's GEMM" : "; our GEMM")
                           : "slots: " + plan::describe(p.plan) + "; NCCL on " + std::to_string(opts.nccl_sms) + " SMs";
}

}  // namespace flashoverlap::api

namespace flashoverlap {

std::string plan_gemm_alltoall(const std::vector<AllToAllRouting>& routings, int64_t n, int64_t k, DType dtype,
                               const GemmAllToAllOptions& options, int sms, int rank) {
  const int world = int(routings.size());
  const std::string who = "plan_gemm_alltoall (world " + std::to_string(world) + ", n " + std::to_string(n) + ", k " +
                          std::to_string(k) + ")";
  if (world < 1 || world > 1024) throw InvalidArgument(who + ": one routing per rank, 1 to 1024 of them");
  if (rank < 0 || rank >= world) throw InvalidArgument(who + ": rank must be in [0, world)");
  if (sms < 2 || sms > 1024) throw InvalidArgument(who + ": sms must be in [2, 1024]");
  int64_t most_rows = 1;
  for (const AllToAllRouting& r : routings) most_rows = std::max(most_rows, r.rows);
  api::check_shape(who, most_rows, n, k);
  api::check_op_options(who, sms, options.nccl_sms, options.wait_timeout_s);
  if (options.path == GemmAllToAllOptions::Path::NVLink && (n % 8 != 0 || world > 8))
    throw InvalidArgument(who + ": Path::NVLink needs n % 8 == 0 and at most 8 ranks");
  const int E = options.experts;
  if (E < 1 || E > 4096 || int64_t(E) * n > INT32_MAX)
    throw InvalidArgument(who + ": experts must be in [1, 4096], and experts x n (the weights' rows) below 2^31");
  api::check_alltoall_inputs(who, options, k);
  // Every rank's routing as the op gathers it (host arrays); count_moe_rows checks the rest.
  plan::MoeRouting all;
  all.world = world, all.experts = E;
  for (int s = 0; s < world; ++s) {
    const AllToAllRouting& r = routings[size_t(s)];
    const std::string at = who + ": rank " + std::to_string(s) + "'s routing: ";
    if (r.on_device) throw InvalidArgument(at + "the planning call reads host arrays (on_device must be false)");
    if (r.rows < 0 || r.tokens < 0 || r.tokens >= (int64_t(1) << 30))
      throw InvalidArgument(at + "rows and tokens must be >= 0 (and tokens below 2^30)");
    if (!r.send_counts || !r.recv_counts) throw InvalidArgument(at + "send_counts and recv_counts must not be null");
    if (r.rows > 0 && (!r.dest_rank || !r.dest_token))
      throw InvalidArgument(at + "dest_rank and dest_token must not be null with rows");
    if ((E > 1) != (r.expert_counts != nullptr))
      throw InvalidArgument(at + (E > 1 ? "expert_counts must not be null with several experts per rank"
                                        : "expert_counts is for several experts per rank (one here)"));
    if (E > 1) all.expert_rows.emplace_back(r.expert_counts, r.expert_counts + size_t(world) * size_t(E));
    const size_t rows = size_t(r.rows);
    all.tokens.push_back(int32_t(r.tokens));
    all.dest_rank.emplace_back(r.dest_rank, r.dest_rank + rows);
    all.dest_token.emplace_back(r.dest_token, r.dest_token + rows);
    all.gate.push_back(r.gate ? std::vector<float>(r.gate, r.gate + rows) : std::vector<float>(rows, 0.f));
    all.send_counts.insert(all.send_counts.end(), r.send_counts, r.send_counts + world);
  }
  for (int d = 0; d < world; ++d)
    for (int s = 0; s < world; ++s)
      if (routings[size_t(d)].recv_counts[s] != all.send_count(s, d))
        throw InvalidArgument(who + ": rank " + std::to_string(d) + "'s recv_counts[" + std::to_string(s) + "] = " +
                              std::to_string(routings[size_t(d)].recv_counts[s]) + " but rank " + std::to_string(s) +
                              " sends it " + std::to_string(all.send_count(s, d)) + " rows");
  const plan::MoeRowCounts counts = plan::count_moe_rows(all, api::kBm);  // (throws naming the rank and row)
  api::AllToAllPlanner p;
  p.n = n, p.k = k, p.world = world, p.sms = sms, p.dtype = dtype, p.opts = options;
  p.wave_ms = api::model_wave_ms(k, options.input);
  return p.describe(p.plan_for(all, counts, rank), rank);
}

}  // namespace flashoverlap
