// flags.h — waiting on group counters from a stream, with a bound.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashoverlap::kernels {

// Written (once, by the first waiter that times out) into host-mapped memory
// so that the host can report which wait failed instead of hanging.
struct WaitError {
  uint32_t failed;    // 0 = no failure
  int32_t group;
  uint32_t value;     // counter value seen last
  uint32_t expected;  // the target it waited for
  int32_t tile = -1;  // the owner layout: the tile whose flag it was (-1: a group's counter)
};

// Enqueues a one-thread kernel on `stream` that spins until
// (int32_t)(*counter - target) >= 0 (epoch counters wrap) or until
// `timeout_ns` of GPU time passes; on timeout it records `err` and returns,
// so the stream moves on and the host finds the failure when it checks.
void launch_wait_counter(const uint32_t* counter, uint32_t target, uint64_t timeout_ns, WaitError* err,
                         int32_t group, cudaStream_t stream);

void preload_flag_kernels();

}  // namespace flashoverlap::kernels
