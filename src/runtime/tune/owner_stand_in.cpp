// owner_stand_in.cpp — see owner_stand_in.h.
#include "runtime/tune/owner_stand_in.h"

#include <vector>

#include "kernels/check.h"
#include "kernels/cuda_check.h"

namespace flashoverlap::rt {
namespace {
DeviceBuffer zeroed(size_t bytes) {
  DeviceBuffer b(bytes);
  FO_CUDA_CHECK(cudaMemset(b.get(), 0, bytes));
  return b;
}
}  // namespace

OwnerStandIn::OwnerStandIn(kernels::GemmParams& p, int rank, int row0_half, int push_tma, uint64_t seed) {
  const plan::Schedule& s = p.sched;
  const int64_t half_rows = int64_t(s.tiles_m()) * s.bm, window_rows = 2 * half_rows;
  const size_t window_bytes = size_t(window_rows) * s.n * 2, tiles = size_t(s.tiles());
  row0_ = row0_half * half_rows;
  window_ = zeroed(window_bytes);
  kernels::fill_random(p.dtype, window_.get(), window_rows * s.n, seed, -1.f, 1.f, nullptr);
  peer_window_ = zeroed(window_bytes);
  peer_c_ = zeroed(size_t(s.m) * s.n * 2);
  const uint32_t epoch = 7;
  flags_ = DeviceBuffer(tiles * 4);
  const std::vector<uint32_t> arrived(tiles, epoch);  // the peer's partials and finals are all here
  FO_CUDA_CHECK(cudaMemcpy(flags_.get(), arrived.data(), tiles * 4, cudaMemcpyHostToDevice));
  FO_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // (its DMA landed: buffer.h, copy_to_device)
  peer_flags_ = zeroed(tiles * 4);
  claims_ = zeroed(2 * 4);
  err_ = zeroed(sizeof(kernels::WaitError));
  group_of_tile_ = zeroed(tiles * 4);
  // The call check (kernels::Owner::publish, check): this GPU's slots and
  // the peer's stand-in, every call call #1, whose descriptor from the peer
  // is here already: each call publishes and checks as on two GPUs, and passes.
  constexpr uint32_t kPlan = 0x5eedu;
  descs_ = zeroed(2 * OwnerCallSlots::kBytes);  // [this GPU's][the peer's stand-in]
  char* here = descs_.as<char>();
  char* peer = here + OwnerCallSlots::kBytes;
  calls_ = OwnerCallSlots(rank == 0 ? std::vector<char*>{here, peer} : std::vector<char*>{peer, here}, 0, rank);
  const kernels::CallDesc from_peer{1, uint32_t(s.m), kPlan, 0};  // (call #1's, parity 0, in the peer's slot here)
  FO_CUDA_CHECK(cudaMemcpy(reinterpret_cast<kernels::CallDesc*>(here) + (1 - rank), &from_peer, sizeof(from_peer),
                           cudaMemcpyHostToDevice));
  FO_CUDA_CHECK(cudaDeviceSynchronize());  // (fill_random ran on the legacy stream)

  kernels::GemmParams q = p;  // (p changes only once the result is accepted)
  q.group_of_tile = group_of_tile_.as<int32_t>();
  kernels::Owner& o = q.owner;
  o = kernels::Owner{};
  o.rank = rank, o.split = s.tiles() / 2;
  o.window = window_.get(), o.peer_window = peer_window_.get(), o.window_rows = window_rows, o.row0 = int32_t(row0_);
  o.flags = flags_.as<uint32_t>(), o.peer_flags = peer_flags_.as<uint32_t>(), o.epoch = epoch;
  o.timeout_ns = 10'000'000'000ull, o.err = err_.as<kernels::WaitError>();
  o.pushers = kernels::owner_pushers_by_k(q.k);  // as the runtime's default
  calls_.prepare(o, uint32_t(s.m), kPlan);  // (never advanced: every call is call #1)
  if (kernels::gemm_four_stages(q)) {  // as run_registered: the finals straight into each other's C
    o.push_tma = push_tma, o.push_window = peer_window_.get();
    o.finals_in_c = true, o.peer_out = peer_c_.get(), o.peer_ld = s.n;
    finals_in_c_ = true;
  }
  prepare_call(q, 0);
  kernels::check_gemm_params(q);
  p = q;
}

void OwnerStandIn::prepare_call(kernels::GemmParams& p, uint32_t call) const {
  uint32_t* claims = claims_.as<uint32_t>();
  p.owner.claims = claims + (call & 1);
  p.owner.claims_reset = claims + ((call + 1) & 1);
}

}  // namespace flashoverlap::rt
