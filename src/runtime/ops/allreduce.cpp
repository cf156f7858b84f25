// allreduce.cpp — see allreduce.h.
#include "runtime/ops/allreduce.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <sstream>

#include "flashoverlap/error.h"
#include "kernels/reorder.h"
#include "runtime/core/checks.h"
#include "runtime/transport/peer_windows.h"
#include "runtime/transport/stream_ops.h"

namespace flashoverlap::rt {

const char* layout_name(ArLayout l) {
  switch (l) {
    case ArLayout::Slots: return "slots";
    case ArLayout::RowBands: return "row bands";
    case ArLayout::Owners: return "owners";
  }
  return "?";
}

OverlapAllReduce::OverlapAllReduce(const OverlapAllReduceOptions& opts) : opts_(opts), epoch_(opts.testing.first_epoch) {
  const plan::Schedule& s = opts_.sched;
  if (!opts_.comm) throw InvalidArgument("OverlapAllReduce: no NCCL communicator");
  if (opts_.owner_pushers < -1 || opts_.owner_pushers > 1)
    throw InvalidArgument("OverlapAllReduce: owner_pushers must be -1 (by k), 0 or 1, not " +
                          std::to_string(opts_.owner_pushers));
  auto seconds_ok = [](double t) { return t > 0 && t <= kMaxTimeoutS; };  // (false for NaN and infinity)
  if (!seconds_ok(opts_.wait_timeout_s) || !seconds_ok(opts_.exchange_timeout_s))
    throw InvalidArgument("OverlapAllReduce: wait_timeout_s and exchange_timeout_s must be > 0 and <= " +
                          std::to_string(int64_t(kMaxTimeoutS)) + " seconds, not " +
                          std::to_string(opts_.wait_timeout_s) + " and " + std::to_string(opts_.exchange_timeout_s));
  if (opts_.push_tma < 0 || opts_.push_tma > 2)
    throw InvalidArgument("OverlapAllReduce: push_tma must be 0, 1 or 2, not " + std::to_string(opts_.push_tma));
  if (!kernels::op_tile_supported(s.bm, s.bn, opts_.fp8.on))
    throw InvalidArgument("OverlapAllReduce: unsupported tile " + std::to_string(s.bm) + "x" + std::to_string(s.bn) +
                          " (" + (opts_.fp8.on ? "FP8: " : "") + kernels::op_tile_names(opts_.fp8.on) + ")");
  if (opts_.fp8.on && opts_.layout == ArLayout::Owners)
    throw InvalidArgument("OverlapAllReduce: FP8 inputs do not take the owner layout");
  auto& groups = opts_.groups;
  plan::require_tile_groups(groups, s.tiles(), "OverlapAllReduce");
  // Inside a band tiles walk down its tile rows first: only whole bands are whole rows of C.
  for (size_t g = 0; g < groups.size(); ++g)
    if (is_banded(opts_.layout) && groups[g].first_tile % (s.swizzle * s.tiles_n()) != 0)
      throw InvalidArgument("OverlapAllReduce: row-band group " + std::to_string(g) + " does not start a band");
  if (is_banded(opts_.layout) && (s.raster != plan::Raster::AlongN))
    throw InvalidArgument("OverlapAllReduce: row-band groups need the AlongN raster");
  for (const auto& g : groups) target_.push_back(uint32_t(g.tiles()) * kernels::kSignalsPerTile);

  // (After the host's checks: those run on any machine.)
  if (!opts_.core) own_core_ = std::make_unique<OverlapCore>();
  core_ = opts_.core ? opts_.core : own_core_.get();
  wait_error_ = core_->wait_error();
  kernels::preload_kernels();  // before any wait is enqueued (docs/design.md §5.4)
  // Slots: the tile buffer; otherwise row-major scratch for strided outputs and
  // RMSNorm, which owners never need (their own scratch, or the window).
  if (opts_.layout == ArLayout::Slots && !sequential())
    slots_ = core_->scratch(kSlotsScratch, size_t(s.tiles()) * s.bm * s.bn * 2);
  else if (!owners() || sequential())
    slots_ = core_->scratch(kSlotsScratch, size_t(s.m) * s.n * 2);
  std::vector<uint32_t> counters = counts_after(epoch_, target_);
  counters.push_back(0);  // the fault-injection sink
  counters_ = to_device(counters);
  group_of_tile_ = to_device(plan::group_of_tiles(groups, s.tiles(), gemm_drop_group()));
  if (owners() && !sequential()) setup_owned();
  // The signalling GEMM's 4 stages (owners: setup_owned): row bands;
  // kernels::gemm_four_stages decides per launch.
  if (!sequential() && opts_.layout == ArLayout::RowBands) four_stages_ = opts_.four_stages && s.bn == 256;

  if (opts_.fallback_cublas) {
    if (!sequential()) throw InvalidArgument("OverlapAllReduce: fallback_cublas needs the sequential plan (one group)");
    if (!opts_.cublas) own_cublas_ = std::make_unique<CublasGemm>();
    cublas_ = opts_.cublas ? opts_.cublas : own_cublas_.get();
  }
  if (opts_.trace) {
    trace_.resize(2 + 2 * groups.size());
    for (auto& e : trace_) FO_CUDA_CHECK(cudaEventCreate(&e));
    // Never zeroed again: the kernel keeps the latest time of each phase (atomicMax).
    monitor_ = GemmMonitor(opts_.sched);
    tracing_ = true;
  }
  if (!opts_.core) FO_CUDA_CHECK(cudaDeviceSynchronize());  // (a shared core's ops are made between calls: no sync)
}

std::pair<int64_t, int64_t> OverlapAllReduce::group_elements(size_t g) const {
  const plan::Schedule& s = opts_.sched;
  const plan::Group& gr = opts_.groups[g];
  if (opts_.layout == ArLayout::Slots) {
    const int64_t tile = int64_t(s.bm) * s.bn;
    return {gr.first_tile * tile, int64_t(gr.tiles()) * tile};
  }
  const int64_t r0 = int64_t(gr.first_tile / s.tiles_n()) * s.bm;
  const int64_t r1 = std::min<int64_t>(int64_t(gr.end_tile / s.tiles_n()) * s.bm, s.m);
  return {r0 * s.n, (r1 - r0) * s.n};
}

std::string describe_groups(ArLayout layout, const plan::Schedule& s, const std::vector<plan::Group>& groups) {
  if (groups.size() <= 1) return "1 (sequential)";
  const bool waves = !is_banded(layout);
  std::string out = waves ? "waves " : "bands ";
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& gr = groups[g];
    const int size = waves
                         ? gr.end_wave - gr.first_wave
                         : (gr.end_tile - gr.first_tile + s.swizzle * s.tiles_n() - 1) / (s.swizzle * s.tiles_n());
    out += (g ? "," : "") + std::to_string(size);
  }
  return out;
}

std::string OverlapAllReduce::describe_groups() const {
  return rt::describe_groups(opts_.layout, opts_.sched, opts_.groups);
}

OverlapAllReduce::~OverlapAllReduce() {
  // The last call's work (a shared core's: the latest call of any op on it),
  // before this op's buffers go.
  core_->wait_last_call();
  for (auto e : trace_) cudaEventDestroy(e);
}

void OverlapAllReduce::enqueue_overlapped(const void* a, const void* b, void* c, cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  EpochBump bump(epoch_);
  const cudaStream_t comm_stream = core_->comm_stream();
  if (graph_)  // (the previous call's waits are done: the caller's stream joined them)
    FO_CUDA_CHECK(cudaMemsetAsync(counters_.get(), 0, counters_.bytes(), stream));
  // The comm stream starts no earlier than the GEMM, so its waiters never sit
  // on SMs while the caller's earlier work runs.
  core_->fork(stream);

  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, c, s.n);  // RowBands: C itself
  p.fp8 = opts_.fp8;
  if (opts_.layout == ArLayout::Slots)
    p.store = kernels::Store::SlotTiles, p.c = nullptr, p.slots = slots_, p.slot_rows = int64_t(s.tiles()) * s.bm;
  const size_t groups = opts_.groups.size();
  p.counters = counters_.as<uint32_t>(), p.group_of_tile = group_of_tile_.as<int32_t>();
  p.four_stages = opts_.four_stages;  // (where the store qualifies: kernels::gemm_four_stages)
  launch_call_gemm(p, stream, bump);  // in host order before the waits (lazy-loading hazard)

  char* base = static_cast<char*>(opts_.layout == ArLayout::Slots ? slots_ : c);
  for (size_t g = 0; g < groups; ++g) {
    const uint32_t target = counter_target(g);  // wraps; the compare is cyclic
    uint32_t* counter = counters_.as<uint32_t>() + g;
    kernels::launch_wait_counter(counter, target, timeout_ns(), wait_error_, int32_t(g), comm_stream);
    if (tracing_) FO_CUDA_CHECK(cudaEventRecord(trace_[2 + 2 * g], comm_stream));
    const auto [offset, count] = group_elements(g);
    void* data = base + offset * 2;
    const ncclComm_t comm = (g + 1 == groups && opts_.tail_comm) ? opts_.tail_comm : opts_.comm;
    FO_NCCL_CHECK_CTX(ncclAllReduce(data, data, size_t(count), nccl_type(opts_.dtype), ncclSum, comm, comm_stream),
                      "rank " + std::to_string(opts_.rank) + " group " + std::to_string(g));
    if (tracing_) FO_CUDA_CHECK(cudaEventRecord(trace_[3 + 2 * g], comm_stream));
  }
  if (tracing_) traced_ = true;  // (its events all recorded: timeline() reads them and the monitors)
  core_->join(stream);
}

void OverlapAllReduce::enqueue_sequential_allreduce(void* data, int64_t count, cudaStream_t stream) {
  const ncclComm_t comm = opts_.tail_comm ? opts_.tail_comm : opts_.comm;
  FO_NCCL_CHECK_CTX(ncclAllReduce(data, data, size_t(count), nccl_type(opts_.dtype), ncclSum, comm, stream),
                    "rank " + std::to_string(opts_.rank) + " sequential AllReduce");
}

void OverlapAllReduce::enqueue_sequential_gemm(const void* a, const void* b, void* c, cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, c, s.n);
  p.fp8 = opts_.fp8;
  run_plain_gemm(cublas_, p, stream);
}

void OverlapAllReduce::begin_call(cudaStream_t stream) {
  if (capturing(stream) && !graph_) {
    // A replay repeats the launch arguments captured: the epochs the host
    // passes per call (the owner layout's flags and window halves) would be
    // frozen.
    if (!sequential() && owners())
      throw InvalidArgument("OverlapAllReduce (rank " + std::to_string(opts_.rank) + ", " + std::to_string(opts_.sched.m) +
                            "x" + std::to_string(opts_.sched.n) + "): the " + layout_name(opts_.layout) +
                            " layout cannot be captured into a CUDA graph (its epochs are passed per call); the "
                            "sequential, slot and row-band plans can");
    if (tracing_) throw InvalidArgument("OverlapAllReduce: a traced call cannot be captured into a CUDA graph");
    graph_ = true;
  }
  core_->begin_call(stream);
}

void OverlapAllReduce::run(const void* a, const void* b, void* out, int64_t ld_out, cudaStream_t stream) {
  begin_call(stream);
  enqueue_run(a, b, out, ld_out, stream);
  end_call(stream);
}

void OverlapAllReduce::run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out,
                                   cudaStream_t stream) {
  begin_call(stream);
  enqueue_run_rmsnorm(a, b, norm, out, stream);
  end_call(stream);
}

bool OverlapAllReduce::result_in_window() const { return !sequential() && owners(); }

void OverlapAllReduce::enqueue_run(const void* a, const void* b, void* out, int64_t ld_out, cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  if (ld_out < s.n) throw InvalidArgument("OverlapAllReduce::run: ld_out < n");
  if (!out) throw InvalidArgument("OverlapAllReduce::run (rank " + std::to_string(opts_.rank) + "): null output");
  const bool direct = ld_out == s.n;
  if (!sequential() && owners()) {
    enqueue_owned(a, b, out, ld_out, nullptr, stream);
    return;
  }
  if (!sequential() && opts_.layout == ArLayout::Slots) {
    enqueue_overlapped(a, b, nullptr, stream);
    kernels::reorder_tiles_to_rows(opts_.dtype, slots_, s, out, ld_out, stream);
    return;
  }
  // Row-major C in place: the output itself when it is contiguous.
  void* c = direct ? out : slots_;
  if (!sequential()) {
    enqueue_overlapped(a, b, c, stream);
  } else {  // the GEMM, then one AllReduce of the contiguous result
    enqueue_sequential_gemm(a, b, c, stream);
    enqueue_sequential_allreduce(c, int64_t(s.m) * s.n, stream);
  }
  if (!direct)
    FO_CUDA_CHECK(cudaMemcpy2DAsync(out, ld_out * 2, c, s.n * 2, s.n * 2, s.m, cudaMemcpyDeviceToDevice, stream));
}

void check_norm_buffers(const RmsNormArgs& norm, const void* out, size_t bytes, const std::string& who) {
  if (!norm.residual || !norm.weight) throw InvalidArgument(who + ": residual and weight are required");
  if (!out) throw InvalidArgument(who + ": null output");
  auto overlap = [bytes](const void* x, const void* y) {
    const auto p = reinterpret_cast<uintptr_t>(x), q = reinterpret_cast<uintptr_t>(y);
    return x && y && p < q + bytes && q < p + bytes;
  };
  if (overlap(norm.residual, out) || overlap(norm.residual_out, out) || overlap(norm.residual_out, norm.residual))
    throw InvalidArgument(who + ": residual, residual_out and the output must not overlap (pass separate buffers)");
}

void OverlapAllReduce::check_rmsnorm_args(const RmsNormArgs& norm, const void* out, int64_t m) const {
  const plan::Schedule& s = opts_.sched;
  check_norm_buffers(norm, out, size_t(m) * s.n * 2,
                     "run_rmsnorm (rank " + std::to_string(opts_.rank) + ", " + std::to_string(m) + "x" +
                         std::to_string(s.n) + ")");
}

void OverlapAllReduce::enqueue_run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out,
                                           cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  check_rmsnorm_args(norm, out, s.m);
  if (owners() && !sequential()) {
    enqueue_owned(a, b, out, s.n, &norm, stream);
    return;
  }
  if (opts_.layout == ArLayout::Slots && !sequential()) {
    enqueue_overlapped(a, b, nullptr, stream);
    kernels::reorder_add_rmsnorm(opts_.dtype, slots_, s, norm.residual, norm.weight, norm.eps, out,
                                 norm.residual_out, stream);
    return;
  }
  // Row-major C in the scratch buffer, then the element-wise step reads it.
  if (!sequential()) {
    enqueue_overlapped(a, b, slots_, stream);
  } else {
    enqueue_sequential_gemm(a, b, slots_, stream);
    enqueue_sequential_allreduce(slots_, int64_t(s.m) * s.n, stream);
  }
  kernels::add_rmsnorm_rows(opts_.dtype, slots_, s.m, s.n, norm.residual, norm.weight, norm.eps, out,
                            norm.residual_out, stream);
}

void OverlapAllReduce::launch_call_gemm(kernels::GemmParams& p, cudaStream_t stream, EpochBump& bump) {
  if (tracing_) monitor_.attach(p);
  kernels::check_gemm_params(p);
  if (tracing_) {
    traced_ = false;
    FO_CUDA_CHECK(cudaEventRecord(trace_[0], stream));
  }
  bump.keep = true;  // (a launch that fails after this may have queued the GEMM)
  kernels::launch_gemm(p, stream);
  if (tracing_) FO_CUDA_CHECK(cudaEventRecord(trace_[1], stream));
}

void OverlapAllReduce::set_tracing(bool on) {
  if (on && trace_.empty())
    throw InvalidArgument("OverlapAllReduce::set_tracing (rank " + std::to_string(opts_.rank) +
                          "): this op was built without OverlapAllReduceOptions::trace (no trace buffers)");
  tracing_ = on;
}

Timeline OverlapAllReduce::timeline() const {
  Timeline t;
  if (trace_.empty() || sequential() || !traced_) return t;
  auto at = [&](cudaEvent_t e) {
    FO_CUDA_CHECK(cudaEventSynchronize(e));
    float ms = 0;
    FO_CUDA_CHECK(cudaEventElapsedTime(&ms, trace_[0], e));
    return double(ms);
  };
  t.gemm_end = at(trace_[1]);
  const GemmMonitor::Reading r = monitor_.read();
  t.clocks = r.clocks, t.phases = r.phases;
  if (owners()) return t;  // no communication calls: the GEMM does it
  for (size_t g = 0; g < opts_.groups.size(); ++g) {
    t.wait_end.push_back(at(trace_[2 + 2 * g]));
    t.comm_end.push_back(at(trace_[3 + 2 * g]));
  }
  return t;
}

void OverlapAllReduce::check() const {
  if (!wait_error_->failed) return;
  const kernels::WaitError e = *wait_error_;
  std::ostringstream os;
  if (e.failed == kernels::kCallCheckFailed)  // (the owner layout's call check)
    throw Error(describe_call_check(e, opts_.rank, "the overlapped GEMM+AllReduce (owners; n " +
                                                     std::to_string(opts_.sched.n) + ", k " + std::to_string(opts_.k) +
                                                     ")", "m"));
  if (owners()) {
    os << "rank " << opts_.rank << ": the tiles of group " << e.group << " of the overlapped GEMM+AllReduce ("
       << opts_.sched.m << "x" << opts_.sched.n << "x" << opts_.k << ", " << layout_name(opts_.layout)
       << " layout) did not all arrive within "
       << opts_.wait_timeout_s << " s: arrival counter " << e.value << ", expected " << e.expected;
    if (e.tile >= 0 && world_ > 2)  // the owner layout on more ranks: which tile, what of it, from whom
      os << " (tile " << e.tile << ": "
         << (e.failed == 3 ? "the other ranks' partials of a tile this rank owns"
                           : "the final of a tile rank " +
                                 std::to_string(kernels::owner_of_tile(e.tile, opts_.sched.tiles(), world_)) + " owns")
         << ")";
    else if (e.tile >= 0)  // the owner layout: which tile, and what of it
      os << " (tile " << e.tile << ": "
         << (e.failed == 3 ? "the peer's partial of a tile this rank owns" : "the peer's final of a tile it owns")
         << ")";
    os << " (a rank did not run this call, or its GEMM did not store all of the group's tiles)";
    throw Error(os.str());
  }
  os << "rank " << opts_.rank << ": group " << e.group << " of the overlapped GEMM+AllReduce ("
     << opts_.sched.m << "x" << opts_.sched.n << "x" << opts_.k << ") did not complete within "
     << opts_.wait_timeout_s << " s: counter " << e.value << ", expected " << e.expected
     << " (the GEMM did not signal all of the group's tiles)";
  throw Error(os.str());
}

}  // namespace flashoverlap::rt
