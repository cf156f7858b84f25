// exchange.cpp — see exchange.h.
#include "runtime/core/exchange.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <sstream>
#include <thread>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"

namespace flashoverlap::rt {

std::vector<uint8_t> gather_bytes(ncclComm_t comm, int rank, const void* mine, size_t bytes, const std::string& what,
                                  std::chrono::milliseconds timeout) {
  const std::string ctx = "rank " + std::to_string(rank) + ": " + what;
  int world = 0, me = 0;
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world), ctx);
  FO_NCCL_CHECK_CTX(ncclCommUserRank(comm, &me), ctx);  // (where this rank's bytes go; `rank` names it in messages)
  DeviceBuffer buf(bytes * size_t(world));
  char* at = static_cast<char*>(buf.get()) + bytes * size_t(me);
  cudaStream_t st = nullptr;
  FO_CUDA_CHECK_CTX(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), ctx);
  // (on the gather's stream: a pageable copy may return before it lands)
  cudaError_t e = cudaMemcpyAsync(at, mine, bytes, cudaMemcpyHostToDevice, st);
  const ncclResult_t r = e == cudaSuccess ? ncclAllGather(at, buf.get(), bytes, ncclUint8, comm, st) : ncclSuccess;
  // Poll rather than synchronise, so that a rank that never joins fails
  // this one after `timeout` (and NCCL's own asynchronous errors surface).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::microseconds(20);
  bool timed_out = false;
  ncclResult_t async = ncclSuccess;
  while (e == cudaSuccess && r == ncclSuccess) {
    const cudaError_t q = cudaStreamQuery(st);
    if (q != cudaErrorNotReady) {
      e = q;
      break;
    }
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &async);
    if (queried != ncclSuccess) async = queried;  // (the query failing is an error too)
    if (async != ncclSuccess && async != ncclInProgress) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
  cudaStreamDestroy(st);  // (released once its work is done, if ever)
  if (timed_out || (async != ncclSuccess && async != ncclInProgress)) {
    // The AllGather is still enqueued and will write into buf if the other
    // ranks join: keep that memory rather than free it under the collective.
    (void)buf.release();
    if (timed_out) {
      std::ostringstream waited;
      waited << timeout.count() / 1000.0 << " s";
      throw Error(ctx + ": the other ranks did not join within " + waited.str() +
                  " (a rank failed or returned before this collective step; its own error says why). The step stays "
                  "enqueued on the communicator: abort it (ncclCommAbort) unless the other ranks still join");
    }
    FO_NCCL_CHECK_CTX(async, ctx + " (asynchronous NCCL error while waiting for the other ranks)");
  }
  FO_NCCL_CHECK_CTX(r, ctx);
  FO_CUDA_CHECK_CTX(e, ctx);
  std::vector<uint8_t> all(buf.bytes());
  FO_CUDA_CHECK_CTX(cudaMemcpy(all.data(), buf.get(), buf.bytes(), cudaMemcpyDeviceToHost), ctx);
  return all;
}

}  // namespace flashoverlap::rt
