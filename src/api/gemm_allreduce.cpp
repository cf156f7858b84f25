// gemm_allreduce.cpp — flashoverlap::GemmAllReduce (flashoverlap.h): one
// op for any m <= max_m. Built once: the communicator bounded to the SMs
// left to NCCL, the scratch sized for max_m, the GEMM's time per wave
// (measured, max over ranks) and the AllReduce curves (rank 0's): what the
// model plans from, the same on every rank. A call with an m not seen
// before plans it (per m's tile rows: the plan of a bucket holds for every m
// in it) from the model, without measuring, and makes its op, which shares
// the core (streams, order of calls, scratch) with the others.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "api/allreduce_planner.h"
#include "api/communicator_impl.h"
#include "api/op_cache.h"
#include "api/op_setup.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "plan/curve_files.h"
#include "plan/latency_model.h"
#include "plan/tile_grid.h"
#include "runtime/core/call_watch.h"
#include "runtime/core/exchange.h"
#include "runtime/core/overlap_core.h"
#include "runtime/ops/allreduce.h"
#include "runtime/transport/peers.h"
#include "runtime/tune/picks.h"
#include "runtime/tune/tuner.h"

namespace flashoverlap {
namespace {

using api::bucket_of;
using api::kBm;
using api::to_kernels;

}  // namespace

struct GemmAllReduce::Impl {
  std::shared_ptr<Communicator::Impl> comm;  // (keeps the caller's communicator object alive)
  rt::Communicator bounded;                  // NCCL on nccl_sms CTAs, clusters of 1: beside the GEMM
  std::unique_ptr<rt::CallWatch> watch;      // (after the communicators it may revoke: gone before them)
  int64_t max_m = 0, n = 0, k = 0;
  DType dtype = DType::BF16;
  GemmAllReduceOptions opts;
  int rank = 0, world = 1, sms = 0;
  bool check_m = false;
  // What each m is planned from (wave times and sequential GEMMs measured,
  // rank 0's curves and picks): the model, without a GPU.
  api::AllReducePlanner planner;
  // The sequential calls' cuBLAS GEMM, one object for every m's op.
  std::unique_ptr<rt::CublasGemm> cublas;
  rt::OverlapCore core;  // (before the ops: they use it until they are destroyed)
  std::map<int32_t, rt::AllReducePlan> plans;                    // by m's bucket
  api::OpCache<rt::OverlapAllReduce> ops;  // by m (at most api::kOpsKept not captured)
  // Owners: one window for max_m (built with the op), one op per tile rows,
  // which runs every m of them (OverlapAllReduce::run_rows).
  std::unique_ptr<rt::OwnerWindow> owner_window;
  std::map<int32_t, std::unique_ptr<rt::OverlapAllReduce>> owner_ops;  // by m's bucket
  rt::OverlapAllReduce* last = nullptr;                          // the op of the last call (check())
  // register_output's buffers by slot; an owner op registers them on itself
  // (collectively, in slot order) at its first run_registered.
  struct Registered {
    void* out;
    int64_t ld;
  };
  std::vector<Registered> registered;
  std::map<const rt::OverlapAllReduce*, size_t> registered_on;  // owner op -> slots registered on it

  std::string who() const {
    return "GemmAllReduce (rank " + std::to_string(rank) + " of " + std::to_string(world) + ", max_m " +
           std::to_string(max_m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")";
  }
  // (stream: the call's; a new m cannot be planned while it is being captured: planning allocates)
  rt::OverlapAllReduce& op_for(int64_t m, cudaStream_t stream = nullptr, bool calling = false) {
    if (m < 1 || m > max_m)
      throw InvalidArgument(who() + ": m must be in [1, max_m], not " + std::to_string(m));
    if (rt::OverlapAllReduce* op = ops.find(m)) return *op;
    if (auto it = owner_ops.find(bucket_of(m)); it != owner_ops.end()) return *it->second;
    if (calling) api::refuse_planning_under_capture(stream, m, who());
    const int32_t bucket = bucket_of(m);
    auto pit = plans.find(bucket);
    if (pit == plans.end()) pit = plans.emplace(bucket, planner.plan_for(m)).first;
    const rt::AllReducePlan& p = pit->second;
    if (p.layout == rt::ArLayout::Owners && !p.sequential) return make_owner_op(bucket, p);
    rt::OverlapAllReduceOptions o;
    o.sched = plan::make_schedule(m, n, {p.sched.bm, p.sched.bn}, p.sched.ctas, p.sched.raster, p.sched.swizzle);
    o.groups = p.groups;  // (tile ranges: the same for every m of the bucket)
    if (p.sequential) {  // the faster GEMM at m (ours on its faster tile)
      o.fallback_cublas = planner.seq.cublas(m), o.cublas = cublas.get();
      if (!o.fallback_cublas) o.sched = planner.full_grid(m, planner.tiles[planner.seq.at(m).ours_tile]);
      o.groups = plan::make_groups(o.sched, {o.sched.waves()});
    }
    o.layout = p.layout, o.k = int(k), o.dtype = to_kernels(dtype), o.rank = rank;
    o.fp8 = api::fp8_of(opts.input, opts.scales);
    o.comm = p.sequential ? comm->comm.get() : bounded.get();
    o.tail_comm = comm->comm.get();  // the last group, after the GEMM: NCCL's default CTAs
    o.wait_timeout_s = opts.wait_timeout_s, o.four_stages = p.four_stages;
    o.core = &core;
    return ops.add(m, std::make_unique<rt::OverlapAllReduce>(o), [this](int64_t, rt::OverlapAllReduce& gone) {
      forget(gone);
    });
  }
  // The owner op of m's tile rows: planned for their most rows, run for any of them (run_rows).
  rt::OverlapAllReduce& make_owner_op(int32_t bucket, const rt::AllReducePlan& p) {
    rt::OverlapAllReduceOptions o;
    o.sched = plan::make_schedule(int64_t(bucket) * kBm, n, {p.sched.bm, p.sched.bn}, p.sched.ctas, p.sched.raster,
                                  p.sched.swizzle);
    o.groups = p.groups, o.layout = p.layout, o.k = int(k), o.dtype = to_kernels(dtype);
    o.rank = rank, o.comm = comm->comm.get(), o.wait_timeout_s = opts.wait_timeout_s;
    o.four_stages = p.four_stages, o.owner_copy_in_gemm = p.copy_in_gemm;
    o.core = &core, o.owner_window = owner_window.get();
    return *owner_ops.emplace(bucket, std::make_unique<rt::OverlapAllReduce>(o)).first->second;
  }
  bool is_owner_op(const rt::OverlapAllReduce& op) const {
    const auto it = owner_ops.find(bucket_of(op.schedule().m));
    return it != owner_ops.end() && it->second.get() == &op;
  }
  // An earlier call's wait that timed out (the host-mapped record, read
  // without synchronising): thrown by this call, before it enqueues anything.
  void check_earlier_calls() const {
    if (last && core.wait_error()->failed) last->check();  // (a timed-out wait's message first: it names the group)
    watch->check();
  }
  // An op about to go (ops' least recently used): if it ran the last call,
  // that call is waited for and its errors thrown now (then the op stays).
  void forget(const rt::OverlapAllReduce& gone) {
    if (&gone != last) return;
    core.wait_last_call();
    check_earlier_calls();
    last = nullptr;
  }
  void check_same_m(int64_t m, cudaStream_t stream) {
    if (check_m) api::check_same_m(comm->comm.get(), rank, m, stream, who());
  }
};

GemmAllReduce::GemmAllReduce(const Communicator& comm, int64_t max_m, int64_t n, int64_t k, DType dtype,
                             const GemmAllReduceOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  if (!comm.impl_) throw InvalidArgument("GemmAllReduce: no communicator");
  d.comm = comm.impl_;
  d.max_m = max_m, d.n = n, d.k = k, d.dtype = dtype, d.opts = options;
  d.rank = comm.rank(), d.world = comm.world();
  api::check_shape(d.who(), max_m, n, k);
  d.sms = rt::current_device_sms();
  api::check_op_options(d.who(), d.sms, options.nccl_sms, options.wait_timeout_s);
  api::check_allreduce_inputs(d.who(), options, k);
  const bool fp8 = options.input == InputType::E4M3;
  d.check_m = api::check_m_enabled(options.check_m);
  const ncclComm_t c = comm.get();

  // NCCL beside the GEMM on the SMs it leaves: its CTAs bounded, clusters of 1 (docs/design.md §5.5).
  d.bounded = comm.impl_->comm.split({0, options.nccl_sms, 1, -1});
  d.watch = api::make_call_watch(d.who(), options.wait_timeout_s,
                                 {d.bounded.get(), comm.impl_->comm.owned() ? c : nullptr});

  // This GPU's name (the curves' and the picks' key).
  const std::string gpu = api::current_gpu_name();
  // The curves: rank 0's files where it has them, else the built-in model.
  const std::string dt_name = dtype == DType::BF16 ? "bf16" : "fp16";
  auto curve = [&](int ctas) {
    std::string mine;
    if (!options.curves.empty()) {
      std::ostringstream log;
      if (auto found = plan::load_fitting_curve(plan::allreduce_curve_file(options.curves, ctas, d.world, dt_name),
                                                plan::Collective::AllReduce, gpu, d.world, log))
        mine = found->to_json().dump();
    }
    const std::string text = api::from_rank0(c, d.rank, mine, d.who() + ": the AllReduce curve");
    return std::make_unique<plan::BandwidthCurve>(
        text.empty() ? api::model_allreduce_curve(d.world, ctas)
                     : plan::BandwidthCurve::from_json(nlohmann::json::parse(text), "rank 0's curve"));
  };
  d.planner.n = n, d.planner.k = k, d.planner.world = d.world, d.planner.sms = d.sms, d.planner.dtype = dtype;
  d.planner.opts = options;
  d.planner.tiles = api::op_tiles(options.input);
  d.planner.curve_default = curve(0);
  d.planner.curve_bounded = curve(options.nccl_sms);

  // The tuning cache's picks for this machine and shape: rank 0's.
  {
    rt::PickKey shape;
    shape.gpu = gpu;
    shape.sms = d.sms, shape.world = d.world, shape.dtype = to_kernels(dtype), shape.tile_rows = 1, shape.n = n, shape.k = k;
    d.planner.picks = rt::PickCache::parse_entries(api::rank0_tuning_entries(c, d.rank, options.tuning_cache, shape, d.who()),
                                           shape);
    if (fp8) d.planner.picks.clear();  // (the cache's picks are for 16-bit inputs; rank 0's read anyway: collective)
  }

  // Our GEMM's time per wave for each tile shape (max over ranks), and
  // against cuBLAS's for the sequential calls.
  {
    d.planner.wave_ms = api::gemm_wave_ms(c, d.rank, max_m, n, k, dtype, d.sms, d.who(), options.input);
    d.cublas = std::make_unique<rt::CublasGemm>();
    d.planner.seq = api::measure_sequential_gemms(c, d.rank, max_m, n, k, dtype, d.sms, *d.cublas, d.who(),
                                                  options.input, options.scales);
  }
  // Scratch for the largest m: row-major C, or the slot layout's tiles (whole tiles).
  size_t scratch = size_t(max_m) * size_t(n) * 2;
  for (plan::TileShape t : d.planner.tiles)
    scratch = std::max(scratch, size_t(bucket_of(max_m)) * t.bm * size_t((n + t.bn - 1) / t.bn) * t.bn * 2);
  d.core.reserve(0, scratch);

  // Owners: the window for max_m, built now (collective: every rank registers it).
  if (options.path == GemmAllReduceOptions::Path::NVLink) {
    if (d.world < 2 || d.world > 8 || n % 8 != 0)
      throw InvalidArgument(d.who() + ": the owners path needs 2 to 8 ranks and n % 8 == 0");
    if (!rt::all_ranks_reachable(c))
      throw InvalidArgument(d.who() + ": the owners path needs every rank to reach the others' memory (one NVLink "
                            "domain); use RowBands or Slots here");
    d.owner_window = std::make_unique<rt::OwnerWindow>(c, d.rank, bucket_of(max_m), n, (n + 127) / 128,
                                                       d.who() + ": the owner window");
  }
}

GemmAllReduce::~GemmAllReduce() = default;
GemmAllReduce::GemmAllReduce(GemmAllReduce&&) noexcept = default;
GemmAllReduce& GemmAllReduce::operator=(GemmAllReduce&&) noexcept = default;

void GemmAllReduce::run(const void* a, const void* b, void* out, int64_t m, cudaStream_t stream, int64_t ld_out,
                        const InputScales& scales) {
  Impl& d = *impl_;
  api::check_run_args(d.who(), a, b, out, ld_out, d.n);
  api::check_input_scales(d.who(), d.opts.input, d.opts.scales, scales);
  d.check_earlier_calls();
  rt::OverlapAllReduce& op = d.op_for(m, stream, true);
  const rt::CallWatch::Scope watched(*d.watch, stream);
  d.check_same_m(m, stream);
  op.set_input_scales(scales.a, scales.b);
  if (d.is_owner_op(op))
    op.run_rows(a, b, out, ld_out == 0 ? d.n : ld_out, m, stream);
  else
    op.run(a, b, out, ld_out == 0 ? d.n : ld_out, stream);
  d.last = &op;
}

void GemmAllReduce::run_rmsnorm(const void* a, const void* b, const void* residual, const void* norm_weight, float eps,
                                void* out, void* residual_out, int64_t m, cudaStream_t stream,
                                const InputScales& scales) {
  Impl& d = *impl_;
  api::check_rmsnorm_args(d.who(), a, b, residual, norm_weight, out, eps);
  api::check_input_scales(d.who(), d.opts.input, d.opts.scales, scales);
  d.check_earlier_calls();
  rt::OverlapAllReduce& op = d.op_for(m, stream, true);
  const rt::CallWatch::Scope watched(*d.watch, stream);
  d.check_same_m(m, stream);
  op.set_input_scales(scales.a, scales.b);
  const rt::RmsNormArgs norm{residual, norm_weight, eps, residual_out};
  if (d.is_owner_op(op))
    op.run_rmsnorm_rows(a, b, norm, out, m, stream);
  else
    op.run_rmsnorm(a, b, norm, out, stream);
  d.last = &op;
}

int GemmAllReduce::register_output(void* out, int64_t ld_out) {
  Impl& d = *impl_;
  const int64_t ld = ld_out == 0 ? d.n : ld_out;
  if (!out || reinterpret_cast<uintptr_t>(out) % 16 != 0 || ld < d.n || ld % 8 != 0)
    throw InvalidArgument(d.who() + "::register_output: the output must be 16-byte aligned with ld_out 0 (n) or >= n "
                          "and a multiple of 8, not ld_out " + std::to_string(ld_out));
  d.registered.push_back({out, ld});
  return int(d.registered.size()) - 1;
}

void GemmAllReduce::run_registered(const void* a, const void* b, int slot, int64_t m, cudaStream_t stream,
                                   const InputScales& scales) {
  Impl& d = *impl_;
  if (!a || !b) throw InvalidArgument(d.who() + "::run_registered: a and b must not be null");
  api::check_input_scales(d.who(), d.opts.input, d.opts.scales, scales);
  if (slot < 0 || size_t(slot) >= d.registered.size())
    throw InvalidArgument(d.who() + "::run_registered: no output " + std::to_string(slot) + " (" +
                          std::to_string(d.registered.size()) + " registered)");
  d.check_earlier_calls();
  rt::OverlapAllReduce& op = d.op_for(m, stream, true);
  const rt::CallWatch::Scope watched(*d.watch, stream);
  d.check_same_m(m, stream);
  op.set_input_scales(scales.a, scales.b);
  const Impl::Registered& r = d.registered[size_t(slot)];
  if (!d.is_owner_op(op)) {
    op.run(a, b, r.out, r.ld, stream);
  } else {
    // (collective: every rank makes the same calls, so every rank registers here alike)
    for (size_t& done = d.registered_on[&op]; done < d.registered.size(); ++done) {
      api::refuse_planning_under_capture(stream, m, d.who());  // (registering exchanges with the peers)
      (void)op.register_output(d.registered[done].out, d.registered[done].ld);
    }
    op.run_registered(a, b, slot, stream, m);
  }
  d.last = &op;
}

void GemmAllReduce::prepare(int64_t m) {
  (void)impl_->op_for(m);
  impl_->ops.pin(m);  // (kept from now on: a graph will capture it)
}

std::string GemmAllReduce::plan(int64_t m) {
  Impl& d = *impl_;
  (void)d.op_for(m);  // (planned, its op made)
  return d.planner.describe(m, d.plans.at(bucket_of(m)));
}

void GemmAllReduce::check() const {
  if (impl_->last) impl_->last->check();
  impl_->watch->check();
}

int64_t GemmAllReduce::max_m() const { return impl_->max_m; }
int64_t GemmAllReduce::n() const { return impl_->n; }
int64_t GemmAllReduce::k() const { return impl_->k; }
DType GemmAllReduce::dtype() const { return impl_->dtype; }

}  // namespace flashoverlap
