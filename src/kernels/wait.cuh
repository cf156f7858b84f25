// wait.cuh — the bounded poll behind every device-side wait (docs/design.md
// §5.7: no hang without a message).
#pragma once
#include <cstdint>

#include "kernels/flags.h"
#include "kernels/ptx.cuh"

namespace flashoverlap::kernels {

// Polls `flag` (acquire at system scope: flags may be released by another
// GPU writing into this one's memory) until (int32_t)(*flag - target) >= 0,
// which survives epoch wrap-around; returns true then. After `timeout_ns` of
// GPU time the first waiter to give up records `code`, group, last value and
// target (and `tile`, where the flag is a tile's) in `err` and every one returns false. The sleep between polls
// doubles from kFirstNs up to kMaxNs (a late wake-up delays the waiter).
template <uint32_t kFirstNs, uint32_t kMaxNs>
__device__ __forceinline__ bool bounded_wait(const uint32_t* flag, uint32_t target, uint64_t timeout_ns,
                                             WaitError* err, int32_t group, uint32_t code, int32_t tile = -1) {
  const uint64_t start = ptx::globaltimer_ns();
  uint32_t backoff = kFirstNs;
  while (true) {
    const uint32_t v = ptx::ld_acquire_sys(flag);
    if (static_cast<int32_t>(v - target) >= 0) return true;
    if (ptx::globaltimer_ns() - start > timeout_ns) {
      if (atomicCAS(&err->failed, 0u, code) == 0u) {
        err->group = group, err->value = v, err->expected = target, err->tile = tile;
        __threadfence_system();
      }
      return false;
    }
    __nanosleep(backoff);
    if (backoff < kMaxNs) backoff *= 2;
  }
}

// A fused sum's group g is ready (lane or thread 0 calls this): its own
// flag, and with `peer_ready` ([groups][world], written by each peer once its
// copy of the group has landed here) every other rank's entry, has reached
// its target. Returns false after a timeout (recorded in err).
template <uint32_t kFirstNs, uint32_t kMaxNs>
__device__ __forceinline__ bool wait_group_ready(const uint32_t* ready, const uint32_t* peer_ready, int32_t world,
                                                 int32_t rank, int32_t g, uint32_t target, uint32_t epoch,
                                                 uint64_t timeout_ns, WaitError* err) {
  if (!bounded_wait<kFirstNs, kMaxNs>(ready + g, target, timeout_ns, err, g, 2u)) return false;
  if (peer_ready)
    for (int32_t w = 0; w < world; ++w)
      if (w != rank && !bounded_wait<kFirstNs, kMaxNs>(peer_ready + int64_t(g) * world + w, epoch, timeout_ns, err, g, 2u))
        return false;
  return true;
}

}  // namespace flashoverlap::kernels
