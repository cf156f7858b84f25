// rt_overlap_pushed.cpp — the pushed layouts of OverlapAllReduce (see
// rt_overlap_allreduce.h): setup of the symmetric window, the peers'
// addresses and the arrival counters; one call = the GEMM with its NVLink
// copies (and the sum inside it), then the sum of what it did not sum.
#include <string>
#include <vector>

#include "flashoverlap/error.h"
#include "kernels/reorder.h"
#include "runtime/rt_checks.h"
#include "runtime/rt_overlap_allreduce.h"
#include "runtime/rt_peer.h"

namespace flashoverlap::rt {

void OverlapAllReduce::setup_pushed() {
  const plan::Schedule& s = opts_.sched;
  const ncclComm_t comm = opts_.comm;
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world_), "comm");
  FO_NCCL_CHECK_CTX(ncclCommUserRank(comm, &gather_rank_), "comm");
  const std::string what = "the pushed layout of " + std::to_string(s.m) + "x" + std::to_string(s.n);
  if (world_ < 2 || world_ > 8)
    throw InvalidArgument("OverlapAllReduce: " + what + " needs 2 to 8 ranks (the GEMM copies to at most 7 peers), not " +
                          std::to_string(world_));
  const bool tiles = opts_.layout == ArLayout::PushedTiles;
  if (!tiles && s.n % 8 != 0) throw InvalidArgument("OverlapAllReduce: " + what + " needs n % 8 == 0 (rows by TMA)");
  if (opts_.push_signal_every < 1 || opts_.push_signal_every > 2)
    throw InvalidArgument("OverlapAllReduce: push_signal_every must be 1 or 2, not " +
                          std::to_string(opts_.push_signal_every));
  for (const plan::Group& g : opts_.groups) per_epoch_.push_back(uint32_t(g.tiles()) * uint32_t(world_));
  setup_blocks(2);
  const size_t groups = gather_.size();
  const size_t data_bytes = size_t(2 * gathered_rows_) * gather_width_ * 2;
  const size_t counters_at = (data_bytes + 255) / 256 * 256;
  gathered_ = SymmetricBuffer(comm, counters_at + (groups + 1) * sizeof(uint32_t), what);  // +1: the fault sink
  arrivals_ = reinterpret_cast<uint32_t*>(static_cast<char*>(gathered_.get()) + counters_at);
  FO_CUDA_CHECK(cudaMemset(arrivals_, 0, (groups + 1) * sizeof(uint32_t)));
  const std::vector<void*> at = window_peer_pointers(comm, gathered_.window(), world_);
  std::vector<void*> peer_bases;
  std::vector<uint32_t*> peer_arrivals;
  for (int r = 0; r < world_; ++r)
    if (!at[size_t(r)]) throw Error("rank " + std::to_string(opts_.rank) + ": NCCL gave no address for rank " +
                                    std::to_string(r) + "'s copy of " + what);
  for (int r = 0; r < world_; ++r)
    if (r != gather_rank_) {
      peer_bases.push_back(at[size_t(r)]);
      peer_arrivals.push_back(reinterpret_cast<uint32_t*>(static_cast<char*>(at[size_t(r)]) + counters_at));
    }
  push_peers_ = DeviceBuffer(peer_bases.size() * sizeof(void*));
  FO_CUDA_CHECK(cudaMemcpy(push_peers_.get(), peer_bases.data(), push_peers_.bytes(), cudaMemcpyHostToDevice));
  peer_arrivals_ = DeviceBuffer(peer_arrivals.size() * sizeof(uint32_t*));
  FO_CUDA_CHECK(cudaMemcpy(peer_arrivals_.get(), peer_arrivals.data(), peer_arrivals_.bytes(), cudaMemcpyHostToDevice));
  kernel_sum_ok_ = int64_t(s.tiles()) * s.bm * s.bn < INT32_MAX && (!tiles || s.n % 8 == 0);
  fuse_ok_ = opts_.fuse_sum && kernel_sum_ok_;
  claims_ = DeviceBuffer(2 * groups * sizeof(uint32_t));
  FO_CUDA_CHECK(cudaMemset(claims_.get(), 0, claims_.bytes()));
  // Every rank's counters are zero before any rank's first call counts into them.
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t st = nullptr;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DeviceBuffer token(sizeof(float));
  const ncclResult_t r = ncclAllReduce(token.get(), token.get(), 1, ncclFloat, ncclSum, comm, st);
  const cudaError_t e = r == ncclSuccess ? cudaStreamSynchronize(st) : cudaSuccess;
  cudaStreamDestroy(st);
  FO_NCCL_CHECK_CTX(r, "rank " + std::to_string(opts_.rank) + ": barrier after setting up " + what);
  FO_CUDA_CHECK(e);
}

const char* OverlapAllReduce::pushed_half() const {
  return static_cast<const char*>(gathered_.get()) + size_t(epoch_ & 1) * gathered_rows_ * gather_width_ * 2;
}

void OverlapAllReduce::enqueue_pushed(const void* a, const void* b, void* out, int64_t ld_out, const RmsNormArgs* norm,
                                      cudaStream_t stream) {
  const plan::Schedule& s = opts_.sched;
  ++epoch_;
  const size_t groups = gather_.size();
  const bool tiles = opts_.layout == ArLayout::PushedTiles;
  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, gathered_.get(), s.n);
  if (tiles)
    p.store = kernels::Store::SlotTiles, p.c = nullptr, p.slots = gathered_.get(), p.slot_rows = 2 * gathered_rows_;
  else
    p.c_rows = 2 * gathered_rows_;
  p.row_shift = row_shift_.as<int32_t>() + size_t(epoch_ & 1) * (groups + 1);
  p.counters = counters_.as<uint32_t>(), p.group_of_tile = group_of_tile_.as<int32_t>();
  p.push.peers = world_ - 1, p.push.peer_c = push_peers_.as<void*>(), p.push.arrivals = arrivals_;
  p.push.peer_arrivals = peer_arrivals_.as<uint32_t*>();
  p.push.signal_every = opts_.push_signal_every;
  // With RMSNorm: the sum into the output rows (contiguous), then one
  // residual + RMSNorm pass over them in place after the GEMM (rows are whole
  // only at the end for tiles; for row bands, most groups are summed during
  // the GEMM and only the norm's 3 bytes per byte of C are left after it).
  // Every group, as soon as all ranks' tiles of it are here.
  kernels::FusedSum f = fused_sum(int32_t(groups), arrivals_, pushed_half(), out, ld_out);
  f.tiles = tiles;
  const bool aligned = (reinterpret_cast<uintptr_t>(out) & 15) == 0;
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
  if (opts_.trace) FO_CUDA_CHECK(cudaEventRecord(trace_[0], stream));
  kernels::launch_gemm(p, stream);
  if (opts_.trace) FO_CUDA_CHECK(cudaEventRecord(trace_[1], stream));
  if (!in_gemm && norm && !tiles) {  // row bands the GEMM cannot sum: sum + norm per group, fused
    for (size_t g = 0; g < groups; ++g) enqueue_gathered_post(g, out, ld_out, norm, stream);
    return;
  }
  if (!in_gemm) kernels::sum_groups(opts_.dtype, f, s, stream);  // one launch on the whole GPU
  if (norm)
    kernels::add_rmsnorm_rows(opts_.dtype, out, s.m, s.n, norm->residual, norm->weight, norm->eps, out,
                              norm->residual_out, stream);
}

}  // namespace flashoverlap::rt
