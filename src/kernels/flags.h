// flags.h — waiting on group counters from a stream, with a bound.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashoverlap::kernels {

// Written (once, by the first waiter that times out) into host-mapped memory
// so that the host can report which wait failed instead of hanging.
struct WaitError {
  uint32_t failed;    // 0 = no failure; kCallCheckFailed: the call check below
  int32_t group;
  uint32_t value;     // counter value seen last
  uint32_t expected;  // the target it waited for
  int32_t tile = -1;  // the owner layout: the tile whose flag it was (-1: a group's counter)
  // The call check's (group -1 - source): the source's latest call number
  // seen, its m and plan where that is this call, and this rank's call
  // number and expectation of them.
  uint32_t seen_seq = 0, seen_m = 0, seen_plan = 0;
  uint32_t want_seq = 0, want_m = 0, want_plan = 0;
  int32_t token = 0;  // 1: the source's token did not come (seen_seq: its tokens so far)
};
constexpr uint32_t kCallCheckFailed = 8;  // (1-4: the waits' own codes; see their callers)

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

// The NVLink forms' call check (docs/design.md §5.8). As its GEMM starts,
// every source publishes its call's descriptor into its slot in every
// rank's window header (CallPublish; the slots alternate with the calls'
// parity). Each receiver, once its own GEMM is done and before it counts on
// any source's rows, compares every source's descriptor with what it
// expects of it (CallCheck), then sends each source a token (1 more on its
// token counter there) and waits for every source's rows and for its token
// of this call (token counters count calls, apart from the rows' counts, so
// a later call's signals never stand in for a missing token). A source
// therefore ends call k only after every rank has checked call k, so a
// descriptor ahead of the receiver's call is a real disagreement (a rank
// that skipped a call), never a race. A failure is recorded
// (kCallCheckFailed) and the call's waits stop; no token is sent, so the
// other ranks fail too, bounded. The AllReduce's owner layout checks
// without tokens (CallCheck::tokens null; Owner::check): there a source
// ends call k only on every rank's data of call k, so it can be one call
// ahead, never two, and every rank sees every other's m.
struct CallDesc {
  uint32_t seq;   // the call's number on the windows, from 1
  uint32_t m;     // the source's rows
  uint32_t plan;  // the op's digest of its plan (the signals it sends; the All-to-All's also its rows to each rank)
  uint32_t unused;
};
struct CallPublish {
  CallDesc* const* slots = nullptr;  // device [world]: this source's slot at every rank; null: off
  CallDesc desc{};
};
struct CallCheck {
  const CallDesc* slots = nullptr;   // this GPU's [2][kMaxCounters] (parity, source); null: off
  int32_t parity = 0;                // this call's
  uint32_t seq = 0;
  uint32_t m[kMaxCounters]{}, plan[kMaxCounters]{};  // each source's, as this rank expects them
  uint32_t* const* tokens = nullptr;        // device [world]: this rank's token counter at every rank; null: none
  const uint32_t* token_counters = nullptr;  // this GPU's, one per source
};

// With `check` (its slots non-null) the call check first, then the waits.
void launch_wait_counters(const uint32_t* counters, int32_t count, const CounterTargets& targets, uint64_t timeout_ns,
                          WaitError* err, cudaStream_t stream, const CallCheck& check = {});

// Adds `value` with release at system scope to *counters[i], i < count
// (device array of pointers, some on other GPUs): a rank with nothing to
// store still counts its call at every receiver (and, with `publish`,
// publishes its call's descriptor first).
void launch_signal_counters(uint32_t* const* counters, int32_t count, uint32_t value, cudaStream_t stream,
                            const CallPublish& publish = {});

// A fault for tests: takes 1 from flags[t] of every tile t of `group`
// (group_of_tile, `tiles` of them), so that a wait for those flags at this
// call's epoch never completes and times out, naming the group.
void launch_uncount_group(uint32_t* flags, const int32_t* group_of_tile, int32_t tiles, int32_t group,
                          cudaStream_t stream);

void preload_flag_kernels();

}  // namespace flashoverlap::kernels
