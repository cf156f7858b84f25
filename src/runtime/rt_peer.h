// rt_peer.h — where the other ranks' copies of a symmetric NCCL window are
// mapped in this process (NCCL 2.28's load/store-accessible "LSA" team:
// ranks whose memory this GPU reaches with plain loads and stores, over
// NVLink), for kernels that store into them directly.
#pragma once
#include <nccl.h>

#include <vector>

namespace flashoverlap::rt {

// For each rank r of `comm` (world ranks), the address of byte 0 of rank r's
// copy of `win` (r = this rank: its own buffer). Throws InvalidArgument when
// some rank is not load/store accessible from this GPU, or when this build of
// NCCL has no device API.
std::vector<void*> window_peer_pointers(ncclComm_t comm, ncclWindow_t win, int world);

// Whether every rank of `comm` is load/store accessible from this GPU (what
// the pushed layout needs); false without NCCL's device API.
bool all_ranks_reachable(ncclComm_t comm);

}  // namespace flashoverlap::rt
