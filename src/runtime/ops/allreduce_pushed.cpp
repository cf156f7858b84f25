// allreduce_pushed.cpp — the pushed layouts of OverlapAllReduce (see
// allreduce.h): setup of the symmetric window, the peers'
// addresses and the arrival counters; one call = the GEMM with its NVLink
// copies (and the sum inside it), then the sum of what it did not sum.
#include <string>
#include <vector>

#include "flashoverlap/error.h"
#include "kernels/reorder.h"
#include "runtime/core/checks.h"
#include "runtime/ops/allreduce.h"
#include "runtime/transport/peers.h"
#include "runtime/transport/stream_ops.h"

namespace flashoverlap::rt {

void OverlapAllReduce::setup_pushed() {
  const plan::Schedule& s = opts_.sched;
  const ncclComm_t comm = opts_.comm;
  bind_world(comm, "comm");
  const std::string what = "the pushed layout of " + std::to_string(s.m) + "x" + std::to_string(s.n);
  if (world_ < 2 || world_ > 8)
    throw InvalidArgument("OverlapAllReduce: " + what + " needs 2 to 8 ranks (the GEMM copies to at most 7 peers), not " +
                          std::to_string(world_));
  const bool tiles = opts_.layout == ArLayout::PushedTiles;
  if (!tiles && s.n % 8 != 0) throw InvalidArgument("OverlapAllReduce: " + what + " needs n % 8 == 0 (rows by TMA)");
  if (opts_.push_signal_every < 1 || opts_.push_signal_every > 2)
    throw InvalidArgument("OverlapAllReduce: push_signal_every must be 1 or 2, not " +
                          std::to_string(opts_.push_signal_every));
  const bool ce = copy_engines();
  if (ce && (opts_.copy_streams < 1 || opts_.copy_streams > 8))
    throw InvalidArgument("OverlapAllReduce: copy_streams must be in [1, 8], not " + std::to_string(opts_.copy_streams));
  // What a group's sum waits for: every rank's tiles counted in this GPU's
  // arrival counter (the GEMM's stores), or this GEMM's own signals (copy
  // engines; the peers' blocks have their flags).
  for (size_t g = 0; g < opts_.groups.size(); ++g)
    per_epoch_.push_back(ce ? target_[g] : uint32_t(opts_.groups[g].tiles()) * uint32_t(world_));
  setup_blocks(2);
  const size_t groups = gather_.size();
  const size_t data_bytes = size_t(2 * gathered_rows_) * gather_width_ * 2;
  const size_t counters_at = (data_bytes + 255) / 256 * 256;
  const size_t flags_at = counters_at + (groups + 1) * sizeof(uint32_t);  // +1: the fault sink
  const size_t flag_bytes = ce ? groups * size_t(world_) * sizeof(uint32_t) : 0;
  gathered_ = SymmetricBuffer(comm, flags_at + flag_bytes, what);
  arrivals_ = reinterpret_cast<uint32_t*>(static_cast<char*>(gathered_.get()) + counters_at);
  FO_CUDA_CHECK(cudaMemset(arrivals_, 0, flags_at + flag_bytes - counters_at));
  copy_to_device(arrivals_, counts_after(epoch_, per_epoch_));  // (the peers' flags below: set to the epoch)
  if (ce) peer_flags_ = reinterpret_cast<uint32_t*>(static_cast<char*>(gathered_.get()) + flags_at);
  if (ce) copy_to_device(peer_flags_, counts_after(epoch_, std::vector<uint32_t>(groups * size_t(world_), 1)));
  const std::vector<void*> at = window_peer_pointers(comm, gathered_.window(), world_);
  std::vector<uint32_t*> peer_arrivals;
  for (int r = 0; r < world_; ++r)
    if (!at[size_t(r)]) throw Error("rank " + std::to_string(opts_.rank) + ": NCCL gave no address for rank " +
                                    std::to_string(r) + "'s copy of " + what);
  for (int r = 0; r < world_; ++r)
    if (r != gather_rank_) {
      peer_arrivals.push_back(reinterpret_cast<uint32_t*>(static_cast<char*>(at[size_t(r)]) + counters_at));
      peer_base_.push_back(static_cast<char*>(at[size_t(r)]));
      peer_flag_at_.push_back(reinterpret_cast<uint32_t*>(static_cast<char*>(at[size_t(r)]) + flags_at));
    }
  if (ce) {  // load the stream memory-op entry points now, not inside a call
    stream_wait_fn();
    stream_write_fn();
  }
  push_peers_ = to_device(peer_base_);  // the kernel's void* [peers]
  peer_arrivals_ = to_device(peer_arrivals);
  kernel_sum_ok_ = int64_t(s.tiles()) * s.bm * s.bn < INT32_MAX && (!tiles || s.n % 8 == 0);
  fuse_ok_ = opts_.fuse_sum && kernel_sum_ok_;
  claims_ = DeviceBuffer(2 * groups * sizeof(uint32_t));
  FO_CUDA_CHECK(cudaMemset(claims_.get(), 0, claims_.bytes()));
  setup_barrier(comm, opts_.rank, what);  // every rank's counters are zero before any rank's first call
  if (ce) {  // last: nothing below throws before the destructor owns them
    int lo = 0, hi = 0;
    FO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    for (int i = 0; i < opts_.copy_streams; ++i) {
      cudaStream_t cs = nullptr;
      FO_CUDA_CHECK(cudaStreamCreateWithPriority(&cs, cudaStreamNonBlocking, hi));
      copy_streams_.push_back(cs);
    }
    copies_done_.resize(2 * copy_streams_.size());  // [call parity][stream]
    for (auto& ev : copies_done_) FO_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
}

const char* OverlapAllReduce::pushed_half() const {
  return static_cast<const char*>(gathered_.get()) + size_t(epoch_ & 1) * gathered_rows_ * gather_width_ * 2;
}

void OverlapAllReduce::enqueue_pushed(const void* a, const void* b, void* out, int64_t ld_out, const RmsNormArgs* norm,
                                      cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  EpochBump bump(epoch_);  // this call's (pushed_half() and the copies read it)
  const size_t groups = gather_.size();
  const bool tiles = opts_.layout == ArLayout::PushedTiles;
  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, gathered_.get(), s.n);
  if (tiles)
    p.store = kernels::Store::SlotTiles, p.c = nullptr, p.slots = gathered_.get(), p.slot_rows = 2 * gathered_rows_;
  else
    p.c_rows = 2 * gathered_rows_;
  p.row_shift = row_shift_.as<int32_t>() + size_t(epoch_ & 1) * (groups + 1);
  p.counters = counters_.as<uint32_t>(), p.group_of_tile = group_of_tile_.as<int32_t>();
  const bool ce = copy_engines();
  if (!ce) {
    p.push.peers = world_ - 1, p.push.peer_c = push_peers_.as<void*>(), p.push.arrivals = arrivals_;
    p.push.peer_arrivals = peer_arrivals_.as<uint32_t*>();
    p.push.signal_every = opts_.push_signal_every;
  } else {
    // This GEMM overwrites this rank's blocks of the half that the call
    // before last copied from: those copies first (long done, in practice).
    const size_t k = copy_streams_.size();
    for (size_t i = 0; i < k; ++i) FO_CUDA_CHECK(cudaStreamWaitEvent(stream, copies_done_[(epoch_ & 1) * k + i], 0));
    // The copy streams' waits start no earlier than this call's GEMM.
    for (cudaStream_t cs : copy_streams_) core_->fork(stream, cs);
  }
  // With RMSNorm: the sum into the output rows (contiguous), then one
  // residual + RMSNorm pass over them in place after the GEMM (rows are whole
  // only at the end for tiles; for row bands, most groups are summed during
  // the GEMM and only the norm's 3 bytes per byte of C are left after it).
  // Every group, as soon as all ranks' tiles of it are here.
  kernels::FusedSum f = fused_sum(int32_t(groups), ce ? counters_.as<uint32_t>() : arrivals_, pushed_half(), out, ld_out);
  f.tiles = tiles;
  if (ce) f.peer_ready = peer_flags_, f.rank = gather_rank_;
  const bool aligned = kernels::aligned16(out);
  const bool in_gemm = kernel_sum_ok_ && aligned && (tiles ? ld_out % 8 == 0 : ld_out == s.n);
  // Inside the GEMM, every group: chunks are claimed by the producer's idle
  // warps during the GEMM (fuse_sum) and by every consumer warp once its
  // CTA's tiles are done, so the last group's sum starts as its tiles land
  // and needs no launch after the GEMM.
  uint32_t* claims = claims_.as<uint32_t>();
  if (in_gemm) {
    p.sum = f;
    p.sum.claims = claims + size_t(epoch_ & 1) * groups;
    p.sum.producers = fuse_ok_, p.sum.consumers = true;
  }
  p.sum.claims_reset = claims + size_t((epoch_ + 1) & 1) * groups, p.sum.claims_reset_count = int32_t(groups);
  launch_call_gemm(p, stream, bump);
  if (ce) enqueue_copies();
  if (tracing_) traced_ = true;  // (its events all recorded: timeline() reads them and the monitors)
  if (!in_gemm && norm && !tiles) {  // row bands the GEMM cannot sum: sum + norm per group, fused
    for (size_t g = 0; g < groups; ++g) enqueue_gathered_post(g, out, ld_out, norm, stream);
    return;
  }
  if (!in_gemm) kernels::sum_groups(opts_.dtype, f, s, stream);  // one launch on the whole GPU
  if (norm)
    kernels::add_rmsnorm_rows(opts_.dtype, out, s.m, s.n, norm->residual, norm->weight, norm->eps, out,
                              norm->residual_out, stream);
  // (Copy engines: the caller's stream does not wait for the copy streams
  // now. Their copies read only this op's buffer, the half this call used,
  // which the call after next reuses: that call's GEMM waits for them first.
  // Into a peer's half they write only once the peer has summed the call
  // that used it: the peer's flags for the call between are needed here.
  // Their waits are stream memory ops, not bounded, but they wait only for
  // this GEMM's own tile signals, which its storer always sends; a peer that
  // never copies is caught by the sums' bounded waits.)
}

void OverlapAllReduce::enqueue_copies() {
  const size_t groups = gather_.size();
  const size_t half = size_t(pushed_half() - static_cast<const char*>(gathered_.get()));  // this call's
  const bool tiles = opts_.layout == ArLayout::PushedTiles;
  for (size_t g = 0; g < groups; ++g) {
    const GatherBlock& gb = gather_[g];
    // Groups take the copy streams in turn, so that one group's copy need
    // not wait for the one before it to finish.
    const cudaStream_t cs = copy_streams_[g % copy_streams_.size()];
    // This GEMM's tiles of g are stored (its signals, released at GPU scope).
    CUresult r = stream_wait_fn()(reinterpret_cast<CUstream>(cs),
                                  reinterpret_cast<CUdeviceptr>(counters_.as<uint32_t>() + g), epoch_ * target_[g],
                                  CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
      throw Error("rank " + std::to_string(opts_.rank) + ": cuStreamWaitValue32 failed (CUresult " +
                  std::to_string(int(r)) + ")");
    if (tracing_) FO_CUDA_CHECK(cudaEventRecord(trace_[2 + 2 * g], cs));
    const size_t offset = half + size_t(gb.block0 + int64_t(gather_rank_) * gb.pad_rows) * gather_width_ * 2;
    // Row bands: the group's rows of C (not the padding to whole tiles);
    // tile slots: every slot of the block.
    const size_t bytes = size_t(tiles ? gb.pad_rows : gb.rows) * gather_width_ * 2;
    const char* mine = static_cast<const char*>(gathered_.get()) + offset;
    for (size_t j = 0; j < peer_base_.size(); ++j) {
      FO_CUDA_CHECK_CTX(cudaMemcpyAsync(peer_base_[j] + offset, mine, bytes, cudaMemcpyDeviceToDevice, cs),
                        "rank " + std::to_string(opts_.rank) + " group " + std::to_string(g) + " copy to a peer");
      // After the copy (the write is fenced behind it): this block is there.
      // (Testing: a dropped group's flags are never written, as if the copy
      // never arrived; the peers' sums time out with the message.)
      if (int(g) == opts_.testing.fault_drop_group) continue;
      r = stream_write_fn()(reinterpret_cast<CUstream>(cs),
                            reinterpret_cast<CUdeviceptr>(peer_flag_at_[j] + g * size_t(world_) + size_t(gather_rank_)),
                            epoch_, 0);
      if (r != CUDA_SUCCESS)
        throw Error("rank " + std::to_string(opts_.rank) + ": cuStreamWriteValue32 to a peer failed (CUresult " +
                    std::to_string(int(r)) + ")");
    }
    if (tracing_) FO_CUDA_CHECK(cudaEventRecord(trace_[3 + 2 * g], cs));
  }
  const size_t k = copy_streams_.size();
  for (size_t i = 0; i < k; ++i) FO_CUDA_CHECK(cudaEventRecord(copies_done_[(epoch_ & 1) * k + i], copy_streams_[i]));
}

void OverlapAllReduce::wait_pushed_group(size_t g, cudaStream_t stream) {
  if (!copy_engines()) {  // every rank's tiles of g are counted here
    kernels::launch_wait_counter(arrivals_ + g, epoch_ * per_epoch_[g], timeout_ns(), wait_error_, int32_t(g), stream);
    return;
  }
  // (This GEMM's own tiles of g: it ran before on this stream.)
  for (int w = 0; w < world_; ++w)
    if (w != gather_rank_)
      kernels::launch_wait_counter(peer_flags_ + g * size_t(world_) + size_t(w), epoch_, timeout_ns(), wait_error_,
                                   int32_t(g), stream);
}

}  // namespace flashoverlap::rt
