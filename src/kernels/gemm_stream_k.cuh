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
// Sliced (plan::StreamK::sliced), the flags are counts per tile instead:
// [tiles][2] partials put of each warpgroup's half, then from flags + ctas
// [tiles] warpgroups done (tiles <= ctas / 2).
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

// This warpgroup's sums (BN/2 per thread) into CTA `cta`'s slot, then 1
// added to `flag` with release (every thread's stores before it, through
// the barrier): its own flag, or sliced its tile's count. kGroups (sliced):
// the slot as [column group j][thread] of 4 values (registers 4j .. 4j + 3),
// so that a slice's values are 16-byte loads.
template <int BN, bool kGroups = false>
__device__ __forceinline__ void put_partial(const float (&acc)[BN / 2], const StreamKWork& w, int cta, int cw,
                                            int tid, uint32_t* flag) {
  float* slot = w.partials + (int64_t(cta) * 2 + cw) * (BN / 2) * 128;
  if constexpr (kGroups) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
      __stcg(reinterpret_cast<float4*>(slot) + j * 128 + tid,
             make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  } else {
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) __stcg(slot + e * 128 + tid, acc[e]);  // (coalesced: thread-fastest; L2)
  }
  __threadfence();
  ptx::named_barrier_sync(1 + cw, 128);
  if (tid == 0) ptx::red_release_gpu_add(flag, 1);
}

// Sliced: once all S partials of this warpgroup's half of `tile` are put
// (put_partial<BN, true>), the sums of column groups [j0, j1) (registers
// 4 j0 .. 4 j1) from them in k order, the first CTA's partial first, as
// add_partials sums them; acc's other registers are left as they are (its
// own values are in its slot). Group by group (j0, j1 are the CTA's: each
// group's branch is uniform, and no group's loads wait in registers beside
// another's).
template <int BN>
__device__ __forceinline__ void sum_slice(float (&acc)[BN / 2], const StreamKWork& w, const plan::StreamK& sk,
                                          int tile, int j0, int j1, int cw, int tid) {
  const int S = sk.slices();
  if (tid == 0) spin_until_at_least(w.flags + tile * 2 + cw, uint32_t(S));
  ptx::named_barrier_sync(1 + cw, 128);
  auto part = [&](int q, int j) {
    const float* slot = w.partials + (int64_t(sk.slice_cta(tile, q)) * 2 + cw) * (BN / 2) * 128;
    return __ldcg(reinterpret_cast<const float4*>(slot) + j * 128 + tid);
  };
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    if (j < j0 || j >= j1) continue;
    float4 sum = part(0, j);
#pragma unroll 4
    for (int q = 1; q < S; ++q) {
      const float4 v = part(q, j);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    acc[4 * j] = sum.x, acc[4 * j + 1] = sum.y, acc[4 * j + 2] = sum.z, acc[4 * j + 3] = sum.w;
  }
}

// Sliced: this warpgroup's slice is stored. The tile's last of its 2 S
// warpgroups zeroes the tile's counts for the next launch and, given a
// group counter, adds the 2 a tile adds there (every slice's stores
// before it: each warpgroup's fence, its arrive, the last one's acquire).
__device__ __forceinline__ void slice_done(const StreamKWork& w, const plan::StreamK& sk, int tile,
                                           uint32_t* counter, int cw, int tid) {
  __threadfence();
  ptx::named_barrier_sync(1 + cw, 128);
  if (tid != 0) return;
  uint32_t* done = w.flags + sk.ctas + tile;
  if (ptx::atom_add_acq_rel_gpu(done, 1) != uint32_t(2 * sk.slices() - 1)) return;
  w.flags[tile * 2] = 0;
  w.flags[tile * 2 + 1] = 0;
  *done = 0;
  if (counter) ptx::red_release_gpu_add(counter, 2);
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
