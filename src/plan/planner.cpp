#include "plan/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "flashoverlap/error.h"
#include "plan/search.h"
#include "plan/slot_map_allreduce.h"

namespace flashoverlap::plan {

namespace {

using BytesFn = std::function<double(int32_t, int32_t)>;

std::string fmt(double v, int digits = 3) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(digits);
  o << v;
  return o.str();
}

void check_request(const PlanRequest& req) {
  if (req.op == Collective::AllGather)
    throw InvalidArgument("allgather is not a GEMM collective to plan (allreduce, reducescatter or alltoall)");
  // Every rank its own rows and a new routing every call: nothing one shape describes.
  if (req.op == Collective::AllToAll)
    throw InvalidArgument("alltoall is planned per call, from every rank's routing, by plan::make_moe_plan "
                          "(plan/moe_plan.h), not by make_plan");
  if (req.m < 1 || req.n < 1 || req.k < 1)
    throw InvalidArgument("shape M=" + std::to_string(req.m) + " N=" + std::to_string(req.n) + " K=" +
                          std::to_string(req.k) + ": every dimension must be >= 1");
  if (req.world < 1 || req.world > kMaxWorld)
    throw InvalidArgument("world size " + std::to_string(req.world) + " must be in [1, " + std::to_string(kMaxWorld) +
                          "]");
  if (req.sms < 1) throw InvalidArgument("SM count " + std::to_string(req.sms) + " must be >= 1");
  if (req.reserve_sms >= req.sms || req.reserve_sms < -1)
    throw InvalidArgument("reserved SMs " + std::to_string(req.reserve_sms) + " must be in [0, " +
                          std::to_string(req.sms - 1) + "] (SMs: " + std::to_string(req.sms) + ")");
  if (!(req.gemm.slowdown >= 1.0) || !(req.gemm.peak_tflops > 0) || req.gemm.peak_sms < 1)
    throw InvalidArgument("GEMM model needs slowdown >= 1, peak TFLOP/s > 0 and peak SMs >= 1");
  if (!req.measured_wave_ms.empty() && (!req.tile || req.reserve_sms < 0))
    throw InvalidArgument("measured wave times are for one configuration: set the tile and the reserved SMs");
  for (double w : req.measured_wave_ms)
    if (!(w > 0) || !std::isfinite(w)) throw InvalidArgument("measured wave times must be positive and finite");
}

// Bytes of the send buffer of the call for waves [w0, w1) (group_bytes).
BytesFn make_bytes_fn(const PlanRequest& req, const Schedule& s, RsLayout layout) {
  const double row_bytes = double(s.bn) * element_bytes(req.dtype);
  if (req.op == Collective::ReduceScatter && layout == RsLayout::Standard) {
    auto counts = std::make_shared<WaveCounts>(rs_standard_counts(s, req.world));
    return [counts, row_bytes](int32_t w0, int32_t w1) {
      return double(rs_standard_padded_rows(*counts, w0, w1)) * row_bytes;
    };
  }
  const double tile_bytes = row_bytes * s.bm;
  return [s, tile_bytes](int32_t w0, int32_t w1) { return group_spanning(s, w0, w1).tiles() * tile_bytes; };
}

double baseline_bytes(const PlanRequest& req) { return double(req.n) * element_bytes(req.dtype) * double(req.m); }

struct Candidate {
  Schedule schedule;
  int32_t reserve = 0;
  RsLayout layout = RsLayout::SubTile;
  CostModel cost;
  BytesFn bytes;
  Partition partition;
  Prediction prediction;
};

// Ragged costs (AllReduce, sub-tile ReduceScatter) depend only on the group's
// length and on whether it holds the partial last wave: memoise on that, so a
// DP over T waves evaluates the curve O(T) times instead of O(T^2).
bool translation_invariant(Collective op, RsLayout layout) {
  return op == Collective::AllReduce || (op == Collective::ReduceScatter && layout == RsLayout::SubTile);
}

CostModel make_cost(const PlanRequest& req, const CommModel& comm, const Schedule& s, int32_t reserve,
                    RsLayout layout, const BytesFn& bytes) {
  CostModel cost;
  cost.wave_ms = req.measured_wave_ms.empty() ? req.gemm.waves_ms(s, req.k) : req.measured_wave_ms;
  if (int32_t(cost.wave_ms.size()) != s.waves())
    throw InvalidArgument("measured wave times: " + std::to_string(cost.wave_ms.size()) +
                          " given, the schedule has " + std::to_string(s.waves()) + " waves");
  if (reserve > 0) {
    for (double& w : cost.wave_ms) w *= req.gemm.slowdown;
  } else {  // NCCL gets SMs only when the persistent GEMM is done
    cost.comm_not_before_ms = std::accumulate(cost.wave_ms.begin(), cost.wave_ms.end(), 0.0);
  }
  auto call = [&comm, bytes, reserve](int32_t w0, int32_t w1) { return comm.ms(bytes(w0, w1), reserve); };
  if (!translation_invariant(req.op, layout)) {
    cost.comm_ms = call;
    return cost;
  }
  const int32_t T = s.waves();
  auto memo = std::make_shared<std::vector<double>>(size_t(2 * T + 1), -1.0);
  cost.comm_ms = [memo, call, T](int32_t w0, int32_t w1) {
    double& v = (*memo)[size_t(w1 - w0 + (w1 == T ? T : 0))];
    if (v < 0) v = call(w0, w1);
    return v;
  };
  return cost;
}

Schedule schedule_for(const PlanRequest& req, TileShape tile, int32_t ctas, Raster raster, int32_t swizzle) {
  const int32_t tiles_m = int32_t((req.m + tile.bm - 1) / tile.bm);
  return make_schedule(req.m, req.n, tile, ctas, raster,
                       swizzle > 0 ? swizzle : raster == Raster::AlongM ? 1 : default_swizzle(ctas, tile, tiles_m));
}

std::vector<int32_t> reserves_for(const PlanRequest& req, TileShape tile) {
  if (req.reserve_sms >= 0) return {req.reserve_sms};
  std::set<int32_t> all;
  for (int32_t x : kReserveCandidates)
    if (x < req.sms) all.insert(x);
  const int64_t tiles = ((req.m + tile.bm - 1) / tile.bm) * ((req.n + tile.bn - 1) / tile.bn);
  for (int64_t w = 1; w <= tiles; ++w) {
    const int64_t x = req.sms - (tiles + w - 1) / w;  // fewest CTAs that take the tiles in w waves
    if (x > kMaxReserve) break;                       // grows with w
    if (x >= kMinReserve && x < req.sms) all.insert(int32_t(x));
  }
  // Drop r when another leaves the GEMM no more waves and NCCL at least as
  // many useful CTAs, better on one count or a smaller reserve (planner.h).
  auto waves = [&](int32_t r) { return (tiles + (req.sms - r) - 1) / (req.sms - r); };
  auto useful = [&](int32_t r) { return std::min(r, req.comm_saturating_ctas); };
  std::vector<int32_t> kept;
  for (int32_t r : all) {
    bool dominated = false;
    for (int32_t o : all)
      dominated |= o != r && waves(o) <= waves(r) && useful(o) >= useful(r) &&
                   (waves(o) < waves(r) || useful(o) > useful(r) || o < r);
    if (!dominated) kept.push_back(r);
  }
  return kept;
}

std::vector<std::pair<Raster, int32_t>> rasters_for(const PlanRequest& req, RsLayout layout) {
  if (req.raster) return {{*req.raster, req.swizzle}};
  std::vector<std::pair<Raster, int32_t>> r{{Raster::AlongN, 0}};
  // Column-major walk: every tile column spans all ranks' rows (low padding).
  if (req.op == Collective::ReduceScatter && layout == RsLayout::Standard) r.push_back({Raster::AlongM, 1});
  return r;
}

std::vector<RsLayout> layouts_for(const PlanRequest& req, TileShape tile) {
  if (req.op != Collective::ReduceScatter) return {RsLayout::SubTile};
  std::vector<RsLayout> out;
  for (RsLayout l : {RsLayout::Standard, RsLayout::SubTile}) {
    if (req.rs_layout && *req.rs_layout != l) continue;
    Schedule probe;
    probe.m = int32_t(std::min<int64_t>(req.m, INT32_MAX));
    probe.bm = tile.bm;
    if (rs_layout_applies(probe, req.world, l)) out.push_back(l);
  }
  return out;
}

std::string layout_note(const Plan& p) {
  const int32_t W = p.world;
  if (p.rs_layout == RsLayout::Standard) {
    std::string s = "reducescatter layout: standard (rank k gets rows [k*M/W, (k+1)*M/W))";
    const double data = std::accumulate(p.group_bytes.begin(), p.group_bytes.end(), 0.0) - p.padding_bytes;
    if (p.padding_bytes > 0) s += ", padding " + fmt(100.0 * p.padding_bytes / data, 1) + "% of the bytes";
    return s;
  }
  return "reducescatter layout: sub-tile (rank k gets rows tm*" + std::to_string(p.schedule.bm) + " + k*" +
         std::to_string(p.schedule.bm / W) + " + [0, " + std::to_string(p.schedule.bm / W) +
         ") of every tile row; not the standard row blocks)";
}

struct Baseline {
  TileShape tile;
  double gemm_ms = INFINITY, comm_ms = 0;
};

// Sequential: the fastest tile on every SM, then one call on all of C.
Baseline sequential_baseline(const PlanRequest& req, const CommModel& comm, const std::vector<TileShape>& tiles) {
  Baseline b{tiles.front()};
  b.comm_ms = comm.ms(baseline_bytes(req), 0);
  for (TileShape t : tiles) {
    const int32_t waves = schedule_for(req, t, req.sms, Raster::AlongN, 0).waves();
    const double gemm = req.measured_wave_ms.empty()
                            ? req.gemm.wave_ms(t, req.k) * waves
                            : std::accumulate(req.measured_wave_ms.begin(), req.measured_wave_ms.end(), 0.0) /
                                  double(req.measured_wave_ms.size()) * waves;
    if (gemm < b.gemm_ms) b = {t, gemm, b.comm_ms};
  }
  return b;
}

// The best overlap candidate per ReduceScatter layout (index: RsLayout; the
// other collectives use SubTile's); none when no reserve fits the SMs. Throws
// for a partition that fits no configuration and for ReduceScatter shapes
// that no layout can split.
std::array<std::optional<Candidate>, 2> best_candidates(const PlanRequest& req, const CommModel& comm,
                                                        const std::vector<TileShape>& tiles) {
  std::array<std::optional<Candidate>, 2> best;
  const int64_t given_waves =
      req.partition ? std::accumulate(req.partition->begin(), req.partition->end(), int64_t{0}) : 0;
  std::string mismatch;
  for (TileShape tile : tiles)
    for (RsLayout layout : layouts_for(req, tile))
      for (int32_t reserve : reserves_for(req, tile))
        for (auto [raster, swizzle] : rasters_for(req, layout)) {
          Candidate c;
          c.schedule = schedule_for(req, tile, req.sms - reserve, raster, swizzle);
          c.reserve = reserve;
          c.layout = layout;
          if (req.partition && given_waves != c.schedule.waves()) {
            if (!mismatch.empty()) mismatch += ", ";
            mismatch += std::to_string(c.schedule.waves()) + " (" + to_string(tile) + ", " +
                        std::to_string(reserve) + " reserved)";
            continue;
          }
          c.bytes = make_bytes_fn(req, c.schedule, layout);
          c.cost = make_cost(req, comm, c.schedule, reserve, layout, c.bytes);
          c.partition = req.partition ? *req.partition : search_coarsened(c.cost, kMaxSearchWaves);
          c.prediction = predict(c.cost, c.partition);
          auto& slot = best[size_t(layout)];
          if (!slot || c.prediction.total_ms < slot->prediction.total_ms) slot = std::move(c);
        }
  if (best[0] || best[1]) return best;
  if (req.partition)
    throw InvalidArgument("partition " + to_string(*req.partition) + " sums to " + std::to_string(given_waves) +
                          " waves but " +
                          (mismatch.empty() ? "no configuration leaves SMs to NCCL (" + std::to_string(req.sms) + " SMs)"
                                            : "the configurations have T = " + mismatch));
  if (req.op == Collective::ReduceScatter && layouts_for(req, tiles.front()).empty()) {
    if (req.rs_layout)
      require_rs_layout(schedule_for(req, tiles.front(), req.sms, Raster::AlongN, 0), req.world, *req.rs_layout);
    throw InvalidArgument("reducescatter needs M % world == 0 (standard layout) or tile rows % world == 0 "
                          "(sub-tile layout): M=" + std::to_string(req.m) + ", world=" + std::to_string(req.world));
  }
  return best;  // none: no SMs can be left to NCCL
}

void set_sequential(Plan& plan, const PlanRequest& req, const Baseline& base) {
  plan.sequential = true;
  plan.reserve_sms = 0;
  plan.schedule = schedule_for(req, base.tile, req.sms, Raster::AlongN, 0);
  plan.rs_layout = req.rs_layout.value_or(
      rs_layout_applies(plan.schedule, req.world, RsLayout::Standard) ? RsLayout::Standard : RsLayout::SubTile);
  plan.partition = {plan.schedule.waves()};
  plan.groups = make_groups(plan.schedule, plan.partition);
  plan.group_bytes = {baseline_bytes(req)};
  plan.predicted.groups = {{0, base.gemm_ms, base.gemm_ms, base.gemm_ms + base.comm_ms}};
  plan.predicted.total_ms = base.gemm_ms + base.comm_ms;
}

void set_overlap(Plan& plan, const PlanRequest& req, const Candidate& c) {
  plan.reserve_sms = c.reserve;
  plan.schedule = c.schedule;
  plan.rs_layout = c.layout;
  plan.partition = c.partition;
  plan.groups = make_groups(plan.schedule, plan.partition);
  for (const Group& g : plan.groups) plan.group_bytes.push_back(c.bytes(g.first_wave, g.end_wave));
  plan.predicted = c.prediction;
  if (req.op == Collective::ReduceScatter && plan.rs_layout == RsLayout::Standard) {
    const WaveCounts counts = rs_standard_counts(plan.schedule, plan.world);
    for (const Group& g : plan.groups)
      plan.padding_bytes += double(rs_standard_padding_rows(counts, g.first_wave, g.end_wave)) * plan.schedule.bn *
                            element_bytes(req.dtype);
  }
  if (plan.schedule.waves() > kMaxSearchWaves && !req.partition)
    plan.notes.push_back("search over runs of " +
                         std::to_string((plan.schedule.waves() + kMaxSearchWaves - 1) / kMaxSearchWaves) +
                         " waves (T > " + std::to_string(kMaxSearchWaves) + ")");
}

}  // namespace

Plan make_plan(const PlanRequest& req) {
  check_request(req);
  const BandwidthCurve curve = req.curve ? *req.curve : BandwidthCurve::builtin_h200(req.op);
  if (curve.op() != req.op)
    throw InvalidArgument("the bandwidth curve is for " + std::string(to_string(curve.op())) + ", the plan for " +
                          std::string(to_string(req.op)));
  const CommModel comm(curve, req.world, req.comm_saturating_ctas);
  if (req.partition)  // entries only: which T it must sum to depends on the configuration
    validate_partition(*req.partition, std::accumulate(req.partition->begin(), req.partition->end(), 0));
  const std::vector<TileShape> tiles =
      req.tile ? std::vector<TileShape>{*req.tile}
               : std::vector<TileShape>(std::begin(kTileCandidates), std::end(kTileCandidates));

  const Baseline base = sequential_baseline(req, comm, tiles);
  const auto best = best_candidates(req, comm, tiles);
  const bool standard = best[1] && (!best[0] || best[1]->prediction.total_ms <=
                                                    best[0]->prediction.total_ms * (1 + kStandardLayoutTolerance));
  const Candidate* chosen = best[standard ? 1 : 0] ? &*best[standard ? 1 : 0] : nullptr;

  Plan plan;
  plan.op = req.op;
  plan.dtype = req.dtype;
  plan.world = req.world;
  plan.k = req.k;
  plan.sms = req.sms;
  plan.baseline_gemm_ms = base.gemm_ms;
  plan.baseline_comm_ms = base.comm_ms;
  plan.notes.push_back(req.measured_wave_ms.empty()
                           ? "GEMM model: " + fmt(req.gemm.peak_tflops, 0) + " TFLOP/s over " +
                                 std::to_string(req.gemm.peak_sms) + " SMs (128x128 tiles at 0.92), x" +
                                 fmt(req.gemm.slowdown, 2) + " while NCCL runs"
                           : "GEMM model: measured wave times, x" + fmt(req.gemm.slowdown, 2) + " while NCCL runs");
  plan.notes.push_back("comm model: " + comm.describe());
  if (!chosen) {
    set_sequential(plan, req, base);
    plan.notes.push_back("sequential: no SMs can be left to NCCL on " + std::to_string(req.sms) + " SMs");
  } else if (!req.partition && chosen->prediction.total_ms > plan.baseline_ms() * (1 - req.min_gain)) {
    set_sequential(plan, req, base);
    plan.notes.push_back("sequential: the best overlap (" + fmt(chosen->prediction.total_ms) + " ms) is not " +
                         fmt(100 * req.min_gain, 0) + "% faster than GEMM then one call");
  } else {
    set_overlap(plan, req, *chosen);
  }
  if (req.op == Collective::ReduceScatter) {
    plan.notes.push_back(layout_note(plan));
    if (best[0] && best[1] && !plan.sequential && !standard)
      plan.notes.push_back("standard layout rejected: predicted " + fmt(best[1]->prediction.total_ms) +
                           " ms with its padding");
  }
  return plan;
}

SlotMap make_slot_map(const Plan& plan, int32_t rank) {
  switch (plan.op) {
    case Collective::AllReduce: return make_allreduce_map(plan.schedule, plan.groups, plan.world);
    case Collective::ReduceScatter:
      return make_reducescatter_map(plan.schedule, plan.groups, plan.world, rank, plan.rs_layout);
    case Collective::AllToAll:  // never planned here (check_request): per rank and call, make_alltoall_map
    case Collective::AllGather: break;  // a transport, never planned (check_request)
  }
  throw InvalidArgument("no slot map for " + std::string(to_string(plan.op)));
}

}  // namespace flashoverlap::plan
