// reducescatter_planner.cpp — see reducescatter_planner.h.
#include "api/reducescatter_planner.h"

#include <algorithm>
#include <sstream>

#include "plan/slot_map_reducescatter.h"
#include "runtime/ops/reducescatter.h"

namespace flashoverlap::api {
namespace {

const char* path_name(GemmReduceScatterOptions::Path p) {
  switch (p) {
    case GemmReduceScatterOptions::Path::Auto: return "auto";
    case GemmReduceScatterOptions::Path::Sequential: return "sequential";
    case GemmReduceScatterOptions::Path::Slots: return "slots";
    case GemmReduceScatterOptions::Path::NVLink: return "nvlink";
  }
  return "?";
}

}  // namespace

plan::Plan ReduceScatterPlanner::plan_with(int64_t m, size_t tile, std::optional<plan::Partition> partition,
                                           double min_gain) const {
  plan::PlanRequest req;
  req.op = plan::Collective::ReduceScatter;
  req.m = m, req.n = n, req.k = k, req.world = world;
  req.dtype = dtype == DType::BF16 ? plan::DType::BF16 : plan::DType::FP16;
  req.tile = op_tiles(opts.input)[tile];
  req.sms = sms, req.reserve_sms = opts.nccl_sms, req.rs_layout = layout();
  const int64_t tiles = (m + req.tile->bm - 1) / req.tile->bm * ((n + req.tile->bn - 1) / req.tile->bn);
  const int64_t waves = (tiles + (sms - opts.nccl_sms) - 1) / (sms - opts.nccl_sms);
  req.measured_wave_ms.assign(size_t(waves), wave_ms[tile]);
  req.partition = std::move(partition);
  req.min_gain = min_gain;
  return plan::make_plan(req);
}

std::optional<ReduceScatterPlanner::Planned> ReduceScatterPlanner::picked_for(int64_t m) const {
  using Path = rt::ReduceScatterPick::Path;
  const auto it = picks.find(rt::tile_rows_of(m));
  if (opts.path != GemmReduceScatterOptions::Path::Auto || it == picks.end()) return std::nullopt;
  const rt::ReduceScatterPick& pk = it->second;
  if ((pk.path == Path::Slots && pk.nccl_sms != opts.nccl_sms) || (pk.path == Path::NVLink && !nvlink_ready))
    return std::nullopt;
  const auto& tiles = op_tiles(opts.input);
  const auto at = std::find_if(tiles.begin(), tiles.end(), [&](plan::TileShape t) { return t.bm == pk.bm && t.bn == pk.bn; });
  if (at == tiles.end() || (pk.path == Path::NVLink && !scatter_takes_tile(opts.input, *at))) return std::nullopt;
  const size_t tile = size_t(at - tiles.begin());
  Planned p;
  p.picked = true;
  if (pk.path == Path::Slots) {
    p.plan = plan_with(m, tile, plan::Partition(pk.waves.begin(), pk.waves.end()), -1e9);
    if (p.plan.sequential || p.plan.groups.size() != pk.waves.size()) return std::nullopt;
  } else {
    p.plan = plan_with(m, tile, std::nullopt, 1e9);  // (the tile's sequential plan: the NVLink form's grid too)
    p.nvlink = pk.path == Path::NVLink, p.cublas = pk.cublas;
  }
  return p;
}

ReduceScatterPlanner::Planned ReduceScatterPlanner::plan_for(int64_t m) const {
  if (std::optional<Planned> p = picked_for(m)) return *p;
  Planned out = model_plan_for(m);
  // The standard layout's sequential calls: the faster GEMM at m.
  out.cublas = !out.nvlink && out.plan.sequential && out.plan.rs_layout == plan::RsLayout::Standard &&
               !seq.samples.empty() && seq.cublas(m);
  return out;
}

ReduceScatterPlanner::Planned ReduceScatterPlanner::model_plan_for(int64_t m) const {
  using Path = GemmReduceScatterOptions::Path;
  std::optional<plan::Plan> best;
  const double gain = opts.path == Path::Auto ? 0.01 : -1e9;  // a forced path overlaps where it can
  for (size_t t = 0; t < op_tiles(opts.input).size(); ++t) {
    plan::Plan p = plan_with(m, t, std::nullopt, gain);
    if (opts.path == Path::Slots && !p.sequential && p.groups.size() < 2 && p.schedule.waves() >= 2)
      p = plan_with(m, t, plan::Partition{p.schedule.waves() - 1, 1}, gain);  // (two groups at least)
    if (opts.path == Path::Slots && p.groups.size() < 2) continue;
    if (!best || p.predicted.total_ms < best->predicted.total_ms) best = std::move(p);
  }
  // Auto: an overlap must beat the sequential call with the faster GEMM
  // (the model's sequential time is our GEMM's).
  const double ratio = seq.samples.empty() ? 1.0 : seq.ratio(m);
  if (opts.path == Path::Auto && best && !best->sequential &&
      best->predicted.total_ms * 1.01 > best->baseline_gemm_ms * ratio + best->baseline_comm_ms)
    best.reset();
  if (opts.path == Path::Sequential || opts.path == Path::NVLink || !best || best->sequential) {
    // the sequential plan of the fastest tile (a tie to the wider)
    // (NVLink: its tile and the whole grid; a tile its scatter epilogue takes)
    const bool nvlink = opts.path == Path::NVLink;
    std::optional<plan::Plan> seq_best;
    for (size_t t = 0; t < op_tiles(opts.input).size(); ++t) {
      if (nvlink && !scatter_takes_tile(opts.input, op_tiles(opts.input)[t])) continue;
      plan::Plan p = plan_with(m, t, std::nullopt, 1e9);
      if (!seq_best || p.predicted.total_ms < seq_best->predicted.total_ms) seq_best = std::move(p);
    }
    return {std::move(*seq_best), nvlink};
  }
  return {*best};
}

std::string ReduceScatterPlanner::describe(int64_t m, const Planned& planned, int rank) const {
  const plan::Plan& p = planned.plan;
  std::ostringstream os;
  if (planned.nvlink) {
    os << "nvlink, standard layout (" << p.schedule.bm << "x" << p.schedule.bn << " tiles, " << p.schedule.ctas
       << " CTAs): each row stored into its owner's window as its tile finishes, counted there, summed by the owner"
       << (planned.picked ? " (the tuning cache's pick)" : "");
    return os.str();
  }
  // The padding rows as the op that runs p counts them (OverlapReduceScatter::padding_rows).
  const bool one_group = p.groups.size() <= 1;
  const int64_t padding = one_group && p.rs_layout == plan::RsLayout::Standard
                              ? 0
                              : plan::make_reducescatter_map(p.schedule, p.groups, world, rank, p.rs_layout).padding_rows;
  os << (p.sequential ? "sequential" : "slots") << ", " << plan::to_string(p.rs_layout) << " layout ("
     << p.schedule.bm << "x" << p.schedule.bn << " tiles, " << p.schedule.ctas << " CTAs"
     << (p.sequential ? "" : ", NCCL on " + std::to_string(opts.nccl_sms) + " SMs") << "); groups "
     << rt::describe_rs_groups(false, p.groups);
  if (padding > 0) os << " (" << padding << " padding rows)";
  if (p.sequential && !planned.picked && p.rs_layout == plan::RsLayout::Standard)
    os << "; " << (seq.samples.empty() ? "the faster of cuBLAS's GEMM and ours (timed when the op is built)"
                                      : seq.describe(m));
  else if (planned.cublas)
    os << "; cuBLAS's GEMM";
  else
    os << "; our GEMM";
  os << "; predicted " << p.predicted.total_ms << " ms against " << p.baseline_ms() << " ms sequential (path "
     << path_name(opts.path) << (planned.picked ? ", the tuning cache's pick" : "") << ")";
  return os.str();
}

}  // namespace flashoverlap::api

namespace flashoverlap {

std::string plan_gemm_reducescatter(int64_t m, int64_t n, int64_t k, int world, DType dtype,
                                    const GemmReduceScatterOptions& options, int sms, const std::string& gpu,
                                    int rank) {
  const std::string who = "plan_gemm_reducescatter (m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                          std::to_string(k) + ", world " + std::to_string(world) + ")";
  api::check_shape(who, std::max<int64_t>(m, 1), n, k);
  if (m < 1) throw InvalidArgument(who + ": m must be >= 1");
  if (world < 1 || world > 1024) throw InvalidArgument(who + ": world must be in [1, 1024]");
  if (rank < 0 || rank >= world) throw InvalidArgument(who + ": rank must be in [0, world)");
  if (sms < 2 || sms > 1024) throw InvalidArgument(who + ": sms must be in [2, 1024]");
  api::check_op_options(who, sms, options.nccl_sms, options.wait_timeout_s);
  const bool standard = options.layout == GemmReduceScatterOptions::Layout::Standard;
  if (!standard && api::kBm % world != 0)
    throw InvalidArgument(who + ": the sub-tile layout needs the world size to divide 128");
  if (standard && m % world != 0)
    throw InvalidArgument(who + ": m is not a multiple of the world size (the standard layout gives every rank m / "
                                "world rows)");
  if (options.path == GemmReduceScatterOptions::Path::NVLink && (!standard || n % 8 != 0 || world > 8))
    throw InvalidArgument(who + ": Path::NVLink needs the standard layout, n % 8 == 0 and at most 8 ranks");
  api::ReduceScatterPlanner p;
  p.n = n, p.k = k, p.world = world, p.sms = sms, p.dtype = dtype, p.opts = options;
  p.nvlink_ready = standard && n % 8 == 0 && world <= 8;  // (one host's NVLink: every rank within reach)
  api::check_input_options(who, options.input, options.scales, k);
  const bool fp8 = options.input == InputType::E4M3;
  p.wave_ms = api::model_wave_ms(k, options.input);
  const std::string cache = api::tuning_cache_path(options.tuning_cache);
  if (!cache.empty() && !fp8 && options.path == GemmReduceScatterOptions::Path::Auto) {
    rt::PickKey shape;
    shape.gpu = gpu, shape.sms = sms, shape.world = world, shape.dtype = api::to_kernels(dtype), shape.tile_rows = 1;
    shape.n = n, shape.k = k, shape.op = rt::reducescatter_op(p.layout());
    p.picks = rt::PickCache::parse_reducescatter_entries(rt::PickCache(cache).entries_for(shape), shape);
  }
  return p.describe(m, p.plan_for(m), rank);
}

}  // namespace flashoverlap
