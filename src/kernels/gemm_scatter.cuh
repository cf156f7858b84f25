// gemm_scatter.cuh — the Scatter's stores (gemm.h: Scatter, the NVLink forms
// of the ReduceScatter and the All-to-All): the consumers stage each half
// tile as for a TMA store, and two producer warps (warp 1 + h for half h)
// store its rows where row_of sends them, hand the staging back, then fence
// at system scope and count the half at every rank. The fence waits for the
// stores' round trips in these warps, not in the consumers, which go on with
// the next tile meanwhile.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_smem.cuh"
#include "kernels/ptx.cuh"
#include "kernels/wait.cuh"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

// Where a half's 64 rows go, lane l holding rows l (lo) and 32 + l (hi):
// rank d = dst / rows_per_rank, row dst % rows_per_rank of rows[d], n
// elements per row; null where row_of is -1 (not stored). Looked up before
// the half is ready, so the loads' latency is hidden.
template <typename T>
__device__ __forceinline__ void scatter_row_ptrs(const Scatter& sc, const int32_t* row_of, int32_t n, int lane,
                                                 T*& lo, T*& hi) {
  const auto at = [&](int32_t dst) -> T* {
    if (dst < 0) return nullptr;
    const int32_t d = dst / sc.rows_per_rank;
    return static_cast<T*>(sc.rows[d]) + int64_t(dst - d * sc.rows_per_rank) * n;
  };
  lo = at(row_of[lane]);
  hi = at(row_of[32 + lane]);
}

// The half (in shared memory, TMA's 128-byte swizzle) stored row by row to
// those rows, columns [col, col+BN) (those from n on are not), 16 bytes per
// lane: each warp instruction covers one row (BN 256) or two (BN 128), on the
// same side of row 32, so the row's address comes by one shuffle.
template <typename T, int BN>
__device__ __forceinline__ void scatter_half(const uint8_t* half, T* lo, T* hi, int32_t col, int32_t n, int lane) {
  constexpr int kUnits = BN / 8;
  static_assert(kUnits == 16 || kUnits == 32, "a warp instruction's rows lie on one side of row 32");
#pragma unroll 2
  for (int i = lane; i < 64 * kUnits; i += 32) {  // (the same trip count in every lane: the shuffles)
    const int r = i / kUnits, c8 = i % kUnits;
    T* row = reinterpret_cast<T*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(r < 32 ? lo : hi), r & 31));
    const int32_t gcol = col + c8 * 8;
    if (!row || gcol >= n) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(half + (c8 / 8) * 8192 + sw128_offset(r, c8 % 8));
    *reinterpret_cast<uint4*>(row + gcol) = v;
  }
}

// One warp's share: half h of each of the CTA's tiles (its staging buffer
// `half`, filled by consumer warpgroup h). Per half, 1 is added with release
// at system scope to this source's counter at every rank, whether the half
// had rows for it or not: 2 per tile and call, which every receiver knows.
template <typename T, int BN>
__device__ __forceinline__ void scatter_storer(const GemmKernelParams& p, const uint8_t* half, uint64_t* c_full,
                                               uint64_t* c_empty, int tiles, int h, int lane) {
  constexpr int BM = 128;
  if (h == 0 && blockIdx.x == 0 && p.scatter.publish.slots && lane < p.scatter.world)
    publish_call(p.scatter.publish, lane);  // (the call check: flags.h)
  uint32_t t = 0;  // the tiles this CTA's consumers staged
  for (int idx = blockIdx.x; idx < tiles; idx += gridDim.x) {
    if (p.grouped.a_row0 && p.grouped.rows[p.sched.tile_of(idx).tm] == 0) {  // (an empty tile row: never staged)
      if (lane == 0)
        for (int d = 0; d < p.scatter.world; ++d) ptx::red_release_sys_add(p.scatter.arrivals[d], 1);
      continue;
    }
    T* lo = nullptr;
    T* hi = nullptr;
    scatter_row_ptrs<T>(p.scatter, p.row_of + int64_t(idx) * BM + h * 64, p.sched.n, lane, lo, hi);
    const bool last = idx + int32_t(gridDim.x) >= tiles;
    ptx::mbar_wait(&c_full[h], t & 1);
    if (h == 1 && lane == 0 && last) record_phase(p.monitor_phases, 0);
    scatter_half<T, BN>(half, lo, hi, p.sched.tile_of(idx).tn * BN, p.sched.n, lane);
    __syncwarp();  // every lane's reads of the half are done
    if (lane == 0) ptx::mbar_arrive(&c_empty[h]);
    __threadfence_system();  // each lane's stores are visible system-wide before the counts below
    __syncwarp();
    if (lane == 0) {
      for (int d = 0; d < p.scatter.world; ++d) ptx::red_release_sys_add(p.scatter.arrivals[d], 1);
      if (p.monitor_ns) {
        p.monitor_ns[int64_t(idx) * 2 + h] = ptx::globaltimer_ns();
        if (h == 0) p.monitor_sm[idx] = ptx::smid();
      }
      if (h == 1 && last) record_phase(p.monitor_phases, 1);
    }
    ++t;
  }
}

}  // namespace flashoverlap::kernels
