// ptx.cuh — thin inline-PTX wrappers for the sm_90a features the GEMM uses:
// mbarriers, TMA (cp.async.bulk.tensor), WGMMA fences and descriptors,
// setmaxnreg, proxy fences and release/acquire flag operations.
// Each wrapper is one instruction (or a wait loop around one); the semantics
// are the PTX ISA's.
#pragma once
#include <cuda.h>
#include <cstdint>
#include <cstdio>

namespace flashoverlap::kernels::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier -------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
// Makes barrier initialisation visible to the async proxy (TMA).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Programmatic dependent launch (a launch with the programmatic stream
// serialization attribute, GemmParams::pdl): wait until the grids before it
// on the stream have completed and their memory is visible (a no-op in a
// launch without it); and let the next such launch be scheduled once every
// CTA of this grid has said so or exited.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

#ifdef FO_DEBUG_HANG
// Debug builds (-DFO_DEBUG_HANG=ON): a wait on an mbarrier that has not
// completed after 10 s of GPU time names itself and traps, instead of hanging.
static __device__ __noinline__ void mbar_hang_report(uint64_t* bar, uint32_t parity) {
  printf("mbarrier wait stuck 10 s: block %d thread %d, shared 0x%x parity %u\n", int(blockIdx.x), int(threadIdx.x),
         smem_addr(bar), parity);
  __trap();
}
#endif

// The wait of mbar_wait and mbar_wait_cluster: try_wait.parity, with the
// semantics SEM ("": acquire at CTA scope, the default), until the phase
// completes (debug builds: a report after 10 s instead of a hang).
#ifdef FO_DEBUG_HANG
#define FO_MBAR_WAIT(SEM, bar, parity)                                                                          \
  do {                                                                                                         \
    const uint64_t start = globaltimer_ns();                                                                   \
    while (true) {                                                                                             \
      uint32_t done;                                                                                           \
      asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity" SEM                                            \
                   ".shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"                                 \
                   : "=r"(done)                                                                                \
                   : "r"(smem_addr(bar)), "r"(parity)                                                          \
                   : "memory");                                                                                \
      if (done) break;                                                                                         \
      if (globaltimer_ns() - start > 10'000'000'000ull) mbar_hang_report(bar, parity);                         \
    }                                                                                                          \
  } while (0)
#else
#define FO_MBAR_WAIT(SEM, bar, parity)                                                                          \
  asm volatile("{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity" SEM                                      \
               ".shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),                      \
               "r"(parity)                                                                                     \
               : "memory")
#endif

// Waits until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { FO_MBAR_WAIT("", bar, parity); }

// ---- clusters (distributed shared memory) ---------------------------------
// Every thread of every CTA of the cluster arrives, then waits for the rest.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The shared-memory address `addr` of this CTA's, at the same offset in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}
// An arrival on another CTA's mbarrier (`remote`: map_to_rank's address),
// releasing this thread's writes at cluster scope.
__device__ __forceinline__ void mbar_arrive_remote(uint32_t remote) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
// mbar_wait, acquiring at cluster scope what the arrivals of other CTAs released.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  FO_MBAR_WAIT(".acquire.cluster", bar, parity);
}
#undef FO_MBAR_WAIT

// ---- TMA ------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
// 2D tile load global -> shared, completion counted on `bar` (bytes).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                            int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// The same with an L2 cache policy (policy_evict_first, policy_evict_last).
__device__ __forceinline__ void tma_load_2d_hint(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                                 int32_t c1, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}
// Policies for every line a load brings (fraction 1.0).
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
// 2D tile store shared -> global (out-of-bounds parts are not written).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(smem_addr(src)), "r"(c0), "r"(c1)
               : "memory");
}
// Contiguous bulk copy global -> shared (no tensor map), completion counted
// on `bar` (bytes). Addresses 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// All committed stores complete: their writes to global memory are performed.
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// All committed stores have finished READING shared memory (it may be reused);
// says nothing about the global writes.
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Generic-proxy shared-memory writes become visible to the async proxy.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Async-proxy global writes are ordered with later generic-proxy operations.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// ---- WGMMA ----------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Shared-memory matrix descriptor for a K-major operand stored as rows of
// 128 bytes (64 bf16) written by TMA with 128-byte swizzle: 8-row core-matrix
// groups are 1024 bytes apart (stride byte offset); the leading byte offset is
// unused for swizzled K-major layouts. Tiles are 1024-byte aligned, so the
// base offset field stays 0.
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* p) {
  const uint64_t addr = smem_addr(p);
  uint64_t d = (addr & 0x3FFFF) >> 4;   // start address
  d |= uint64_t(1) << 16;               // leading byte offset (unused)
  d |= uint64_t(1024 >> 4) << 32;       // stride byte offset
  d |= uint64_t(1) << 62;               // 128-byte swizzle
  return d;
}

// ---- registers ------------------------------------------------------------
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// ---- named barriers -------------------------------------------------------
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- flags ----------------------------------------------------------------
// Release at GPU scope: every write this thread has observed (including
// writes ordered before it by a barrier) is visible before the add.
__device__ __forceinline__ void red_release_gpu_add(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// System scope: the add (and the writes it releases) is seen by other GPUs
// that acquire at system scope (flags in a peer's memory over NVLink).
__device__ __forceinline__ void red_release_sys_add(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// The SM's cycle counter (runs at the SM clock, so cycles over globaltimer
// nanoseconds between two reads on one SM is the clock in between).
__device__ __forceinline__ uint64_t clock_cycles() {
  uint64_t c;
  asm volatile("mov.u64 %0, %clock64;" : "=l"(c));
  return c;
}
__device__ __forceinline__ uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %smid;" : "=r"(s));
  return s;
}

}  // namespace flashoverlap::kernels::ptx
