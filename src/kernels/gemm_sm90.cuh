// gemm_sm90.cuh — the persistent, warp-specialised Hopper GEMM with tile
// signals (device code; host side in gemm_sm90.cu).
//
// CTA = 384 threads: warpgroup 0 is the producer (one thread issues TMA loads
// of 128x64 A and BNx64 B blocks into a STAGES-deep ring guarded by mbarriers;
// another, the storer, issues the TMA stores of finished tiles, waits for
// their completion and signals), warpgroups 1 and 2 are consumers, each
// computing 64 rows x BN of the 128 x BN tile with wgmma m64nBNk16 and
// writing its half to shared memory for the storer.
// Registers are moved from the producer to the consumers with setmaxnreg.
// Tiles are taken in plan::Schedule order: CTA c computes tiles c, c+G, ...
//
// This header holds the kernel itself (producer, MMA main loop, epilogue
// dispatch); the parts it calls are in headers of their own:
//   gemm_smem.cuh         GemmKernelParams, GemmSmem, record_phase, pack2, sw128_offset
//   gemm_staging.cuh      add_pack2, stage_columns, stage_accumulators, stage_piece
//   gemm_pieces.cuh       write_pieces, piece_storer (the 4-stage plain store)
//   gemm_owners.cuh       the owner layout's helpers: owner_tile_at, owner_owns,
//                         owner_pushed_by_tma, push_half, warp_copy_block, owner_push_rows,
//                         owner_count, add_window_partials
//   gemm_owner_warps.cuh  PushRing, owner_piece_storer, owner_pusher, owner_storer,
//                         copy_peer_tiles
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/gemm.h"
#include "kernels/gemm_owner_warps.cuh"
#include "kernels/gemm_owners.cuh"
#include "kernels/gemm_pieces.cuh"
#include "kernels/gemm_scatter.cuh"
#include "kernels/gemm_smem.cuh"
#include "kernels/gemm_staging.cuh"
#include "kernels/ptx.cuh"
#include "kernels/wgmma_ops.cuh"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

// Registers per thread of the producer and of each consumer warpgroup: 4
// stages (the output in pieces) 88 / 208; 3 stages at 128x256 56 / 224; 5
// stages at 128x128 64 / 216 (its accumulators are half as many; FP8 128x112
// alike); FP8 at 128x192, 128x160 and 128x144 40 / 232 (a sum and one part
// each; plain stores only).
template <int BN, bool kPieces, int BM = 128>
constexpr int kProducerRegs = kPieces ? 88 : BN == 256 ? 56 : BM == 128 && BN > 128 ? 40 : 64;
template <int BN, bool kPieces, int BM = 128>
constexpr int kConsumerRegs = kPieces ? 208 : BN == 256 ? 224 : BM == 128 && BN > 128 ? 232 : 216;
// 64-row tiles (one consumer warpgroup, the other down to 24).
constexpr int kConsumerRegsOne = 240;
static_assert(128 * kProducerRegs<144, false, 64> + 128 * 24 + 128 * kConsumerRegsOne <= kGemmThreads * 168,
              "the warpgroups' registers exceed the launch's");
static_assert(128 * kProducerRegs<256, true> + 256 * kConsumerRegs<256, true> <= kGemmThreads * 168 &&
                  128 * kProducerRegs<256, false> + 256 * kConsumerRegs<256, false> <= kGemmThreads * 168 &&
                  128 * kProducerRegs<128, false> + 256 * kConsumerRegs<128, false> <= kGemmThreads * 168 &&
                  128 * kProducerRegs<192, false> + 256 * kConsumerRegs<192, false> <= kGemmThreads * 168,
              "the warpgroups' registers exceed the launch's");

// C = (scale_a * scale_b) applied to an FP8 tile's fp32 accumulators in
// place (Fp8 in gemm.h), each element (acc * sa) * sb as torch's row-wise
// epilogue computes it; rows and columns past C's take scale 0. Per tensor
// the two scales are the caller's (read once, before the main loop).
template <int BN, int BM = 128>
__device__ __forceinline__ void apply_scales(float (&acc)[BN / 2], const Fp8& f, const plan::Schedule& s,
                                             const plan::TileCoord& tc, int cw, int warp, int lane,
                                             float tensor_sa, float tensor_sb) {
  const int32_t row = tc.tm * BM + cw * 64 + warp * 16 + lane / 4, col = tc.tn * BN + 2 * (lane % 4);
  if (f.scales == Scales::PerTensor) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = acc[i] * tensor_sa * tensor_sb;
    return;
  }
  if (f.scales != Scales::RowWise) return;
  const float sa[2] = {row < s.m ? f.scale_a[row] : 0.f, row + 8 < s.m ? f.scale_a[row + 8] : 0.f};
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // (register 4j + 2h + c: row + 8h, column col + 8j + c)
      const int32_t x = col + 8 * j + c;
      const float sb = x < s.n ? f.scale_b[x] : 0.f;
      acc[4 * j + c] = acc[4 * j + c] * sa[0] * sb;
      acc[4 * j + 2 + c] = acc[4 * j + 2 + c] * sa[1] * sb;
    }
}

// Runs body(piece) on each of this CTA's units of work in order: its whole
// tiles (blockIdx.x, + gridDim.x, ...), or with kSplit its stream-K pieces
// (plan/stream_k.h), or with kPairK its cluster's one tile, this CTA's half
// of the k-blocks. Without either the plain loop over tiles, so that those
// kernels compile as they did before stream-K.
template <bool kSplit, bool kPairK = false, class Body>
__device__ __forceinline__ void for_each_piece(const GemmKernelParams& p, int tiles, Body&& body) {
  if constexpr (kPairK) {  // (GemmParams::pair_k: the cluster's tile, this CTA's half of its k-blocks)
    const int32_t half = p.k_blocks / 2, r = int32_t(blockIdx.x % 2);
    body(plan::Piece{int32_t(blockIdx.x / 2), r ? half : 0, r ? p.k_blocks : half, true, false});
  } else if constexpr (kSplit) {
    plan::PieceWalk walk(p.sk, blockIdx.x);
    for (plan::Piece w; walk.next(w);) body(w);
  } else {
    for (int i = blockIdx.x; i < tiles; i += gridDim.x) body(plan::Piece{i, 0, p.k_blocks, true, true});
  }
}

// TIn: the inputs' type (T, or __nv_fp8_e4m3 with T the output's). kSplit:
// stream-K (Plain and slot stores only; its own instantiation, so that the
// kernels without it are unchanged). kPairK: GemmParams::pair_k (FP8; its
// own instantiation too, launched in clusters of two). BM: the tile's rows,
// 128, or 64 (FP8, whole tiles into a plain C: one consumer warpgroup, the
// other idle), for grids of few 128-row tiles.
template <int BN, int STAGES, typename T, bool kPieces = false, bool kWide = false, typename TIn = T,
          bool kSplit = false, bool kPairK = false, int BM_ = 128>
__global__ void __launch_bounds__(kGemmThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                     const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ CUtensorMap tm_w,
                     const __grid_constant__ CUtensorMap tm_p, const __grid_constant__ CUtensorMap tm_q,
                     const GemmKernelParams p) {
  constexpr bool kFp8 = std::is_same_v<TIn, __nv_fp8_e4m3>;
  using L = GemmSmem<BN, STAGES, kPieces, !kFp8, BM_>;  // (FP8: no owner layout, no staging for its copy)
  constexpr int kHalves = BM_ / 64;  // (consumer warpgroups at work: one per 64 rows)
  static_assert(BM_ == 128 || (kFp8 && !kSplit && !kPairK && (BN == 48 || BN == 144)),
                "64-row tiles: FP8 64x48 and 64x144, whole");
  static_assert(!kPieces || BN == 256, "the four-stage plain store is for 128x256 tiles");
  static_assert(!kFp8 || ((BN == 112 || BN == 128 || BN == 144 || BN == 160 || BN == 192 || BM_ == 64) && !kPieces &&
                          !kWide),
                "FP8: 128x112, 128x128, 128x144, 128x160, 128x192, 64x48 or 64x144 tiles");
  static_assert(kFp8 || (BN == 128 || BN == 256), "16-bit inputs: 128x128 and 128x256 tiles");
  static_assert(!kSplit || !kPieces, "stream-K: not with the four-stage store");
  static_assert(!kPairK || (kFp8 && !kSplit), "the pair split: FP8, not with stream-K");
  // 128x192, 128x160, 128x144 and 128x112 (FP8): Plain and slot stores only (no
  // owner layout, no scatter: the host refuses them); 64-row tiles Plain only.
  constexpr bool kExtras = BN == 128 || BN == 256;
  constexpr bool kOwner = kExtras && !kFp8;  // (the host refuses the owner layout with FP8)
  constexpr int BM = L::kBM, BK = 128 / int(sizeof(TIn));  // (a k-block: 128 bytes of each row, any input type)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* empty = full + STAGES;

  uint64_t* c_full = empty + STAGES;  // consumer half h written to shared memory
  uint64_t* c_empty = c_full + 2;      // storer done reading half h
  uint64_t* p_ready = c_empty + 22;    // owner layout: the peer's partial is in half h

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  // The barriers, one per thread (in parallel: where a CTA computes one
  // tile, a set-up by one thread in turn is a share of the launch).
  constexpr int kBarriers = 2 * STAGES + 26;  // full, empty, c_full, c_empty, p_ready
  static_assert(kBarriers == L::kBarCount, "the barriers set up are the ones laid out");
  if (threadIdx.x < kBarriers) {
    const int b = threadIdx.x, push = b - (2 * STAGES + 8);  // (c_empty[6 + push]: the consumer warps' and the push ring's)
    uint32_t count = 1;  // (full: the producer's arrive + the TMA bytes; c_full, c_empty[0..5]: one arrive)
    if (b >= STAGES && b < 2 * STAGES) count = kHalves;  // empty: one arrive per consumer warpgroup
    if (push >= 0 && push < 16) count = kPieces && push >= kPushRing && push < 2 * kPushRing ? 2 : 1;
    // (kPairK: p_ready[0] counts the peer CTA's 128 threads sending this CTA's rows)
    if (b >= 2 * STAGES + 24) count = kPairK ? 128 : 1;
    ptx::mbar_init(full + b, count);
    ptx::fence_barrier_init();
  }
  if constexpr (kPieces)
    if (threadIdx.x == 0) *reinterpret_cast<int32_t*>(smem + L::kPushFailed) = 0;
  // A launch with GemmParams::pdl may start while the kernel before it on
  // the stream still runs: no global memory is touched above this. The next
  // such launch may then be scheduled; its CTAs take SMs only as this grid's
  // leave (one CTA fills an SM's shared memory) and wait here in turn.
  ptx::griddep_wait();
  if (threadIdx.x == 0) ptx::griddep_launch_dependents();
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.owner.claims_reset) *p.owner.claims_reset = 0;
  __syncthreads();
  if constexpr (kPairK) ptx::cluster_sync();  // (the peer's barriers initialised before any arrival on them)

  const int tiles = p.sched.tiles();
  if (threadIdx.x == 0) record_phase(p.monitor_phases, 3);
  if (wg == 0) {
    // The producer warpgroup's registers (setmaxnreg takes multiples of 8;
    // 128 x producer + 256 x consumer <= the launch's 384 x 168 = 64512):
    // what its warps' owner-layout work (the storer's loads and pushes, the
    // copy, 4 loads in flight) needs without spilling, the rest to the
    // consumers' accumulators (kProducerRegs, kConsumerRegs).
    ptx::setmaxnreg_dec<kProducerRegs<BN, kPieces, BM_>>();
    if (tid == 0) {
      // ---------------- producer: TMA loads into the ring ----------------
      ptx::tma_prefetch_desc(&tm_a);
      ptx::tma_prefetch_desc(&tm_b);
      int it = 0;
      for_each_piece<kSplit, kPairK>(p, tiles, [&](const plan::Piece& w) {
        const int i = w.idx;
        const plan::TileCoord tc = p.sched.tile_of(owner_tile_at<kWide>(p.owner, i, tiles));
        if (p.grouped.a_row0 && p.grouped.rows[tc.tm] == 0) return;  // (an empty tile row: skipped by all)
        // (grouped: the tile row's rows of A and its expert's rows of B)
        const int32_t a_row = p.grouped.a_row0 ? p.grouped.a_row0[tc.tm] : tc.tm * BM;
        const int32_t b_row = (p.grouped.a_row0 ? p.grouped.b_row0[tc.tm] : 0) + tc.tn * BN;
        for (int kb = w.kb0; kb < w.kb1; ++kb, ++it) {
          const int s = it % STAGES;
          const uint32_t phase = (it / STAGES) & 1;
          ptx::mbar_wait(&empty[s], phase ^ 1);
          if (kb == w.kb0 && p.monitor_mma) {  // (here, not in the consumers: no registers taken from the MMAs)
            p.monitor_mma[int64_t(i) * 2] = ptx::globaltimer_ns();  // by slot: CTA c's are c, c + ctas, ...
            p.monitor_mma[int64_t(i) * 2 + 1] = ptx::clock_cycles();
          }
          ptx::mbar_arrive_expect_tx(&full[s], L::kABytes + L::kBBytes);
          if (kFp8 && p.l2_hints) {  // (gemm_l2_hints: FP8 only; policies made here: no registers held across the loop)
            ptx::tma_load_2d_hint(smem + L::kA + s * L::kABytes, &tm_a, &full[s], kb * BK, a_row,
                                  ptx::policy_evict_last());
            ptx::tma_load_2d_hint(smem + L::kB + s * L::kBBytes, &tm_b, &full[s], kb * BK, b_row,
                                  ptx::policy_evict_first());
          } else {
            ptx::tma_load_2d(smem + L::kA + s * L::kABytes, &tm_a, &full[s], kb * BK, a_row);
            ptx::tma_load_2d(smem + L::kB + s * L::kBBytes, &tm_b, &full[s], kb * BK, b_row);
          }
        }
      });
    } else if constexpr (kPieces) {
      const PushRing ring{c_empty + 6, c_empty + 6 + kPushRing, reinterpret_cast<int32_t*>(smem + L::kPushFailed)};
      if (tid >= 32 && tid < 64 && p.owner.rank >= 0) {
        owner_piece_storer<T, BN, L::kHalfCBytes, kWide>(p, &tm_c, &tm_w, &tm_p, &tm_q, smem + L::kC, c_full, c_empty,
                                                  p_ready, ring, tiles, tid - 32);
      } else if (tid == 32) {
        piece_storer<BN, L::kHalfCBytes>(p, &tm_c, smem + L::kC, c_full, c_empty, tiles);
      } else if (tid >= 64 && p.owner.rank >= 0) {  // warps 2-3: the owner layout's pushes, then its copy
        if (p.owner.pushers) owner_pusher<T, BN, kWide>(p, ring, tiles, tid / 32 - 2, tid % 32);
        if (p.owner.producers) copy_peer_tiles<T, L::kSumWarpBytes, BN, true, kWide>(p, nullptr, nullptr);
      }
    } else if (tid >= 64 && p.owner.rank >= 0 && p.owner.producers) {
      // ---------------- warps 2-3: the owner layout's copy during the GEMM ----------------
      const int w = tid / 32 - 2;
      if constexpr (kOwner)
        copy_peer_tiles<T, L::kSumWarpBytes, BN>(p, smem + L::kSum + w * L::kSumStageBytes, c_empty + 2 + 2 * w);
    } else if (tid >= 32 && tid < 64 && p.owner.rank >= 0) {
      // ---------------- storer of the owner layout ----------------
      if constexpr (kOwner)
        owner_storer<T, BN, L::kHalfCBytes>(p, &tm_c, &tm_w, smem + L::kC, c_full, c_empty, p_ready, tiles, tid - 32);
    } else if (tid >= 32 && tid < 96 && p.scatter.world > 0) {
      // ---------------- storers of the Scatter: warp 1 + h stores half h ----------------
      if constexpr (kExtras)
        scatter_storer<T, BN>(p, smem + L::kC + (tid / 32 - 1) * L::kHalfCBytes, c_full, c_empty, tiles,
                              tid / 32 - 1, tid % 32);
    } else if (tid == 32 && p.tma_store) {
      // ---------------- storer: TMA stores, completion, signal ----------------
      // Waiting for store completion here, not in a consumer, keeps the
      // tensor cores busy while the tile's data drains to global memory.
      ptx::tma_prefetch_desc(&tm_c);
      const bool plain = p.store == static_cast<int32_t>(Store::Plain);
      const bool grouped = p.grouped.a_row0 != nullptr;
      uint32_t t = 0;  // tiles stored here (grouped: a ragged tile row's tiles are the consumers' to store)
      for_each_piece<kSplit, kPairK>(p, tiles, [&](const plan::Piece& w) {
        if (kSplit && !w.finishes) return;  // (a piece that leaves a partial: nothing to store)
        const int idx = w.idx;
        const plan::TileCoord tc = p.sched.tile_of(idx);
        if (grouped && p.grouped.rows[tc.tm] < BM) return;
        // Plain: rows of C (grouped: its tile row's rows of A); SlotTiles: rows idx*BM.. of the slot buffer.
        const int32_t row = plain ? (grouped ? p.grouped.a_row0[tc.tm] : tc.tm * BM) : idx * BM;
        const int32_t col = plain ? tc.tn * BN : 0;
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          if (kPairK && h != int(blockIdx.x % 2)) continue;  // (the peer CTA stores that half)
          ptx::mbar_wait(&c_full[h], t & 1);
          if (h == kHalves - 1 && idx + int32_t(gridDim.x) >= tiles) record_phase(p.monitor_phases, 0);
          const uint8_t* half = smem + L::kC + h * L::kHalfCBytes;
          const int32_t hrow = p.half_row ? p.half_row[idx * 2 + h] : row + h * 64;
#pragma unroll
          for (int c = 0; c < BN / 64; ++c) ptx::tma_store_2d(&tm_c, half + c * 8192, col + c * 64, hrow);
          // Past the 64-column chunks: 32 columns by a map of 32-column boxes,
          // passed as tm_w (128x160, 128x112, 64x48), then 16 by a map of
          // 16-column boxes, passed as tm_p (128x112, 64x48, 64x144).
          if constexpr (BN % 64 >= 32) ptx::tma_store_2d(&tm_w, half + (BN / 64) * 8192, col + (BN / 64) * 64, hrow);
          if constexpr (BN % 32 == 16)
            ptx::tma_store_2d(&tm_p, half + (BN / 64) * 8192 + (BN % 64 >= 32 ? 4096 : 0), col + BN - 16, hrow);
          ptx::tma_store_commit();
        }
        ptx::tma_store_wait_read();
#pragma unroll
        for (int h = 0; h < kHalves; ++h) ptx::mbar_arrive(&c_empty[h]);
        if (p.counters || p.monitor_ns) {
          ptx::tma_store_wait_all();        // the tile is complete in global memory,
          ptx::fence_proxy_async_global();  // ordered before the generic-proxy release
          if (p.counters) ptx::red_release_gpu_add(p.counters + p.group_of_tile[idx], 2);
          if (p.monitor_ns) {
            const uint64_t now = ptx::globaltimer_ns();
            p.monitor_ns[int64_t(idx) * 2] = now;
            p.monitor_ns[int64_t(idx) * 2 + 1] = now;
            p.monitor_sm[idx] = ptx::smid();
          }
        }
        ++t;
      });
      // The CTA may leave once its stores have read shared memory; the
      // launch's end makes their writes visible. The trace waits for them.
      if (p.monitor_phases) {
        ptx::tma_store_wait_all();
        record_phase(p.monitor_phases, 1);
      } else {
        ptx::tma_store_wait_read();
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  if constexpr (kHalves == 1) {
    // 64-row tiles: warpgroup 2 idles and gives up its registers, so that
    // warpgroup 1 holds two parts beside its sum at any width (no drain at
    // each promotion, which no other warpgroup would cover).
    if (wg == 2) {
      ptx::setmaxnreg_dec<24>();
      return;
    }
    ptx::setmaxnreg_inc<kConsumerRegsOne>();
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs<BN, kPieces, BM_>>();
  }
  const int cw = wg - 1;  // this warpgroup computes tile rows [cw*64, cw*64+64)
  const int warp = tid / 32, lane = tid % 32;
  // Per tensor: the scales read while the first k-block loads, not after
  // the last MMAs (a launch of one tile a CTA would wait for them there).
  float tensor_sa = 0.f, tensor_sb = 0.f;
  if constexpr (kFp8)
    if (p.fp8.scales == Scales::PerTensor) tensor_sa = p.fp8.scale_a[0], tensor_sb = p.fp8.scale_b[0];
  uint8_t* my_c = smem + L::kC + cw * L::kHalfCBytes;  // (laid out as staged_unit_offset<BN>)
  const uint32_t my_c_addr = ptx::smem_addr(my_c);

  float acc[BN / 2];
  int it = 0;
  uint32_t t = 0, owned_tiles = 0;
  uint32_t tt = 0;  // tiles handed to the storer (c_empty[cw]'s phases): all but the grouped GEMM's ragged ones
  for_each_piece<kSplit, kPairK>(p, tiles, [&](const plan::Piece& w) {
    ++t;
    const int i = w.idx;
    const int idx = owner_tile_at<kWide>(p.owner, i, tiles);
    const plan::TileCoord tc = p.sched.tile_of(idx);
    if (p.grouped.a_row0 && p.grouped.rows[tc.tm] == 0) return;  // (an empty tile row: skipped by all)

    // Main loop: one wgmma batch (4 x k16) per stage; keep one batch in
    // flight and release a stage once the batch that read it has retired.
#if defined(FO_FAULT_SKIP_KBLOCK)
    // test-only fault (FO_TEST_FAULT=skip_kblock): see scripts/gpu_all.sh faults.
    // Tile 1 of the schedule (0 if it is the only one) is computed without
    // the MMAs of its k-block 1 (0 if it has one only; its accumulators are
    // then zeroed below). Every barrier wait and arrive, wgmma fence, commit
    // and wait still happens (a commit of no wgmma is an empty group; ptxas
    // adds a wgmma fence where the paths join: info C7519, no serialisation).
    const int fault_kb = idx == (tiles > 1 ? 1 : 0) ? (p.k_blocks > 1 ? 1 : 0) : -1;
#endif
    if constexpr (kFp8) {
      // A part sum of the MMAs (the tensor cores keep ~14 bits while they
      // sum), added into acc in fp32: the promotion. 128x128 and 128x112:
      // two parts in turn, each of one k-block, as 64x144; 64x48: two parts
      // of two k-blocks; 128x144, 128x160 and 128x192: one part of two (below).
      auto issue = [&](int at, float(&part)[BN / 2], bool add = false) {
        const int s = at % STAGES;
        ptx::mbar_wait(&full[s], (at / STAGES) & 1);
        ptx::wgmma_fence();
        const uint64_t da = ptx::smem_desc_sw128(smem + L::kA + s * L::kABytes + cw * 64 * 128);
        const uint64_t db = ptx::smem_desc_sw128(smem + L::kB + s * L::kBBytes);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // +32 bytes along K each
          ptx::Wgmma<BN, TIn>::mma(part, da + 2 * kk, db + 2 * kk, kk > 0 || add ? 1 : 0);
        ptx::wgmma_commit();
      };
      auto release = [&](int at) {
        if (tid == 0) ptx::mbar_arrive(&empty[at % STAGES]);
      };
      // (acc from zero, not a copy of the first part: a copy lets the
      // compiler give acc the part's registers, which the next MMAs write.)
      auto add = [&](const float(&part)[BN / 2]) {
#pragma unroll
        for (int e = 0; e < BN / 2; ++e) acc[e] += part[e];
      };
      // k-block kb's MMAs (into part) done: its stage released, part added.
      auto promote = [&](int at, const float(&part)[BN / 2]) {
        release(at);
        add(part);
      };
#pragma unroll
      for (int e = 0; e < BN / 2; ++e) acc[e] = 0.f;
      const int kbs = w.kb1 - w.kb0;
      // (trace) the CTA's first k-block in shared memory: the pipeline's fill.
      // Slot 2 is stream-K's "partial put"; whole tiles leave it free.
      if (!kSplit && p.monitor_phases && tid == 0 && cw == 0 && i == int(blockIdx.x)) {
        ptx::mbar_wait(&full[it % STAGES], (it / STAGES) & 1);
        record_phase(p.monitor_phases, 2);
      }
      if constexpr (BN > 128 && kHalves == 2) {
        // One part (BN / 2 registers beside acc's: no room for a second), so
        // the tensor cores drain while it is promoted; summing two k-blocks
        // per part halves those drains.
        float part[BN / 2];
        for (int kb = 0; kb < kbs; kb += 2) {
          issue(it + kb, part);
          if (kb + 1 < kbs) {
            issue(it + kb + 1, part, true);
            ptx::wgmma_wait<1>();
            release(it + kb);
            ptx::wgmma_wait<0>();
            release(it + kb + 1);
          } else {
            ptx::wgmma_wait<0>();
            release(it + kb);
          }
          add(part);
        }
      } else {
        // Two parts: the next part's MMAs are issued before this one's are
        // waited for, so the tensor cores do not drain at every promotion.
        // A part sums kPer k-blocks, each its own commit group: one, but two
        // at 64 x 48, where one warpgroup's k-block of MMAs is too short to
        // cover the next issue and a promotion. part0 holds k-blocks kb..
        // in flight at the top of each turn; with kPer = 2 and kbs odd, the
        // first part holds k-block 0 alone (kb = -1) beside an empty group.
        constexpr int kPer = kHalves == 1 && BN == 48 ? 2 : 1;
        float part0[BN / 2], part1[BN / 2];
        auto issue_part = [&](int at, float(&part)[BN / 2]) {
          issue(at, part);
          if constexpr (kPer == 2) issue(at + 1, part, true);
        };
        auto promote_part = [&](int at, const float(&part)[BN / 2]) {
          if constexpr (kPer == 2) {
            if (at >= it) release(at);
            release(at + 1);
            add(part);
          } else {
            promote(at, part);
          }
        };
        int kb = 0;
        if (kPer == 2 && kbs % 2 == 1) {
          issue(it, part0);
          ptx::wgmma_commit();
          kb = -1;
        } else {
          issue_part(it, part0);
        }
        for (; kb + 3 * kPer <= kbs; kb += 2 * kPer) {
          issue_part(it + kb + kPer, part1);
          ptx::wgmma_wait<kPer>();
          promote_part(it + kb, part0);
          issue_part(it + kb + 2 * kPer, part0);
          ptx::wgmma_wait<kPer>();
          promote_part(it + kb + kPer, part1);
        }
        if (kb + kPer < kbs) {
          issue_part(it + kb + kPer, part1);
          ptx::wgmma_wait<kPer>();
          promote_part(it + kb, part0);
          ptx::wgmma_wait<0>();
          promote_part(it + kb + kPer, part1);
        } else {
          ptx::wgmma_wait<0>();
          promote_part(it + kb, part0);
        }
      }
      it += kbs;
    } else {
    int prev = -1;
    for (int kb = 0; kb < w.kb1 - w.kb0; ++kb, ++it) {
      const int s = it % STAGES;
      ptx::mbar_wait(&full[s], (it / STAGES) & 1);
      ptx::wgmma_fence();
      const uint64_t da = ptx::smem_desc_sw128(smem + L::kA + s * L::kABytes + cw * 64 * 128);
      const uint64_t db = ptx::smem_desc_sw128(smem + L::kB + s * L::kBBytes);
#if defined(FO_FAULT_SKIP_KBLOCK)
      if (kb != fault_kb)  // test-only fault (FO_TEST_FAULT=skip_kblock): see scripts/gpu_all.sh faults
#endif
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)  // +32 bytes along K = +2 in the descriptor
        ptx::Wgmma<BN, TIn>::mma(acc, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
      ptx::wgmma_commit();
      if (prev >= 0) {
        ptx::wgmma_wait<1>();
        if (tid == 0) ptx::mbar_arrive(&empty[prev]);
      }
      prev = s;
    }
    ptx::wgmma_wait<0>();
    if (tid == 0) ptx::mbar_arrive(&empty[prev]);
#if defined(FO_FAULT_SKIP_KBLOCK)
    if (fault_kb == 0) {  // test-only fault (FO_TEST_FAULT=skip_kblock): see scripts/gpu_all.sh faults
#pragma unroll
      for (int e = 0; e < BN / 2; ++e) acc[e] = 0.f;  // (its only k-block skipped: no MMA wrote them)
    }
#endif
    }  // (not kFp8)
    if constexpr (kPairK) {
      // The tile's rows are split between the pair: this CTA (rank r) stores
      // warpgroup r's half, summed with the peer's partial of it, which
      // arrives in this CTA's C staging area (64 x BN fp32: the area's size;
      // unused until the epilogue: one tile a CTA). Warpgroup 1 - r sends
      // its partial there in the peer. Each thread's values go to the same
      // thread's place (the same fragment layout): 16 bytes, unit j at
      // (j x 128 + tid) x 16.
      const uint32_t r = blockIdx.x % 2, area = ptx::smem_addr(smem + L::kC);
      if (cw != int(r)) {
        const uint32_t dst = ptx::map_to_rank(area, r ^ 1);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
          ptx::st_cluster_v4(dst + uint32_t(j * 128 + tid) * 16, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2],
                             acc[4 * j + 3]);
        ptx::mbar_arrive_remote(ptx::map_to_rank(ptx::smem_addr(&p_ready[0]), r ^ 1));
        return;
      }
      ptx::mbar_wait_cluster(&p_ready[0], 0);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(smem + L::kC + (j * 128 + tid) * 16);
        acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
      }
      ptx::named_barrier_sync(1 + cw, 128);  // (every read of the area before the staging below writes it)
    }
    if constexpr (kSplit) {
      if (!w.finishes) {  // (a stream-K piece after the tile's first: its sums to the finisher)
        put_partial<BN>(acc, p.sk_work, blockIdx.x, cw, tid);
        if (p.monitor_phases && tid == 0 && cw == 0) record_phase(p.monitor_phases, 2);  // (trace) partial out
        return;
      }
      if (!w.whole) {  // (the tile's other pieces in k order: CTA - 1's first)
        if (p.monitor_phases && tid == 0 && cw == 0) record_phase(p.monitor_phases, 4);  // (trace) own MMAs done
        add_partials<BN>(acc, p.sk_work, p.sk, blockIdx.x, p.sk.contributors(idx, blockIdx.x), cw, tid);
      }
    }
    if constexpr (kFp8) apply_scales<BN, BM>(acc, p.fp8, p.sched, tc, cw, warp, lane, tensor_sa, tensor_sb);  // (after the pieces' sum)
    if (p.monitor_phases && tid == 0 && cw == 0) {  // (trace) the MMAs of the CTA's first and last tile done
      if (!kSplit && i == int(blockIdx.x)) record_phase(p.monitor_phases, 4);
      if (i + int(gridDim.x) >= tiles) record_phase(p.monitor_phases, 5);
    }

    if constexpr (kPieces) {  // the output in two pieces (piece_storer, owner_piece_storer)
      if constexpr (kWide)
        if (owner_owns<true>(p.owner, idx)) {  // slots 1..world-2 of the window, before staging
          const volatile int32_t* failed = reinterpret_cast<const volatile int32_t*>(smem + L::kPushFailed);
          const bool arrived = add_window_partials<T, 0>(acc, p, idx, cw, warp, lane, failed);
          add_window_partials<T, 1>(acc, p, idx, cw, warp, lane, failed, arrived);
        }
      write_pieces<T>(acc, my_c_addr, &c_full[cw], &c_empty[cw], &p_ready[cw], owner_owns<kWide>(p.owner, idx),
                      owned_tiles, tid, warp, lane, cw);
    } else {  // (the rest of the loop body is compiled without kPieces only)

    // Epilogue. (1) my_c must be free: the storer has read the last half
    // handed to it (TMA path), and every thread of this warpgroup is done
    // with it (rows path). The grouped GEMM's ragged tile rows of a Plain C
    // take the rows path beside TMA tiles, so it takes both.
    const bool grouped = p.grouped.a_row0 != nullptr;
    const bool mixed = grouped && p.tma_store && p.store == static_cast<int32_t>(Store::Plain);
    const bool rows_tile = !p.tma_store || (mixed && p.grouped.rows[tc.tm] < BM);
    if (p.tma_store) ptx::mbar_wait(&c_empty[cw], (tt & 1) ^ 1);
    if (!p.tma_store || mixed) ptx::named_barrier_sync(1 + cw, 128);

    // (2) Accumulators -> shared memory (stage_accumulators); a tile this
    // rank owns (owner layout) once the peer's partial is loaded there.
    if (kOwner && owner_owns(p.owner, idx)) {
      ptx::mbar_wait(&p_ready[cw], owned_tiles & 1);
      ++owned_tiles;
      stage_accumulators<T, BN, true>(acc, my_c_addr, warp, lane);
    } else {
      stage_accumulators<T, BN, false>(acc, my_c_addr, warp, lane);
    }

    if (!rows_tile) {
      // (3) Hand the half to the storer warp.
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(1 + cw, 128);
      if (tid == 0) ptx::mbar_arrive(&c_full[cw]);
      ++tt;
      return;
    }

    // (3') Rows epilogue: 16-byte units, consecutive threads along a row.
    ptx::named_barrier_sync(1 + cw, 128);
    constexpr int kUnits = BN / 8;
    // Plain C: the tile's rows of C and how many of them exist (grouped: its tile row's rows of A).
    const int32_t row0 = grouped ? p.grouped.a_row0[tc.tm] : tc.tm * BM;
    const int32_t nrows = grouped ? p.grouped.rows[tc.tm] : p.sched.m - tc.tm * BM;
    for (int i = tid; i < 64 * kUnits; i += 128) {
      const int r = i / kUnits, c8 = i % kUnits;
      const uint4 v = *reinterpret_cast<const uint4*>(my_c + staged_unit_offset<BN>(r, c8));
      const int tr = cw * 64 + r;  // row inside the tile
      if (p.row_of) {
        const int32_t dst = p.row_of[static_cast<int64_t>(idx) * BM + tr];
        if (dst >= 0) {
          *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + int64_t(dst) * BN + c8 * 8) = v;
        }
      } else {
        const int32_t gcol = tc.tn * BN + c8 * 8;
        if (tr < nrows && gcol < p.sched.n) {
          T* dst = static_cast<T*>(p.out) + int64_t(row0 + tr) * p.ld_out + gcol;
          const int valid = p.sched.n - gcol < 8 ? p.sched.n - gcol : 8;
          if (valid == 8 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {  // (the grouped GEMM's C: most units)
            *reinterpret_cast<uint4*>(dst) = v;
          } else {
            const T* src = reinterpret_cast<const T*>(&v);
            for (int e = 0; e < valid; ++e) dst[e] = src[e];
          }
        }
      }
    }
    if (p.counters || p.monitor_ns) {
      // Every thread's stores, then one release for the half (cumulative
      // over the barrier).
      __threadfence();
      ptx::named_barrier_sync(1 + cw, 128);
      if (tid == 0) {
        if (p.counters) ptx::red_release_gpu_add(p.counters + p.group_of_tile[idx], 1);
        if (p.monitor_ns) {
          p.monitor_ns[int64_t(idx) * 2 + cw] = ptx::globaltimer_ns();
          if (cw == 0) p.monitor_sm[idx] = ptx::smid();
        }
      }
    }
    }  // (not kPieces)
  });

  // The consumer warps join the owner layout's copy once the storer has
  // read this warpgroup's last half tile: my_c becomes 4 staging buffers,
  // one per warp.
  if constexpr (kPieces) {
    // The owner layout's copy, through registers (no shared memory).
    if (p.owner.rank >= 0) copy_peer_tiles<T, L::kSumWarpBytes, BN, true, kWide>(p, nullptr, nullptr);
  } else {
    if (kOwner && p.owner.rank >= 0) {
      ptx::mbar_wait(&c_empty[cw], (t & 1) ^ 1);
      if constexpr (kOwner)
        copy_peer_tiles<T, L::kSumWarpBytes, BN>(p, my_c + warp * L::kSumWarpBytes,
                                                 c_empty + 6 + (cw * 4 + warp) * 2);
    }
  }
}

}  // namespace flashoverlap::kernels
