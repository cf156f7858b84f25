// `flashoverlap plan`: the overlap plan for one shape, from the model alone
// (no GPU). Also printed by the default job on machines without a GPU.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli_parse.h"
#include "commands.h"
#include "flashoverlap/error.h"
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

struct Planned {
  fp::Plan plan;
  std::optional<fp::Routing> routing;
  fp::SlotMap map;  // rank 0's
};

Planned plan_for(const PlanOptions& o) {
  check_gemm_shape(o.m, o.n, o.k);  // bench's rule: no plan for a shape bench refuses
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
  if (req.op == fp::Collective::AllToAll) req.routing = fp::make_routing(o.routing, o.world, o.m);
  Planned p{fp::make_plan(req), req.routing, {}};
  p.map = fp::make_slot_map(p.plan, 0, p.routing ? &*p.routing : nullptr);
  return p;
}

nlohmann::json span_json(const fp::Span& s) { return {s.offset, s.count}; }

nlohmann::json plan_json(const Planned& p, const PlanOptions& o) {
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
  if (p.routing) {
    j["routing"] = o.routing;
    const fp::AllToAllLoad load(p.plan.schedule, *p.routing);
    for (const fp::Group& g : p.plan.groups) j["busiest_link_rows"].push_back(load.max_link_rows(g.first_wave, g.end_wave));
  }
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
  const bool a2a = plan.op == fp::Collective::AllToAll;
  out << strf("  %-5s %-9s %-13s %8s  %-13s  %-13s  %s\n", "group", "waves", "tiles", "MiB", "compute ms", "comm ms",
              a2a ? "rank 0 slot rows to each peer" : "send elements [offset +count]");
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
    std::string slots;
    if (a2a && call.send_to.size() <= 8) {
      for (size_t d = 0; d < call.send_to.size(); ++d) {
        if (d) slots += ',';
        slots += std::to_string(call.send_to[d].count / s.bn);
      }
    } else if (a2a) {
      const auto [lo, hi] = std::minmax_element(call.send_to.begin(), call.send_to.end(),
                                                [](const fp::Span& a, const fp::Span& b) { return a.count < b.count; });
      slots = strf("%lld..%lld", (long long)(lo->count / s.bn), (long long)(hi->count / s.bn));
    } else {
      slots = strf("[%lld +%lld]", (long long)call.send.offset, (long long)call.send.count);
    }
    out << strf("  %-5zu %-9s %-13s %8.2f  %-13s  %-13s  %s\n", g,
                strf("%d-%d", gr.first_wave, gr.end_wave).c_str(), strf("%d-%d", gr.first_tile, gr.end_tile).c_str(),
                mib(plan.group_bytes[g]), strf("%.3f-%.3f", t.compute_start, t.compute_end).c_str(),
                strf("%.3f-%.3f", t.comm_start, t.comm_end).c_str(), slots.c_str());
  }
  out << strf("predicted: %.3f ms vs sequential %.3f ms (GEMM %.3f + %s %.3f): speedup %.2fx\n", plan.predicted.total_ms,
              plan.baseline_ms(), plan.baseline_gemm_ms, op.c_str(), plan.baseline_comm_ms, plan.speedup());
  for (const std::string& note : plan.notes) out << "  - " << note << "\n";
}

}  // namespace

void add_plan_options(CLI::App* cmd, PlanOptions& o) {
  cmd->add_option("--op", o.op, "collective after the GEMM")
      ->check(CLI::IsMember({"allreduce", "reducescatter", "alltoall"}))
      ->capture_default_str();
  cmd->add_option("--m", o.m, "rows of C (tokens)")->check(at_least_one())->capture_default_str();
  cmd->add_option("--n", o.n, "columns of C (output features)")->check(at_least_one())->capture_default_str();
  cmd->add_option("--k", o.k, "reduction dimension (input features; a multiple of 8)")
      ->check(at_least_one())
      ->capture_default_str();
  cmd->add_option("--world", o.world, "ranks (GPUs)")->check(CLI::Range(1, int(fp::kMaxWorld)))->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "element type")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
  cmd->add_option("--tile", o.tile, "GEMM tile: auto | 128x256 | 128x128")
      ->check(CLI::IsMember({"auto", "128x256", "128x128"}))
      ->capture_default_str();
  cmd->add_option("--sms", o.sms, "SMs of the GPU")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--reserve-sms", o.reserve_sms, "SMs left to NCCL (-1: search 8, 16, 24, 32)")
      ->check(CLI::Range(-1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--curve", o.curve, "bandwidth curve JSON (default: built-in 2x H200 curve)");
  cmd->add_option("--partition", o.partition, "evaluate this partition of the waves, e.g. 1,2,2 (default: search)");
  cmd->add_option("--routing", o.routing, "alltoall routing: uniform | skewed | empty:<rank>")->capture_default_str();
  cmd->add_flag("--json", o.json, "print one JSON object");
}

int print_plan(const PlanOptions& opts, std::ostream& out) {
  const Planned p = plan_for(opts);
  if (opts.json) {
    out << plan_json(p, opts).dump() << "\n";
  } else {
    print_text(p, out);
  }
  return 0;
}

void add_plan_command(CLI::App& app, int& rc) {
  auto opts = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand("plan", "Print the overlap plan for one shape from the model (no GPU needed)");
  add_plan_options(cmd, *opts);
  cmd->callback([opts, &rc] { rc = print_plan(*opts, std::cout); });
}

}  // namespace flashoverlap::cli
