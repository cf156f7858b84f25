// gemm_pieces.cuh — the 4-stage plain store (gemm.h: GemmParams::
// four_stages, GemmSmem's kPieces): each consumer writes its half of a tile
// in two pieces of 128 columns (write_pieces) and one storer thread stores
// them by TMA and signals (piece_storer). Separate: the whole pieces
// epilogue but the owner layout's storer (gemm_owner_warps.cuh).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "kernels/gemm_smem.cuh"
#include "kernels/gemm_staging.cuh"
#include "kernels/ptx.cuh"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

// A consumer warpgroup's epilogue with kPieces: piece 0, then piece 1, each
// once the storer has freed the buffer (parity: two completions per tile)
// and, for a tile this rank owns, once the peer's partial of the piece is in it.
template <typename T>
__device__ __forceinline__ void write_pieces(const float (&acc)[128], uint32_t my_c_addr, uint64_t* c_full_cw,
                                             uint64_t* c_empty_cw, uint64_t* p_ready_cw, bool own,
                                             uint32_t& owned_pieces, int tid, int warp, int lane, int cw) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    ptx::mbar_wait(c_empty_cw, uint32_t(q ^ 1));
    if (own) {
      ptx::mbar_wait(p_ready_cw, owned_pieces & 1);
      ++owned_pieces;
      if (q == 0) stage_piece<T, 0, true>(acc, my_c_addr, warp, lane);
      else stage_piece<T, 1, true>(acc, my_c_addr, warp, lane);
    } else {
      if (q == 0) stage_piece<T, 0>(acc, my_c_addr, warp, lane);
      else stage_piece<T, 1>(acc, my_c_addr, warp, lane);
    }
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(1 + cw, 128);
    if (tid == 0) ptx::mbar_arrive(c_full_cw);
  }
}

// kPieces: the storer (one thread) takes the pieces in the order the
// consumers write them (piece 0 of both halves, then piece 1), stores each by
// TMA and hands the buffer back once the TMA has read it. Each buffer
// completes twice per tile, so piece q's wait is on parity q. With counters
// (signalling: the NCCL layouts) it then waits for the tile's
// stores to complete and adds 2 to its group's counter, as the 3-stage
// storer does (the consumers are by then in the next tile's mainloop).
template <int BN, int kPieceBytes>
__device__ __forceinline__ void piece_storer(const GemmKernelParams& p, const CUtensorMap* tm_c, uint8_t* c_smem,
                                             uint64_t* c_full, uint64_t* c_empty, int32_t tiles) {
  ptx::tma_prefetch_desc(tm_c);
  for (int32_t idx = blockIdx.x; idx < tiles; idx += gridDim.x) {
    const plan::TileCoord tc = p.sched.tile_of(idx);
    const int32_t row = tc.tm * 128, col = tc.tn * BN;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ptx::mbar_wait(&c_full[h], uint32_t(q));
        if (q == 1 && h == 1 && idx + int32_t(gridDim.x) >= tiles) record_phase(p.monitor_phases, 0);  // (trace)
        const uint8_t* piece = c_smem + h * kPieceBytes;
#pragma unroll
        for (int c = 0; c < 2; ++c) ptx::tma_store_2d(tm_c, piece + c * 8192, col + q * 128 + c * 64, row + h * 64);
        ptx::tma_store_commit();
        ptx::tma_store_wait_read();
        ptx::mbar_arrive(&c_empty[h]);
      }
    if (p.counters) {
      ptx::tma_store_wait_all();        // the tile is complete in global memory,
      ptx::fence_proxy_async_global();  // ordered before the generic-proxy release
      ptx::red_release_gpu_add(p.counters + p.group_of_tile[idx], 2);
    }
  }
  ptx::tma_store_wait_all();
  if (int32_t(blockIdx.x) < tiles) record_phase(p.monitor_phases, 1);  // (trace) its last tile stored
}

}  // namespace flashoverlap::kernels
