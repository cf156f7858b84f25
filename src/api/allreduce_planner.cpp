// allreduce_planner.cpp — see allreduce_planner.h.
#include "api/allreduce_planner.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "plan/curve_files.h"
#include "plan/tile_grid.h"
#include "runtime/ops/allreduce.h"
#include "runtime/tune/picks.h"

namespace flashoverlap::api {
namespace {

const char* path_name(GemmAllReduceOptions::Path p) {
  switch (p) {
    case GemmAllReduceOptions::Path::Auto: return "auto";
    case GemmAllReduceOptions::Path::Sequential: return "sequential";
    case GemmAllReduceOptions::Path::RowBands: return "row bands";
    case GemmAllReduceOptions::Path::Slots: return "slots";
    case GemmAllReduceOptions::Path::NVLink: return "nvlink";
  }
  return "?";
}

}  // namespace

plan::BandwidthCurve model_allreduce_curve(int world, int ctas) {
  const plan::BandwidthCurve base = plan::BandwidthCurve::builtin_h200(plan::Collective::AllReduce);
  const plan::CommModel model(base, world);
  std::vector<plan::CurveSample> samples;
  for (const plan::CurveSample& x : base.samples()) samples.push_back({x.bytes, model.ms(x.bytes, ctas)});
  return plan::BandwidthCurve(plan::Collective::AllReduce, world, samples, "the built-in H200 model");
}

plan::Schedule AllReducePlanner::full_grid(int64_t m, plan::TileShape tile) const {
  return plan::make_schedule(m, n, tile, sms, plan::Raster::AlongN,
                             plan::default_swizzle(sms, tile, int32_t((m + tile.bm - 1) / tile.bm)));
}

rt::AllReducePlan AllReducePlanner::sequential_plan(int64_t m) const {
  rt::AllReducePlan p;
  p.sequential = true;
  p.layout = rt::ArLayout::RowBands;
  p.sched = full_grid(m, tiles[0]);
  for (size_t i = 1; i < tiles.size(); ++i)
    if (const plan::Schedule other = full_grid(m, tiles[i]); gemm_ms(other) < gemm_ms(p.sched)) p.sched = other;
  p.groups = plan::make_groups(p.sched, {p.sched.waves()});
  // (the faster GEMM's time: the model's times are our GEMM's)
  const double ratio = seq.samples.empty() ? 1.0 : seq.ratio(m);
  p.predicted_ms = gemm_ms(p.sched) * ratio + curve_default->latency_ms(double(m) * double(n) * 2);
  return p;
}

double AllReducePlanner::gemm_ms(const plan::Schedule& s) const {
  for (size_t i = 0; i < tiles.size() && i < wave_ms.size(); ++i)
    if (tiles[i].bm == s.bm && tiles[i].bn == s.bn) return wave_ms[i] * s.waves();
  throw InvalidArgument("AllReducePlanner: no wave time for tile " + std::to_string(s.bm) + "x" + std::to_string(s.bn));
}

rt::AllReducePlan AllReducePlanner::plan_for(int64_t m) const {
  using Path = GemmAllReduceOptions::Path;
  const rt::AllReducePlan seq_plan = sequential_plan(m);
  if (opts.path == Path::Sequential) return seq_plan;
  if (auto it = picks.find(bucket_of(m)); opts.path == Path::Auto && it != picks.end()) {
    rt::AllReducePlan p = it->second;  // (measured: the sequential fallback with our GEMM, or an NCCL path)
    const bool runs_here = p.sequential || ((p.layout == rt::ArLayout::RowBands || p.layout == rt::ArLayout::Slots) &&
                                            p.reserve == opts.nccl_sms && p.sched.ctas == sms - opts.nccl_sms);
    if (runs_here) return p;
  }
  rt::AllReduceTuning t;
  t.sms = sms, t.dtype = to_kernels(dtype), t.world = world, t.reserve = opts.nccl_sms, t.tiles = tiles;
  t.curve_for = [this](int ctas) -> const plan::BandwidthCurve& { return ctas > 0 ? *curve_bounded : *curve_default; };
  t.gemm_ms = [this](const plan::Schedule& s) { return gemm_ms(s); };  // (the model: nothing measured)
  if (opts.path == Path::NVLink) {  // the model's best owner plan, or the sequential one
    t.layouts = {rt::ArLayout::Owners}, t.push_reachable = true;
    if (world > 2) t.tiles = {op_tiles()[0]};  // (owners on 3-8 ranks: 128x256 tiles on 4 stages; 16-bit inputs)
    try {
      return rt::tune_allreduce(t, m, n, k, nullptr, nullptr, nullptr, 1e30);
    } catch (const rt::NoPlan&) {
      return seq_plan;  // (one band of tile rows: nothing to overlap)
    }
  }
  t.layouts = opts.path == Path::RowBands ? std::vector<rt::ArLayout>{rt::ArLayout::RowBands}
              : opts.path == Path::Slots  ? std::vector<rt::ArLayout>{rt::ArLayout::Slots}
                                          : std::vector<rt::ArLayout>{rt::ArLayout::RowBands, rt::ArLayout::Slots};
  std::vector<rt::AllReducePlan> ranked;
  t.ranked = &ranked;  // (every candidate, fastest predicted first, the sequential plan among them)
  try {
    const rt::AllReducePlan best = rt::tune_allreduce(t, m, n, k, nullptr, nullptr, nullptr, seq_plan.predicted_ms);
    if (opts.path == Path::Auto) return best;
  } catch (const rt::NoPlan&) {
    return seq_plan;  // (e.g. one band of tile rows: nothing to overlap)
  }
  // A forced path overlaps where the shape lets it: the fastest predicted
  // candidate with two units (bands, waves) or more, in two groups at
  // least (the model may find one group best: e.g. on one rank, whose
  // AllReduce moves nothing); one unit only: the sequential plan.
  for (rt::AllReducePlan p : ranked) {
    if (p.sequential) continue;
    const bool bands = p.layout == rt::ArLayout::RowBands;
    const int units = bands ? plan::band_count(p.sched) : p.sched.waves();
    if (units < 2) continue;
    if (p.groups.size() < 2) {
      const plan::Partition two = {units - 1, 1};  // (a small last group: what follows the GEMM)
      p.groups = bands ? plan::band_groups(p.sched, two) : plan::make_groups(p.sched, two);
    }
    return p;
  }
  return seq_plan;
}

void check_allreduce_inputs(const std::string& who, const GemmAllReduceOptions& options, int64_t k) {
  check_input_options(who, options.input, options.scales, k);
  if (options.input == InputType::E4M3 && options.path == GemmAllReduceOptions::Path::NVLink)
    throw InvalidArgument(who + ": FP8 inputs are not on the NVLink path yet (use Auto, Sequential, RowBands or "
                                "Slots)");
}

std::string AllReducePlanner::describe(int64_t m, const rt::AllReducePlan& p) const {
  std::ostringstream os;
  if (p.sequential)
    os << "sequential: "
       << (seq.samples.empty() ? "the faster of cuBLAS's GEMM and ours (timed when the op is built)" : seq.describe(m))
       << ", then one ncclAllReduce";
  else
    os << rt::describe(p) << "; groups " << rt::describe_groups(p.layout, p.sched, p.groups);
  os << "; predicted " << p.predicted_ms << " ms (path " << path_name(opts.path) << ", NCCL on " << opts.nccl_sms
     << " SMs beside the GEMM)";
  return os.str();
}

}  // namespace flashoverlap::api

namespace flashoverlap {

std::string plan_gemm_allreduce(int64_t m, int64_t n, int64_t k, int world, DType dtype,
                                const GemmAllReduceOptions& options, int sms, const std::string& gpu) {
  const std::string who = "plan_gemm_allreduce (m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                          std::to_string(k) + ", world " + std::to_string(world) + ")";
  api::check_shape(who, std::max<int64_t>(m, 1), n, k);
  if (m < 1) throw InvalidArgument(who + ": m must be >= 1");
  if (world < 1 || world > 1024) throw InvalidArgument(who + ": world must be in [1, 1024]");
  if (sms < 2 || sms > 1024) throw InvalidArgument(who + ": sms must be in [2, 1024]");
  api::check_op_options(who, sms, options.nccl_sms, options.wait_timeout_s);
  if (options.path == GemmAllReduceOptions::Path::NVLink && (world < 2 || world > 8 || n % 8 != 0))
    throw InvalidArgument(who + ": the owners path needs 2 to 8 ranks and n % 8 == 0");
  api::check_allreduce_inputs(who, options, k);
  const bool fp8 = options.input == InputType::E4M3;
  api::AllReducePlanner p;
  p.n = n, p.k = k, p.world = world, p.sms = sms, p.dtype = dtype, p.opts = options;
  p.tiles = api::op_tiles(options.input);
  p.wave_ms = api::model_wave_ms(k, options.input);  // (the op measures its own)
  const std::string dt = dtype == DType::BF16 ? "bf16" : "fp16";
  auto curve = [&](int ctas) {
    if (!options.curves.empty()) {
      std::ostringstream log;
      if (auto found = plan::load_fitting_curve(plan::allreduce_curve_file(options.curves, ctas, world, dt),
                                                plan::Collective::AllReduce, gpu, world, log))
        return std::make_unique<plan::BandwidthCurve>(*found);
    }
    return std::make_unique<plan::BandwidthCurve>(api::model_allreduce_curve(world, ctas));
  };
  p.curve_default = curve(0);
  p.curve_bounded = curve(options.nccl_sms);
  const std::string cache = api::tuning_cache_path(options.tuning_cache);
  if (!cache.empty() && !fp8) {  // (the cache's picks are for 16-bit inputs, as the op takes them)
    rt::PickKey shape;
    shape.gpu = gpu, shape.sms = sms, shape.world = world, shape.dtype = api::to_kernels(dtype), shape.tile_rows = 1;
    shape.n = n, shape.k = k;
    p.picks = rt::PickCache::parse_entries(rt::PickCache(cache).entries_for(shape), shape);
  }
  return p.describe(m, p.plan_for(m));
}

}  // namespace flashoverlap
