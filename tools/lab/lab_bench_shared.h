// lab_bench_shared.h — what `flashoverlap-lab lab-bench` shares between its collectives
// (cmd_lab_bench.cpp: AllReduce and the run over shapes, tables, CSV and JSON;
// cmd_lab_bench_rs.cpp: ReduceScatter): the options, a shape's result rows and
// the context that lives across shapes (process group, communicators, curves).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_parse.h"
#include "kernels/cuda_check.h"
#include "kernels/gemm.h"
#include "plan/curve_files.h"
#include "runtime/core/buffer.h"
#include "runtime/core/communicator.h"
#include "runtime/core/cublas.h"
#include "process/bootstrap.h"
#include "runtime/tune/power_meter.h"
#include "runtime/tune/tuner.h"

namespace flashoverlap::cli::bench {

struct Options {
  std::string op = "allreduce";
  int64_t m = 4096, n = 8192, k = 8192;
  std::string shapes;  // overrides m, n, k: "MxNxK,MxNxK"
  std::string dtype = "bf16";
  std::string tile = "auto";
  int reserve_sms = -1;
  std::string partition;
  std::string band_swizzles;  // row-band layouts: the swizzles the tuner tries (empty: its default)
  std::string layout = "auto";
  std::string decomp = "2,4,8";
  std::string rs_layout;  // reducescatter: standard | subtile (empty: standard)
  std::string routing = "uniform";  // alltoall: uniform | zipf:S | one:R | empty:R (plan::make_moe_routing)
  int topk = 0;                     // alltoall: ranks each token picks (0: min(2, world))
  int64_t tokens = 0;               // alltoall: tokens per rank (0: the shape's M)
  bool rmsnorm = false, json = false, trace = false, select = true;
  bool owners_wide = false;  // testing: owners on 2 ranks through the path of 3-8
  bool registered = false;  // flashoverlap into a registered output (run_registered)
  bool gate = true;  // each timed run queued whole before the GPU starts it (host_gate.h)
  bool four_stages = true;  // 128x256 tiles: 4 pipeline stages where the store qualifies (false: --three-stages)
  std::string push_tma = "last";  // owners, 4 stages: tiles pushed by TMA from the staging (none, last, all)
  std::string owner_pushers = "auto";  // owners, 4 stages: warps 2-3 push the tiles from C (auto: k <= 4096, on, off)
  bool owner_copy_in_gemm = true;  // owners: the copy of the peer's finals inside the GEMM where the plan says so
  double wait_timeout_s = 30;  // a bounded wait of the overlapped op fails the call after this long
  double power_s = 0;  // > 0: each variant run this long again while NVML samples power and clocks
  int warmup = 5, iters = 20, nproc = 0;
  std::string csv;
  std::string curves;  // measured curves kept here between runs (curve_files.h); empty: measure each run
  std::string tuning_cache;  // the measured picks stored here (runtime/tune/picks.h), for the public op
};

struct Row {
  std::string variant;
  double ms = 0;
  std::string partition, config;
};

struct ShapeResult {
  int64_t m = 0, n = 0, k = 0;
  double gemm_ms = 0, comm_ms = 0, seq_ms = 0, ideal_ms = 0;  // the components timed in turns with the variants
  std::vector<Row> rows;
  std::string checks;
  double predicted_ms = 0;
  std::string trace;
  std::string power;  // the --power table
  std::string selection;  // the finalists measured by the tuner, the pick starred
  std::string host_us;    // the host's enqueue per call, each variant (this rank, median)
  double gemm_before_ms = 0, comm_before_ms = 0;  // the components timed on their own, before the tuner
  int topk = 0;  // alltoall: the routing's top-K (m: its most tokens on a rank)
};

inline std::vector<std::array<int64_t, 3>> shapes_of(const Options& o) {
  auto out = o.shapes.empty() ? std::vector<std::array<int64_t, 3>>{{o.m, o.n, o.k}} : parse_shapes(o.shapes);
  for (const auto& s : out) check_gemm_shape(s[0], s[1], s[2]);  // (plan checks the same)
  return out;
}

// Everything that lives across shapes: the process group, communicators
// (one per NCCL CTA budget), measured curves, cuBLAS.
struct Context {
  rt::DistEnv env;
  std::unique_ptr<rt::Rendezvous> rv;
  rt::Communicator base;  // NCCL's defaults: baselines, the overlap's last group
  std::map<int, rt::Communicator> narrow;       // by max CTAs
  std::map<int, plan::BandwidthCurve> curves;   // by max CTAs (0 = base)
  rt::DeviceInfo info;
  std::unique_ptr<rt::PowerMeter> meter;  // --power: this rank's GPU (null: no NVML)
  bool power_everywhere = false;          // every rank has a meter
  cudaStream_t stream = nullptr;
  std::unique_ptr<rt::CublasGemm> cublas;
  kernels::DType dtype = kernels::DType::BF16;

  ncclComm_t comm_for(int ctas) {
    if (ctas <= 0) return base.get();
    auto it = narrow.find(ctas);
    if (it == narrow.end()) it = narrow.emplace(ctas, base.split({ctas, ctas, 1})).first;
    return it->second.get();
  }
  std::string curves_dir, dtype_name;  // curve files (curve_files.h); empty: measured in this run only

  bool all_ranks(bool mine) { return rt::max_over_ranks(*rv, {mine ? 0.0 : 1.0})[0] == 0.0; }
  plan::RankAgreement agreement() {
    return {[this](bool m) { return all_ranks(m); },
            [this](const std::string& text) {
              const auto bytes =
                  rv->broadcast(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
              return std::string(bytes.begin(), bytes.end());
            }};
  }
  const plan::BandwidthCurve& curve_for(int ctas) {
    auto it = curves.find(ctas);
    if (it == curves.end())
      it = curves
               .emplace(ctas,
                        plan::cached_curve(
                            curves_dir.empty() ? "" : plan::allreduce_curve_file(curves_dir, ctas, rv->world(), dtype_name),
                            plan::Collective::AllReduce, info.name, rv->world(), rv->rank() == 0, agreement(),
                            [&] {
                              return rt::measure_allreduce_curve(*rv, comm_for(ctas), dtype, stream,
                                                                 256.0 * (1 << 20), 5, info.name);
                            },
                            std::cerr))
               .first;
    return it->second;
  }
};

// "all within the bound ok" or "N elements beyond the bound FAIL" (n: a count, max over ranks).
inline std::string beyond_text(double n) {
  return n == 0 ? std::string("all within the bound ok")
                : std::to_string(int64_t(n)) + " elements beyond the bound FAIL";
}

// The variants of one shape, for time_variants.
struct Variants {
  std::function<void()> sequential, sequential_ours, flashoverlap;
  std::vector<std::pair<int, std::function<void()>>> decomposition;  // (chunks, call), one per chunk count
  std::function<void()> gemm_alone, comm_alone;                      // the ideal's components
};

// The variants timed in turns (run i of each, then run i+1), so that clock
// or temperature drifts hit all alike; the ideal's components, the GEMM and
// the collective alone, in the same turns, last: timed on their own before
// the variants, the GEMM ran faster than inside the sequential baseline
// (clocks: the GPU is power-capped), which skewed the gain. Medians,
// max over ranks (collective). Sets res.gemm_ms, comm_ms, ideal_ms, seq_ms and
// host_us, and adds the baselines' rows (the decomposition's best chunk
// count); returns the times of sequential, sequential-ourgemm, each
// decomposition and flashoverlap (last), in that order.
inline std::vector<double> time_variants(Context& cx, const Options& o, const Variants& v, const std::string& collective,
                                         const std::string& decomposition_config, ShapeResult& res) {
  std::vector<std::function<void()>> fns = {v.sequential, v.sequential_ours};
  std::vector<std::string> names = {"sequential", "sequential-ourgemm"};
  for (const auto& [chunks, call] : v.decomposition) {
    fns.push_back(call);
    names.push_back("decomposition " + std::to_string(chunks));
  }
  fns.insert(fns.end(), {v.flashoverlap, v.gemm_alone, v.comm_alone});
  names.insert(names.end(), {"flashoverlap", "GEMM alone", collective + " alone"});
  std::vector<double> ms;
  std::ostringstream h;
  h << std::fixed << std::setprecision(1) << "host enqueue per call (rank " << cx.rv->rank() << ", median us): ";
  size_t i = 0;
  for (const auto& st : rt::time_collective_interleaved(fns, cx.stream, cx.base.get(), o.warmup, o.iters, o.gate)) {
    ms.push_back(st.median_ms);
    h << (i ? ", " : "") << names[i] << " " << st.host_median_us;
    ++i;
  }
  res.host_us = h.str() + (o.gate ? " (not in the times)" : " (in the times: --no-gate)");
  FO_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
  ms = rt::max_over_ranks(*cx.rv, ms);
  res.comm_ms = ms.back(), ms.pop_back();
  res.gemm_ms = ms.back(), ms.pop_back();
  res.ideal_ms = std::max(res.gemm_ms, res.comm_ms);
  res.seq_ms = ms[0];
  res.rows.push_back({"sequential", ms[0], "1", "cuBLAS + NCCL"});
  res.rows.push_back({"sequential-ourgemm", ms[1], "1", "128x256, " + std::to_string(cx.info.sms) + " CTAs"});
  size_t best = 2;
  for (size_t d = 3; d < 2 + v.decomposition.size(); ++d)
    if (ms[d] < ms[best]) best = d;
  res.rows.push_back({"decomposition", ms[best], std::to_string(v.decomposition[best - 2].first) + " chunks",
                      decomposition_config});
  return ms;
}

// The candidates of the flashoverlap row timed in turns (median per rank,
// max over ranks); check() after them (each op's waits). Returns the fastest
// and writes the finalists' line ("name [model] 0.123 ms*, ...") to `line`.
inline size_t fastest_in_turns(Context& cx, const Options& o, const std::vector<std::function<void()>>& fns,
                               const std::function<std::string(size_t)>& name, const std::function<void()>& check,
                               std::string& line) {
  std::vector<double> ms;
  for (const auto& t : rt::time_collective_interleaved(fns, cx.stream, cx.base.get(), o.warmup, o.iters, o.gate))
    ms.push_back(t.median_ms);
  FO_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
  check();
  ms = rt::max_over_ranks(*cx.rv, ms);
  size_t best = 0;
  for (size_t i = 1; i < ms.size(); ++i)
    if (ms[i] < ms[best]) best = i;
  std::ostringstream sel;
  sel << std::fixed << std::setprecision(3);
  for (size_t i = 0; i < ms.size(); ++i) sel << (i ? ", " : "") << name(i) << " " << ms[i] << " ms" << (i == best ? "*" : "");
  line = sel.str();
  return best;
}

// --op reducescatter (cmd_lab_bench_rs.cpp). Its options, checked before any GPU
// is looked for (the world size from the job's environment, where set):
// throws InvalidArgument.
void check_reducescatter_options(const Options& o, const std::vector<std::array<int64_t, 3>>& shapes);
// One shape: correctness, then the variants timed in turns. Throws rt::NoPlan
// (the same on every rank) for a shape these options cannot run.
ShapeResult bench_reducescatter(Context& cx, const Options& o, int64_t M, int64_t N, int64_t K);

// --op alltoall (cmd_lab_bench_a2a.cpp), the same way: a shape's M is the tokens
// per rank (--tokens overrides it).
void check_alltoall_options(const Options& o, const std::vector<std::array<int64_t, 3>>& shapes);
ShapeResult bench_alltoall(Context& cx, const Options& o, int64_t M, int64_t N, int64_t K);

}  // namespace flashoverlap::cli::bench
