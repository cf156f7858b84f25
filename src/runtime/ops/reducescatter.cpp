// reducescatter.cpp — see reducescatter.h.
#include "runtime/ops/reducescatter.h"

#include <sstream>

#include "flashoverlap/error.h"
#include "kernels/reorder.h"
#include "runtime/core/checks.h"

namespace flashoverlap::rt {

OverlapReduceScatter::OverlapReduceScatter(const OverlapReduceScatterOptions& opts)
    : opts_(opts), epoch_(opts.testing.first_epoch) {
  const plan::Schedule& s = opts_.sched;
  const std::string who = "OverlapReduceScatter (" + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                          std::to_string(opts_.k) + ")";
  world_ = opts_.world, rank_ = opts_.rank;
  rank_and_world(opts_.comm, bool(opts_.transport), rank_, world_, who);
  if (!(opts_.wait_timeout_s > 0 && opts_.wait_timeout_s <= 7 * 24 * 3600.0))
    throw InvalidArgument(who + ": wait_timeout_s must be > 0 and at most a week");
  if (!kernels::op_tile_supported(s.bm, s.bn, opts_.fp8.on))
    throw InvalidArgument(who + ": unsupported tile " + std::to_string(s.bm) + "x" + std::to_string(s.bn) +
                          " (" + (opts_.fp8.on ? "FP8: " : "") + kernels::op_tile_names(opts_.fp8.on) + ")");
  plan::require_rs_layout(s, world_, opts_.layout);  // (m % W, or bm % W for sub-tile: its message)
  const auto& groups = opts_.groups;
  plan::require_tile_groups(groups, s.tiles(), who);
  if (opts_.fallback_cublas && !plain_sequential())
    throw InvalidArgument(who + ": fallback_cublas needs the sequential plan of the standard layout");
  if (opts_.fp8.on && opts_.nvlink && s.bn != 128)
    throw InvalidArgument(who + ": FP8 inputs take 128x128 tiles on the NVLink form (its scatter epilogue)");
  for (const auto& g : groups) target_.push_back(uint32_t(g.tiles()) * kernels::kSignalsPerTile);

  if (!opts_.core) own_core_ = std::make_unique<OverlapCore>();
  core_ = opts_.core ? opts_.core : own_core_.get();
  wait_error_ = core_->wait_error();
  kernels::preload_kernels();  // before any wait is enqueued (docs/design.md §5.4)
  if (opts_.nvlink) {
    if (opts_.layout != plan::RsLayout::Standard || s.n % 8 != 0)
      throw InvalidArgument(who + ": the NVLink form needs the standard layout and n % 8 == 0");
    out_rows_ = s.m / world_;
    row_of_ = to_device(plan::rs_peer_row_of(s, world_, rank_));
    send_bytes_ = recv_bytes_ = 256;  // (no slots)
    if (opts_.peers) {
      if (opts_.peers->half_bytes() < size_t(s.m) * size_t(s.n) * 2)
        throw InvalidArgument(who + ": the shared windows' halves are smaller than m x n");
      peers_ = opts_.peers;
    } else {
      own_peers_ =
          PeerWindows(rank_, world_, size_t(s.m) * size_t(s.n) * 2, opts_.transport ? nullptr : opts_.comm, who);
    }
  } else if (plain_sequential()) {
    out_rows_ = s.m / world_;
    send_bytes_ = size_t(s.m) * s.n * 2, recv_bytes_ = size_t(out_rows_) * s.n * 2;
    if (opts_.fallback_cublas && !opts_.cublas) own_cublas_ = std::make_unique<CublasGemm>();
    if (opts_.fallback_cublas) cublas_ = opts_.cublas ? opts_.cublas : own_cublas_.get();
  } else {
    const plan::SlotMap map = plan::make_reducescatter_map(s, groups, world_, rank_, opts_.layout);
    out_rows_ = map.out_rows, padding_rows_ = map.padding_rows, calls_ = map.groups, send_rows_ = map.send_rows;
    row_of_ = to_device(map.row_of);
    if (const std::vector<int32_t> first = plan::half_rows_of(map); !first.empty() && !opts_.testing.rows_store)
      half_row_ = to_device(first);  // half tiles by TMA
    slot_of_out_ = to_device(map.slot_of_out);
    send_bytes_ = size_t(map.send_rows) * s.bn * 2, recv_bytes_ = size_t(std::max<int64_t>(map.recv_rows, 1)) * s.bn * 2;
  }
  send_ = core_->scratch(kSendScratch, send_bytes_);
  recv_ = core_->scratch(kRecvScratch, recv_bytes_);
  std::vector<uint32_t> counters = counts_after(epoch_, target_);
  counters.push_back(0);  // the fault-injection sink
  counters_ = to_device(counters);
  group_of_tile_ = to_device(plan::group_of_tiles(groups, s.tiles(), opts_.testing.fault_drop_group));
  if (!opts_.core) FO_CUDA_CHECK(cudaDeviceSynchronize());
}

OverlapReduceScatter::~OverlapReduceScatter() { core_->wait_last_call(); }

std::vector<int32_t> OverlapReduceScatter::rows_of_rank() const {
  return plan::rs_rows_of_rank(opts_.sched, world_, rank_, opts_.layout);
}

std::string describe_rs_groups(bool nvlink, const std::vector<plan::Group>& groups) {
  if (nvlink) return "nvlink";
  if (groups.size() <= 1) return "1 (sequential)";
  std::string out = "waves ";
  for (size_t g = 0; g < groups.size(); ++g) out += (g ? "," : "") + std::to_string(groups[g].end_wave - groups[g].first_wave);
  return out;
}

std::string OverlapReduceScatter::describe_groups() const { return describe_rs_groups(opts_.nvlink, opts_.groups); }

void OverlapReduceScatter::begin_call(cudaStream_t stream) {
  const bool capture = capturing(stream);
  if (capture && opts_.nvlink)  // (refused before anything is enqueued)
    throw InvalidArgument("OverlapReduceScatter (rank " + std::to_string(rank_) +
                          "): the NVLink form cannot be captured into a CUDA graph (its counters run across calls)");
  if (capture) graph_ = true;  // (every call zeroes its counters from now on)
  core_->begin_call(stream);
  // The scratch of the core, which another op of it may have grown since.
  send_ = core_->scratch(kSendScratch, send_bytes_);
  recv_ = core_->scratch(kRecvScratch, recv_bytes_);
}

void OverlapReduceScatter::move(const RsGroupCall& c) {
  if (opts_.transport) {
    opts_.transport(c);
    return;
  }
  const bool last = c.group < 0 || size_t(c.group) + 1 == calls_.size();
  const ncclComm_t comm = last && opts_.tail_comm ? opts_.tail_comm : opts_.comm;
  FO_NCCL_CHECK_CTX(ncclReduceScatter(c.send, c.recv, c.recv_count, nccl_type(opts_.dtype), ncclSum, comm, c.stream),
                    "rank " + std::to_string(rank_) + (c.group < 0 ? " sequential ReduceScatter"
                                                                   : " group " + std::to_string(c.group)));
}

void OverlapReduceScatter::enqueue_reduced(const void* a, const void* b, void* rows, cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  if (plain_sequential()) {  // row-major C, one call: this rank's rows of it into `rows`
    // One rank's ReduceScatter is the identity: C goes straight where its rows go.
    const bool alone = world_ == 1 && !opts_.transport;
    void* c = alone ? rows : send_;
    kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, c, s.n);
    p.fp8 = opts_.fp8;
    run_plain_gemm(cublas_, p, stream);
    if (!alone) move({-1, send_, rows, size_t(out_rows_) * s.n, stream});
    return;
  }
  const bool seq = sequential();
  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, nullptr, 0);
  p.fp8 = opts_.fp8;
  p.store = kernels::Store::SlotRows, p.slots = send_, p.row_of = row_of_.as<int32_t>();
  p.half_row = half_row_.get() ? half_row_.as<int32_t>() : nullptr;
  p.slot_rows = send_rows_;
  if (!seq) p.counters = counters_.as<uint32_t>(), p.group_of_tile = group_of_tile_.as<int32_t>();
  kernels::check_gemm_params(p);
  if (!seq) {
    if (graph_)  // (the previous call's waits are done: the caller's stream joined them)
      FO_CUDA_CHECK(cudaMemsetAsync(counters_.get(), 0, counters_.bytes(), stream));
    core_->fork(stream);  // the waits start no earlier than the GEMM
  }
  ++epoch_;
  kernels::launch_gemm(p, stream);  // in host order before the waits (lazy-loading hazard)
  const cudaStream_t comm_stream = seq ? stream : core_->comm_stream();
  char* send = static_cast<char*>(send_);
  char* recv = static_cast<char*>(recv_);
  for (size_t g = 0; g < calls_.size(); ++g) {
    if (!seq)
      kernels::launch_wait_counter(counter(g), counter_target(g), timeout_ns(), wait_error_, int32_t(g), comm_stream);
    const plan::GroupCall& c = calls_[g];
    move({seq ? -1 : int32_t(g), send + c.send.offset * 2, recv + c.recv.offset * 2, size_t(c.recv.count), comm_stream});
  }
  if (!seq) core_->join(stream);
}

const void* OverlapReduceScatter::enqueue_nvlink(const void* a, const void* b, cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  if (!peers_->connected())
    throw InvalidArgument("OverlapReduceScatter (rank " + std::to_string(rank_) +
                          "): the NVLink form needs every rank's window connected");
  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, nullptr, 0);
  p.fp8 = opts_.fp8;
  p.store = kernels::Store::SlotRows, p.row_of = row_of_.as<int32_t>();
  p.scatter.world = world_, p.scatter.rows = peers_->rows(0);
  p.scatter.rows_per_rank = int32_t(s.m), p.scatter.arrivals = peers_->arrivals(opts_.testing.fault_drop_group >= 0);
  kernels::check_gemm_params(p);  // (what can be refused, before the windows' state moves)
  // Every source: m rows, 2 signals per tile (every rank has this schedule).
  const PeerWindows::Call next =
      peers_->next_call(std::vector<uint32_t>(size_t(world_), uint32_t(s.tiles()) * kernels::kSignalsPerTile),
                        std::vector<uint32_t>(size_t(world_), uint32_t(s.m)));
  const int half = next.half;
  try {
    p.scatter.rows = peers_->rows(half), p.scatter.publish = next.publish;
    kernels::launch_gemm(p, stream);
    kernels::launch_wait_counters(peers_->counters(), world_, next.targets, timeout_ns(), wait_error_, stream,
                                  next.check);
  } catch (...) {
    peers_->mark_broken();  // (the other ranks count on this call: every later one would wait in vain)
    throw;
  }
  return peers_->half(half);
}

void OverlapReduceScatter::check_out(const void* out, const char* call) const {
  if (!out)
    throw InvalidArgument(std::string("OverlapReduceScatter::") + call + " (rank " + std::to_string(rank_) +
                          "): null output");
}

void OverlapReduceScatter::run(const void* a, const void* b, void* out, int64_t ld_out, cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  check_out(out, "run");
  if (ld_out < s.n) throw InvalidArgument("OverlapReduceScatter::run: ld_out < n");
  begin_call(stream);
  if (opts_.nvlink) {  // this rank's W blocks summed in rank order
    kernels::sum_gathered_rows(opts_.dtype, enqueue_nvlink(a, b, stream), world_, out_rows_ * s.n,
                               int32_t(out_rows_), s.n, out, ld_out, stream);
    core_->end_call(stream);
    return;
  }
  // The sequential standard plan reduces straight into a contiguous output.
  const bool direct = plain_sequential() && ld_out == s.n;
  enqueue_reduced(a, b, direct ? out : recv_, stream);
  if (plain_sequential() && !direct)
    FO_CUDA_CHECK(cudaMemcpy2DAsync(out, ld_out * 2, recv_, s.n * 2, s.n * 2, out_rows_, cudaMemcpyDeviceToDevice,
                                    stream));
  else if (!plain_sequential())
    kernels::gather_slot_rows(opts_.dtype, recv_, s.bn, slot_of_out_.as<int32_t>(), s.tiles_n(), int32_t(out_rows_),
                              s.n, out, ld_out, stream);
  core_->end_call(stream);
}

void OverlapReduceScatter::run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out,
                                       cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  check_norm_buffers(norm, out, size_t(out_rows_) * s.n * 2,
                     "OverlapReduceScatter::run_rmsnorm (rank " + std::to_string(rank_) + ")");
  begin_call(stream);
  if (opts_.nvlink) {
    kernels::sum_gathered_add_rmsnorm(opts_.dtype, enqueue_nvlink(a, b, stream), world_, out_rows_ * s.n,
                                      int32_t(out_rows_), s.n, norm.residual, norm.weight, norm.eps, out,
                                      norm.residual_out, stream);
    core_->end_call(stream);
    return;
  }
  enqueue_reduced(a, b, recv_, stream);
  if (plain_sequential())
    kernels::add_rmsnorm_rows(opts_.dtype, recv_, int32_t(out_rows_), s.n, norm.residual, norm.weight, norm.eps, out,
                              norm.residual_out, stream);
  else
    kernels::gather_slot_rows_add_rmsnorm(opts_.dtype, recv_, s.bn, slot_of_out_.as<int32_t>(), s.tiles_n(),
                                          int32_t(out_rows_), s.n, norm.residual, norm.weight, norm.eps, out,
                                          norm.residual_out, stream);
  core_->end_call(stream);
}

void OverlapReduceScatter::check() const {
  if (!wait_error_->failed) return;
  const kernels::WaitError e = *wait_error_;
  std::ostringstream os;
  if (e.failed == kernels::kCallCheckFailed)
    throw Error(describe_call_check(e, rank_, "the overlapped GEMM+ReduceScatter (NVLink form; n " +
                                                  std::to_string(opts_.sched.n) + ", k " + std::to_string(opts_.k) + ")",
                                    "m"));
  if (e.group < 0) {  // (the NVLink form's wait: group -1 - source)
    os << "rank " << rank_ << ": the partial sums from rank " << (-1 - e.group)
       << " of the overlapped GEMM+ReduceScatter (NVLink form; " << opts_.sched.m << "x" << opts_.sched.n << "x"
       << opts_.k << ") did not arrive within " << opts_.wait_timeout_s << " s: arrivals " << e.value
       << ", expected " << e.expected << " (that rank's GEMM did not count all of its tiles here, or it is out of step)";
    throw Error(os.str());
  }
  os << "rank " << rank_ << ": group " << e.group << " of the overlapped GEMM+ReduceScatter (" << opts_.sched.m << "x"
     << opts_.sched.n << "x" << opts_.k << ", " << plan::to_string(opts_.layout) << " layout) did not complete within "
     << opts_.wait_timeout_s << " s: counter " << e.value << ", expected " << e.expected
     << " (the GEMM did not signal all of the group's tiles)";
  throw Error(os.str());
}

}  // namespace flashoverlap::rt
