#include "plan/moe_plan.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>

#include "flashoverlap/error.h"
#include "plan/planner.h"  // kMaxSearchWaves, kMaxWorld
#include "plan/search.h"
#include "plan/slot_map.h"
#include "plan/slot_map_alltoall.h"

namespace flashoverlap::plan {

namespace {

std::string fmt(double v) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(3);
  o << v;
  return o.str();
}

// Everything but the routing's rows (count_moe_rows checks those).
void check_request(const MoePlanRequest& req) {
  if (!req.routing) throw InvalidArgument("MoE plan: no routing (every rank's routing is required)");
  if (req.routing->world < 1 || req.routing->dest_rank.size() != size_t(req.routing->world))
    validate_moe_routing(*req.routing);  // throws, naming the problem
  if (req.routing->world > kMaxWorld)
    throw InvalidArgument("MoE plan: world size " + std::to_string(req.routing->world) + " above " +
                          std::to_string(kMaxWorld));
  if (req.n < 1 || req.k < 1)
    throw InvalidArgument("MoE plan: N=" + std::to_string(req.n) + " K=" + std::to_string(req.k) +
                          ": both must be >= 1");
  if (req.sms < 1) throw InvalidArgument("MoE plan: SM count " + std::to_string(req.sms) + " must be >= 1");
  if (req.reserve_sms < 0 || req.reserve_sms >= req.sms)
    throw InvalidArgument("MoE plan: reserved SMs " + std::to_string(req.reserve_sms) + " must be in [0, " +
                          std::to_string(req.sms - 1) + "] (SMs: " + std::to_string(req.sms) + ")");
  if (req.tile.bm < 1 || req.tile.bn < 1)
    throw InvalidArgument("MoE plan: tile " + to_string(req.tile) + ": both sides must be >= 1");
  if (!(req.wave_ms >= 0) || !std::isfinite(req.wave_ms))
    throw InvalidArgument("MoE plan: measured wave time " + std::to_string(req.wave_ms) +
                          " ms must be finite and >= 0 (0: the GEMM model's estimate)");
  if (!(req.gemm.slowdown >= 1.0) || !(req.gemm.peak_tflops > 0) || req.gemm.peak_sms < 1)
    throw InvalidArgument("MoE plan: GEMM model needs slowdown >= 1, peak TFLOP/s > 0 and peak SMs >= 1");
  if (req.wave_ms == 0) {
    try {
      GemmModel::efficiency(req.tile);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("MoE plan: ") + e.what());
    }
  }
  if (!std::isfinite(req.min_gain))
    throw InvalidArgument("MoE plan: min_gain " + std::to_string(req.min_gain) + " must be finite");
  if (req.curve && req.curve->op() != Collective::AllToAll)
    throw InvalidArgument("MoE plan: the bandwidth curve is for " + std::string(to_string(req.curve->op())) +
                          ", the plan for alltoall");
}

using RowCounts = std::vector<std::vector<int64_t>>;  // MoeRowCounts::counts

std::vector<Schedule> schedules(const MoePlanRequest& req, int32_t ctas) {
  const MoeRouting& r = *req.routing;
  std::vector<Schedule> out;
  for (int32_t rank = 0; rank < r.world; ++rank) out.push_back(make_moe_schedule(r, rank, req.n, req.tile, ctas));
  return out;
}

int32_t most_waves(const std::vector<Schedule>& s) {
  int32_t most = 0;
  for (const Schedule& x : s) most = std::max(most, x.waves());
  return most;
}

// Every rank's off-rank traffic on the common wave axis as prefix sums over
// waves 0..T, in slot rows: sent_[w*W + x] = rows of x's first min(w, T_x)
// waves to other ranks, recv_[w*W + x] = rows of every other source's first
// min(w, T_s) waves to x. A source past its last wave adds nothing (the
// clipping of make_clipped_groups), so a group's load is O(W) from them.
class MoeLoad {
 public:
  MoeLoad(const std::vector<Schedule>& sched, const RowCounts& per_tile_row, int32_t T)
      : W_(int32_t(sched.size())), sent_(size_t(T + 1) * W_, 0), recv_(size_t(T + 1) * W_, 0) {
    for (int32_t src = 0; src < W_; ++src) {
      const Schedule& s = sched[size_t(src)];
      const WaveCounts counts(s, W_, per_tile_row[size_t(src)]);
      for (int32_t w = 1; w <= T; ++w) {
        const int32_t ws = std::min(w, s.waves());
        for (int32_t d = 0; d < W_; ++d) {
          if (d == src) continue;
          const int64_t c = counts.sum(0, ws, d);
          sent_[size_t(w) * W_ + src] += c;
          recv_[size_t(w) * W_ + d] += c;
        }
      }
    }
  }

  int64_t max_link_rows(int32_t w0, int32_t w1) const {
    const int64_t *s0 = &sent_[size_t(w0) * W_], *s1 = &sent_[size_t(w1) * W_];
    const int64_t *r0 = &recv_[size_t(w0) * W_], *r1 = &recv_[size_t(w1) * W_];
    int64_t most = 0;
    for (int32_t x = 0; x < W_; ++x) most = std::max({most, s1[x] - s0[x], r1[x] - r0[x]});
    return most;
  }

 private:
  int32_t W_;
  std::vector<int64_t> sent_, recv_;
};

// Bytes of the send buffer of a uniform all-to-all whose busiest link carries
// `rows` slot rows (it puts (W-1)/W of its buffer on the links; make_plan's).
double link_bytes(int64_t rows, const MoePlanRequest& req) {
  const int32_t W = req.routing->world;
  return W > 1 ? double(rows) * req.tile.bn * double(element_bytes(req.dtype)) * W / (W - 1) : 0.0;
}

// The whole traffic's busiest link in slot rows: every row goes once per tile column.
int64_t total_link_rows(const MoeRouting& r, int64_t tiles_n) {
  int64_t most = 0;
  for (int32_t x = 0; x < r.world; ++x) {
    int64_t sent = 0, recv = 0;
    for (int32_t y = 0; y < r.world; ++y)
      if (y != x) {
        sent += r.send_count(x, y);
        recv += r.send_count(y, x);
      }
    most = std::max({most, sent, recv});
  }
  return most * tiles_n;
}

// The overlapped grid's model (planner.cpp's make_cost with the MoE bytes).
CostModel make_cost(const MoePlanRequest& req, std::shared_ptr<const CommModel> comm,
                    const std::vector<Schedule>& sched, const RowCounts& per_tile_row, double wave) {
  const int32_t T = most_waves(sched), reserve = req.reserve_sms;
  CostModel cost;
  if (reserve > 0) {
    cost.wave_ms.assign(size_t(T), wave * req.gemm.slowdown);
  } else {  // NCCL gets SMs only when the persistent GEMM is done
    cost.wave_ms.assign(size_t(T), wave);
    cost.comm_not_before_ms = wave * T;
  }
  auto load = std::make_shared<const MoeLoad>(sched, per_tile_row, T);
  const double row_bytes = link_bytes(1, req);
  cost.comm_ms = [load, comm, row_bytes, reserve](int32_t w0, int32_t w1) {
    return comm->ms(double(load->max_link_rows(w0, w1)) * row_bytes, reserve);
  };
  return cost;
}

void set_groups(MoePlan& p) {
  p.groups_of_rank.clear();
  for (const Schedule& s : p.sched_of_rank) p.groups_of_rank.push_back(make_clipped_groups(s, p.common));
}

}  // namespace

int32_t MoePlan::waves() const { return most_waves(sched_of_rank); }

MoePlan make_moe_plan(const MoePlanRequest& req) {
  check_request(req);
  const MoeRouting& routing = *req.routing;
  // The routing's rows per tile row and destination (checking it on the way), or the caller's:
  // per virtual tile row of the grouped GEMM with several experts, as make_moe_schedule walks them.
  std::optional<MoeRowCounts> own;
  if (!req.counts || req.counts->bm != req.tile.bm || req.counts->counts.size() != size_t(routing.world))
    own = count_moe_rows(routing, req.tile.bm);
  const RowCounts& per_tile_row = (own ? *own : *req.counts).counts;
  const int32_t W = routing.world;
  auto comm = std::make_shared<const CommModel>(
      req.curve ? *req.curve : BandwidthCurve::builtin_h200(Collective::AllToAll), W, req.comm_saturating_ctas);
  // A measured wave is used for both grids (planner.cpp's sequential_baseline does the same).
  const double wave = req.wave_ms > 0 ? req.wave_ms : req.gemm.wave_ms(req.tile, req.k);

  const int32_t ctas = req.sms - req.reserve_sms;
  std::vector<Schedule> overlap = schedules(req, ctas);
  const int32_t T = most_waves(overlap);
  if (req.partition) {
    try {
      validate_partition(*req.partition, std::max(T, 1));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("MoE plan: partition " + to_string(*req.partition) + " for the " + std::to_string(T) +
                            " waves of " + std::to_string(ctas) + " CTAs" + (T == 0 ? " (no rows: only {1})" : "") +
                            ": " + e.what());
    }
  }

  MoePlan plan;
  plan.sched_of_rank = schedules(req, req.sms);
  const double gemm_ms = wave * plan.waves();
  const double comm_ms =
      comm->ms(link_bytes(total_link_rows(routing, plan.sched_of_rank.front().tiles_n()), req), 0);
  plan.baseline_ms = gemm_ms + comm_ms;

  // A forced partition is evaluated whenever there are waves; a searched one
  // needs peers and two waves, and must beat sequential by min_gain (and
  // strictly: with min_gain 0 a tie, e.g. one group on every SM, is
  // sequential). A negative min_gain takes the best overlap however slow (a
  // forced path, a benchmark's candidates); >= 1, never.
  if (T >= 1 && (req.partition || (W > 1 && T >= 2))) {
    const CostModel cost = make_cost(req, comm, overlap, per_tile_row, wave);
    Partition p = req.partition ? *req.partition : search_coarsened(cost, kMaxSearchWaves);
    Prediction pred = predict(cost, p);
    if (req.partition || (pred.total_ms <= plan.baseline_ms * (1 - req.min_gain) &&
                          (req.min_gain < 0 || pred.total_ms < plan.baseline_ms))) {
      plan.ctas = ctas;
      plan.sched_of_rank = std::move(overlap);
      plan.common = std::move(p);
      plan.predicted = std::move(pred);
      set_groups(plan);
      return plan;
    }
  }
  plan.sequential = true;
  plan.ctas = req.sms;
  plan.common = {std::max(plan.waves(), 1)};  // {1} with no rows: one empty group per rank
  plan.predicted.groups = {{0, gemm_ms, gemm_ms, plan.baseline_ms}};
  plan.predicted.total_ms = plan.baseline_ms;
  set_groups(plan);
  return plan;
}

std::string describe(const MoePlan& p) {
  if (p.sched_of_rank.empty()) return "empty MoE plan";
  const Schedule& s = p.sched_of_rank.front();
  std::ostringstream o;
  if (p.sequential) o << "sequential, " << p.waves() << " waves";
  else o << "waves " << to_string(p.common) << " of " << p.waves();
  o << " (" << s.bm << "x" << s.bn << ", " << p.ctas << " CTAs), predicted " << fmt(p.predicted.total_ms) << " ms";
  if (!p.sequential) o << " against " << fmt(p.baseline_ms) << " ms sequential";
  return o.str();
}

}  // namespace flashoverlap::plan
