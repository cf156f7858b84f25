// cmd_lab_bench_rs.cpp — `flashoverlap-lab lab-bench --op reducescatter`: GEMM +
// ReduceScatter, every variant in one run on all ranks, as the AllReduce
// lab-bench (cmd_lab_bench.cpp, whose run over shapes prints the rows): correctness
// first, then timings in turns (median per rank, max over ranks). Every rank
// holds A (M x K, M the rows on each rank) and B; rank r ends with its rows
// of the sum over ranks of A B^T (--rs-layout: standard rows [r M/W, (r+1)
// M/W), or the sub-tile layout's slice r of every 128-row tile).
//   sequential          cuBLAS GEMM into C, then one ncclReduceScatter of C (what users run today)
//   sequential-ourgemm  our GEMM, then one ncclReduceScatter
//   decomposition       every rank's row block in 2/4/8 chunks: a chunk's GEMMs, then its
//                       ReduceScatter on a 2nd stream beside the next chunk's GEMMs (best)
//   flashoverlap        rt::OverlapReduceScatter: of the model's plan for each tile shape,
//                       the sequential plans and (standard rows, every GPU within NVLink
//                       reach) the NVLink form, the one measured fastest
// The baselines always end with the standard rows (m % W != 0, sub-tile
// only: C padded to W ceil(M/W) rows, as a caller of ncclReduceScatter pads).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lab/lab_bench_shared.h"
#include "flashoverlap/error.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "kernels/reorder.h"
#include "plan/planner.h"
#include "runtime/core/checks.h"
#include "runtime/core/overlap_core.h"
#include "runtime/ops/baselines.h"
#include "runtime/ops/reducescatter.h"
#include "runtime/transport/peers.h"
#include "runtime/tune/picks.h"

namespace flashoverlap::cli::bench {
namespace {

// --reserve-sms -1: the public op's default (GemmReduceScatterOptions::nccl_sms).
constexpr int kDefaultReserve = 8;

plan::RsLayout layout_of(const Options& o) {
  return o.rs_layout == "subtile" ? plan::RsLayout::SubTile : plan::RsLayout::Standard;
}

// What keeps the layout from running on `world` ranks at all (InvalidArgument).
void check_world(int world, plan::RsLayout layout) {
  if (layout == plan::RsLayout::SubTile && 128 % world != 0)
    throw InvalidArgument("lab-bench --op reducescatter --rs-layout subtile: the world size must divide 128 (each rank "
                          "gets 128 / world rows of every 128-row tile), not " + std::to_string(world));
}

// What keeps one shape from running ("" if nothing): the same words before
// the GPU (one shape: the error) and per shape (several: that shape skipped).
std::string shape_problem(int64_t m, int world, plan::RsLayout layout) {
  if (layout == plan::RsLayout::Standard && m % world != 0)
    return "lab-bench --op reducescatter: M = " + std::to_string(m) + " is not a multiple of the world size " +
           std::to_string(world) + " (the standard layout gives every rank M / world rows; --rs-layout subtile "
           "takes any M)";
  if (layout == plan::RsLayout::SubTile && (world - 1) * (128 / world) >= m)
    return "lab-bench --op reducescatter --rs-layout subtile: M = " + std::to_string(m) + " leaves rank " +
           std::to_string(world - 1) + " no rows (its rows of each 128-row tile start at row " +
           std::to_string((world - 1) * (128 / world)) + ")";
  return "";
}

// One candidate of the flashoverlap row: a plan and how the op runs it.
struct Candidate {
  plan::Plan plan;
  bool cublas = false;  // sequential standard plan with cuBLAS's GEMM
  bool model = false;   // the model's pick (the public op's plan for these options)
  bool nvlink = false;  // the NVLink form (the sequential plan's tile and grid)
  std::string name() const {
    std::string s = plan::to_string(plan::TileShape{plan.schedule.bm, plan.schedule.bn});
    if (cublas) return "sequential (cuBLAS)";
    if (nvlink) return "nvlink " + s;
    if (plan.sequential || plan.groups.size() < 2) return "sequential " + s;
    s += " waves ";
    for (size_t g = 0; g < plan.partition.size(); ++g) s += (g ? "," : "") + std::to_string(plan.partition[g]);
    return s + " (" + plan::to_string(plan.schedule.raster).data() + ")";
  }
};

// "128x256, 124 CTAs, along_m swizzle 1, NCCL on 8 CTAs beside the GEMM, standard layout, ..."
std::string describe(const Candidate& c, const rt::OverlapReduceScatter& op, size_t measured) {
  const plan::Schedule& s = op.schedule();
  std::ostringstream os;
  if (c.cublas)
    os << "cuBLAS GEMM";
  else
    os << s.bm << "x" << s.bn << ", " << s.ctas << " CTAs, " << plan::to_string(s.raster) << " swizzle " << s.swizzle;
  os << (op.nvlink()       ? ", NVLink form: rows stored into their owners' windows, summed there, no NCCL"
         : op.sequential() ? ", sequential fallback (one ReduceScatter, NCCL default CTAs)"
                           : ", NCCL on " + std::to_string(c.plan.reserve_sms) + " CTAs beside the GEMM")
     << ", " << plan::to_string(op.layout()) << " layout";
  if (op.padding_rows() > 0) os << " (" << op.padding_rows() << " padding rows sent)";
  if (!op.sequential() && !op.nvlink()) os << (op.tiles_by_tma() ? ", tiles stored whole (TMA)" : ", stored row by row");
  os << (measured > 1 ? ", fastest of " + std::to_string(measured) + " plans measured" : "")
     << (c.model ? ", the model's pick" : ", not the model's pick");
  return os.str();
}

}  // namespace

void check_reducescatter_options(const Options& o, const std::vector<std::array<int64_t, 3>>& shapes) {
  // The AllReduce's layouts, transports and diagnostics: not this op's.
  std::vector<std::string> given;
  if (o.layout != "auto") given.push_back("--layout");
  if (!o.band_swizzles.empty()) given.push_back("--band-swizzles");
  if (o.registered) given.push_back("--registered-output");
  if (o.trace) given.push_back("--trace");
  if (o.power_s > 0) given.push_back("--power");
  if (!o.four_stages) given.push_back("--three-stages");
  if (o.push_tma != "last") given.push_back("--push-tma");
  if (o.owner_pushers != "auto") given.push_back("--owner-pushers");
  if (!o.owner_copy_in_gemm) given.push_back("--owner-copy-at-end");
  if (o.owners_wide) given.push_back("--owners-wide");
  if (!given.empty()) {
    std::string list;
    for (const auto& g : given) list += (list.empty() ? "" : ", ") + g;
    throw InvalidArgument("lab-bench --op reducescatter: " + list + (given.size() > 1 ? " are" : " is") +
                          " for --op allreduce only");
  }
  if (o.reserve_sms < -1) throw InvalidArgument("--reserve-sms must be -1 (default) or at least 0");
  if (!o.partition.empty()) (void)plan::parse_partition(o.partition);  // (its syntax: its message)
  const std::vector<int> chunks = parse_ints(o.decomp, "decomposition chunk");
  if (chunks.empty()) throw InvalidArgument("--decomposition: no chunk counts given");
  for (int c : chunks)
    if (c < 1) throw InvalidArgument("--decomposition: chunk counts are at least 1, not " + std::to_string(c));
  // The world, where the job's environment says it (launched processes);
  // checked again on the ranks' own count once they meet.
  const auto env = rt::DistEnv::from_env();
  const int world = env ? env->world : 1;
  check_world(world, layout_of(o));
  if (shapes.size() == 1)
    if (const std::string why = shape_problem(shapes[0][0], world, layout_of(o)); !why.empty())
      throw InvalidArgument(why);
}

ShapeResult bench_reducescatter(Context& cx, const Options& o, int64_t M, int64_t N, int64_t K) {
  const int m = int(M), n = int(N), k = int(K), rank = cx.rv->rank(), world = cx.rv->world();
  const plan::RsLayout layout = layout_of(o);
  check_world(world, layout);
  if (const std::string why = shape_problem(M, world, layout); !why.empty()) throw rt::NoPlan(why);
  const int sms = cx.info.sms, reserve = o.reserve_sms < 0 ? kDefaultReserve : o.reserve_sms;
  if (reserve >= sms)
    throw InvalidArgument("--reserve-sms " + std::to_string(reserve) + ": the GPU has " + std::to_string(sms) + " SMs");
  const auto dt = cx.dtype;
  const ncclComm_t base = cx.base.get();
  const cudaStream_t st = cx.stream;

  // The rows each rank ends with, in its output's order (host, every rank's:
  // the reference's send buffer puts rank p's rows in part p).
  plan::Schedule probe;  // (the rows depend on m, bm = 128 and the world only)
  probe.m = m, probe.n = n, probe.bm = 128, probe.bn = 256;
  std::vector<std::vector<int32_t>> rows_by_rank;
  for (int p = 0; p < world; ++p) rows_by_rank.push_back(plan::rs_rows_of_rank(probe, world, p, layout));
  const int64_t out_rows = int64_t(rows_by_rank[size_t(rank)].size());
  int64_t ref_rows = 0;  // the most rows a rank holds
  for (const auto& r : rows_by_rank) ref_rows = std::max<int64_t>(ref_rows, int64_t(r.size()));
  // The baselines' rows per rank (standard rows; m % W != 0: C padded to W R rows).
  const int64_t R = (M + world - 1) / world;
  const int64_t valid_rows = std::clamp<int64_t>(M - rank * R, 0, R);  // of them, rows of C (< M)

  const size_t c_bytes = size_t(world) * R * N * 2, row_bytes = size_t(N) * 2;
  rt::DeviceBuffer a(size_t(M) * K * 2), b(size_t(N) * K * 2), c_seq(c_bytes), c_ours(c_bytes),
      send(std::max(c_bytes, size_t(world) * ref_rows * row_bytes)), out_seq(size_t(R) * row_bytes),
      out_ours(size_t(R) * row_bytes), out_dec(size_t(R) * row_bytes), out_fo(size_t(ref_rows) * row_bytes),
      ref_ours(size_t(ref_rows) * row_bytes), ref_cublas(size_t(ref_rows) * row_bytes);
  const uint64_t seed = 0x5eed + uint64_t(rank) * 7919 + uint64_t(M) * 31 + uint64_t(N) * 17 + uint64_t(K);
  kernels::fill_random(dt, a.get(), M * K, seed, -1.f, 1.f, st);
  kernels::fill_random(dt, b.get(), N * K, seed ^ 0xabcdef, -1.f, 1.f, st);
  for (auto* c : {&c_seq, &c_ours, &send}) FO_CUDA_CHECK(cudaMemsetAsync(c->get(), 0, c->bytes(), st));  // (padding rows)
  FO_CUDA_CHECK(cudaStreamSynchronize(st));

  ShapeResult res{M, N, K, 0, 0, 0, 0, {}, {}, 0, {}, {}, {}, {}};
  auto run_gemm_alone = [&] { cx.cublas->run(dt, a.get(), b.get(), c_seq.get(), m, n, k, n, st); };
  auto run_rs_alone = [&] {
    FO_NCCL_CHECK_CTX(ncclReduceScatter(c_seq.get(), out_seq.get(), size_t(R) * N, rt::nccl_type(dt), ncclSum, base, st),
                      "ReduceScatter alone");
  };
  {  // the components on their own, before the rest (the CSV's *_before_ms)
    const std::vector<double> comp = rt::max_over_ranks(
        *cx.rv, {rt::time_collective(run_gemm_alone, st, base, o.warmup, o.iters, o.gate).median_ms,
                 rt::time_collective(run_rs_alone, st, base, o.warmup, o.iters, o.gate).median_ms});
    res.gemm_before_ms = comp[0], res.comm_before_ms = comp[1];
  }

  // ---- the plans: the model's for each tile shape, from our GEMM's measured wave times ----
  std::vector<plan::TileShape> tiles = {{128, 256}, {128, 128}};
  if (o.tile != "auto") tiles = {plan::parse_tile(o.tile)};
  std::vector<Candidate> cands;
  std::optional<size_t> model_pick;  // index into cands
  std::string partition_error;
  // The NVLink form where it applies: standard rows, every GPU within load/store reach of every other.
  const bool nvlink = o.partition.empty() && layout == plan::RsLayout::Standard && N % 8 == 0 && world <= 8 &&
                      (world == 1 || cx.all_ranks(rt::all_ranks_reachable(base)));
  for (const plan::TileShape tile : tiles) {
    const int ctas = sms - reserve;
    const plan::Schedule s = plan::make_schedule(M, N, tile, ctas, plan::Raster::AlongN,
                                                 plan::default_swizzle(ctas, tile, int32_t((M + tile.bm - 1) / tile.bm)));
    const double wave_ms = rt::max_over_ranks(
        *cx.rv, {rt::measure_gemm_ms(s, k, dt, a.get(), b.get(), c_ours.get(), st, 10) / s.waves()})[0];
    plan::PlanRequest req;
    req.op = plan::Collective::ReduceScatter;
    req.m = M, req.n = N, req.k = K, req.world = world;
    req.dtype = dt == kernels::DType::BF16 ? plan::DType::BF16 : plan::DType::FP16;
    req.tile = tile, req.sms = sms, req.reserve_sms = reserve, req.rs_layout = layout;
    req.measured_wave_ms.assign(size_t(s.waves()), wave_ms);
    auto plan_with = [&req](double min_gain) {
      plan::PlanRequest r = req;
      r.min_gain = min_gain;
      return plan::make_plan(r);
    };
    if (!o.partition.empty()) {  // that partition of the waves, where it fits the tile's
      req.partition = plan::parse_partition(o.partition);
      try {
        cands.push_back({plan_with(0.01)});
      } catch (const InvalidArgument& e) {  // (the same on every rank: agreed inputs)
        partition_error = e.what();
      }
      continue;
    }
    // The model's pick for the tile (the public op's rule: 1% predicted
    // gain, else sequential), its best overlap anyway, and its sequential plan.
    const plan::Plan pick = plan_with(0.01);
    const plan::Plan overlap = pick.sequential ? plan_with(-1e9) : pick;
    const plan::Plan seq = pick.sequential ? pick : plan_with(1e9);
    const bool better = !model_pick || pick.predicted.total_ms < cands[*model_pick].plan.predicted.total_ms;
    const bool overlaps = overlap.groups.size() >= 2, picks_overlap = overlaps && !pick.sequential;
    if (overlaps) cands.push_back({overlap});
    if (better && picks_overlap) model_pick = cands.size() - 1;
    cands.push_back({seq});
    if (better && !picks_overlap) model_pick = cands.size() - 1;
    if (nvlink) cands.push_back({seq, false, false, true});
  }
  if (cands.empty()) throw rt::NoPlan("lab-bench --op reducescatter --partition " + o.partition + ": " + partition_error);
  if (model_pick) cands[*model_pick].model = true;
  if (o.partition.empty() && layout == plan::RsLayout::Standard) {  // cuBLAS's GEMM in the sequential plan
    Candidate c{cands[nvlink ? cands.size() - 2 : cands.size() - 1].plan, true};
    cands.push_back(c);
  }
  if (!o.select) {  // the model's pick alone (a forced partition: the best predicted)
    size_t keep = model_pick.value_or(0);
    for (size_t i = 0; i < cands.size(); ++i)
      if (!model_pick && cands[i].plan.predicted.total_ms < cands[keep].plan.predicted.total_ms) keep = i;
    cands = {cands[keep]};
  }
  rt::OverlapCore core;  // (before the ops: they share its streams and scratch)
  std::vector<std::unique_ptr<rt::OverlapReduceScatter>> ops;
  for (const Candidate& c : cands) {  // (communicators split in the same order on every rank)
    rt::OverlapReduceScatterOptions ro;
    ro.sched = c.plan.schedule, ro.groups = c.plan.groups, ro.layout = c.plan.rs_layout;
    ro.k = k, ro.dtype = dt;
    ro.comm = c.plan.sequential ? base : cx.comm_for(c.plan.reserve_sms);
    ro.tail_comm = base;  // the last group, after the GEMM: NCCL's default CTAs
    ro.wait_timeout_s = o.wait_timeout_s;
    ro.fallback_cublas = c.cublas;
    ro.nvlink = c.nvlink;
    if (c.nvlink) ro.comm = base;  // (its windows mapped over it)
    ro.core = &core;
    ops.push_back(std::make_unique<rt::OverlapReduceScatter>(ro));
    if (ops.back()->out_rows() != out_rows)
      throw Error("lab-bench --op reducescatter: the op holds " + std::to_string(ops.back()->out_rows()) +
                  " rows on rank " + std::to_string(rank) + ", expected " + std::to_string(out_rows));
  }
  auto fo_call = [&](size_t i) { return [&, i] { ops[i]->run(a.get(), b.get(), out_fo.get(), N, st); }; };
  size_t best = 0;
  if (ops.size() > 1) {  // the measured choice: the candidates in turns, max over ranks
    std::vector<std::function<void()>> fns;
    for (size_t i = 0; i < ops.size(); ++i) fns.push_back(fo_call(i));
    best = fastest_in_turns(
        cx, o, fns, [&](size_t i) { return cands[i].name() + (cands[i].model ? " [model]" : ""); },
        [&] {
          for (const auto& op : ops) op->check();
        },
        res.selection);
  }
  const Candidate& pick = cands[best];
  rt::OverlapReduceScatter& op = *ops[best];
  res.predicted_ms = pick.plan.predicted.total_ms;
  // A measured pick free to choose its tile and groups: what the public op
  // looks up by m's tile rows (GemmReduceScatterOptions::tuning_cache).
  if (!o.tuning_cache.empty() && o.select && o.partition.empty() && o.tile == "auto" && rank == 0) {
    using Path = rt::ReduceScatterPick::Path;
    rt::ReduceScatterPick stored;
    stored.path = pick.nvlink ? Path::NVLink : pick.plan.sequential ? Path::Sequential : Path::Slots;
    stored.bm = pick.plan.schedule.bm, stored.bn = pick.plan.schedule.bn, stored.nccl_sms = reserve;
    stored.cublas = pick.cublas, stored.predicted_ms = pick.plan.predicted.total_ms;
    if (stored.path == Path::Slots)
      for (const plan::Group& g : pick.plan.groups) stored.waves.push_back(g.end_wave - g.first_wave);
    rt::PickKey key;
    key.gpu = cx.info.name, key.sms = sms, key.world = world, key.dtype = dt;
    key.tile_rows = rt::tile_rows_of(M), key.n = N, key.k = K, key.op = rt::reducescatter_op(layout);
    rt::PickCache cache(o.tuning_cache);
    cache.store(key, stored);
    for (const std::string& w : cache.warnings()) std::cerr << "lab-bench: " << w << "\n";
  }

  // ---- correctness first: poisoned outputs, fresh random inputs ----
  const plan::Schedule full = plan::make_schedule(M, N, {128, 256}, sms, plan::Raster::AlongN,
                                                  plan::default_swizzle(sms, {128, 256}, int32_t((M + 127) / 128)));
  auto run_seq = [&] {
    rt::sequential_cublas_reducescatter(*cx.cublas, dt, a.get(), b.get(), c_seq.get(), out_seq.get(), m, n, k, base, st);
  };
  auto run_ours = [&] {
    rt::sequential_ours_reducescatter(dt, a.get(), b.get(), c_ours.get(), out_ours.get(), full, k, base, st);
  };
  auto run_fo = fo_call(best);
  std::vector<std::unique_ptr<rt::DecompositionReduceScatter>> decs;
  for (int c : parse_ints(o.decomp, "decomposition chunk"))
    decs.push_back(std::make_unique<rt::DecompositionReduceScatter>(c, base));
  auto run_dec = [&](rt::DecompositionReduceScatter& d) {
    d.run(*cx.cublas, dt, a.get(), b.get(), send.get(), out_dec.get(), m, n, k, st);
  };
  // The reference for the op's rows: each rank's C with rank p's rows (in
  // its output's order) gathered into part p of `send` ([W][ref_rows] x N,
  // zeros past a rank's rows), then one ncclReduceScatter into `ref`.
  auto reduce_by_rank = [&](const rt::DeviceBuffer& c, rt::DeviceBuffer& ref) {
    FO_CUDA_CHECK(cudaMemsetAsync(send.get(), 0, size_t(world) * ref_rows * row_bytes, st));
    for (int p = 0; p < world; ++p) {
      const std::vector<int32_t>& rows = rows_by_rank[size_t(p)];
      for (size_t i = 0; i < rows.size();) {  // runs of consecutive rows: one copy each
        size_t j = i + 1;
        while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
        FO_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(send.get()) + (size_t(p) * ref_rows + i) * row_bytes,
                                      static_cast<const char*>(c.get()) + size_t(rows[i]) * row_bytes,
                                      (j - i) * row_bytes, cudaMemcpyDeviceToDevice, st));
        i = j;
      }
    }
    FO_NCCL_CHECK_CTX(ncclReduceScatter(send.get(), ref.get(), size_t(ref_rows) * N, rt::nccl_type(dt), ncclSum, base, st),
                      "the reference's ReduceScatter");
  };
  for (auto* p : {&out_seq, &out_ours, &out_dec, &out_fo}) kernels::poison(p->get(), p->bytes() / 2, st);
  run_seq();
  run_ours();
  run_dec(*decs.front());
  reduce_by_rank(c_ours, ref_ours);  // (c_seq, c_ours: this rank's C from the two sequential runs)
  reduce_by_rank(c_seq, ref_cublas);
  for (int rep = 0; rep < 3; ++rep) run_fo();  // several epochs
  FO_CUDA_CHECK(cudaStreamSynchronize(st));
  op.check();
  // Bitwise reference: the same GEMM then one ReduceScatter (1-2 ranks; more:
  // NCCL may sum in another order for other sizes, so within the per-element
  // bound of the same GEMM + NCCL too); against cuBLAS + NCCL, the bound of
  // two GEMMs summed over the ranks.
  const kernels::Tolerance tol = kernels::gemm_tolerance(dt, K, world);
  const rt::DeviceBuffer& ref = pick.cublas ? ref_cublas : ref_ours;
  const auto vs_ours = kernels::compare(dt, out_fo.get(), N, ref.get(), N, out_rows, N, st, tol);
  const auto vs_cublas = kernels::compare(dt, out_fo.get(), N, ref_cublas.get(), N, out_rows, N, st, tol);
  kernels::CompareResult dec_vs, ours_vs;  // the baselines' standard rows against cuBLAS + NCCL
  if (valid_rows > 0) {
    dec_vs = kernels::compare(dt, out_dec.get(), N, out_seq.get(), N, valid_rows, N, st, tol);
    ours_vs = kernels::compare(dt, out_ours.get(), N, out_seq.get(), N, valid_rows, N, st, tol);
  }
  const std::vector<double> bad = rt::max_over_ranks(
      *cx.rv, {double(vs_ours.mismatches), double(vs_cublas.beyond), double(vs_cublas.nan_count),
               double(dec_vs.beyond), double(vs_ours.beyond), vs_cublas.worst_ratio, double(ours_vs.beyond)});
  const bool bitwise = world <= 2;
  const std::string ref_name = pick.cublas ? "sequential (cuBLAS fallback)" : "our GEMM + ncclReduceScatter";
  std::ostringstream chk;
  chk << std::setprecision(2) << plan::to_string(layout) << " layout, " << out_rows << " rows on rank " << rank << ": ";
  if (bitwise)
    chk << (bad[0] == 0 ? "bitwise == " + ref_name : "NOT bitwise equal to " + ref_name);
  else
    chk << "vs " << ref_name << ": " << beyond_text(bad[4]);
  chk << "; vs cuBLAS+NCCL: " << beyond_text(bad[1]) << " (worst " << bad[5] << "x of it); NaN " << bad[2];
  if (bad[3] > 0) chk << "; decomposition vs cuBLAS+NCCL: " << beyond_text(bad[3]);
  if (bad[6] > 0) chk << "; sequential-ourgemm vs cuBLAS+NCCL: " << beyond_text(bad[6]);
  res.checks = chk.str();
  if ((bitwise ? bad[0] != 0 : bad[4] != 0) || bad[1] != 0 || bad[2] != 0 || bad[3] != 0 || bad[6] != 0)
    throw Error("correctness check failed for " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                std::to_string(K) + " (reducescatter): " + res.checks);

  // ---- timings ----
  Variants timed{run_seq, run_ours, run_fo, {}, run_gemm_alone, run_rs_alone};
  for (auto& d : decs) timed.decomposition.push_back({d->chunks(), [&, dp = d.get()] { run_dec(*dp); }});
  const std::vector<double> ms =
      time_variants(cx, o, timed, "ReduceScatter", "best of " + o.decomp + " chunks of every rank's row block", res);
  op.check();
  const std::string cfg = describe(pick, op, cands.size());
  res.rows.push_back({"flashoverlap", ms.back(), op.describe_groups(), cfg});

  if (o.rmsnorm) {  // GEMM -> ReduceScatter -> residual + RMSNorm of this rank's rows, against the fused path
    const int64_t norm_rows = std::max(R, ref_rows);
    rt::DeviceBuffer residual(size_t(norm_rows) * row_bytes), weight(row_bytes), y_seq(size_t(R) * row_bytes),
        y_ref(size_t(ref_rows) * row_bytes), y_fo(size_t(ref_rows) * row_bytes);
    kernels::fill_random(dt, residual.get(), norm_rows * N, seed + 3, -1.f, 1.f, st);
    kernels::fill_random(dt, weight.get(), N, 42, 0.5f, 1.5f, st);
    const float eps = 1e-6f;
    auto unfused = [&] {
      run_seq();
      kernels::add_rmsnorm_rows(dt, out_seq.get(), int32_t(R), n, residual.get(), weight.get(), eps, y_seq.get(),
                                nullptr, st);
    };
    const rt::RmsNormArgs norm{residual.get(), weight.get(), eps, nullptr};
    auto fused = [&] { op.run_rmsnorm(a.get(), b.get(), norm, y_fo.get(), st); };
    kernels::poison(y_fo.get(), ref_rows * N, st);
    // The reference from the rows checked above (the same GEMM as the op's).
    kernels::add_rmsnorm_rows(dt, ref.get(), int32_t(out_rows), n, residual.get(), weight.get(), eps, y_ref.get(),
                              nullptr, st);
    fused();
    FO_CUDA_CHECK(cudaStreamSynchronize(st));
    op.check();
    const auto r = kernels::compare(dt, y_fo.get(), N, y_ref.get(), N, out_rows, N, st);
    const std::vector<double> rb =
        rt::max_over_ranks(*cx.rv, {double(r.mismatches), double(r.nan_count), r.rel_error()});
    res.checks += std::string("; rmsnorm fused vs unfused: ") + (rb[0] == 0 ? "bitwise equal" : "differs") +
                  " (rel " + std::to_string(rb[2]) + ")";
    if (rb[1] > 0 || (bitwise && rb[0] != 0))
      throw Error("fused RMSNorm differs from GEMM -> ReduceScatter -> RMSNorm: " + res.checks);
    const auto t = rt::time_collective_interleaved({unfused, fused}, st, base, o.warmup, o.iters, o.gate);
    FO_CUDA_CHECK(cudaStreamSynchronize(st));
    op.check();
    const std::vector<double> rms = rt::max_over_ranks(*cx.rv, {t[0].median_ms, t[1].median_ms});
    res.rows.push_back({"sequential+rmsnorm", rms[0], "1", "cuBLAS + NCCL + RMSNorm"});
    res.rows.push_back({"flashoverlap+rmsnorm", rms[1], op.describe_groups(), cfg + ", fused"});
  }
  return res;
}

}  // namespace flashoverlap::cli::bench
