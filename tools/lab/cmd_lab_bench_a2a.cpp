// cmd_lab_bench_a2a.cpp — `flashoverlap-lab lab-bench --op alltoall`: the MoE combine
// (expert GEMM, then each row back to its token's rank, weighted and summed
// per token), every variant in one run on all ranks, as the other
// collectives' benches: correctness first, then timings in turns (median
// per rank, max over ranks). A shape MxNxK means M tokens per rank (or
// --tokens), each picking --topk ranks by --routing; rank e's expert holds
// the rows dispatched to it (by source rank, then token: the dispatch's
// order) and the (N x K) weight. Every rank draws the same routing from the
// seed, so the ops take it whole (no exchange: the public op's exchange is
// not in these times).
//   sequential          cuBLAS GEMM, ncclSend/ncclRecv of each rank's block, our combine kernel
//   sequential-ourgemm  rt::OverlapAllToAll with one group: our GEMM, one all-to-all, the combine
//   decomposition       every rank's rows in 2/4/8 chunks: a chunk's GEMM, then its all-to-all on a
//                       2nd stream beside the next chunk's GEMM (best)
//   flashoverlap        rt::OverlapAllToAll: of the model's plan for each tile shape, the
//                       sequential plans and (one GPU, or every GPU within NVLink reach) the
//                       NVLink form on each tile shape, and the sequential call with cuBLAS's GEMM
//                       (rows by destination), the one measured fastest
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lab/lab_bench_shared.h"
#include "moe_routing_args.h"
#include "flashoverlap/error.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "plan/moe_plan.h"
#include "runtime/core/checks.h"
#include "runtime/core/overlap_core.h"
#include "runtime/ops/alltoall.h"
#include "runtime/ops/baselines_alltoall.h"
#include "runtime/transport/peers.h"

namespace flashoverlap::cli::bench {
namespace {

constexpr int kDefaultReserve = 8;  // --reserve-sms -1: the public op's default (GemmAllToAllOptions::nccl_sms)

struct Candidate {
  plan::MoePlan plan;
  size_t tile = 0;     // index into the tiles
  bool model = false;  // the model's pick
  bool nvlink = false;  // the NVLink form (plan: the sequential one's grid)
  bool cublas = false;  // the sequential plan with cuBLAS's GEMM (direct calls: rows by destination)
  std::string name(const plan::TileShape& t) const {
    std::string s = plan::to_string(t);
    if (nvlink) return "nvlink " + s;
    if (cublas) return "sequential cuBLAS";
    if (plan.sequential) return "sequential " + s;
    s += " waves ";
    for (size_t g = 0; g < plan.common.size(); ++g) s += (g ? "," : "") + std::to_string(plan.common[g]);
    return s;
  }
};

// The routing of a shape: drawn from the seed (the same on every rank), or the file's.
plan::MoeRouting routing_for(const Options& o, int world, int64_t M, int64_t N, int64_t K) {
  return moe_routing_for(o.routing, o.topk, o.tokens, world, M, N, K, "lab-bench --op alltoall");
}

}  // namespace

void check_alltoall_options(const Options& o, const std::vector<std::array<int64_t, 3>>& shapes) {
  std::vector<std::string> given;
  if (o.layout != "auto") given.push_back("--layout");
  if (!o.rs_layout.empty()) given.push_back("--rs-layout");
  if (o.rmsnorm) given.push_back("--with-rmsnorm");
  if (o.registered) given.push_back("--registered-output");
  if (o.trace) given.push_back("--trace");
  if (o.power_s > 0) given.push_back("--power");
  if (!o.partition.empty()) given.push_back("--partition");
  if (!given.empty()) {
    std::string list;
    for (const auto& g : given) list += (list.empty() ? "" : ", ") + g;
    throw InvalidArgument("lab-bench --op alltoall: " + list + (given.size() > 1 ? " are" : " is") +
                          " not for the all-to-all");
  }
  if (o.reserve_sms < -1) throw InvalidArgument("--reserve-sms must be -1 (default) or at least 0");
  if (o.tokens < 0) throw InvalidArgument("--tokens must be >= 0 (0: the shape's M)");
  const std::vector<int> chunks = parse_ints(o.decomp, "decomposition chunk");
  if (chunks.empty()) throw InvalidArgument("--decomposition: no chunk counts given");
  for (int c : chunks)
    if (c < 1) throw InvalidArgument("--decomposition: chunk counts are at least 1, not " + std::to_string(c));
  for (const auto& s : shapes)
    if (s[1] % 8 != 0)
      throw InvalidArgument("lab-bench --op alltoall: N = " + std::to_string(s[1]) +
                            " must be a multiple of 8 (the baseline's combine reads 8 columns at a time)");
  const auto env = rt::DistEnv::from_env();
  const int world = env ? env->world : 1;
  check_moe_routing_args(o.routing, o.topk, o.tokens, world, "lab-bench --op alltoall");
}

ShapeResult bench_alltoall(Context& cx, const Options& o, int64_t M, int64_t N, int64_t K) {
  const int rank = cx.rv->rank(), world = cx.rv->world(), sms = cx.info.sms;
  const int reserve = o.reserve_sms < 0 ? kDefaultReserve : o.reserve_sms;
  if (reserve < 1 || reserve >= sms)
    throw InvalidArgument("--reserve-sms " + std::to_string(reserve) + ": must be in [1, " + std::to_string(sms) + ")");
  const auto dt = cx.dtype;
  const ncclComm_t base = cx.base.get();
  const cudaStream_t st = cx.stream;
  const plan::MoeRouting routing = routing_for(o, world, M, N, K);
  const int topk = plan::moe_topk(routing);
  const int64_t T = *std::max_element(routing.tokens.begin(), routing.tokens.end());  // (the CSV's tokens)
  const int64_t rows = routing.rows(rank);
  int64_t most_rows = 0;
  for (int r = 0; r < world; ++r) most_rows = std::max(most_rows, routing.rows(r));
  const int k = int(K);

  std::vector<std::unique_ptr<rt::MoeCombineBaseline>> bases;
  bases.push_back(std::make_unique<rt::MoeCombineBaseline>(routing, rank, N, dt, base, 1));
  for (int c : parse_ints(o.decomp, "decomposition chunk"))
    bases.push_back(std::make_unique<rt::MoeCombineBaseline>(routing, rank, N, dt, base, c));
  rt::MoeCombineBaseline& seq = *bases.front();
  const int64_t recv = seq.recv_rows();
  const size_t row_bytes = size_t(N) * 2;
  rt::DeviceBuffer a(size_t(std::max<int64_t>(rows, 1)) * K * 2), b(size_t(N) * K * 2),
      y(size_t(std::max<int64_t>(rows, 1)) * row_bytes), recv_seq(size_t(std::max<int64_t>(recv, 1)) * row_bytes),
      recv_dec(recv_seq.bytes()), rows_ours(recv_seq.bytes()), rows_fo(recv_seq.bytes()),
      out_seq(size_t(std::max<int64_t>(T, 1)) * row_bytes), out_ours(out_seq.bytes()), out_dec(out_seq.bytes()),
      out_fo(out_seq.bytes());
  const uint64_t seed = 0xa11 + uint64_t(rank) * 7919 + uint64_t(T) * 31 + uint64_t(N) * 17 + uint64_t(K);
  kernels::fill_random(dt, a.get(), std::max<int64_t>(rows, 1) * K, seed, -1.f, 1.f, st);
  kernels::fill_random(dt, b.get(), N * K, seed ^ 0xabcdef, -1.f, 1.f, st);
  FO_CUDA_CHECK(cudaStreamSynchronize(st));

  ShapeResult res{T, N, K, 0, 0, 0, 0, {}, {}, 0, {}, {}, {}, {}};
  res.topk = topk;
  auto run_gemm_alone = [&] {
    if (rows > 0) cx.cublas->run(dt, a.get(), b.get(), y.get(), int(rows), int(N), k, N, st);
  };
  auto run_comm_alone = [&] { seq.all_to_all(y.get(), recv_seq.get(), st); };
  {
    const std::vector<double> comp = rt::max_over_ranks(
        *cx.rv, {rt::time_collective(run_gemm_alone, st, base, o.warmup, o.iters, o.gate).median_ms,
                 rt::time_collective(run_comm_alone, st, base, o.warmup, o.iters, o.gate).median_ms});
    res.gemm_before_ms = comp[0], res.comm_before_ms = comp[1];
  }

  // ---- the plans: the model's for each tile shape, from our GEMM's measured wave times ----
  std::vector<plan::TileShape> tiles = {{128, 256}, {128, 128}};
  if (o.tile != "auto") tiles = {plan::parse_tile(o.tile)};
  rt::OverlapCore core;  // (before the ops: they share its streams and scratch)
  std::vector<std::unique_ptr<rt::OverlapAllToAll>> ops;  // one per tile
  std::vector<Candidate> cands;
  std::optional<size_t> model_pick;
  // Every rank's rows by destination: the sequential call stores C whole, and may take cuBLAS's GEMM.
  bool direct_rows = true;
  for (int r = 0; r < world && direct_rows; ++r)
    direct_rows = std::is_sorted(routing.dest_rank[size_t(r)].begin(), routing.dest_rank[size_t(r)].end());
  // The NVLink form where every rank's GPU is within load/store reach of every other's.
  const bool nvlink = world == 1 || (world <= 8 && cx.all_ranks(rt::all_ranks_reachable(base)));
  for (size_t t = 0; t < tiles.size(); ++t) {
    const plan::TileShape tile = tiles[t];
    // The wave time of our GEMM on the busiest rank's rows (at least a tile row).
    const int64_t m_cal = std::max<int64_t>(std::min<int64_t>(most_rows, 4096), 128);
    rt::DeviceBuffer ac(size_t(m_cal) * K * 2), cc(size_t(m_cal) * row_bytes);
    kernels::fill_random(dt, ac.get(), m_cal * K, seed + 5, -1.f, 1.f, st);
    const int ctas = sms - reserve;
    const plan::Schedule s = plan::make_schedule(m_cal, N, tile, ctas, plan::Raster::AlongN,
                                                 plan::default_swizzle(ctas, tile, int32_t((m_cal + tile.bm - 1) / tile.bm)));
    const double wave_ms = rt::max_over_ranks(
        *cx.rv, {rt::measure_gemm_ms(s, k, dt, ac.get(), b.get(), cc.get(), st, 10) / s.waves()})[0];
    plan::MoePlanRequest req;
    req.routing = &routing;
    req.n = N, req.k = K;
    req.dtype = dt == kernels::DType::BF16 ? plan::DType::BF16 : plan::DType::FP16;
    req.tile = tile, req.sms = sms, req.reserve_sms = reserve, req.wave_ms = wave_ms;
    auto plan_with = [&req](double min_gain) {
      plan::MoePlanRequest r = req;
      r.min_gain = min_gain;
      return plan::make_moe_plan(r);
    };
    const plan::MoePlan pick = plan_with(0.01);
    const plan::MoePlan overlap = pick.sequential ? plan_with(-1e9) : pick;
    const plan::MoePlan sequential = pick.sequential ? pick : plan_with(1e9);
    const bool better = !model_pick || pick.predicted.total_ms < cands[*model_pick].plan.predicted.total_ms;
    const bool overlaps = !overlap.sequential && overlap.common.size() >= 2;
    if (overlaps) cands.push_back({overlap, t});
    if (better && overlaps && !pick.sequential) model_pick = cands.size() - 1;
    cands.push_back({sequential, t});
    if (better && pick.sequential) model_pick = cands.size() - 1;
    if (nvlink) cands.push_back({sequential, t, false, true});
    if (t == 0 && direct_rows) cands.push_back({sequential, t, false, false, true});

    rt::OverlapAllToAllOptions ao;
    ao.n = N, ao.k = k, ao.dtype = dt, ao.tile = tile, ao.ctas = ctas, ao.sequential_ctas = sms;
    ao.max_rows = most_rows, ao.max_recv_rows = recv, ao.max_tokens = int32_t(T);  // (max_rows: of any rank)
    ao.comm = cx.comm_for(reserve), ao.tail_comm = base;
    ao.wait_timeout_s = o.wait_timeout_s;
    ao.core = &core;
    ao.nvlink = nvlink;
    ops.push_back(std::make_unique<rt::OverlapAllToAll>(ao));
  }
  if (model_pick) cands[*model_pick].model = true;
  if (!o.select) cands = {cands[model_pick.value_or(0)]};
  auto fo_call = [&](size_t i, void* out, bool combine) {
    return [&, i, out, combine] {
      const Candidate& c = cands[i];
      const rt::A2aCall call{&routing, c.plan.sequential ? plan::Partition{1} : c.plan.common, combine, c.nvlink,
                             c.cublas};
      ops[c.tile]->run(a.get(), b.get(), call, out, N, st);
    };
  };
  size_t best = 0;
  if (cands.size() > 1) {  // the measured choice: the candidates in turns, max over ranks
    std::vector<std::function<void()>> fns;
    for (size_t i = 0; i < cands.size(); ++i) fns.push_back(fo_call(i, out_fo.get(), true));
    best = fastest_in_turns(
        cx, o, fns,
        [&](size_t i) { return cands[i].name(tiles[cands[i].tile]) + (cands[i].model ? " [model]" : ""); },
        [&] {
          for (const auto& op : ops) op->check();
        },
        res.selection);
  }
  const Candidate& pick = cands[best];
  rt::OverlapAllToAll& op = *ops[pick.tile];
  res.predicted_ms = pick.plan.predicted.total_ms;

  // ---- correctness first: poisoned outputs ----
  // sequential-ourgemm: the op of the first tile with one group.
  auto run_ours = [&](void* out, bool combine) {
    ops[0]->run(a.get(), b.get(), rt::A2aCall{&routing, plan::Partition{1}, combine}, out, N, st);
  };
  auto run_seq = [&] { seq.run(*cx.cublas, a.get(), b.get(), k, y.get(), recv_seq.get(), out_seq.get(), st); };
  auto run_dec = [&](rt::MoeCombineBaseline& d) {
    d.run(*cx.cublas, a.get(), b.get(), k, y.get(), recv_dec.get(), out_dec.get(), st);
  };
  for (auto* p : {&out_seq, &out_ours, &out_dec, &out_fo, &rows_ours, &rows_fo})
    kernels::poison(p->get(), p->bytes() / 2, st);
  run_seq();
  run_dec(*bases[1]);
  run_ours(out_ours.get(), true);
  run_ours(rows_ours.get(), false);
  for (int rep = 0; rep < 3; ++rep) fo_call(best, out_fo.get(), true)();
  fo_call(best, rows_fo.get(), false)();
  FO_CUDA_CHECK(cudaStreamSynchronize(st));
  for (const auto& x : ops) x->check();
  const kernels::Tolerance tol = kernels::gemm_tolerance(dt, K, std::max(topk, 2));
  const int64_t t_rows = routing.tokens[size_t(rank)];
  auto cmp = [&](const rt::DeviceBuffer& x, const rt::DeviceBuffer& ref, int64_t n_rows) {
    return n_rows > 0 ? kernels::compare(dt, x.get(), N, ref.get(), N, n_rows, N, st, tol) : kernels::CompareResult{};
  };
  // (bitwise against the same GEMM's: ours, or cuBLAS's where the pick runs it)
  const auto fo_vs_ours = cmp(out_fo, pick.cublas ? out_seq : out_ours, t_rows),
             rows_vs_ours = cmp(rows_fo, pick.cublas ? recv_seq : rows_ours, recv);
  const auto fo_vs_seq = cmp(out_fo, out_seq, t_rows), rows_vs_seq = cmp(rows_fo, recv_seq, recv);
  const auto dec_vs_seq = cmp(out_dec, out_seq, t_rows);
  const std::vector<double> bad = rt::max_over_ranks(
      *cx.rv, {double(fo_vs_ours.mismatches), double(rows_vs_ours.mismatches), double(fo_vs_seq.beyond),
               double(rows_vs_seq.beyond), double(fo_vs_seq.nan_count), double(dec_vs_seq.beyond),
               fo_vs_seq.worst_ratio});
  std::ostringstream chk;
  chk << std::setprecision(2) << o.routing << " top-" << topk << ", " << T << " tokens a rank, " << rows
      << " expert rows and " << recv << " received on rank " << rank << " (most rows " << most_rows << "): "
      << (bad[0] == 0 && bad[1] == 0 ? "bitwise == " : "NOT bitwise equal to ")
      << (pick.cublas ? "cuBLAS + one all-to-all + our combine" : "our GEMM + one all-to-all + our combine")
      << (bad[0] == 0 && bad[1] == 0 ? " (combined and unweighted)" : "")
      << "; vs cuBLAS + NCCL: " << beyond_text(bad[2]) << " combined, " << beyond_text(bad[3])
      << " unweighted (worst " << bad[6] << "x of it); NaN " << bad[4];
  if (bad[5] > 0) chk << "; decomposition vs cuBLAS+NCCL: " << beyond_text(bad[5]);
  res.checks = chk.str();
  if (bad[0] != 0 || bad[1] != 0 || bad[2] != 0 || bad[3] != 0 || bad[4] != 0 || bad[5] != 0)
    throw Error("correctness check failed for " + std::to_string(T) + "x" + std::to_string(N) + "x" +
                std::to_string(K) + " (alltoall): " + res.checks);

  // ---- timings ----
  Variants timed{run_seq, [&] { run_ours(out_ours.get(), true); }, fo_call(best, out_fo.get(), true), {},
                 run_gemm_alone, run_comm_alone};
  for (size_t i = 1; i < bases.size(); ++i)
    timed.decomposition.push_back({bases[i]->chunks(), [&, dp = bases[i].get()] { run_dec(*dp); }});
  const std::vector<double> ms =
      time_variants(cx, o, timed, "All-to-All", "best of " + o.decomp + " chunks of every rank's rows", res);
  op.check();
  res.rows[0].config = "cuBLAS + ncclSend/ncclRecv + our combine";
  std::ostringstream cfg;
  const plan::TileShape tile = tiles[pick.tile];
  cfg << tile.bm << "x" << tile.bn << ", "
      << (pick.nvlink ? std::to_string(sms) + " CTAs, NVLink form: rows stored straight into the ranks' windows, no NCCL"
          : pick.plan.sequential ? std::to_string(sms) + " CTAs, sequential fallback (one all-to-all, NCCL default CTAs)"
                                 : std::to_string(pick.plan.ctas) + " CTAs, NCCL on " + std::to_string(reserve) +
                                       " CTAs beside the GEMM")
      << (pick.nvlink   ? ""
          : pick.cublas ? ", cuBLAS's GEMM, each destination's block of C sent as it is"
          : op.direct() ? ", C stored whole, each destination's block sent as it is"
                        : ", rows stored one by one")
      << (cands.size() > 1 ? ", fastest of " + std::to_string(cands.size()) + " plans measured" : "")
      << (pick.model ? ", the model's pick" : ", not the model's pick");
  std::string groups = pick.nvlink ? "nvlink" : pick.plan.sequential ? "1 (sequential)" : "waves ";
  if (!pick.plan.sequential && !pick.nvlink)
    for (size_t g = 0; g < pick.plan.common.size(); ++g) groups += (g ? "," : "") + std::to_string(pick.plan.common[g]);
  res.rows.push_back({"flashoverlap", ms.back(), groups, cfg.str()});
  return res;
}

}  // namespace flashoverlap::cli::bench
