// `flashoverlap plan`: the overlap plan for one shape, from the model alone
// (no GPU). Also printed by the default job on machines without a GPU.
// AllReduce and ReduceScatter: plan::make_plan. All-to-All: the MoE combine's
// plan, plan::make_moe_plan, of the routing `lab-bench --op alltoall` draws for
// the same flags (moe_routing_args.h) and with the request lab-bench makes, the
// GEMM's wave time from the model instead of measured.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cli_parse.h"
#include "commands.h"
#include "flashoverlap/error.h"
#include "flashoverlap/flashoverlap.h"
#include "moe_routing_args.h"
#include "plan/moe_plan.h"
#include "plan/planner.h"
#include "plan/slot_map_alltoall.h"

namespace flashoverlap::cli {

namespace {

namespace fp = flashoverlap::plan;

template <class... Args>
std::string strf(const char* format, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// --op alltoall's own flags (PlanOptions has --routing).
struct MoeFlags {
  int topk = 0;        // 0: min(2, world x experts)
  int64_t tokens = 0;  // tokens per rank; 0: --m
  int experts = 1;     // per rank
};

struct Planned {
  fp::Plan plan;
  fp::SlotMap map;  // rank 0's
};

Planned plan_for(const PlanOptions& o) {
  check_gemm_shape(o.m, o.n, o.k);  // bench's and lab-bench's rule: no plan for a shape they refuse
  fp::PlanRequest req;
  req.op = fp::parse_collective(o.op);
  req.m = o.m;
  req.n = o.n;
  req.k = o.k;
  req.world = o.world;
  req.dtype = fp::parse_dtype(o.dtype);
  if (o.tile != "auto") {
    req.tile = fp::parse_tile(o.tile);
    fp::GemmModel::efficiency(*req.tile);  // only tiles the kernel and the model know
  }
  req.sms = o.sms;
  req.reserve_sms = o.reserve_sms;
  if (!o.curve.empty()) req.curve = fp::BandwidthCurve::load(o.curve);
  if (!o.partition.empty()) req.partition = fp::parse_partition(o.partition);
  Planned p{fp::make_plan(req), {}};
  p.map = fp::make_slot_map(p.plan, 0);
  return p;
}

nlohmann::json span_json(const fp::Span& s) { return {s.offset, s.count}; }

nlohmann::json plan_json(const Planned& p) {
  nlohmann::json j = fp::to_json(p.plan);
  nlohmann::json slots{{"rank", 0},
                       {"row_elements", p.map.bn},
                       {"send_elements", p.map.send_elements()},
                       {"recv_elements", p.map.recv_elements()},
                       {"groups", nlohmann::json::array()}};
  for (const fp::GroupCall& g : p.map.groups) {
    nlohmann::json x{{"send", span_json(g.send)}, {"recv", span_json(g.recv)}};
    for (const fp::Span& s : g.send_to) x["send_to"].push_back(span_json(s));
    for (const fp::Span& s : g.recv_from) x["recv_from"].push_back(span_json(s));
    slots["groups"].push_back(x);
  }
  j["slots"] = slots;
  return j;
}

void print_text(const Planned& p, std::ostream& out) {
  const fp::Plan& plan = p.plan;
  const fp::Schedule& s = plan.schedule;
  const std::string op(fp::to_string(plan.op));
  out << strf("plan: %s of C = %d x %d (K %lld, %s) over %d ranks\n", op.c_str(), s.m, s.n, (long long)plan.k,
              std::string(fp::to_string(plan.dtype)).c_str(), plan.world);
  out << strf("tiles: %dx%d, %d x %d = %d tiles; %d CTAs (%d SMs, %d left to NCCL); %d wave%s; %s, swizzle %d\n",
              s.bm, s.bn, s.tiles_m(), s.tiles_n(), s.tiles(), s.ctas, plan.sms, plan.reserve_sms, s.waves(),
              s.waves() == 1 ? "" : "s", std::string(fp::to_string(s.raster)).c_str(), s.swizzle);
  out << "partition: " << fp::to_string(plan.partition) << " (" << plan.groups.size() << " group"
      << (plan.groups.size() == 1 ? "" : "s") << (plan.sequential ? ", sequential: GEMM then one call" : "")
      << strf("); slot buffers %.1f MiB send, %.1f MiB receive (rank 0)\n", mib(2.0 * p.map.send_elements()),
              mib(2.0 * p.map.recv_elements()));
  out << strf("  %-5s %-9s %-13s %8s  %-13s  %-13s  %s\n", "group", "waves", "tiles", "MiB", "compute ms", "comm ms",
              "send elements [offset +count]");
  constexpr size_t kShown = 16;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    if (g == kShown) {
      const size_t more = plan.groups.size() - kShown;
      out << "  ... " << more << " more group" << (more == 1 ? "" : "s") << " (--json lists all)\n";
      break;
    }
    const fp::Group& gr = plan.groups[g];
    const fp::GroupTiming& t = plan.predicted.groups[g];
    const fp::GroupCall& call = p.map.groups[g];
    const std::string slots = strf("[%lld +%lld]", (long long)call.send.offset, (long long)call.send.count);
    out << strf("  %-5zu %-9s %-13s %8.2f  %-13s  %-13s  %s\n", g,
                strf("%d-%d", gr.first_wave, gr.end_wave).c_str(), strf("%d-%d", gr.first_tile, gr.end_tile).c_str(),
                mib(plan.group_bytes[g]), strf("%.3f-%.3f", t.compute_start, t.compute_end).c_str(),
                strf("%.3f-%.3f", t.comm_start, t.comm_end).c_str(), slots.c_str());
  }
  out << strf("predicted: %.3f ms vs sequential %.3f ms (GEMM %.3f + %s %.3f): speedup %.2fx\n", plan.predicted.total_ms,
              plan.baseline_ms(), plan.baseline_gemm_ms, op.c_str(), plan.baseline_comm_ms, plan.speedup());
  for (const std::string& note : plan.notes) out << "  - " << note << "\n";
}

// ---- --op alltoall: the MoE combine ----

constexpr int kMoeReserve = 8;  // --reserve-sms -1: GemmAllToAllOptions::nccl_sms, as lab-bench's
const std::string kMoeWho = "plan --op alltoall";
constexpr size_t kMoeShown = 12;  // ranks and groups printed (--json lists all)

struct MoePlanned {
  fp::MoeRouting routing;
  fp::MoePlanRequest req;  // the kept plan's (its routing reset: it would dangle once this moves)
  fp::MoePlan plan;
  std::vector<std::pair<fp::TileShape, double>> tried;  // each tile's predicted ms
  int32_t overlap_waves = 0;  // the common wave axis on sms - reserve CTAs (the kept tile)
  // Off-rank slot rows of group g on rank x: sent[g * W + x] to other ranks,
  // received[g * W + x] from them; busiest[g]: the most of either over ranks
  // (the load the model prices group g's call by).
  std::vector<int64_t> sent, received, busiest;
  std::vector<std::string> notes;
  // What GemmAllToAll runs for this routing on rank 0 (path auto, NCCL on
  // --reserve-sms SMs or the option's default), plan_gemm_alltoall's text;
  // empty where the reserve is not an option the op takes.
  std::string op_plan;
  int op_nccl_sms = 0;
};

int32_t common_waves(const fp::MoeRouting& r, int64_t n, fp::TileShape tile, int32_t ctas) {
  int32_t most = 0;
  for (int32_t x = 0; x < r.world; ++x) most = std::max(most, fp::make_moe_schedule(r, x, n, tile, ctas).waves());
  return most;
}

// O(W * (rows + groups * W)) from WaveCounts, not from every rank's maps
// (O(W * all rows)): at world 1024 the maps would take minutes.
void add_link_loads(MoePlanned& p) {
  const fp::MoeRouting& r = p.routing;
  const int32_t W = r.world;
  const size_t G = p.plan.common.size();
  p.sent.assign(G * W, 0);
  p.received.assign(G * W, 0);
  for (int32_t src = 0; src < W; ++src) {
    const fp::Schedule& s = p.plan.sched_of_rank[size_t(src)];
    const auto& dest = r.dest_rank[size_t(src)];
    std::vector<int64_t> per_tile_row(size_t(s.tiles_m()) * W, 0);
    for (size_t i = 0; i < dest.size(); ++i) ++per_tile_row[i / size_t(s.bm) * W + dest[i]];
    const fp::WaveCounts counts(s, W, per_tile_row);
    for (size_t g = 0; g < G; ++g) {
      const fp::Group& x = p.plan.groups_of_rank[size_t(src)][g];
      for (int32_t d = 0; d < W; ++d)
        if (d != src) {
          const int64_t c = counts.sum(x.first_wave, x.end_wave, d);
          p.sent[g * W + src] += c;
          p.received[g * W + d] += c;
        }
    }
  }
  p.busiest.assign(G, 0);
  for (size_t g = 0; g < G; ++g)
    for (int32_t x = 0; x < W; ++x) p.busiest[g] = std::max({p.busiest[g], p.sent[g * W + x], p.received[g * W + x]});
}

std::string ms3(double v) { return strf("%.3f", v); }

void add_moe_notes(MoePlanned& p) {
  const fp::MoePlanRequest& req = p.req;
  const fp::Schedule& s = p.plan.sched_of_rank.front();
  p.notes.push_back("GEMM model: " + strf("%.0f", req.gemm.peak_tflops) + " TFLOP/s over " +
                    std::to_string(req.gemm.peak_sms) + " SMs, a wave of " + fp::to_string(req.tile) + " tiles at K " +
                    std::to_string(req.k) + " = " + ms3(req.gemm.wave_ms(req.tile, req.k)) + " ms, x" +
                    strf("%.2f", req.gemm.slowdown) + " while NCCL runs (lab-bench and the op measure it)");
  const fp::CommModel comm(req.curve ? *req.curve : fp::BandwidthCurve::builtin_h200(fp::Collective::AllToAll),
                           p.routing.world, req.comm_saturating_ctas);
  p.notes.push_back("comm model: " + comm.describe() +
                    "; a group's call priced by its busiest rank's off-rank slot rows (" + std::to_string(s.bn) +
                    " columns each)");
  if (p.tried.size() > 1) {
    std::string t = "tiles tried:";
    for (const auto& [tile, ms] : p.tried) t += " " + fp::to_string(tile) + " " + ms3(ms) + " ms,";
    p.notes.push_back(t + " the lowest kept");
  }
  if (!p.plan.sequential) return;
  const std::string why = p.routing.world == 1 ? "one rank: nothing to hide"
                          : p.overlap_waves < 2
                              ? std::to_string(p.overlap_waves) + " wave(s) on " +
                                    std::to_string(req.sms - req.reserve_sms) + " CTAs: nothing to overlap"
                              : "no overlap is predicted " + strf("%.0f", 100 * req.min_gain) +
                                    "% faster than the GEMM then one all-to-all";
  p.notes.push_back("sequential: " + why);
}

MoePlanned moe_plan_for(const PlanOptions& o, const MoeFlags& f) {
  check_gemm_shape(o.m, o.n, o.k);  // (as lab-bench: the shape's M is the tokens per rank)
  MoePlanned p;
  p.routing = moe_routing_for(o.routing, f.topk, f.tokens, o.world, o.m, o.n, o.k, kMoeWho, f.experts);
  fp::MoePlanRequest req;  // lab-bench's request, less the measured wave time
  req.n = o.n, req.k = o.k;
  req.dtype = fp::parse_dtype(o.dtype);
  req.sms = o.sms;
  req.reserve_sms = o.reserve_sms < 0 ? kMoeReserve : o.reserve_sms;
  if (req.reserve_sms >= req.sms)
    throw InvalidArgument("reserved SMs " + std::to_string(req.reserve_sms) + " must be in [0, " +
                          std::to_string(req.sms - 1) + "] (SMs: " + std::to_string(req.sms) + ")" +
                          (o.reserve_sms < 0 ? "; --reserve-sms -1 means 8 for alltoall" : ""));
  if (!o.curve.empty()) req.curve = fp::BandwidthCurve::load(o.curve);
  std::vector<fp::TileShape> tiles(std::begin(fp::kTileCandidates), std::end(fp::kTileCandidates));
  if (o.tile != "auto") tiles = {fp::parse_tile(o.tile)};
  const int32_t ctas = req.sms - req.reserve_sms;
  if (!o.partition.empty()) {  // of the common wave axis: only the tiles whose axis it sums to
    const fp::Partition part = fp::parse_partition(o.partition);
    const int32_t sum = std::accumulate(part.begin(), part.end(), 0);
    fp::validate_partition(part, sum);
    std::vector<fp::TileShape> fit;
    std::string axes;
    for (const fp::TileShape& t : tiles) {
      const int32_t T = std::max(common_waves(p.routing, o.n, t, ctas), 1);  // (no rows: {1})
      if (T == sum) fit.push_back(t);
      axes += (axes.empty() ? "" : ", ") + std::to_string(T) + " (" + fp::to_string(t) + ")";
    }
    if (fit.empty())
      throw InvalidArgument("partition " + fp::to_string(part) + " sums to " + std::to_string(sum) +
                            " waves but the common wave axis has T = " + axes + " on " + std::to_string(ctas) + " CTAs");
    tiles = fit;
    req.partition = part;
  }
  req.routing = &p.routing;
  for (const fp::TileShape& t : tiles) {  // the model's pick, as lab-bench's and the op's: the lowest prediction
    req.tile = t;
    fp::MoePlan x = fp::make_moe_plan(req);
    p.tried.push_back({t, x.predicted.total_ms});
    if (p.tried.size() == 1 || x.predicted.total_ms < p.plan.predicted.total_ms) {
      p.plan = std::move(x);
      p.req = req;
    }
  }
  p.req.routing = nullptr;
  GemmAllToAllOptions op;
  if (o.reserve_sms > 0) op.nccl_sms = o.reserve_sms;
  op.experts = p.routing.experts;
  if (op.nccl_sms <= o.sms / 2) {  // (the op takes [1, sms / 2])
    std::vector<int64_t> recv;
    p.op_plan = plan_gemm_alltoall(public_routings(p.routing, recv), o.n, o.k,
                                   o.dtype == "fp16" ? DType::FP16 : DType::BF16, op, o.sms);
    p.op_nccl_sms = op.nccl_sms;
  }
  p.overlap_waves = common_waves(p.routing, o.n, p.req.tile, ctas);
  add_link_loads(p);
  add_moe_notes(p);
  return p;
}

// "3,2,2" of a rank's groups (its own waves in each), or "min..max" past `most` groups.
std::string group_waves(const std::vector<fp::Group>& groups, size_t most = 8) {
  const auto waves = [](const fp::Group& g) { return g.end_wave - g.first_wave; };
  std::string out;
  if (groups.size() <= most) {
    for (size_t g = 0; g < groups.size(); ++g) out += (g ? "," : "") + std::to_string(waves(groups[g]));
    return out;
  }
  int32_t lo = waves(groups[0]), hi = lo;
  for (const fp::Group& g : groups) lo = std::min(lo, waves(g)), hi = std::max(hi, waves(g));
  return std::to_string(lo) + ".." + std::to_string(hi) + " (" + std::to_string(groups.size()) + " groups)";
}

std::pair<int32_t, int32_t> token_range(const fp::MoeRouting& r) {
  const auto [lo, hi] = std::minmax_element(r.tokens.begin(), r.tokens.end());
  return {*lo, *hi};
}

nlohmann::json moe_plan_json(const MoePlanned& p, const PlanOptions& o) {
  const fp::MoePlan& plan = p.plan;
  const fp::MoeRouting& r = p.routing;
  const int32_t W = r.world;
  const std::string dtype(fp::to_string(p.req.dtype));
  nlohmann::json j{{"op", "alltoall"},
                   {"routing", o.routing},
                   {"topk", fp::moe_topk(r)},
                   {"experts", r.experts},
                   {"tokens", token_range(r).second},
                   {"world", W},
                   {"n", o.n},
                   {"k", o.k},
                   {"dtype", dtype},
                   {"tile", fp::to_string(p.req.tile)},
                   {"sms", p.req.sms},
                   {"reserve_sms", p.req.reserve_sms},
                   {"sequential", plan.sequential},
                   {"ctas", plan.ctas},
                   {"waves", plan.waves()},
                   {"common", plan.common},
                   {"predicted_ms", plan.predicted.total_ms},
                   {"baseline_ms", plan.baseline_ms},
                   {"speedup", plan.speedup()},
                   {"describe", fp::describe(plan)},
                   {"notes", p.notes}};
  if (!p.op_plan.empty()) j["op_plan"] = p.op_plan;
  j["groups"] = nlohmann::json::array();
  for (size_t g = 0, w = 0; g < plan.common.size(); w += size_t(plan.common[g]), ++g) {
    const fp::GroupTiming& t = plan.predicted.groups[g];
    j["groups"].push_back({{"waves", {w, w + size_t(plan.common[g])}},
                           {"compute_ms", {t.compute_start, t.compute_end}},
                           {"comm_ms", {t.comm_start, t.comm_end}},
                           {"busiest_link_rows", p.busiest[g]}});
  }
  j["ranks"] = nlohmann::json::array();
  for (int32_t x = 0; x < W; ++x) {
    const fp::Schedule& s = plan.sched_of_rank[size_t(x)];
    nlohmann::json rank{{"rank", x},
                        {"tokens", r.tokens[size_t(x)]},
                        {"rows", r.rows(x)},
                        {"tiles", s.m > 0 ? s.tiles() : 0},
                        {"waves", s.waves()},
                        {"groups", nlohmann::json::array()}};
    for (size_t g = 0; g < plan.common.size(); ++g) {
      const fp::Group& gr = plan.groups_of_rank[size_t(x)][g];
      rank["groups"].push_back({{"waves", {gr.first_wave, gr.end_wave}},
                                {"tiles", {gr.first_tile, gr.end_tile}},
                                {"sent_rows", p.sent[g * W + x]},
                                {"received_rows", p.received[g * W + x]}});
    }
    j["ranks"].push_back(rank);
  }
  return j;
}

void print_moe_text(const MoePlanned& p, const PlanOptions& o, std::ostream& out) {
  const fp::MoePlan& plan = p.plan;
  const fp::MoeRouting& r = p.routing;
  const int32_t W = r.world;
  const fp::Schedule& s0 = plan.sched_of_rank.front();
  const auto [t_lo, t_hi] = token_range(r);
  const std::string tokens = t_lo == t_hi ? std::to_string(t_hi) : strf("%d..%d", t_lo, t_hi);
  out << "plan: alltoall, the MoE combine, over " << W << " rank" << (W == 1 ? "" : "s") << ": " << tokens
      << " tokens a rank, top-" << fp::moe_topk(r) << " by routing " << o.routing
      << (r.experts > 1 ? ", " + std::to_string(r.experts) + " experts per rank" : std::string()) << "; N " << o.n
      << ", K " << o.k
      << ", " << fp::to_string(p.req.dtype) << "\n";
  out << "moe plan: " << fp::describe(plan) << "\n";
  out << strf("tiles: %dx%d, %d tile column%s; %d CTAs (%d SMs, %d left to NCCL%s); %d wave%s on the common axis\n",
              s0.bm, s0.bn, s0.tiles_n(), s0.tiles_n() == 1 ? "" : "s", plan.ctas, p.req.sms,
              plan.sequential ? 0 : p.req.reserve_sms, plan.sequential ? ", sequential" : "", plan.waves(),
              plan.waves() == 1 ? "" : "s");
  out << "partition: " << fp::to_string(plan.common) << " (" << plan.common.size() << " group"
      << (plan.common.size() == 1 ? "" : "s")
      << (plan.sequential ? ", sequential: GEMM then one all-to-all" : " of the common waves")
      << ", each rank's clipped to its own waves)\n";
  out << strf("  %-5s %8s %9s %8s %6s  %-18s %s\n", "rank", "tokens", "rows", "tiles", "waves", "waves per group",
              "off-rank slot rows sent / received");
  for (int32_t x = 0; x < W; ++x) {
    if (size_t(x) == kMoeShown) {
      out << "  ... " << W - x << " more rank" << (W - x == 1 ? "" : "s") << " (--json lists all)\n";
      break;
    }
    const fp::Schedule& s = plan.sched_of_rank[size_t(x)];
    int64_t sent = 0, received = 0;
    for (size_t g = 0; g < plan.common.size(); ++g) sent += p.sent[g * W + x], received += p.received[g * W + x];
    out << strf("  %-5d %8d %9lld %8d %6d  %-18s %lld / %lld\n", x, r.tokens[size_t(x)], (long long)r.rows(x),
                s.m > 0 ? s.tiles() : 0, s.waves(), group_waves(plan.groups_of_rank[size_t(x)]).c_str(),
                (long long)sent, (long long)received);
  }
  out << strf("  %-5s %-9s %-13s  %-13s  %s\n", "group", "waves", "compute ms", "comm ms", "busiest link slot rows");
  for (size_t g = 0, w = 0; g < plan.common.size(); w += size_t(plan.common[g]), ++g) {
    if (g == kMoeShown) {
      const size_t more = plan.common.size() - g;
      out << "  ... " << more << " more group" << (more == 1 ? "" : "s") << " (--json lists all)\n";
      break;
    }
    const fp::GroupTiming& t = plan.predicted.groups[g];
    out << strf("  %-5zu %-9s %-13s  %-13s  %lld\n", g, strf("%zu-%zu", w, w + size_t(plan.common[g])).c_str(),
                strf("%.3f-%.3f", t.compute_start, t.compute_end).c_str(),
                strf("%.3f-%.3f", t.comm_start, t.comm_end).c_str(), (long long)p.busiest[g]);
  }
  out << strf("predicted: %.3f ms vs sequential %.3f ms: speedup %.2fx\n", plan.predicted.total_ms, plan.baseline_ms,
              plan.speedup());
  for (const std::string& note : p.notes) out << "  - " << note << "\n";
  if (!p.op_plan.empty())
    out << "GemmAllToAll (rank 0, path auto, NCCL on " << p.op_nccl_sms << " SMs) runs: " << p.op_plan << "\n";
}

int print_plan_with(const PlanOptions& opts, const MoeFlags& moe, std::ostream& out) {
  if (opts.op != "alltoall") {
    if (opts.routing != PlanOptions{}.routing || moe.topk != 0 || moe.tokens != 0 || moe.experts != 1)
      throw InvalidArgument("--routing, --topk, --tokens and --experts are for --op alltoall");
    const Planned p = plan_for(opts);
    // What the public op runs for these inputs: the same planning code as
    // GemmAllReduce's, on the model's stand-ins for what it measures when built.
    std::string op_plan;
    const DType dt = opts.dtype == "fp16" ? DType::FP16 : DType::BF16;
    if (opts.op == "allreduce") {
      GemmAllReduceOptions ar;
      if (opts.reserve_sms > 0) ar.nccl_sms = opts.reserve_sms;
      op_plan = plan_gemm_allreduce(opts.m, opts.n, opts.k, opts.world, dt, ar, opts.sms);
    } else if (opts.m % opts.world == 0) {  // (the standard layout's rule, which the op keeps)
      GemmReduceScatterOptions rs;
      if (opts.reserve_sms > 0) rs.nccl_sms = opts.reserve_sms;
      op_plan = plan_gemm_reducescatter(opts.m, opts.n, opts.k, opts.world, dt, rs, opts.sms);
    }
    if (opts.json) {
      nlohmann::json j = plan_json(p);
      if (!op_plan.empty()) j["op_plan"] = op_plan;
      out << j.dump() << "\n";
    } else {
      print_text(p, out);
      if (!op_plan.empty())
        out << (opts.op == "allreduce" ? "GemmAllReduce" : "GemmReduceScatter (rank 0, standard layout)")
            << " (path auto, NCCL on " << (opts.reserve_sms > 0 ? opts.reserve_sms : 8) << " SMs) runs: " << op_plan
            << "\n";
    }
    return 0;
  }
  const MoePlanned p = moe_plan_for(opts, moe);
  if (opts.json) out << moe_plan_json(p, opts).dump() << "\n";
  else print_moe_text(p, opts, out);
  return 0;
}

}  // namespace

void add_plan_options(CLI::App* cmd, PlanOptions& o) {
  cmd->add_option("--op", o.op, "collective after the GEMM")
      ->check(CLI::IsMember({"allreduce", "reducescatter", "alltoall"}))
      ->capture_default_str();
  cmd->add_option("--m", o.m, "rows of C (tokens; alltoall: tokens per rank unless --tokens)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  cmd->add_option("--n", o.n, "columns of C (output features)")->check(integer_at_least(1))->capture_default_str();
  cmd->add_option("--k", o.k, "reduction dimension (input features; a multiple of 8)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  cmd->add_option("--world", o.world, "ranks (GPUs)")->check(integer_in(1, fp::kMaxWorld))->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "element type")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
  cmd->add_option("--tile", o.tile, "GEMM tile: auto | 128x256 | 128x128")
      ->check(CLI::IsMember({"auto", "128x256", "128x128"}))
      ->capture_default_str();
  cmd->add_option("--sms", o.sms, "SMs of the GPU")->check(integer_in(1, 1 << 16))->capture_default_str();
  cmd->add_option("--reserve-sms", o.reserve_sms, "SMs left to NCCL (-1: search 8, 16, 24, 32; alltoall: 8)")
      ->check(integer_in(-1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--curve", o.curve, "bandwidth curve JSON of the --op collective (default: built-in 2x H200 curve)");
  cmd->add_option("--partition", o.partition,
                  "evaluate this partition of the waves, e.g. 1,2,2 (alltoall: of the common wave axis; default: search)")
      ->check(partition_check());
  cmd->add_option("--routing", o.routing,
                  "alltoall: how tokens pick ranks, uniform | zipf:S | one:R | empty:R | file:PATH (as lab-bench)")
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "print one JSON object");
}

int print_plan(const PlanOptions& opts, std::ostream& out) { return print_plan_with(opts, MoeFlags{}, out); }

void add_plan_command(CLI::App& app, int& rc) {
  struct All {
    PlanOptions plan;
    MoeFlags moe;  // (not in PlanOptions, which the default job shares)
  };
  auto opts = std::make_shared<All>();
  CLI::App* cmd = app.add_subcommand("plan", "Print the overlap plan for one shape from the model (no GPU needed)");
  add_plan_options(cmd, opts->plan);
  cmd->add_option("--topk", opts->moe.topk, "alltoall: experts each token picks (0: min(2, world x experts))")
      ->check(integer_at_least(0))
      ->capture_default_str();
  cmd->add_option("--experts", opts->moe.experts,
                  "alltoall: experts per rank (their rows by source rank, then expert; the GEMM the grouped one)")
      ->check(integer_in(1, 4096))
      ->capture_default_str();
  cmd->add_option("--tokens", opts->moe.tokens, "alltoall: tokens per rank (0: --m)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  cmd->callback([opts, &rc] { rc = print_plan_with(opts->plan, opts->moe, std::cout); });
}

}  // namespace flashoverlap::cli
