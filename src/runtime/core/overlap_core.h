// overlap_core.h — what every overlapped op's calls stand on, whatever the
// collective (docs/design.md §3): the communication stream and the events
// that fork it from and join it to the caller's stream, the host-mapped
// record of a wait that timed out, the order of calls, and scratch memory.
// Several ops may share one core (the public GemmAllReduce's plans for each
// m): their calls then run one at a time, in the order they were made, so
// the stream, the record and the scratch serve them all.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/flags.h"
#include "runtime/core/buffer.h"

namespace flashoverlap::rt {

class OverlapCore {
 public:
  OverlapCore();
  ~OverlapCore();  // waits for the last call and the communication stream
  OverlapCore(const OverlapCore&) = delete;
  OverlapCore& operator=(const OverlapCore&) = delete;

  // The second stream the groups' communication runs on (highest priority).
  cudaStream_t comm_stream() const { return comm_stream_; }
  // Before a call's work on `stream`: on another stream than the previous
  // call's, wait for that call's end (not while capturing a graph: its
  // launches are the caller's to order).
  void begin_call(cudaStream_t stream);
  // After it: its end, which the next call and the destructor wait for.
  void end_call(cudaStream_t stream);
  // Returns once the last call has ended (and the communication stream's work).
  void wait_last_call() const;
  // The communication stream starts no earlier than this point of `stream`
  // (its waiters never sit on SMs while the caller's earlier work runs).
  void fork(cudaStream_t stream) { fork(stream, comm_stream_); }
  // The same for another stream of the caller's op (e.g. its copy streams).
  void fork(cudaStream_t stream, cudaStream_t to);
  // `stream` goes on once the communication stream's work so far is done.
  void join(cudaStream_t stream);
  // Where a bounded wait records its timeout (host-mapped; never cleared:
  // the first failure stays for check()).
  kernels::WaitError* wait_error() const { return wait_error_; }
  // Scratch of at least `bytes`, one per `slot` (0, 1, ...: the caller's
  // names), kept and grown as needed: growing waits for the device (a
  // free), so a shared core is sized up front (reserve).
  void* scratch(int slot, size_t bytes);
  void reserve(int slot, size_t bytes) { (void)scratch(slot, bytes); }

 private:
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr, call_done_ = nullptr;
  kernels::WaitError* wait_error_ = nullptr;
  bool called_ = false;
  cudaStream_t last_stream_ = nullptr;
  static constexpr int kSlots = 4;
  DeviceBuffer scratch_[kSlots];
};

}  // namespace flashoverlap::rt
