// gemm_stream_k.cuh — the stream-K pieces' partial sums (plan/stream_k.h):
// a piece that does not finish its tile leaves its fp32 sums in its CTA's
// workspace slot and signals; the tile's finisher waits for those pieces
// and adds them, in k order, to its own sums before the epilogue. One slot and
// one flag per CTA and consumer warpgroup (a CTA leaves at most one partial
// per launch: its share's first piece); the finisher zeroes the flag after
// its wait, so every launch finds them zero.
#pragma once
#include <cstdint>

#include "kernels/ptx.cuh"
#include "plan/stream_k.h"

namespace flashoverlap::kernels {

// Device workspace of the stream-K pieces, zeroed once (stream_k_workspace_bytes).
struct StreamKWork {
  float* partials = nullptr;  // [ctas][2 warpgroups][values per thread][128 threads]
  uint32_t* flags = nullptr;  // [ctas][2]
};

// Spins until `flag` (acquire at GPU scope) is at least `target`. No bound
// of its own: add_partials says why.
__device__ __forceinline__ void spin_until_at_least(const uint32_t* flag, uint32_t target) {
  uint32_t backoff = 32;
  while (ptx::ld_acquire_gpu(flag) < target) {
    __nanosleep(backoff);
    if (backoff < 256) backoff *= 2;
  }
}

// This warpgroup's sums (BN/2 per thread) into CTA `cta`'s slot, then its
// flag with release (every thread's stores before it, through the barrier).
template <int BN>
__device__ __forceinline__ void put_partial(const float (&acc)[BN / 2], const StreamKWork& w, int cta, int cw,
                                            int tid) {
  float* slot = w.partials + (int64_t(cta) * 2 + cw) * (BN / 2) * 128;
#pragma unroll
  for (int e = 0; e < BN / 2; ++e) __stcg(slot + e * 128 + tid, acc[e]);  // (coalesced: thread-fastest; L2)
  __threadfence();
  ptx::named_barrier_sync(1 + cw, 128);
  if (tid == 0) ptx::red_release_gpu_add(w.flags + cta * 2 + cw, 1);
}

// Adds the partials of the `n` CTAs before `finisher` (plan::StreamK::
// contributors: the tile's later pieces, in k order) to this warpgroup's
// sums. Each such CTA's piece is at the start of its share and it waits for
// nothing before it (plan/stream_k.h), and the grid is at most one CTA per
// SM (launch_gemm refuses more), so those CTAs are resident or done. Their
// flags are waited for first, one thread each, then the partials are read
// without a barrier between them, so that one partial's loads overlap the
// previous one's adds; each value is added in k order, so the sum is the
// same as one partial at a time. The wait has no timeout of its own: a
// bound there (a timer or a count, and a trap) needs registers the 128x192
// kernel has not got; an op's call is bounded by its call watch (design §5.7).
template <int BN>
__device__ __forceinline__ void add_partials(float (&acc)[BN / 2], const StreamKWork& w, const plan::StreamK& sk,
                                             int finisher, int n, int cw, int tid) {
  // (every CTA holds a share unless there are fewer split k-blocks than CTAs:
  // has_share's 64-bit divisions only then)
  const bool all_share = sk.iterations() >= sk.ctas;
  for (int j = tid + 1; j <= n; j += 128) {  // (thread t: contributors t + 1, t + 129, ...)
    if (!all_share && !sk.has_share(finisher - j)) continue;
    uint32_t* flag = w.flags + (finisher - j) * 2 + cw;
    spin_until_at_least(flag, 1);
    *flag = 0;  // (this launch's only partial of that slot: the next launch finds it zero)
  }
  ptx::named_barrier_sync(1 + cw, 128);
  for (int j = 1; j <= n; ++j) {
    if (!all_share && !sk.has_share(finisher - j)) continue;
    const float* slot = w.partials + (int64_t(finisher - j) * 2 + cw) * (BN / 2) * 128;
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc[e] += __ldcg(slot + e * 128 + tid);  // (L2: not this SM's L1)
  }
}

}  // namespace flashoverlap::kernels
