// flashoverlap-lab lab-bench — GEMM + collective, every internal variant in one
// run on all ranks: correctness first, then timings (median per rank, max
// over ranks). A lab: the variants run through the internal ops (rt::), planned
// and measured here by the tuner, not the public ops of flashoverlap.h (those:
// `flashoverlap bench`, cmd_bench_ops.cpp).
// This file: the AllReduce, and the run over shapes with its table, CSV and
// JSON for every collective (--op reducescatter: cmd_lab_bench_rs.cpp).
//   sequential          cuBLAS GEMM, then one ncclAllReduce (what users run today)
//   sequential-ourgemm  our GEMM, then one ncclAllReduce
//   decomposition       M in 2/4/8 chunks of cuBLAS GEMMs, AllReduce per chunk on a 2nd stream (best)
//   flashoverlap        the signalling GEMM overlapped with per-group AllReduces (planned here)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "lab/lab_bench_shared.h"
#include "cli_parse.h"
#include "commands.h"
#include "lab/lab.h"
#include "plan/curve_files.h"
#include "flashoverlap/error.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "kernels/reorder.h"
#include "plan/planner.h"
#include "process/bootstrap.h"
#include "runtime/tune/ideal_gain.h"
#include "runtime/ops/baselines.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/communicator.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/allreduce.h"
#include "runtime/transport/peers.h"
#include "runtime/tune/picks.h"
#include "runtime/tune/tuner.h"
#include "runtime/tune/power_meter.h"

namespace flashoverlap::cli {
namespace {

using bench::Context;
using bench::Options;
using bench::Row;
using bench::ShapeResult;
using bench::shapes_of;

struct PowerVariant {
  std::string name;
  std::function<void()> call;
  double ms;  // its median (max over ranks): every rank runs the same number of calls
  bool idle = false;  // no GPU work: settle first, report power and clocks only
};

// Each variant run again for --power seconds (after a fifth of that to warm
// up), NVML sampled between batches of ~50 ms: mean power from the energy
// counter, SM clock, the share of samples with a power-cap clock reason.
// The idle row (1 ms host sleeps) waits 2 s first, for the power to settle.
// Power, energy and capped share are the max over ranks, clocks the min.
// `measured` (optional) receives each variant's ms, mJ and W per call
// (all zero where sampling failed).
std::string power_table(Context& cx, const Options& o, const std::vector<PowerVariant>& variants,
                        std::vector<rt::CallEnergy>* measured = nullptr) {
  if (measured) measured->assign(variants.size(), rt::CallEnergy{});
  if (!cx.power_everywhere) return "power: no NVML power meter on every rank (see --power)";
  std::ostringstream os;
  os << std::fixed << std::setprecision(0) << "power (NVML; " << o.power_s << " s per variant; limit "
     << cx.meter->limit_w() << " W; ms per call back to back, W, J and capped: max over ranks; MHz: min over ranks):";
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const PowerVariant& v = variants[vi];
    const double ms = std::max(v.ms, 1e-3);
    const int calls = std::max(10, int(o.power_s * 1e3 / ms)), batch = std::max(1, int(50.0 / ms));
    // A failed NVML read stops this rank's sampling, not its calls (the
    // other ranks' collectives need them); the ranks agree on it below.
    bool failed = false;
    std::vector<rt::PowerSample> samples;
    auto take = [&] {
      if (failed) return;
      try {
        samples.push_back(cx.meter->sample());
      } catch (const Error& e) {
        failed = true;
        std::cerr << "lab-bench --power: rank " << cx.rv->rank() << ": " << e.what() << "\n";
      }
    };
    auto run = [&](int count, bool sample) {
      for (int done = 0; done < count;) {
        const int b = std::min(batch, count - done);
        for (int i = 0; i < b; ++i) v.call();
        FO_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
        done += b;
        if (sample) take();
      }
    };
    if (v.idle) std::this_thread::sleep_for(std::chrono::seconds(2));  // power settles after the timings
    run(calls / 5 + 1, false);
    take();
    run(calls, true);
    const rt::PowerSummary p = rt::summarize(samples);
    const std::vector<double> r =
        rt::max_over_ranks(*cx.rv, {p.mean_w, p.joules * 1e3 / calls, p.capped_share, -p.sm_mhz_mean,
                                    -double(p.sm_mhz_min), failed ? 1.0 : 0.0, p.seconds * 1e3 / calls});
    if (r[5] > 0) {
      os << "\n    " << v.name << ": NVML sampling failed on a rank (see its message)";
      continue;
    }
    if (measured) (*measured)[vi] = {r[6], r[1], r[0]};
    os << "\n    " << std::left << std::setw(40) << v.name << std::right;
    if (v.idle)
      os << std::setprecision(0) << std::setw(37) << r[0] << " W, SM ";
    else
      os << std::setprecision(3) << std::setw(6) << r[6] << " ms per call, " << std::setprecision(0) << std::setw(4)
         << r[0] << " W, " << std::setprecision(1) << std::setw(6) << r[1] << " mJ per call, SM ";
    os << std::setprecision(0) << -r[3]
       << " MHz (min " << -r[4] << "), power-capped in " << r[2] * 100 << "% of " << p.samples << " samples";
  }
  return os.str();
}

ShapeResult bench_allreduce(Context& cx, const Options& o, int64_t M, int64_t N, int64_t K) {
  const int m = int(M), n = int(N), k = int(K), rank = cx.rv->rank(), world = cx.rv->world();
  if (world > 2 && o.layout == "owners" && !o.four_stages)  // (every rank alike: the same world)
    throw InvalidArgument("--layout owners on more than 2 ranks runs on 4 pipeline stages: not with --three-stages");
  const auto dt = cx.dtype;
  const size_t c_bytes = size_t(M) * N * 2;
  rt::DeviceBuffer a(size_t(M) * K * 2), b(size_t(N) * K * 2), out_seq(c_bytes), out_ours(c_bytes), out_fo(c_bytes),
      out_dec(c_bytes), scratch(c_bytes);
  const uint64_t seed = 0x5eed + uint64_t(rank) * 7919 + uint64_t(M) * 31 + uint64_t(N) * 17 + uint64_t(K);
  kernels::fill_random(dt, a.get(), M * K, seed, -1.f, 1.f, cx.stream);
  kernels::fill_random(dt, b.get(), N * K, seed ^ 0xabcdef, -1.f, 1.f, cx.stream);
  FO_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
  const ncclComm_t base = cx.base.get();
  // --registered-output: the baselines' outputs registered with NCCL too
  // (ncclCommRegister), as flashoverlap's is with the op: the same setup for
  // both sides. Deregistered when the shape is done.
  struct NcclRegistration {
    ncclComm_t comm = nullptr;
    void* handle = nullptr;
    ~NcclRegistration() {
      if (handle) ncclCommDeregister(comm, handle);
    }
  };
  std::vector<NcclRegistration> nccl_regs(o.registered ? 2 : 0);
  std::string nccl_reg_note;
  if (o.registered) {
    std::string why;
    void* bufs[2] = {out_seq.get(), out_ours.get()};
    for (int i = 0; i < 2; ++i) {
      nccl_regs[size_t(i)].comm = base;
      const ncclResult_t r = ncclCommRegister(base, bufs[i], c_bytes, &nccl_regs[size_t(i)].handle);
      if (r != ncclSuccess) why = ncclGetErrorString(r), nccl_regs[size_t(i)].handle = nullptr;
    }
    const bool all = rt::max_over_ranks(*cx.rv, {why.empty() ? 0.0 : 1.0})[0] == 0;
    nccl_reg_note = all ? "baselines' outputs registered with NCCL (ncclCommRegister)"
                        : "baselines' outputs NOT registered with NCCL on every rank" + (why.empty() ? "" : ": " + why);
  }

  ShapeResult res{M, N, K, 0, 0, 0, 0, {}, {}, 0, {}, {}, {}, {}};
  // Components, measured on their own for the tuner; the ideal, max(GEMM,
  // AllReduce), comes from the same components timed again in turns with the variants below.
  auto run_gemm_alone = [&] { cx.cublas->run(dt, a.get(), b.get(), out_seq.get(), m, n, k, n, cx.stream); };
  auto run_ar_alone = [&] {
    FO_NCCL_CHECK_CTX(
        ncclAllReduce(out_seq.get(), out_seq.get(), size_t(M) * N, rt::nccl_type(dt), ncclSum, base, cx.stream),
        "AllReduce alone");
  };
  std::vector<double> comp = {rt::time_collective(run_gemm_alone, cx.stream, base, o.warmup, o.iters, o.gate).median_ms,
                              rt::time_collective(run_ar_alone, cx.stream, base, o.warmup, o.iters, o.gate).median_ms};
  comp = rt::max_over_ranks(*cx.rv, comp);
  res.gemm_before_ms = comp[0], res.comm_before_ms = comp[1];

  rt::AllReduceTuning tuning;
  tuning.rv = cx.rv.get(), tuning.sms = cx.info.sms, tuning.dtype = dt, tuning.stream = cx.stream;
  tuning.curve_for = [&cx](int ctas) -> const plan::BandwidthCurve& { return cx.curve_for(ctas); };
  if (o.tile != "auto") tuning.tiles = {plan::parse_tile(o.tile)};
  tuning.reserve = o.reserve_sms;
  if (!o.band_swizzles.empty()) tuning.band_swizzles = parse_ints(o.band_swizzles, "band swizzle");  // (checked)
  tuning.registered_output = o.registered;  // the finalists timed as the flashoverlap row will run
  if (o.layout == "rows") tuning.layouts = {rt::ArLayout::RowBands};
  if (o.layout == "slots") tuning.layouts = {rt::ArLayout::Slots};
  if (o.layout == "owners") tuning.layouts = {rt::ArLayout::Owners};
  tuning.push_reachable = world > 1 && cx.all_ranks(rt::all_ranks_reachable(base));  // the same answer everywhere
  // Auto: owners too on 2 ranks within reach (on more, only asked for: not
  // yet measured against NCCL's layouts on 3+ GPUs).
  if (o.layout == "auto" && world == 2 && tuning.push_reachable) tuning.layouts.push_back(rt::ArLayout::Owners);
  tuning.world = world;
  tuning.group_sizes = o.partition;
  tuning.cublas_gemm_ms = comp[0];
  auto options_for = [&](const rt::AllReducePlan& pl) {
    rt::OverlapAllReduceOptions fo;
    fo.sched = pl.sched, fo.groups = pl.groups, fo.layout = pl.layout, fo.k = k, fo.dtype = dt, fo.rank = rank;
    fo.comm = cx.comm_for(pl.reserve);
    fo.tail_comm = base;
    fo.trace = false;  // (the op timed last gets it: the trace's events cost the calls device time)
    fo.fallback_cublas = pl.fallback_cublas;
    fo.owner_copy_in_gemm = pl.copy_in_gemm && o.owner_copy_in_gemm;
    fo.four_stages = o.four_stages && pl.four_stages;  // (--three-stages, or the tuner's stage round)
    fo.push_tma = o.push_tma == "last" ? 1 : o.push_tma == "all" ? 2 : 0;
    fo.owner_pushers = o.owner_pushers == "on" ? 1 : o.owner_pushers == "off" ? 0 : -1;
    fo.wait_timeout_s = o.wait_timeout_s;
    fo.testing.owners_wide =
        o.owners_wide && !pl.sequential && pl.layout == rt::ArLayout::Owners && pl.sched.bn == 256 && fo.four_stages;
    return fo;
  };
  // The model ranks; a short measurement (separate runs from the timings
  // below) picks among the finalists, unless --no-select.
  if (o.select) tuning.options_for = options_for, tuning.sync_comm = base, tuning.selection = &res.selection;
  tuning.host_gate = o.gate;
  tuning.stage_round = o.four_stages;  // (--three-stages: no choice)
  const rt::AllReducePlan plan =
      rt::tune_allreduce(tuning, M, N, K, a.get(), b.get(), scratch.get(), comp[0] + comp[1]);
  res.predicted_ms = plan.predicted_ms;
  // A measured pick free to choose anything: what the public op looks up by m's tile rows.
  const bool free_pick = o.select && o.layout == "auto" && o.partition.empty() && o.tile == "auto" && o.reserve_sms < 0;
  if (!o.tuning_cache.empty() && free_pick && rank == 0) {
    rt::PickKey key;
    key.gpu = cx.info.name, key.sms = cx.info.sms, key.world = world, key.dtype = dt;
    key.tile_rows = rt::tile_rows_of(M), key.n = N, key.k = K;
    rt::PickCache cache(o.tuning_cache);
    cache.store(key, plan);
    for (const std::string& w : cache.warnings()) std::cerr << "lab-bench: " << w << "\n";
  }
  rt::OverlapAllReduceOptions fo = options_for(plan);
  fo.trace = o.trace;
  rt::OverlapAllReduce op(fo);
  if (o.trace) op.set_tracing(false);  // the timed calls untraced; one more call after them is traced
  plan::Schedule full = plan::make_schedule(M, N, {128, 256}, cx.info.sms, plan::Raster::AlongN,
                                            plan::default_swizzle(cx.info.sms, {128, 256}, int32_t((M + 127) / 128)));
  std::vector<std::unique_ptr<rt::DecompositionAllReduce>> decs;
  for (int c : parse_ints(o.decomp, "decomposition chunk")) decs.push_back(std::make_unique<rt::DecompositionAllReduce>(c, base));

  // ---- correctness first: poisoned outputs, fresh random inputs ----
  auto run_seq = [&] { rt::sequential_cublas_allreduce(*cx.cublas, dt, a.get(), b.get(), out_seq.get(), m, n, k, base, cx.stream); };
  auto run_ours = [&] { rt::sequential_ours_allreduce(dt, a.get(), b.get(), out_ours.get(), full, k, base, cx.stream); };
  const int fo_slot = o.registered ? op.register_output(out_fo.get(), N) : -1;  // (collective)
  auto run_fo = [&] {
    if (o.registered)
      op.run_registered(a.get(), b.get(), fo_slot, cx.stream);
    else
      op.run(a.get(), b.get(), out_fo.get(), N, cx.stream);
  };
  auto run_ours_alone = [&] {  // --power: our GEMM without the AllReduce
    kernels::launch_gemm(kernels::plain_gemm(dt, a.get(), b.get(), full, k, out_ours.get(), N), cx.stream);
  };
  for (auto* p : {&out_seq, &out_ours, &out_fo, &out_dec}) kernels::poison(p->get(), M * N, cx.stream);
  run_seq();
  run_ours();
  for (int rep = 0; rep < 3; ++rep) run_fo();  // (several epochs)
  FO_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
  decs.front()->run(*cx.cublas, dt, a.get(), b.get(), out_dec.get(), m, n, k, cx.stream);
  FO_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
  op.check();
  // Bitwise reference: the same GEMM followed by one AllReduce.
  // (2 ranks: bitwise; more: NCCL's ring sums in another order than our
  // rank-order fp32 sum, so within the per-element bound of the same GEMM +
  // NCCL too; against cuBLAS + NCCL, the bound of two GEMMs summed over the ranks)
  const kernels::Tolerance tol = kernels::gemm_tolerance(dt, K, world);
  const auto vs_ours = kernels::compare(dt, out_fo.get(), N, plan.fallback_cublas ? out_seq.get() : out_ours.get(), N,
                                        M, N, cx.stream, tol);
  const auto vs_cublas = kernels::compare(dt, out_fo.get(), N, out_seq.get(), N, M, N, cx.stream, tol);
  const auto dec_vs = kernels::compare(dt, out_dec.get(), N, out_seq.get(), N, M, N, cx.stream, tol);
  std::vector<double> bad = {double(vs_ours.mismatches), double(vs_cublas.beyond), double(vs_cublas.nan_count),
                             double(dec_vs.beyond), double(vs_ours.beyond), vs_cublas.worst_ratio};
  bad = rt::max_over_ranks(*cx.rv, bad);
  std::ostringstream chk;
  const std::string ref_name = plan.fallback_cublas ? "sequential (cuBLAS fallback)" : "sequential-ourgemm";
  chk << std::setprecision(2);
  const auto beyond = bench::beyond_text;
  if (world == 2)
    chk << (bad[0] == 0 ? "bitwise == " + ref_name : "NOT bitwise equal to " + ref_name);
  else
    chk << "vs " << ref_name << ": " << beyond(bad[4]);
  chk << "; vs cuBLAS+NCCL: " << beyond(bad[1]) << " (worst " << bad[5] << "x of it); NaN " << bad[2];
  if (bad[3] > 0) chk << "; decomposition vs cuBLAS+NCCL: " << beyond(bad[3]);
  res.checks = chk.str();
  const bool ok = (world == 2 ? bad[0] == 0 : bad[4] == 0) && bad[1] == 0 && bad[2] == 0 && bad[3] == 0;
  if (!ok)
    throw Error("correctness check failed for " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                       std::to_string(K) + ": " + res.checks);

  // ---- timings ----
  bench::Variants timed{run_seq, run_ours, run_fo, {}, run_gemm_alone, run_ar_alone};
  for (auto& d : decs)
    timed.decomposition.push_back(
        {d->chunks(), [&, dp = d.get()] { dp->run(*cx.cublas, dt, a.get(), b.get(), out_dec.get(), m, n, k, cx.stream); }});
  const std::vector<double> ms =
      bench::time_variants(cx, o, timed, "AllReduce", "best of " + o.decomp + " chunks", res);
  op.check();
  if (o.trace && !plan.sequential) {  // two more calls, traced, as each timed one ran (sync, gate), this rank
    op.set_tracing(true);
    rt::time_collective(run_fo, cx.stream, base, 1, 1, o.gate);  // (a warm-up first: the timeline is the second's)
    op.set_tracing(false);
    op.check();
    const rt::Timeline tl = op.timeline();
    std::ostringstream tr;
    tr << std::fixed << std::setprecision(3) << "rank " << rank << " timeline (ms from GEMM launch): GEMM end "
       << tl.gemm_end << " (alone on " << op.schedule().ctas << " CTAs: "
       << rt::measure_gemm_ms(op.schedule(), k, dt, a.get(), b.get(), scratch.get(), cx.stream, 10) << ")";
    // More cycles per tile beside the transfers is interference; a lower clock, power.
    auto clocks = [](const rt::TileClocks& c) {
      std::ostringstream s;
      s << std::fixed << std::setprecision(0) << c.mhz << " MHz (quarters";
      for (double q : c.mhz_by_quarter) s << " " << q;
      s << "), " << std::setprecision(1) << c.kcycles_median << " kcycles per tile (p90 " << c.kcycles_p90 << "), "
        << c.us_median << " us";
      return s.str();
    };
    rt::GemmPhases alone;
    const rt::TileClocks alone_clocks =
        rt::measure_gemm_clocks(op.schedule(), k, dt, a.get(), b.get(), scratch.get(), cx.stream, 3, &alone,
                                op.four_stages());
    tr << "\n    GEMM tiles overlapped: " << clocks(tl.clocks) << "\n    GEMM tiles alone:      " << clocks(alone_clocks);
    // Where the end goes: the first and last tiles' MMAs, the last tiles staged (after the epilogue's waits), then
    // their stores and pushes, then the copies.
    auto phases = [](const rt::GemmPhases& g) {
      if (g.ctas == 0) return std::string("n/a (no storer warp: C not stored by TMA)");
      std::ostringstream s;
      s << std::fixed << std::setprecision(1) << "MMAs done: first tiles " << g.mma_first_median_us
        << ", last tiles " << g.mma_last_median_us << " (median) " << g.mma_last_max_us << " (max); last tiles staged "
        << g.staged_median_us << " (median) "
        << g.staged_max_us << " (max), stored+pushed " << g.stored_max_us << ", copied " << g.copied_max_us
        << ", end " << g.end_us << " us";
      return s.str();
    };
    tr << "\n    CTA phases overlapped: " << phases(tl.phases) << "\n    CTA phases alone:      " << phases(alone);
    for (size_t g = 0; g < tl.comm_end.size(); ++g)
      tr << "\n    group " << g << " (tiles " << op.groups()[g].first_tile << "-" << op.groups()[g].end_tile
         << "): wait done " << tl.wait_end[g]
         << ", AllReduce"
         << " done " << tl.comm_end[g];
    res.trace = tr.str();
  }
  std::ostringstream cfg;
  cfg << op.schedule().bm << "x" << op.schedule().bn << ", " << op.schedule().ctas << " CTAs, swizzle "
      << op.schedule().swizzle << ", NCCL "
      << (plan.sequential ? "default CTAs"
          : plan.layout == rt::ArLayout::Owners
              ? std::string("window (each tile summed by its owner rank, stored over NVLink by the GEMM)")
              : std::to_string(plan.reserve) + " CTAs")
      << (plan.sequential ? (plan.fallback_cublas ? ", sequential fallback (cuBLAS)" : ", sequential fallback")
          : std::string(", ") + rt::layout_name(op.layout()) +
                (op.layout() != rt::ArLayout::Owners ? ""
                 : op.owner_copy_in_gemm()           ? " (copies in the GEMM)"
                                                     : " (copies at the GEMM's end)"))
      << (!plan.four_stages && rt::plan_has_stage_choice(plan) ? ", 3 stages" : "")  // (the stage round's pick)
      << (o.registered ? (op.finals_into_outputs() ? ", registered output (the peer's finals stored straight into it); "
                                                   : ", registered output (run: this plan copies); ") + nccl_reg_note
                       : "");
  res.rows.push_back({"flashoverlap", ms.back(), op.describe_groups(), cfg.str()});

  if (o.power_s > 0) {
    // Our GEMM alone, timed here (max over ranks): sets its call count.
    const double ours_ms = rt::max_over_ranks(
        *cx.rv, {rt::measure_gemm_ms(full, k, dt, a.get(), b.get(), out_ours.get(), cx.stream, 10)})[0];
    std::vector<PowerVariant> variants = {
        {"idle (no GPU work)", [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, 1.0, true},
        {"GEMM alone (cuBLAS)", run_gemm_alone, comp[0]},
        {"GEMM alone (ours)", run_ours_alone, ours_ms},
        {"AllReduce alone", run_ar_alone, comp[1]},
        {"sequential", run_seq, ms[0]},
        {"flashoverlap", run_fo, ms.back()}};
    // An owner pick: the same plan with the copy of the peer's finals at the
    // other place too, checked bitwise first, so that their energies compare
    // in one run.
    std::unique_ptr<rt::OverlapAllReduce> alt_op;
    if (!plan.sequential && plan.layout == rt::ArLayout::Owners && o.owner_copy_in_gemm) {
      run_ours();  // the reference again (the GEMM-alone timing above wrote over it)
      rt::AllReducePlan alt = plan;
      alt.copy_in_gemm = !op.owner_copy_in_gemm();
      alt_op = std::make_unique<rt::OverlapAllReduce>(options_for(alt));  // (collective: every rank builds it)
      rt::OverlapAllReduce* p = alt_op.get();
      kernels::poison(out_fo.get(), M * N, cx.stream);
      for (int rep = 0; rep < 2; ++rep) p->run(a.get(), b.get(), out_fo.get(), N, cx.stream);
      FO_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
      std::string why;  // every rank learns of a failure on any (none may be left in a collective)
      try {
        p->check();
      } catch (const Error& e) {
        why = e.what();
      }
      const auto cmp = kernels::compare(dt, out_fo.get(), N, out_ours.get(), N, M, N, cx.stream, tol);
      const std::vector<double> bad = rt::max_over_ranks(
          *cx.rv, {why.empty() ? 0.0 : 1.0, double(cmp.mismatches), double(cmp.nan_count), double(cmp.beyond)});
      if (bad[0] > 0)
        throw Error("lab-bench --power: " + rt::describe(alt) + ": " + (why.empty() ? "failed on another rank" : why));
      if (bad[2] > 0 || (world == 2 ? bad[1] > 0 : bad[3] > 0))
        throw Error("lab-bench --power: " + rt::describe(alt) + (world == 2 ? " is not bitwise equal to" : " differs from") +
                    " sequential-ourgemm");
      variants.push_back({std::string("flashoverlap, owners") + (p->owner_copy_in_gemm() ? ", copy in" : ", copy at end"),
                          [&, p] { p->run(a.get(), b.get(), out_fo.get(), N, cx.stream); }, ms.back()});
    }
    std::vector<rt::CallEnergy> e;
    res.power = power_table(cx, o, variants, &e);
    // Indices: 0 idle, 2 our GEMM, 3 AllReduce, 4 sequential, 5 on: flashoverlap.
    if (e[0].w > 0 && e[2].ms > 0 && e[3].ms > 0 && e[4].ms > 0) {
      std::ostringstream eb;
      const rt::EnergyBound bound = rt::energy_bound(e[0].w, e[2], e[3], e[4].ms, {});
      // The gain is over what users run (cuBLAS + NCCL), its ideal the GEMM the overlap runs (ours).
      eb << std::fixed << "\n  energy bound back to back (our GEMM + the AllReduce above idle, at the GEMM's power): "
         << std::setprecision(3) << bound.bound_ms << " ms, " << std::setprecision(0) << bound.bound_gain * 100
         << "% of the ideal gain (sequential cuBLAS + NCCL down to max(our GEMM, AllReduce))";
      for (size_t i = 5; i < variants.size(); ++i) {
        if (e[i].ms <= 0) continue;
        const rt::EnergyBound bd = rt::energy_bound(e[0].w, e[2], e[3], e[4].ms, e[i]);
        eb << "\n    " << std::left << std::setw(40) << variants[i].name << std::right << std::setprecision(0)
           << std::setw(4) << bd.gain * 100 << "% of the ideal gain, " << std::setprecision(1) << bd.excess_mj
           << " mJ per call above the bound's energy";
      }
      res.power += eb.str();
    }
  }

  if (o.rmsnorm) {  // GEMM -> AllReduce -> RMSNorm against the fused path
    rt::DeviceBuffer residual(c_bytes), weight(size_t(N) * 2), y_ref(c_bytes), y_fo(c_bytes);
    kernels::fill_random(dt, residual.get(), M * N, seed + 3, -1.f, 1.f, cx.stream);
    kernels::fill_random(dt, weight.get(), N, 42, 0.5f, 1.5f, cx.stream);
    const float eps = 1e-6f;
    auto unfused = [&] {
      run_seq();
      kernels::add_rmsnorm_rows(dt, out_seq.get(), m, n, residual.get(), weight.get(), eps, y_ref.get(), nullptr, cx.stream);
    };
    rt::RmsNormArgs norm{residual.get(), weight.get(), eps, nullptr};
    auto fused = [&] { op.run_rmsnorm(a.get(), b.get(), norm, y_fo.get(), cx.stream); };
    kernels::poison(y_fo.get(), M * N, cx.stream);
    if (plan.fallback_cublas) run_seq(); else run_ours();  // the same GEMM as the op's
    kernels::add_rmsnorm_rows(dt, plan.fallback_cublas ? out_seq.get() : out_ours.get(), m, n, residual.get(),
                              weight.get(), eps, y_ref.get(), nullptr, cx.stream);
    fused();
    const auto r = kernels::compare(dt, y_fo.get(), N, y_ref.get(), N, M, N, cx.stream);
    std::vector<double> rb = rt::max_over_ranks(*cx.rv, {double(r.mismatches), r.rel_error()});
    res.checks += std::string("; rmsnorm fused vs unfused: ") + (rb[0] == 0 ? "bitwise equal" : "differs") +
                  " (rel " + std::to_string(rb[1]) + ")";
    if (world == 2 && rb[0] != 0) throw Error("fused RMSNorm differs from GEMM -> AllReduce -> RMSNorm");
    const auto st = rt::time_collective_interleaved({unfused, fused}, cx.stream, base, o.warmup, o.iters, o.gate);
    std::vector<double> rms = rt::max_over_ranks(*cx.rv, {st[0].median_ms, st[1].median_ms});
    res.rows.push_back({"sequential+rmsnorm", rms[0], "1", "cuBLAS + NCCL + RMSNorm"});
    res.rows.push_back({"flashoverlap+rmsnorm", rms[1], op.describe_groups(),
                        cfg.str() + (op.result_in_window() ? ", fused (C in place in the window: no copies)" : ", fused")});
  }
  return res;
}

int run(const Options& o) {
  const bool rs = o.op == "reducescatter", a2a = o.op == "alltoall";
  if (o.op != "allreduce" && !rs && !a2a)
    throw InvalidArgument("lab-bench --op " + o.op + ": must be allreduce, reducescatter or alltoall");
  if (!rs && !a2a && !o.rs_layout.empty()) throw InvalidArgument("--rs-layout is for --op reducescatter");
  if (!a2a && (o.routing != "uniform" || o.topk != 0 || o.tokens != 0))
    throw InvalidArgument("--routing, --topk and --tokens are for --op alltoall");
  const char* collective = rs ? "ReduceScatter" : a2a ? "All-to-All" : "AllReduce";
  if (o.dtype != "bf16" && o.dtype != "fp16") throw InvalidArgument("--dtype must be bf16 or fp16");
  if (o.tile != "auto") {
    const plan::TileShape t = plan::parse_tile(o.tile);  // (a malformed one: its message)
    if (!kernels::tile_supported(t.bm, t.bn))
      throw InvalidArgument("--tile must be auto, 128x256 or 128x128, not " + o.tile);
  }
  if (o.layout != "auto" && o.layout != "rows" && o.layout != "slots" && o.layout != "owners")
    throw InvalidArgument("--layout must be auto, rows, slots or owners" +
                          std::string(o.layout == "gathered" || o.layout == "gathered-tiles" || o.layout == "pushed" ||
                                              o.layout == "pushed-tiles"
                                          ? " (the gathered and pushed layouts were retired: docs/results.md)"
                                          : ""));
  const auto shapes = shapes_of(o);
  if (rs) bench::check_reducescatter_options(o, shapes);  // (before the GPU: what the CPU tests see)
  if (a2a) bench::check_alltoall_options(o, shapes);
  const rt::GpuProbe probe = rt::probe_gpus();
  const int gpus = probe.hopper;
  if (gpus < 1) {
    std::cerr << "lab-bench: no Hopper (sm_90) GPU found on this machine (" << probe.reason << "); nothing to measure "
                 "(`flashoverlap plan` shows the plan without a GPU).\n";
    return 1;
  }
  Context cx;
  cx.env = rt::DistEnv::from_env().value_or(rt::DistEnv{});
  if (cx.env.local_rank >= gpus)
    throw InvalidArgument("local rank " + std::to_string(cx.env.local_rank) + " but only " + std::to_string(gpus) +
                          " GPUs are visible");
  FO_CUDA_CHECK(cudaSetDevice(cx.env.local_rank));
  cx.dtype = o.dtype == "fp16" ? kernels::DType::FP16 : kernels::DType::BF16;
  cx.dtype_name = o.dtype;
  cx.curves_dir = o.curves;
  cx.info = rt::device_info(cx.env.local_rank);
  kernels::preload_kernels();
  cx.rv = std::make_unique<rt::Rendezvous>(cx.env);
  if (o.power_s > 0) {
    char bus[32] = {};
    std::string why = "cudaDeviceGetPCIBusId failed";
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), cx.env.local_rank) == cudaSuccess) cx.meter = rt::PowerMeter::open(bus, &why);
    if (!cx.meter) std::cerr << "lab-bench --power: rank " << cx.rv->rank() << ": " << why << "\n";
    cx.power_everywhere = cx.all_ranks(cx.meter != nullptr);
  }
  cx.base = rt::Communicator::create(*cx.rv);
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&cx.stream, cudaStreamNonBlocking));
  cx.cublas = std::make_unique<rt::CublasGemm>();
  const bool root = cx.rv->rank() == 0;

  std::ofstream csv;
  if (root && !o.csv.empty()) {
    const bool fresh = !std::ifstream(o.csv).good();
    csv.open(o.csv, std::ios::app);
    if (!csv) throw Error("cannot write " + o.csv);
    if (fresh)
      csv << "M,N,K,dtype,world,variant,ms,speedup_vs_sequential,ideal_ms,gain_captured,partition,gemm_ms,comm_ms,"
             "config,gemm_before_ms,comm_before_ms"
          << (a2a ? ",routing,topk,tokens" : "") << "\n";
  }
  nlohmann::json all = nlohmann::json::array();
  if (root && !o.json)
    std::cout << "# " << cx.info.summary() << ", world " << cx.rv->world() << ", " << o.dtype << "\n";
  std::vector<std::string> skipped;  // shapes with no plan for these options (several shapes only)
  for (const auto& s : shapes) {
    ShapeResult r;
    try {
      r = rs    ? bench::bench_reducescatter(cx, o, s[0], s[1], s[2])
          : a2a ? bench::bench_alltoall(cx, o, s[0], s[1], s[2])
                : bench_allreduce(cx, o, s[0], s[1], s[2]);
    } catch (const rt::NoPlan& e) {
      // No plan for this shape with these options: the same on every rank
      // (same shape, options and agreed measurements), at the same step, so
      // every rank skips it and the others still run (any other error ends
      // the run: it may be one rank's). One shape: the error.
      if (shapes.size() == 1) throw;
      skipped.push_back(std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]));
      if (root) std::cerr << "lab-bench: " << skipped.back() << ": skipped: " << e.what() << "\n";
      continue;
    }
    if (!root) continue;
    if (!o.json) {
      std::cout << "\n" << r.m << "x" << r.n << "x" << r.k << "  GEMM " << std::fixed << std::setprecision(3) << r.gemm_ms
                << " ms, " << collective << " " << r.comm_ms << " ms, ideal max " << r.ideal_ms
                << " ms (in turns with the variants; on their own before: " << r.gemm_before_ms << ", "
                << r.comm_before_ms << "); predicted " << r.predicted_ms << " ms\n  check: " << r.checks << "\n";
      if (!r.selection.empty()) std::cout << "  tuner's finalists: " << r.selection << "\n";
      if (!r.host_us.empty()) std::cout << "  " << r.host_us << "\n";
      if (!r.trace.empty()) std::cout << "  " << r.trace << "\n";
      if (!r.power.empty()) std::cout << "  " << r.power << "\n";
      if (!rt::gain_captured(r.seq_ms, r.ideal_ms, r.seq_ms))
        std::cout << "  gain n/a: the ideal, max(GEMM, " << collective << "), is within "
                  << std::setprecision(0) << rt::kLeastIdealGain * 100 << "% of the sequential time"
                  << (cx.rv->world() == 1 ? std::string(" (one GPU: its ") + collective +
                                                " moves nothing, so there is nothing to hide; "
                                            "run on 2 or more GPUs)"
                                          : "")
                  << "\n";
      std::cout << "  " << std::left << std::setw(22) << "variant" << std::right << std::setw(9) << "ms"
                << std::setw(9) << "speedup" << std::setw(8) << "gain" << "  partition / config\n";
    }
    for (const Row& row : r.rows) {
      const double speedup = r.seq_ms / row.ms;
      const std::optional<double> gain = rt::gain_captured(r.seq_ms, r.ideal_ms, row.ms);
      std::ostringstream gain_text;  // table: "83%" or "n/a"; CSV: the share or empty
      if (gain) gain_text << std::fixed << std::setprecision(0) << *gain * 100 << "%";
      else gain_text << "n/a";
      if (!o.json)
        std::cout << "  " << std::left << std::setw(22) << row.variant << std::right << std::fixed
                  << std::setprecision(3) << std::setw(9) << row.ms << std::setw(8) << std::setprecision(3)
                  << speedup << "x" << std::setw(8) << gain_text.str() << "  " << row.partition << "  (" << row.config
                  << ")\n";
      all.push_back({{"M", r.m}, {"N", r.n}, {"K", r.k}, {"dtype", o.dtype}, {"world", cx.rv->world()},
                     {"variant", row.variant}, {"ms", row.ms}, {"speedup_vs_sequential", speedup},
                     {"ideal_ms", r.ideal_ms}, {"gain_captured", gain ? nlohmann::json(*gain) : nlohmann::json()},
                     {"partition", row.partition},
                     {"gemm_ms", r.gemm_ms}, {"comm_ms", r.comm_ms}, {"config", row.config}, {"checks", r.checks},
                     {"gemm_before_ms", r.gemm_before_ms}, {"comm_before_ms", r.comm_before_ms}});
      if (a2a) {
        all.back()["routing"] = o.routing;
        all.back()["topk"] = r.topk;
        all.back()["tokens"] = r.m;
      }
      if (!r.power.empty()) all.back()["power"] = r.power;
      if (csv) {
        csv << r.m << "," << r.n << "," << r.k << "," << o.dtype << "," << cx.rv->world() << "," << row.variant << ","
            << row.ms << "," << speedup << "," << r.ideal_ms << ",";
        if (gain) csv << *gain;  // (empty: n/a)
        csv << ",\"" << row.partition << "\","
            << r.gemm_ms << "," << r.comm_ms << ",\"" << row.config << "\"," << r.gemm_before_ms << ","
            << r.comm_before_ms;
        if (a2a) csv << ",\"" << o.routing << "\"," << r.topk << "," << r.m;
        csv << "\n";
      }
    }
    if (csv) csv.flush();
  }
  if (root && o.json) {
    const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::ostringstream date;
    date << std::put_time(std::gmtime(&now), "%Y-%m-%dT%H:%M:%SZ");
    std::cout << nlohmann::json{{"gpu", cx.info.name}, {"versions", cx.info.summary()}, {"world", cx.rv->world()},
                                {"date", date.str()}, {"rows", all}}
                     .dump(1)
              << "\n";
  }
  cx.curves.clear();
  cudaStreamDestroy(cx.stream);
  if (!skipped.empty()) {
    if (root) {
      std::cerr << "lab-bench: " << skipped.size() << " of " << shapes.size() << " shapes skipped (no plan with these options):";
      for (const auto& n : skipped) std::cerr << " " << n;
      std::cerr << "\n";
    }
    return 2;  // (as a bad argument: the options leave these shapes no plan)
  }
  return 0;
}

}  // namespace

void add_lab_bench_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "lab-bench",
      "lab: the internal variants and the measured tuner, for experiments; not the public ops — use `bench` for "
      "those");
  // (A/B switches and diagnostics, apart from what a user chooses: its own group in --help)
  static const char* kExperiments = "Experiments (A/B switches and diagnostics)";
  cmd->add_option("--op", o->op,
                  "allreduce, reducescatter (each rank ends with its rows of the summed C: --rs-layout) or "
                  "alltoall (the MoE combine: shapes TxNxK, T tokens per rank; --routing, --topk, --tokens)")
      ->capture_default_str();
  cmd->add_option("--routing", o->routing,
                  "alltoall: how tokens pick ranks: uniform, zipf:S (rank i weighted 1/(i+1)^S), one:R (every "
                  "token picks R), empty:R (none picks R: its expert gets no rows), file:PATH (a recorded routing, "
                  "flashoverlap.moe_routing JSON: its tokens and top-K)")
      ->capture_default_str();
  cmd->add_option("--topk", o->topk, "alltoall: ranks each token picks (0: min(2, world))")
      ->capture_default_str()
      ->check(integer_at_least(0));
  cmd->add_option("--tokens", o->tokens, "alltoall: tokens per rank for every shape (0: the shape's first number)")
      ->capture_default_str()
      ->check(integer_at_least(0));
  cmd->add_option("--rs-layout", o->rs_layout,
                  "reducescatter: standard (rank r gets rows [r M/W, (r+1) M/W), as ncclReduceScatter on C; "
                  "M % world == 0) or subtile (row slice r of every 128-row tile, the paper's; world divides 128); "
                  "default standard")
      ->check(CLI::IsMember({"standard", "subtile"}));
  cmd->add_option("--m", o->m, "Rows of A and C (on every rank)")->capture_default_str()->check(integer_at_least(1));
  cmd->add_option("--n", o->n, "Columns of C (rows of B)")->capture_default_str()->check(integer_at_least(1));
  cmd->add_option("--k", o->k, "Inner dimension (multiple of 8)")->capture_default_str()->check(integer_at_least(1));
  cmd->add_option("--shapes", o->shapes, "Several shapes MxNxK,MxNxK (overrides --m --n --k)");
  cmd->add_option("--dtype", o->dtype, "bf16 or fp16")->capture_default_str();
  cmd->add_option("--tile", o->tile, "auto, 128x256 or 128x128")->capture_default_str();
  cmd->add_option("--reserve-sms", o->reserve_sms,
                  "SMs left to NCCL (-1: tuned; reducescatter: 8, the public op's nccl_sms; at most 66, half of a "
                  "Hopper GPU's 132)")
      ->capture_default_str()
      ->check(integer_in(-1, 66));
  cmd->add_option("--partition", o->partition,
                  "Group sizes, e.g. 2,3,3: waves (slots layout, reducescatter) or row bands (rows layout); "
                  "default: planned")
      ->check(partition_check());
  cmd->add_option("--layout", o->layout,
                  "auto (rows and slots; owners too on 2 ranks within NVLink reach), rows (AllReduce in place on C's "
                  "row bands), slots (tile slots + post-reorder) or owners (row bands, each tile summed by one rank "
                  "in its epilogue, the final tile stored into the others' copies, no NCCL call; needs all ranks in "
                  "one NVLink domain; 2 ranks, or 3-8 with 128x256 tiles)")
      ->capture_default_str();
  cmd->add_option("--band-swizzles", o->band_swizzles,
                  "Row-band layouts (rows, owners): the band heights in tile rows the tuner tries, "
                  "e.g. 8 or 4,8,16 (default: 2,4,8; a height over the tile rows is skipped, and owners "
                  "skip one that leaves a single band; with several shapes, one left with no plan is skipped with a message and the run goes on, exit code 2 at the end; one shape: the error)")
      ->check([](const std::string& v) -> std::string {
        try {
          const std::vector<int> sw = parse_ints(v, "band swizzle");
          if (sw.empty()) return "no band heights given";
          for (int h : sw)
            if (h < 1) return "a band is at least 1 tile row, not " + std::to_string(h);
        } catch (const std::exception& e) {
          return e.what();
        }
        return "";
      });
  cmd->add_option("--decomposition", o->decomp,
                  "Chunk counts of the decomposition baseline (reducescatter: chunks of every rank's row block)")->capture_default_str()->group(kExperiments);
  cmd->add_flag("--with-rmsnorm", o->rmsnorm,
                "Also compare the fused residual+RMSNorm path (reducescatter: on this rank's rows)");
  cmd->add_flag("--owners-wide", o->owners_wide,
                "Testing (owners, 128x256 tiles on 4 stages): on 2 ranks, the path built for 3-8 (every rank's "
                "window and output by rank, the pusher warps, no TMA pushes); the same bits, its cost")->group(kExperiments);
  cmd->add_flag("--registered-output", o->registered,
                "flashoverlap runs into an output registered with the op (run_registered: with owners the peer "
                "stores its finals straight into it, no copy); the baselines' outputs are registered with NCCL "
                "(ncclCommRegister) in turn");
  cmd->add_option("--wait-timeout", o->wait_timeout_s,
                  "Seconds before a wait of the overlapped op for a group or tile fails the run with a message")
      ->capture_default_str()
      ->check(above_zero());
  cmd->add_option("--warmup", o->warmup, "Warm-up runs per variant")->capture_default_str()->check(integer_at_least(0));
  cmd->add_option("--iters", o->iters, "Timed runs per variant (median)")->capture_default_str()->check(integer_at_least(1));
  cmd->add_option("--csv", o->csv, "Append rows to this CSV file");
  cmd->add_option("--curves", o->curves,
                  "Directory of measured bandwidth curves (written by `tune --curves DIR`): curves found there for "
                  "this GPU and world size are used, missing ones are measured and saved there; default: "
                  "$FLASHOVERLAP_CURVES, else measured in each run (allreduce; reducescatter plans from the "
                  "built-in ReduceScatter curve and measures its candidates)")
      ->envname("FLASHOVERLAP_CURVES");
  cmd->add_option("--tuning-cache", o->tuning_cache,
                  "File of measured picks: each shape's pick (when the tuner was free to choose: no --layout, "
                  "--tile, --reserve-sms, --partition or --no-select; reducescatter: no --tile, "
                  "--partition or --no-select, keyed by --rs-layout and stored with its --reserve-sms) is stored "
                  "there by its tile rows, for flashoverlap::GemmAllReduce and GemmReduceScatter (their options' "
                  "tuning_cache) to look up; default: $FLASHOVERLAP_TUNING_CACHE (allreduce and reducescatter)")
      ->envname("FLASHOVERLAP_TUNING_CACHE");
  cmd->add_flag("--json", o->json, "Print JSON instead of the table");
  cmd->add_flag("--trace", o->trace,
                "Print rank 0's timeline of one overlapped call after the timed ones (and a traced warm-up): the "
                "GEMM's SM clock and cycles per tile, and when its CTAs' first and last tiles' MMAs were done, their "
                "last tiles staged, stored and pushed, and the copies done, overlapped and alone (the timed calls "
                "run untraced: the trace's events cost a call 6-15 us)");
  cmd->add_flag("!--three-stages", o->four_stages,
                "128x256 tiles: the GEMM with 3 pipeline stages (the default is 4, the output staged in pieces): "
                "owners (then pushed from shared memory) and row bands")->group(kExperiments);
  cmd->add_option("--push-tma", o->push_tma,
                  "Owners with 4 stages: the tiles sent to the peer by TMA straight from the GEMM's staging instead "
                  "of from this GPU's memory by the pusher or storer warps: none, last (each CTA's last tile: its operand loads are done), all")
      ->check(CLI::IsMember({"none", "last", "all"}))
      ->capture_default_str()->group(kExperiments);
  cmd->add_option("--owner-pushers", o->owner_pushers,
                  "Owners with 4 stages: warps 2 and 3 push the tiles from this GPU's memory, so that the storer "
                  "warp goes on with the next tile: on, off, or auto (on where k <= 4096)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str()->group(kExperiments);
  cmd->add_flag("!--owner-copy-at-end", o->owner_copy_in_gemm,
                "Owners: the copy of the peer's finals after the GEMM's tiles, not in the GEMM by its producer "
                "warps as the plan may say (A/B)")->group(kExperiments);
  cmd->add_flag("!--no-gate", o->gate,
                "Time the host's enqueue too: by default the stream is held before each timed run until the host "
                "has queued it, so that only device time is timed (not launches, tensor maps, NCCL's enqueue)")->group(kExperiments);
  cmd->add_flag("!--no-select", o->select,
                "Take the model's best plan as is, without measuring the best of each layout against each other "
                "(reducescatter: of each tile shape and the sequential plans)");
  cmd->add_option("--power", o->power_s,
                  "Seconds: after the timings, stay idle, then run the cuBLAS GEMM, our GEMM, the AllReduce, "
                  "sequential and flashoverlap (an owner pick also with the copy at the other place) back to back "
                  "this long each, and report ms per call, power, energy per "
                  "call, SM clock and power capping (NVML)")
      ->check(not_negative());
  cmd->add_option("--nproc", o->nproc, "Processes (GPUs); default: all local GPUs");
  cmd->callback([o, &rc] { rc = run(*o); });
}

}  // namespace flashoverlap::cli
