// peers.h — where the other ranks' copies of a symmetric NCCL window are
// mapped in this process (NCCL 2.28's load/store-accessible "LSA" team:
// ranks whose memory this GPU reaches with plain loads and stores, over
// NVLink), for kernels that store into them directly.
#pragma once
#include <nccl.h>

#include <string>
#include <vector>

namespace flashoverlap::rt {

// For each rank r of `comm` (world ranks), the address of byte 0 of rank r's
// copy of `win` (r = this rank: its own buffer). Throws InvalidArgument when
// some rank is not load/store accessible from this GPU, or when this build of
// NCCL has no device API.
std::vector<void*> window_peer_pointers(ncclComm_t comm, ncclWindow_t win, int world);

// Whether every rank of `comm` is load/store accessible from this GPU with
// native atomics (what the NVLink paths need): NCCL's load/store team is
// the whole communicator and, where other GPUs are visible to this process,
// each of them supports native P2P atomics with this one (NVLink). With a
// single visible GPU per process only NCCL's answer is available. False
// without NCCL's device API, and where p2p_disabled(). Per rank: combine
// the ranks' answers.
bool all_ranks_reachable(ncclComm_t comm);

// NCCL_P2P_DISABLE is set nonzero: the user keeps the GPUs from each
// other's memory (NCCL then moves data through the host, as on PCIe
// machines without P2P), so our NVLink paths are left out too.
bool p2p_disabled();

// After setting up counters in a window that peers write into: this GPU's
// work is done (device sync), then every rank of `comm` meets in a
// one-element AllReduce, so no rank's first call counts into a peer's
// counters before the peer has zeroed them. Throws naming `rank` and `what`.
void setup_barrier(ncclComm_t comm, int rank, const std::string& what);

}  // namespace flashoverlap::rt
