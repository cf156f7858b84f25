// communicator.h — the NCCL communicator FlashOverlap runs on: adopted from the
// caller (not owned) or created here from the job environment (owned), with
// NCCL's CTA count bounded so that its kernels fit on the SMs the GEMM leaves
// free (docs/design.md §5.5).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

#include "process/bootstrap.h"

namespace flashoverlap::rt {

struct CommOptions {
  int min_ctas = 0;  // 0: NCCL's default
  int max_ctas = 0;  // 0: NCCL's default
  // NCCL groups its CTAs in clusters of 4 on Hopper by default. A cluster
  // needs that many free SMs in one GPC, which the few SMs a persistent GEMM
  // leaves free (scattered over GPCs) never offer: the collective would wait
  // for the GEMM to end. Communicators that overlap the GEMM use 1.
  int cga_cluster_size = 0;  // 0: NCCL's default
  // NCCL_CTA_POLICY_ZERO: AllGather / AlltoAll on symmetric-window buffers
  // run on the copy engines, no SMs at all (NCCL 2.28). -1: NCCL's default.
  int cta_policy = -1;
};

class Communicator {
 public:
  // Wraps a communicator the caller owns (e.g. PyTorch's); never destroyed here.
  static Communicator adopt(ncclComm_t comm);
  // All ranks of `rv` call this together: rank 0 makes the unique id, the
  // rendezvous shares it, each rank joins on its current CUDA device.
  static Communicator create(Rendezvous& rv, const CommOptions& opts = {});
  // Rank `rank` of `world` joining with a unique id every rank was given
  // (collective), on the current CUDA device.
  static Communicator init(const ncclUniqueId& id, int rank, int world, const CommOptions& opts = {});
  // A new communicator over the same ranks with other CTA bounds (collective).
  Communicator split(const CommOptions& opts) const;

  Communicator() = default;
  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&&) noexcept = default;

  ncclComm_t get() const { return comm_.get(); }
  int rank() const { return rank_; }
  int world() const { return world_; }
  explicit operator bool() const { return comm_ != nullptr; }
  // Made here (create, init, split), not adopted: the library may revoke it.
  bool owned() const { return comm_ && comm_.get_deleter().owned; }

 private:
  struct Deleter {
    bool owned = true;
    void operator()(ncclComm* c) const;
  };
  std::unique_ptr<ncclComm, Deleter> comm_{nullptr, Deleter{}};
  int rank_ = 0, world_ = 1;
  void init_rank_info();
};

// Stops `comm`'s collectives in flight (their kernels return) and refuses
// new ones; the handle stays valid for destruction. Throws if it fails, or
// where the NCCL loaded has no ncclCommRevoke (before 2.28.9), with that
// said. Looked up in the NCCL loaded, not the one built against.
void revoke_communicator(ncclComm_t comm);
// Whether the NCCL loaded has ncclCommRevoke.
bool can_revoke_communicators();

}  // namespace flashoverlap::rt
