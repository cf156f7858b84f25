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

// The same for up to kMaxCounters counters at once, counters[i] to reach
// targets[i] (the All-to-All's arrivals from each source), in one launch.
// `group` of a timeout's record: -1 - i.
constexpr int kMaxCounters = 8;
struct CounterTargets {
  uint32_t target[kMaxCounters];
};
void launch_wait_counters(const uint32_t* counters, int32_t count, const CounterTargets& targets, uint64_t timeout_ns,
                          WaitError* err, cudaStream_t stream);

// Adds `value` with release at system scope to *counters[i], i < count
// (device array of pointers, some on other GPUs): a rank with nothing to
// store still counts its call at every receiver.
void launch_signal_counters(uint32_t* const* counters, int32_t count, uint32_t value, cudaStream_t stream);

void preload_flag_kernels();

}  // namespace flashoverlap::kernels
