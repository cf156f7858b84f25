// gemm_staging.cuh — a consumer warpgroup's accumulators into its shared
// staging buffer in the output type, swizzled for TMA (stage_columns,
// stage_accumulators for the 3-stage epilogue, stage_piece for the 4-stage
// pieces), optionally summed with the peer's partial already there (the
// owner layout: add_pack2). Separate: the one step both epilogues share.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/gemm_smem.cuh"

namespace flashoverlap::kernels {

// T(x) + peer in each of 2 lanes, the exact sum rounded once: a 2-rank sum
// of the rounded partials, as NCCL's (a + b commutes). One packed add
// (add.rn.{bf16,f16}x2), the same bits as adding in fp32 and rounding that
// (fp32's 24 bits >= 2 x 11 + 2: rounding twice is innocuous for a sum), at a
// quarter of the instructions: the consumers' epilogue of a tile they own,
// where the tensor cores wait, so its instructions count.
template <typename T>
__device__ __forceinline__ uint32_t add_pack2(float lo, float hi, uint32_t peer) {
  const uint32_t own = pack2<T>(lo, hi);
  uint32_t sum;
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(sum) : "r"(own), "r"(peer));
  else
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(sum) : "r"(own), "r"(peer));
  return sum;
}

// Epilogue step (2) of a consumer warpgroup: its accumulators into its
// half of the staging buffer in the output type, swizzled so that each
// warp's stores hit 32 distinct banks. wgmma's fragment: register 4j+{0,1}
// holds row warp*16+lane/4, columns 8j+2*(lane%4)+{0,1}; 4j+{2,3} the same
// columns 8 rows further down. kAddPeer (owner layout): the peer's partial
// is there already, in the same layout (TMA, same swizzle); the sum replaces it.
// stage_columns does it for columns [8 kJ0, 8 (kJ0 + kJn)) (register groups
// j = kJ0.., laid out as staged_unit_offset<8 kJn>), stage_accumulators for all,
// stage_piece for a piece of 128 (kPieces).
template <typename T, int kJ0, int kJn, bool kAddPeer, int N>
__device__ __forceinline__ void stage_columns(const float (&acc)[N], uint32_t my_c_addr, int warp, int lane) {
#pragma unroll
  for (int j = kJ0; j < kJ0 + kJn; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + lane / 4 + 8 * h;
      const uint32_t addr = my_c_addr + staged_unit_offset<8 * kJn>(r, j - kJ0) + (lane % 4) * 4;
      uint32_t v;
      if constexpr (kAddPeer) {
        uint32_t peer;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(peer) : "r"(addr) : "memory");
        v = add_pack2<T>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], peer);
      } else {
        v = pack2<T>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
    }
  }
}

template <typename T, int BN, bool kAddPeer>
__device__ __forceinline__ void stage_accumulators(const float (&acc)[BN / 2], uint32_t my_c_addr, int warp,
                                                   int lane) {
  stage_columns<T, 0, BN / 8, kAddPeer>(acc, my_c_addr, warp, lane);
}

// kPieces (128x256 tiles): columns [128q, 128q + 128) of a consumer
// warpgroup's rows, piece q, into its 16 KB staging buffer; kAddPeer (owner
// layout): the peer's partial of the piece is there already, the sum replaces it.
template <typename T, int Q, bool kAddPeer = false>
__device__ __forceinline__ void stage_piece(const float (&acc)[128], uint32_t my_c_addr, int warp, int lane) {
  stage_columns<T, Q * 16, 16, kAddPeer>(acc, my_c_addr, warp, lane);
}

}  // namespace flashoverlap::kernels
