// host_gate.h — holding a stream until the host has enqueued a timed run.
//
// A run timed between two events right after a sync also times the host's
// enqueue wherever it outlasts the work queued before the start event: the
// GPU reaches the start event and then idles until the first launch arrives.
// Ops differ in host work per call (tensor maps encoded, NCCL's enqueue,
// checks), so that idle time is not the same for every variant. With the
// gate, the stream first waits (a one-thread bounded spin on host-mapped
// memory) until the host has queued the whole run; the time between the
// events is then the GPU's alone, as in a training step where the host runs
// ahead of the GPU.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/flags.h"

namespace flashoverlap::rt {

class HostGate {
 public:
  HostGate();
  ~HostGate();
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;

  // The stream waits, from here, for the next release() (at most
  // `timeout_ns` of GPU time; then it moves on and check() throws).
  void hold(cudaStream_t stream, uint64_t timeout_ns = 10'000'000'000ull);
  // Lets the last hold() go.
  void release();
  // Throws (with the ticket) if a hold timed out.
  void check() const;

 private:
  uint32_t* flag_ = nullptr;           // host-mapped; the GPU reads it
  kernels::WaitError* err_ = nullptr;  // host-mapped; the GPU writes it on a timeout
  uint32_t ticket_ = 0;
};

// This thread's gate (created at the first call; the timing helpers share it).
HostGate& thread_gate();

}  // namespace flashoverlap::rt
