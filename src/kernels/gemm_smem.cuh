// gemm_smem.cuh — what every part of the signalling GEMM (gemm_sm90.cuh)
// shares: the kernel's parameters (GemmKernelParams), its shared-memory
// layout (GemmSmem), the phase trace (record_phase), and the packing and
// swizzle of staged output (pack2, sw128_offset). Separate so that the
// epilogue's headers (gemm_staging, gemm_pieces,
// gemm_owners, gemm_owner_warps) each read on their own; host code
// (gemm_sm90.cu) sizes the launch's shared memory from GemmSmem.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_stream_k.cuh"
#include "kernels/ptx.cuh"
#include "plan/schedule.h"
#include "plan/stream_k.h"

namespace flashoverlap::kernels {

// Everything the kernel needs besides the tensor maps, passed by value.
struct GemmKernelParams {
  plan::Schedule sched;
  int32_t k_blocks;
  int32_t store;           // Store
  bool tma_store;          // epilogue via TMA (Plain with aligned C, SlotTiles)
  void* out;               // rows epilogue: C (Plain) or the slot buffer (SlotRows)
  int64_t ld_out;          // elements per output row
  const int32_t* row_of;   // SlotRows
  const int32_t* half_row;   // SlotTiles from SlotRows: the slot row of each 64-row half's first row (else idx*BM + h*64)
  uint32_t* counters;
  const int32_t* group_of_tile;
  Scatter scatter;
  uint64_t* monitor_ns;
  uint32_t* monitor_sm;
  uint64_t* monitor_mma;
  uint64_t* monitor_phases;  // GemmParams::monitor_phases
  Owner owner;
  Grouped grouped;
  Fp8 fp8;
  plan::StreamK sk;        // the pieces (the stream-K kernels only)
  StreamKWork sk_work;
  bool l2_hints;  // gemm_l2_hints: A's loads evict last, B's first
};

// Trace (GemmParams::monitor_phases): phase `ph` of this CTA ends now.
__device__ __forceinline__ void record_phase(uint64_t* phases, int ph) {
  if (phases) atomicMax(reinterpret_cast<unsigned long long*>(phases + int64_t(blockIdx.x) * kPhaseSlots + ph),
                        static_cast<unsigned long long>(ptx::globaltimer_ns()));
}

// kPieces: the plain store with 4 stages (gemm.h: GemmParams::four_stages):
// each consumer stages its output half in two pieces of 128 columns, one
// after the other, in 16 KB instead of 32 KB; no staging buffers for the
// owner layout's copy (it goes through registers). kOwner false: no staging
// for the owner layout's copy at all (the FP8 kernels, which never take it),
// so that a sixth stage fits beside 128x128's C.
// BM: the tile's rows, 128 (two consumer warpgroups, a 64-row half each)
// or 64 (FP8: one).
template <int BN, int STAGES, bool kPieces = false, bool kOwner = true, int BM = 128>
struct GemmSmem {
  static constexpr int kBM = BM, kBK = 64;
  static constexpr int kABytes = kBM * kBK * 2;        // one stage of A
  static constexpr int kBBytes = BN * kBK * 2;         // one stage of B
  static constexpr int kHalfCBytes = 64 * (kPieces ? 128 : BN) * 2;  // one consumer's output half (a piece)
  static constexpr int kA = 0;
  static constexpr int kB = kA + STAGES * kABytes;
  static constexpr int kC = kB + STAGES * kBBytes;
  static constexpr int kBars = kC + (BM / 64) * kHalfCBytes;
  // ring, C halves, 2 buffers of each producer copy warp, 2 of each consumer warp
  // (+2: the owner layout's peer partial loaded into each C half)
  static constexpr int kBarCount = 2 * STAGES + 4 + 4 + 16 + 2;
  // Staging of the owner layout's copy (3 stages): 8 KB per producer copy warp.
  static constexpr int kSumStageBytes = kPieces || !kOwner ? 0 : 8192;
  // What each copying warp stages (producer or consumer; the same for all, as
  // claimed chunks must be the same size): a consumer warp uses a quarter of
  // its half of C.
  static constexpr int kSumWarpBytes = kPieces || !kOwner  ? kHalfCBytes / 4
                                       : kHalfCBytes / 4 < kSumStageBytes ? kHalfCBytes / 4
                                                                          : kSumStageBytes;
  static constexpr int kSum = (kBars + kBarCount * 8 + 127) / 128 * 128;
  static constexpr int kPushFailed = kSum + 2 * kSumStageBytes;  // kPieces owners: PushRing::failed
  static constexpr int kBytes = kPushFailed + (kPieces ? 16 : 0);
  static constexpr int kDynamicBytes = kBytes + 1024;  // slack for 1024-byte alignment
  static_assert(kDynamicBytes <= 227 * 1024, "shared memory over the sm_90 limit per block");
};

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Byte offset of 16-byte unit `u` (0..7) of row `r` in a 64-row x 64-column
// chunk stored with the TMA 128-byte swizzle.
__device__ __forceinline__ uint32_t sw128_offset(int r, int u) { return r * 128 + ((u ^ (r & 7)) << 4); }

// A consumer's staged half of W columns (64 rows): chunks of 64 columns
// with the 128-byte swizzle; then, where W % 64 >= 32 (160, 112, 48), a
// chunk of 32 columns, 64-byte rows with the TMA 64-byte swizzle (address
// bits 4-5 XOR bits 7-8); then, where W % 32 == 16 (112, 48, 144), one
// of 16 columns, 32-byte rows with the 32-byte swizzle (bit 4 XOR bit 7):
// each narrow chunk stored by its own box. The byte offset of 16-byte unit
// c8 (8 columns) of row r.
template <int W>
__device__ __forceinline__ uint32_t staged_unit_offset(int r, int c8) {
  static_assert(W % 16 == 0, "staged widths: multiples of 16 columns");
  constexpr int kFull = W / 64;
  constexpr bool k32 = W % 64 >= 32;
  if (c8 / 8 < kFull) return (c8 / 8) * 8192 + sw128_offset(r, c8 % 8);
  const int u = c8 - kFull * 8;  // (the unit's place past the full chunks)
  if (k32 && u < 4) return kFull * 8192 + r * 64 + ((u ^ ((r >> 1) & 3)) << 4);
  return kFull * 8192 + (k32 ? 4096 : 0) + r * 32 + (((u - (k32 ? 4 : 0)) ^ ((r >> 2) & 1)) << 4);
}

}  // namespace flashoverlap::kernels
