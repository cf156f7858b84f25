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
// The poll itself: on timeout, the first to give up records `code` and
// calls record(v) (v: the flag's last value) to fill in the rest.
template <uint32_t kFirstNs, uint32_t kMaxNs, class Record>
__device__ __forceinline__ bool bounded_poll(const uint32_t* flag, uint32_t target, uint64_t timeout_ns,
                                             WaitError* err, uint32_t code, const Record& record) {
  const uint64_t start = ptx::globaltimer_ns();
  uint32_t backoff = kFirstNs;
  while (true) {
    const uint32_t v = ptx::ld_acquire_sys(flag);
    if (static_cast<int32_t>(v - target) >= 0) return true;
    if (ptx::globaltimer_ns() - start > timeout_ns) {
      if (atomicCAS(&err->failed, 0u, code) == 0u) {
        record(v);
        __threadfence_system();
      }
      return false;
    }
    __nanosleep(backoff);
    if (backoff < kMaxNs) backoff *= 2;
  }
}

template <uint32_t kFirstNs, uint32_t kMaxNs>
__device__ __forceinline__ bool bounded_wait(const uint32_t* flag, uint32_t target, uint64_t timeout_ns,
                                             WaitError* err, int32_t group, uint32_t code, int32_t tile = -1) {
  return bounded_poll<kFirstNs, kMaxNs>(flag, target, timeout_ns, err, code, [&](uint32_t v) {
    err->group = group, err->value = v, err->expected = target, err->tile = tile;
  });
}

// The call check's publishing (flags.h: CallPublish), lane or thread d for
// rank d: the descriptor's fields, then its number with release, so that a
// receiver that acquires the number reads the fields of that call.
__device__ __forceinline__ void publish_call(const CallPublish& pub, int d) {
  CallDesc* slot = pub.slots[d];
  slot->m = pub.desc.m;
  slot->plan = pub.desc.plan;
  ptx::st_release_sys(&slot->seq, pub.desc.seq);
}

// The call check of source s (flags.h: CallCheck), by one thread: waits
// (bounded) until s's descriptor in this call's slot (with tokens also the
// other one) reaches this call's number; true if it is this call with the m
// and plan expected and, with tokens, the other slot is not ahead of it.
// Else records the failure (kCallCheckFailed, group -1 - s) and returns
// false. The slot read is not rewritten meanwhile: s's next call of this
// parity comes two calls later, after this rank's token for this one
// (without tokens, the owner layout: after this rank's next call has
// started, which s's next call waits for).
__device__ __forceinline__ bool check_call(const CallCheck& c, int s, uint64_t timeout_ns, WaitError* err) {
  const CallDesc* mine = c.slots + c.parity * kMaxCounters + s;
  const CallDesc* other = c.slots + (1 - c.parity) * kMaxCounters + s;
  const auto ahead = [&](uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) > 0; };  // (wraps)
  // Without tokens a source may be at its next call already (it ended this
  // one on this rank's data): its other slot ahead is no disagreement.
  const bool lead_ok = c.tokens == nullptr;
  const uint64_t start = ptx::globaltimer_ns();
  uint32_t backoff = 32, seq = 0, next = 0;
  bool in_time = true;
  while (true) {
    seq = ptx::ld_acquire_sys(&mine->seq);
    next = ptx::ld_acquire_sys(&other->seq);
    if (!ahead(c.seq, seq) || (!lead_ok && ahead(next, c.seq))) break;
    if (ptx::globaltimer_ns() - start > timeout_ns) {
      in_time = false;
      break;
    }
    __nanosleep(backoff);
    if (backoff < 256) backoff *= 2;
  }
  const uint32_t m = ptx::ld_relaxed_sys(&mine->m), plan = ptx::ld_relaxed_sys(&mine->plan);
  if (in_time && seq == c.seq && (lead_ok || !ahead(next, c.seq)) && m == c.m[s] && plan == c.plan[s]) return true;
  if (atomicCAS(&err->failed, 0u, kCallCheckFailed) == 0u) {
    err->group = -1 - s;
    err->seen_seq = ahead(next, seq) && !(lead_ok && seq == c.seq) ? next : seq;
    err->seen_m = seq == c.seq ? m : 0, err->seen_plan = seq == c.seq ? plan : 0;
    err->want_seq = c.seq, err->want_m = c.m[s], err->want_plan = c.plan[s];
    __threadfence_system();
  }
  return false;
}

// The call check's token of source s for this call (bounded; a timeout is
// recorded as the check's failure, token 1).
__device__ __forceinline__ bool wait_token(const CallCheck& c, int s, uint64_t timeout_ns, WaitError* err) {
  return bounded_poll<32, 256>(c.token_counters + s, c.seq, timeout_ns, err, kCallCheckFailed, [&](uint32_t v) {
    err->group = -1 - s, err->token = 1, err->seen_seq = v, err->want_seq = c.seq;
  });
}

}  // namespace flashoverlap::kernels
