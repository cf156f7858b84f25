// overlap_core.cpp — see overlap_core.h.
#include "runtime/core/overlap_core.h"

#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap::rt {

OverlapCore::OverlapCore() {
  FO_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&wait_error_), sizeof(kernels::WaitError), cudaHostAllocMapped));
  *wait_error_ = kernels::WaitError{};
  int lo = 0, hi = 0;  // the communication stream gets the highest priority
  FO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  FO_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, hi));
  for (cudaEvent_t* e : {&forked_, &joined_, &call_done_}) FO_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

void OverlapCore::wait_last_call() const {
  if (called_) cudaEventSynchronize(call_done_);
  if (comm_stream_) cudaStreamSynchronize(comm_stream_);
  (void)cudaGetLastError();  // (a failure here is not the next caller's: cleared)
}

OverlapCore::~OverlapCore() {
  wait_last_call();
  for (cudaEvent_t e : {forked_, joined_, call_done_})
    if (e) cudaEventDestroy(e);
  if (comm_stream_) cudaStreamDestroy(comm_stream_);
  if (wait_error_) cudaFreeHost(wait_error_);
}

void OverlapCore::begin_call(cudaStream_t stream) {
  if (called_ && stream != last_stream_ && !capturing(stream))
    FO_CUDA_CHECK(cudaStreamWaitEvent(stream, call_done_, 0));
}

void OverlapCore::end_call(cudaStream_t stream) {
  // A call captured into a graph leaves the order alone: an event recorded
  // in a capture is a node of that graph, and waiting on it from a stream
  // outside the capture is an error (cudaErrorInvalidValue). Replays are
  // ordered by the caller's stream, as any captured work is.
  if (capturing(stream)) return;
  FO_CUDA_CHECK(cudaEventRecord(call_done_, stream));
  called_ = true, last_stream_ = stream;
}

void OverlapCore::fork(cudaStream_t stream, cudaStream_t to) {
  FO_CUDA_CHECK(cudaEventRecord(forked_, stream));
  FO_CUDA_CHECK(cudaStreamWaitEvent(to, forked_, 0));
}

void OverlapCore::join(cudaStream_t stream) {
  FO_CUDA_CHECK(cudaEventRecord(joined_, comm_stream_));
  FO_CUDA_CHECK(cudaStreamWaitEvent(stream, joined_, 0));
}

void* OverlapCore::scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= kSlots) throw InvalidArgument("OverlapCore::scratch: slot " + std::to_string(slot));
  DeviceBuffer& b = scratch_[slot];
  if (b.bytes() < bytes) {
    b = DeviceBuffer();  // (freed first: the device finishes with it)
    b = DeviceBuffer(bytes);
  }
  return b.get();
}

}  // namespace flashoverlap::rt
