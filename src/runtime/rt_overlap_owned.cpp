// rt_overlap_owned.cpp — the pushed row-band layout with owners
// (PushBy::Owners and OwnersCopyEngines, 2 ranks; see rt_overlap_allreduce.h
// and kernels::Owner): setup of the symmetric window and the flags; one call
// = the GEMM, which sums and stores every tile itself and either sends it
// too or counts it for the copy streams (then RMSNorm).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashoverlap/error.h"
#include "kernels/reorder.h"
#include "runtime/rt_checks.h"
#include "runtime/rt_overlap_allreduce.h"
#include "runtime/rt_peer.h"
#include "runtime/rt_stream_ops.h"

namespace flashoverlap::rt {

void OverlapAllReduce::setup_owned() {
  const plan::Schedule& s = opts_.sched;
  const ncclComm_t comm = opts_.comm;
  bind_world(comm, "comm");
  const std::string what = "the pushed layout with owners of " + std::to_string(s.m) + "x" + std::to_string(s.n);
  if (world_ != 2) throw InvalidArgument("OverlapAllReduce: " + what + " needs 2 ranks, not " + std::to_string(world_));
  if (opts_.layout != ArLayout::Pushed)
    throw InvalidArgument("OverlapAllReduce: owners reduce row bands (the pushed layout), not " +
                          std::string(layout_name(opts_.layout)));
  if (s.n % 8 != 0) throw InvalidArgument("OverlapAllReduce: " + what + " needs n % 8 == 0 (rows by TMA)");
  // Every CTA resident at once: a CTA's storer and copy warps wait for tiles
  // that other CTAs (here and on the peer) compute.
  const int sms = current_device_sms();
  if (s.ctas > sms)
    throw InvalidArgument("OverlapAllReduce: " + what + " needs at most one CTA per SM (" + std::to_string(s.ctas) +
                          " CTAs, " + std::to_string(sms) + " SMs)");
  // Two halves (call parity) of tiles_m * bm rows, whole tiles: the peer's
  // stores are not clipped to m. Then the flags, one per tile (the finals;
  // without the copy engines also the partials), then one per group (the
  // partials moved by the copy engines).
  const int64_t half_rows = int64_t(s.tiles_m()) * s.bm;
  const size_t flags_at = (size_t(2 * half_rows) * s.n * 2 + 255) / 256 * 256;
  const size_t flag_count = size_t(s.tiles()) + opts_.groups.size();
  gathered_ = SymmetricBuffer(comm, flags_at + flag_count * sizeof(uint32_t), what);
  gathered_rows_ = half_rows, gather_width_ = s.n;
  owner_flags_ = reinterpret_cast<uint32_t*>(static_cast<char*>(gathered_.get()) + flags_at);
  FO_CUDA_CHECK(cudaMemset(owner_flags_, 0, flag_count * sizeof(uint32_t)));
  const std::vector<void*> at = window_peer_pointers(comm, gathered_.window(), world_);
  char* peer = static_cast<char*>(at[size_t(1 - gather_rank_)]);
  if (!peer) throw Error("rank " + std::to_string(opts_.rank) + ": NCCL gave no address for the peer's copy of " + what);
  peer_base_ = {peer};
  owner_peer_flags_ = reinterpret_cast<uint32_t*>(peer + flags_at);
  push_peers_ = DeviceBuffer(sizeof(void*));
  FO_CUDA_CHECK(cudaMemcpy(push_peers_.get(), &peer, sizeof(void*), cudaMemcpyHostToDevice));
  owner_split_ = s.tiles() / 2;
  const bool ce = owner_ce();
  if (ce) {
    // The copy streams move whole groups of partials: each group lies on one side of
    // the split (the group start nearest the middle), and is whole tile rows
    // (groups start bands; a band is `swizzle` tile rows of the AlongN raster).
    const auto& groups = opts_.groups;
    owner_split_ = groups[1].first_tile;
    for (size_t g = 2; g < groups.size(); ++g)
      if (std::abs(2 * int64_t(groups[g].first_tile) - s.tiles()) < std::abs(2 * int64_t(owner_split_) - s.tiles()))
        owner_split_ = groups[g].first_tile;
    const int64_t band = int64_t(s.swizzle) * s.tiles_n();
    for (const auto& g : groups) {
      const int64_t r0 = g.first_tile / band * s.swizzle;
      const int64_t r1 = g.end_tile == s.tiles() ? s.tiles_m() : g.end_tile / band * s.swizzle;
      owner_rows_.push_back({r0 * s.bm, r1 * s.bm});
    }
    if (opts_.copy_streams < 1 || opts_.copy_streams > 8)
      throw InvalidArgument("OverlapAllReduce: copy_streams must be in [1, 8], not " + std::to_string(opts_.copy_streams));
    stream_wait_fn();  // load the stream memory-op entry points now, not inside a call
    stream_write_fn();
  }
  fuse_ok_ = opts_.fuse_sum;  // (here: the producer's warps copy during the GEMM)
  claims_ = DeviceBuffer(2 * sizeof(uint32_t));  // [call parity]
  FO_CUDA_CHECK(cudaMemset(claims_.get(), 0, claims_.bytes()));
  setup_barrier(comm, opts_.rank, what);  // every rank's flags are zero before any rank's first call
  if (ce) {  // last: nothing below throws before the destructor owns them
    int lo = 0, hi = 0;
    FO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    for (int i = 0; i < opts_.copy_streams; ++i) {
      cudaStream_t cs = nullptr;
      FO_CUDA_CHECK(cudaStreamCreateWithPriority(&cs, cudaStreamNonBlocking, hi));
      copy_streams_.push_back(cs);
    }
    copies_done_.resize(copy_streams_.size());
    for (auto& ev : copies_done_) FO_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
}

void OverlapAllReduce::enqueue_owner_copies(uint32_t epoch) {
  const plan::Schedule& s = opts_.sched;
  const auto& groups = opts_.groups;
  const size_t row_bytes = size_t(s.n) * 2, k = copy_streams_.size();
  const size_t half = size_t(epoch & 1) * size_t(gathered_rows_) * row_bytes;  // this call's half of the windows
  char* mine = static_cast<char*>(gathered_.get()) + half;
  char* peer = peer_base_[0] + half;
  auto owns = [&](size_t g) { return (gather_rank_ == 0) == (groups[g].first_tile >= owner_split_); };
  // The partials: the groups this rank does not own, in the order its GEMM finishes them.
  std::vector<size_t> order;
  for (size_t g = 0; g < groups.size(); ++g)
    if (!owns(g)) order.push_back(g);
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t g = order[i];
    const cudaStream_t cs = copy_streams_[i % k];  // in turns: one group's copy need not wait for the last
    // This GEMM's tiles of g are stored (one count per tile, released at GPU scope).
    CUresult r = stream_wait_fn()(reinterpret_cast<CUstream>(cs), reinterpret_cast<CUdeviceptr>(counters_.as<uint32_t>() + g),
                                  epoch * uint32_t(groups[g].tiles()), CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
      throw Error("rank " + std::to_string(opts_.rank) + ": cuStreamWaitValue32 failed (CUresult " +
                  std::to_string(int(r)) + ")");
    const auto [r0, r1] = owner_rows_[g];
    // The partial, whole tiles, from this GPU's window into the peer's.
    FO_CUDA_CHECK_CTX(cudaMemcpyAsync(peer + size_t(r0) * row_bytes, mine + size_t(r0) * row_bytes,
                                      size_t(r1 - r0) * row_bytes, cudaMemcpyDeviceToDevice, cs),
                      "rank " + std::to_string(opts_.rank) + " group " + std::to_string(g) + " copy to the peer");
    // After the copy (the write is fenced behind it): the group is there.
    // (Testing: a dropped group's flag is never written; the peer's waits time out.)
    if (int(g) != opts_.fault_drop_group) {
      r = stream_write_fn()(reinterpret_cast<CUstream>(cs),
                            reinterpret_cast<CUdeviceptr>(owner_peer_flags_ + s.tiles() + g), epoch, 0);
      if (r != CUDA_SUCCESS)
        throw Error("rank " + std::to_string(opts_.rank) + ": cuStreamWriteValue32 to the peer failed (CUresult " +
                    std::to_string(int(r)) + ")");
    }
  }
  for (size_t i = 0; i < k; ++i) FO_CUDA_CHECK(cudaEventRecord(copies_done_[i], copy_streams_[i]));
}

void OverlapAllReduce::enqueue_owned(const void* a, const void* b, void* out, int64_t ld_out, const RmsNormArgs* norm,
                                     cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  // The GEMM stores C by TMA: 16-byte aligned rows. Other outputs get a
  // copy from this op's scratch (allocated at the first such call).
  const bool direct = (reinterpret_cast<uintptr_t>(out) & 15) == 0 && ld_out % 8 == 0;
  if (!direct && !owned_scratch_.get()) owned_scratch_ = DeviceBuffer(size_t(s.m) * s.n * 2);
  // This call's epoch, kept only once the GEMM is launched: a call that
  // throws before (allocation, parameter checks) leaves the flags' count as it was.
  const uint32_t epoch = epoch_ + 1;
  void* c = direct ? out : owned_scratch_.get();
  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, c, direct ? ld_out : s.n);
  p.group_of_tile = group_of_tile_.as<int32_t>();
  p.push.peers = 1, p.push.peer_c = push_peers_.as<void*>();
  kernels::Owner& o = p.owner;
  o.rank = gather_rank_, o.split = owner_split_;
  o.window = gathered_.get(), o.window_rows = 2 * gathered_rows_, o.row0 = int32_t((epoch & 1) * gathered_rows_);
  o.flags = owner_flags_, o.peer_flags = owner_peer_flags_, o.epoch = epoch;
  o.drop_group = opts_.fault_drop_group;
  const bool ce = owner_ce();
  if (ce) o.units = counters_.as<uint32_t>(), o.part_flags = owner_flags_ + s.tiles();
  uint32_t* claims = claims_.as<uint32_t>();
  o.claims = claims + (epoch & 1);
  o.producers = fuse_ok_;
  o.timeout_ns = timeout_ns(), o.err = wait_error_;
  // Block 0 zeroes the next call's claims (this call's were zeroed by the last).
  p.sum.claims_reset = claims + ((epoch + 1) & 1), p.sum.claims_reset_count = 1;
  if (opts_.trace) p.monitor_mma = tile_monitor_.as<uint64_t>(), p.monitor_phases = phase_monitor_.as<uint64_t>();
  if (ce) {  // the copy streams' waits start no earlier than this GEMM
    FO_CUDA_CHECK(cudaEventRecord(gemm_launched_, stream));
    for (cudaStream_t cs : copy_streams_) FO_CUDA_CHECK(cudaStreamWaitEvent(cs, gemm_launched_, 0));
  }
  if (opts_.trace) FO_CUDA_CHECK(cudaEventRecord(trace_[0], stream));
  kernels::launch_gemm(p, stream);
  epoch_ = epoch;
  if (opts_.trace) FO_CUDA_CHECK(cudaEventRecord(trace_[1], stream));
  if (ce) {
    // The copies read this call's half of the window, which the call after
    // next overwrites: this call ends after them (long before its GEMM, in practice).
    enqueue_owner_copies(epoch);
    for (cudaEvent_t e : copies_done_) FO_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
  }
  if (!direct)
    FO_CUDA_CHECK(cudaMemcpy2DAsync(out, size_t(ld_out) * 2, c, size_t(s.n) * 2, size_t(s.n) * 2, size_t(s.m),
                                    cudaMemcpyDeviceToDevice, stream));
  if (norm)
    kernels::add_rmsnorm_rows(opts_.dtype, out, s.m, s.n, norm->residual, norm->weight, norm->eps, out,
                              norm->residual_out, stream);
}

}  // namespace flashoverlap::rt
