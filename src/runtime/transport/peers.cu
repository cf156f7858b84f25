// peers.cu — see peers.h.
#include "runtime/transport/peers.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "flashoverlap/error.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"

#if __has_include(<nccl_device.h>)
#include <nccl_device.h>
#define FO_HAVE_NCCL_DEVICE 1
#endif

namespace flashoverlap::rt {

bool p2p_disabled() {
  const char* v = std::getenv("NCCL_P2P_DISABLE");
  return v && std::atoi(v) != 0;  // (read as NCCL reads it: a number, nonzero disables)
}

#ifdef FO_HAVE_NCCL_DEVICE
namespace {
// The window handle is NCCL's device-side description of the mapping.
__global__ void peer_pointers_kernel(ncclWindow_t win, int world, void** out) {
  for (int r = threadIdx.x; r < world; r += blockDim.x) out[r] = ncclGetPeerPointer(win, 0, r);
}
}  // namespace

bool all_ranks_reachable(ncclComm_t comm) {
  if (p2p_disabled()) return false;
  int world = 0;
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world), "all_ranks_reachable");
  if (ncclTeamLsa(comm).nRanks != world) return false;
  // NCCL's load/store team also admits PCIe P2P peers, where system-scope
  // atomics on peer memory are not native: with other GPUs visible, ask for
  // native atomics with each of them (conservative: any visible GPU counts).
  int dev = 0, devices = 0;
  FO_CUDA_CHECK(cudaGetDevice(&dev));
  FO_CUDA_CHECK(cudaGetDeviceCount(&devices));
  for (int d = 0; d < devices; ++d) {
    if (d == dev) continue;
    int atomics = 0;
    FO_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, dev, d));
    if (!atomics) return false;
  }
  return true;
}

std::vector<void*> window_peer_pointers(ncclComm_t comm, ncclWindow_t win, int world) {
  const ncclTeam_t lsa = ncclTeamLsa(comm);
  if (lsa.nRanks != world)
    throw InvalidArgument("the NVLink paths need every rank's memory mapped on this GPU: " +
                          std::to_string(lsa.nRanks) + " of " + std::to_string(world) + " ranks are");
  DeviceBuffer ptrs(size_t(world) * sizeof(void*));
  peer_pointers_kernel<<<1, 32>>>(win, world, ptrs.as<void*>());
  FO_CUDA_CHECK(cudaGetLastError());
  std::vector<void*> out(static_cast<size_t>(world));
  FO_CUDA_CHECK(cudaMemcpy(out.data(), ptrs.get(), ptrs.bytes(), cudaMemcpyDeviceToHost));
  return out;
}
#else
bool all_ranks_reachable(ncclComm_t) { return false; }
std::vector<void*> window_peer_pointers(ncclComm_t, ncclWindow_t, int) {
  throw InvalidArgument("the NVLink paths need NCCL's device API (nccl_device.h, NCCL >= 2.28)");
}
#endif

void setup_barrier(ncclComm_t comm, int rank, const std::string& what) {
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t st = nullptr;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DeviceBuffer token(sizeof(float));
  const ncclResult_t r = ncclAllReduce(token.get(), token.get(), 1, ncclFloat, ncclSum, comm, st);
  const cudaError_t e = r == ncclSuccess ? cudaStreamSynchronize(st) : cudaSuccess;
  cudaStreamDestroy(st);
  FO_NCCL_CHECK_CTX(r, "rank " + std::to_string(rank) + ": barrier after setting up " + what);
  FO_CUDA_CHECK(e);
}

}  // namespace flashoverlap::rt
