// owner_stand_in.h — the owner layout's kernel (kernels::Owner) of one
// rank run on one GPU, its peer's buffers local stand-ins, for measuring
// what the layout costs the GEMM itself (bench-gemm --modes owners) and for
// testing where its tiles land without a second GPU.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"
#include "runtime/core/buffer.h"
#include "runtime/ops/allreduce.h"

namespace flashoverlap::rt {

// Sets up `p` (a Plain GEMM, C 16-byte aligned, n % 8 == 0; with 128x256
// tiles on 4 stages as run_registered runs it, else as run does)
// as rank `rank` of the AllReduce with owners: its window holds the
// peer's partials (random, for this call's half `row0_half` of the window)
// and every flag is set, as if the peer had pushed all of them; what it pushes
// lands in this GPU's stand-ins of the peer's window and (4 stages, finals
// into the peer's C) the peer's C, and is counted in the stand-in's flags.
// The call check runs too, the peer's descriptor of every call here already.
// push_tma: kernels::Owner::push_tma (4 stages only, else 0); pushers as
// the runtime's default (kernels::owner_pushers_by_k). Throws
// InvalidArgument where check_gemm_params refuses the result (p unchanged).
class OwnerStandIn {
 public:
  OwnerStandIn(kernels::GemmParams& p, int rank, int row0_half, int push_tma, uint64_t seed);
  // Each call's claims (zero at launch): call n uses slot n & 1 and zeroes the other.
  void prepare_call(kernels::GemmParams& p, uint32_t call) const;

  const DeviceBuffer& window() const { return window_; }            // [2 * half rows x n]
  const DeviceBuffer& peer_window() const { return peer_window_; }  // the same shape
  const DeviceBuffer& peer_c() const { return peer_c_; }            // [m x n], finals_in_c only
  const DeviceBuffer& peer_flags() const { return peer_flags_; }    // [tiles]
  const DeviceBuffer& error() const { return err_; }                // kernels::WaitError
  int64_t row0() const { return row0_; }
  bool finals_in_c() const { return finals_in_c_; }

 private:
  DeviceBuffer window_, peer_window_, peer_c_, flags_, peer_flags_, claims_, err_, group_of_tile_, descs_;
  OwnerCallSlots calls_;  // the call check's slots: this GPU's and the peer's stand-in
  int64_t row0_ = 0;
  bool finals_in_c_ = false;
};

}  // namespace flashoverlap::rt
