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

namespace {

// Polls `st` until its work is done, NCCL reports an asynchronous error on
// `comm`, or `timeout` passes (a rank that never joins fails the others
// instead of hanging them). Returns whether the wait failed; throws nothing.
struct Awaited {
  cudaError_t cuda = cudaSuccess;
  ncclResult_t async = ncclSuccess;
  bool timed_out = false;
  bool failed() const { return timed_out || (async != ncclSuccess && async != ncclInProgress); }
};
Awaited await_stream(ncclComm_t comm, cudaStream_t st, std::chrono::milliseconds timeout) {
  Awaited w;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::microseconds(5);
  for (;;) {
    const cudaError_t q = cudaStreamQuery(st);
    if (q != cudaErrorNotReady) {
      w.cuda = q;
      return w;
    }
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &w.async);
    if (queried != ncclSuccess) w.async = queried;  // (the query failing is an error too)
    if (w.failed()) return w;
    if (std::chrono::steady_clock::now() >= deadline) {
      w.timed_out = true;
      return w;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

// The failure of a wait, as an Error naming `ctx` (the collective stays enqueued).
[[noreturn]] void throw_awaited(const Awaited& w, std::chrono::milliseconds timeout, const std::string& ctx) {
  if (w.timed_out) {
    std::ostringstream waited;
    waited << timeout.count() / 1000.0 << " s";
    throw Error(ctx + ": the other ranks did not join within " + waited.str() +
                " (a rank failed or returned before this collective step; its own error says why). The step stays "
                "enqueued on the communicator: abort it (ncclCommAbort) unless the other ranks still join");
  }
  FO_NCCL_CHECK_CTX(w.async, ctx + " (asynchronous NCCL error while waiting for the other ranks)");
  throw Error(ctx + ": the exchange failed");  // (not reached: failed() implies one of the above)
}

}  // namespace

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
  Awaited w;
  if (e == cudaSuccess && r == ncclSuccess) w = await_stream(comm, st, timeout);
  cudaStreamDestroy(st);  // (released once its work is done, if ever)
  if (w.failed()) {
    // The AllGather is still enqueued and will write into buf if the other
    // ranks join: keep that memory rather than free it under the collective.
    (void)buf.release();
    throw_awaited(w, timeout, ctx);
  }
  FO_NCCL_CHECK_CTX(r, ctx);
  FO_CUDA_CHECK_CTX(e, ctx);
  FO_CUDA_CHECK_CTX(w.cuda, ctx);
  std::vector<uint8_t> all(buf.bytes());
  FO_CUDA_CHECK_CTX(cudaMemcpy(all.data(), buf.get(), buf.bytes(), cudaMemcpyDeviceToHost), ctx);
  return all;
}

HostExchange::HostExchange(ncclComm_t comm, size_t bytes) : comm_(comm), bytes_(bytes) {
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world_), "HostExchange");
  FO_NCCL_CHECK_CTX(ncclCommUserRank(comm, &rank_), "HostExchange");
  mine_ = PinnedBuffer(std::max<size_t>(bytes, 1));
  all_ = PinnedBuffer(std::max<size_t>(bytes * size_t(world_), 1));
  device_ = DeviceBuffer(std::max<size_t>(bytes * size_t(world_), 1));
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

HostExchange::~HostExchange() {
  if (!stream_) return;
  if (stuck_) {  // (an exchange still enqueued may write them: leave them)
    (void)device_.release(), (void)all_.release(), (void)mine_.release();
    return;
  }
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

const uint8_t* HostExchange::gather(const std::string& what, std::chrono::milliseconds timeout) {
  const std::string ctx = "rank " + std::to_string(rank_) + ": " + what;
  if (stuck_) throw Error(ctx + ": an earlier exchange of this op failed; the ranks are out of step");
  char* at = device_.as<char>() + bytes_ * size_t(rank_);
  FO_CUDA_CHECK_CTX(cudaMemcpyAsync(at, mine_.get(), bytes_, cudaMemcpyHostToDevice, stream_), ctx);
  FO_NCCL_CHECK_CTX(ncclAllGather(at, device_.get(), bytes_, ncclUint8, comm_, stream_), ctx);
  FO_CUDA_CHECK_CTX(cudaMemcpyAsync(all_.get(), device_.get(), bytes_ * size_t(world_), cudaMemcpyDeviceToHost, stream_),
                    ctx);
  const Awaited w = await_stream(comm_, stream_, timeout);
  if (w.failed()) {
    stuck_ = true;
    throw_awaited(w, timeout, ctx);
  }
  FO_CUDA_CHECK_CTX(w.cuda, ctx);
  return all_.as<uint8_t>();
}

}  // namespace flashoverlap::rt
