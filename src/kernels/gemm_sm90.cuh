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
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/gemm.h"
#include "kernels/ptx.cuh"
#include "kernels/wait.cuh"
#include "kernels/wgmma_ops.cuh"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

// Everything the kernel needs besides the tensor maps, passed by value.
struct GemmKernelParams {
  plan::Schedule sched;
  int32_t k_blocks;
  int32_t store;           // Store
  bool tma_store;          // epilogue via TMA (Plain with aligned C, SlotTiles)
  void* out;               // rows epilogue: C (Plain) or the slot buffer (SlotRows)
  int64_t ld_out;          // elements per output row (also of the peers' buffers when pushing)
  const int32_t* row_of;   // SlotRows
  const int32_t* row_shift;  // Plain / SlotTiles: per group, added to the tile's rows
  uint32_t* counters;
  const int32_t* group_of_tile;
  FusedSum sum;
  Push push;
  uint64_t* monitor_ns;
  uint32_t* monitor_sm;
  uint64_t* monitor_mma;
  uint64_t* monitor_phases;  // GemmParams::monitor_phases
  Owner owner;
};

// Trace (GemmParams::monitor_phases): phase `ph` of this CTA ends now.
__device__ __forceinline__ void record_phase(uint64_t* phases, int ph) {
  if (phases) atomicMax(reinterpret_cast<unsigned long long*>(phases + int64_t(blockIdx.x) * kPhaseSlots + ph),
                        static_cast<unsigned long long>(ptx::globaltimer_ns()));
}

// kPieces: the plain store with 4 stages (gemm.h: GemmParams::four_stages):
// each consumer stages its output half in two pieces of 128 columns, one
// after the other, in 16 KB instead of 32 KB; no buffers for the sums.
template <int BN, int STAGES, bool kPieces = false>
struct GemmSmem {
  static constexpr int kBM = 128, kBK = 64;
  static constexpr int kABytes = kBM * kBK * 2;        // one stage of A
  static constexpr int kBBytes = BN * kBK * 2;         // one stage of B
  static constexpr int kHalfCBytes = 64 * (kPieces ? 128 : BN) * 2;  // one consumer's output half (a piece)
  static constexpr int kA = 0;
  static constexpr int kB = kA + STAGES * kABytes;
  static constexpr int kC = kB + STAGES * kBBytes;
  static constexpr int kBars = kC + 2 * kHalfCBytes;
  // ring, C halves, 2 buffers of each producer sum warp, 2 of each consumer warp
  // (+2: the owner layout's peer partial loaded into each C half)
  static constexpr int kBarCount = 2 * STAGES + 4 + 4 + 16 + 2;
  // Staging of the fused sum (gathered and pushed layouts): 8 KB per producer sum warp.
  static constexpr int kSumStageBytes = kPieces ? 0 : 8192;
  // What each summing warp stages (producer or consumer; the same for all, as
  // claimed chunks must be the same size): a consumer warp uses a quarter of
  // its half of C.
  static constexpr int kSumWarpBytes =
      kPieces ? kHalfCBytes / 4 : (kHalfCBytes / 4 < kSumStageBytes ? kHalfCBytes / 4 : kSumStageBytes);
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

// The FusedSum of gemm.h by one warp (`warp` of `warps` across the grid):
// chunks of a group's rows, every rank's part brought into shared memory by
// the bulk-copy engine (no registers held while loads are in flight: this
// runs under the producer warpgroup's 40 registers), double-buffered (the
// next chunk loads while this one is summed), summed by the lanes in rank
// order and stored with 16-byte stores. Lane 0 polls the group's ready flag
// (bounded, with backoff). Needs n % 8 == 0 and, for rows, ld_out == n;
// for tiles, 16-byte aligned output rows (host-checked).
template <typename T, int kStageBytes, int BN>
__device__ __forceinline__ void fused_sum_rows(const FusedSum f, const plan::Schedule& s, uint8_t* stage,
                                               uint64_t* bars, int32_t warp, int32_t warps) {
  const int32_t n = f.tiles ? s.bn : s.n;  // elements per row of a block
  const int lane = threadIdx.x % 32;
  constexpr int kBufBytes = kStageBytes / 2;
  // Elements per rank per chunk: a power of two (>= 8), so that a chunk of
  // tile slots never straddles two tiles (bm x BN elements each).
  int32_t chunk = 8;
  while (chunk * 2 * 2 * f.world <= kBufBytes) chunk *= 2;
  const T* src = static_cast<const T*>(f.gathered);
  T* out = static_cast<T*>(f.out);
  uint32_t phases = 0;  // bit b: parity of buffer b's next completion
  for (int32_t g = 0; g < f.groups; ++g) {
    const SumGroup sg = f.table[g];
    int ok = 1;
    if (lane == 0) {  // failed = 2: a group's blocks did not all arrive
      ok = wait_group_ready<64, 1024>(f.ready, f.peer_ready, f.world, f.rank, g, f.epoch * sg.per_epoch, f.epoch,
                                      f.timeout_ns, f.err);
      ptx::fence_proxy_async_global();  // the bulk copies below read what the flag released
    }
    if (!__shfl_sync(0xffffffffu, ok, 0)) return;
    const T* gsrc = src + sg.src_row * n;
    T* gout = out + int64_t(sg.row0) * n;
    const int32_t elems = sg.rows * (f.tiles ? s.bm * s.bn : n);  // < 2^31: host-checked
    auto issue = [&](int32_t c0, int b) {
      if (lane != 0) return;
      const int32_t cnt = elems - c0 < chunk ? elems - c0 : chunk;
      ptx::fence_proxy_async_smem();  // the lanes' reads of this buffer before the copies overwrite it
      ptx::mbar_arrive_expect_tx(bars + b, uint32_t(cnt) * 2 * f.world);
      const T* from = gsrc + c0;
      for (int32_t w = 0; w < f.world; ++w, from += sg.block_rows * n)
        ptx::bulk_load(stage + b * kBufBytes + w * chunk * 2, from, uint32_t(cnt) * 2, bars + b);
    };
    // The chunk after `prev` (-1: the first): fixed, or claimed.
    const int32_t chunks = (elems + chunk - 1) / chunk;
    auto next = [&](int32_t prev) -> int32_t {
      if (!f.claims) return prev < 0 ? warp : prev + warps;
      uint32_t c = 0;
      if (lane == 0) c = atomicAdd(f.claims + g, 1u);
      c = __shfl_sync(0xffffffffu, c, 0);
      return c < uint32_t(chunks) ? int32_t(c) : chunks;
    };
    int b = 0;
    int32_t cur = next(-1);
    if (cur < chunks) issue(cur * chunk, b);
    for (; cur < chunks; b ^= 1) {
      const int32_t c0 = cur * chunk;
      cur = next(cur);
      if (cur < chunks) issue(cur * chunk, b ^ 1);
      ptx::mbar_wait(bars + b, (phases >> b) & 1);
      phases ^= 1u << b;
      const int32_t cnt = elems - c0 < chunk ? elems - c0 : chunk;
      const uint8_t* buf = stage + b * kBufBytes;
      T* dst0 = gout + c0;  // rows: contiguous; tiles: the chunk's first element's place in C
      int32_t rows_left = 0, cols_left = 0;
      if (f.tiles) {  // one tile per chunk: its place once, then shifts (BN is a power of two)
        constexpr int32_t kTileElems = 128 * BN;
        const int32_t t = c0 / kTileElems, w0 = c0 - t * kTileElems;
        const plan::TileCoord tc = s.tile_of(sg.row0 + t);
        const int32_t r0 = w0 / BN;  // chunks start at whole rows (chunk >= BN or divides it)
        dst0 = out + int64_t(tc.tm * 128 + r0) * f.ld_out + tc.tn * BN + (w0 - r0 * BN);
        rows_left = s.m - (tc.tm * 128 + r0), cols_left = s.n - tc.tn * BN;
      }
      for (int32_t u = lane * 8; u < cnt; u += 32 * 8) {
        uint4 r;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // two halves of 4: few live registers
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
          for (int32_t w = 0; w < f.world; ++w) {
            const uint2 v = *reinterpret_cast<const uint2*>(buf + (w * chunk + u + 4 * h) * 2);
            const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[i] += static_cast<float>(e[i]);
          }
          T* e = reinterpret_cast<T*>(&r) + 4 * h;
#pragma unroll
          for (int i = 0; i < 4; ++i) e[i] = T(acc[i]);
        }
        if (!f.tiles) {
          *reinterpret_cast<uint4*>(dst0 + u) = r;
        } else {
          const int32_t dr = u / BN, dc = u % BN;  // from the chunk's first element (column 0 of a row if chunk >= BN)
          if (dr < rows_left && dc + (c0 % BN) < cols_left)
            *reinterpret_cast<uint4*>(dst0 + int64_t(dr) * f.ld_out + dc) = r;
        }
      }
      __syncwarp();
    }
  }
}

// One 64 x BN half of a finished tile (in shared memory, TMA's 128-byte
// swizzle) copied by one warp to rows [row, row+64), columns [col, col+BN) of
// every peer's buffer (ld elements per row), 16 bytes per lane per row step
// (a whole 512-byte row of 256 columns per warp instruction); columns from n
// on are not stored.
template <typename T, int BN>
__device__ __forceinline__ void push_half(const uint8_t* half, const Push& push, int64_t ld, int32_t row, int32_t col,
                                          int32_t n, int lane) {
  constexpr int kUnits = BN / 8;  // 16-byte units per row
  for (int j = 0; j < push.peers; ++j) {
    T* dst = static_cast<T*>(push.peer_c[j]) + int64_t(row) * ld + col;
#pragma unroll 2
    for (int i = lane; i < 64 * kUnits; i += 32) {
      const int r = i / kUnits, c8 = i % kUnits;
      if (col + c8 * 8 >= n) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(half + (c8 / 8) * 8192 + sw128_offset(r, c8 % 8));
      *reinterpret_cast<uint4*>(dst + int64_t(r) * ld + c8 * 8) = v;
    }
  }
}

// The owner layout's waits for a tile's flag (the peer's partial, or its
// final) sleep at most this long between polls (the flags are in this GPU's
// memory: a poll costs no NVLink traffic). 256 ns measured the same as 1024
// (the traced call's end within 1 us on 1024x8192x8192 and 4096^3, 3 rounds).
constexpr uint32_t kOwnerPollMaxNs = 1024;

// The owner layout (gemm.h: Owner): rank r's i-th tile slot holds tile
// (i + rot) mod tiles, rot = split on rank 1, so that each rank walks the
// tiles it does not own first. (Read from the kernel's parameters each time:
// no registers held beside the accumulators.)
// kWide: the kernel for more than 2 ranks (Owner::world; a template of its
// own, so that the 2-rank kernel's code is what it was).
template <bool kWide = false>
__device__ __forceinline__ int32_t owner_tile_at(const Owner& o, int32_t i, int32_t tiles) {
  const int32_t j = kWide ? i + o.own_end : o.rank == 1 ? i + o.split : i;  // (owner_walk_tile)
  return j >= tiles ? j - tiles : j;
}
template <bool kWide = false>
__device__ __forceinline__ bool owner_owns(const Owner& o, int32_t idx) {
  if constexpr (kWide) return idx >= o.own_begin && idx < o.own_end;
  return o.rank >= 0 && (o.rank == 0) == (idx >= o.split);
}
// Owner::push_tma: whether a tile (`last`: the CTA's last) goes to the peer
// by TMA from the staged pieces (owner_piece_storer) rather than from C by
// the pusher warps (owner_pusher): the two must agree tile by tile.
__device__ __forceinline__ bool owner_pushed_by_tma(const Owner& o, bool last) {
  return o.push_tma == 2 || (o.push_tma == 1 && last);
}

// T(x) + peer in each of 2 lanes, the exact sum rounded once: a 2-rank sum
// of the rounded partials, as NCCL's (a + b commutes). One packed add
// (add.rn.{bf16,f16}x2), the same bits as adding in fp32 and rounding that
// (fp32's 24 bits >= 2 x 11 + 2: rounding twice is innocuous for a sum), at a
// quarter of the instructions: the consumers' epilogue of a tile they own,
// where the tensor cores wait, ran ~1% of the owner kernel's time in these.
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
// j = kJ0.., chunk (j - kJ0) / 8 of 64 columns), stage_accumulators for all,
// stage_piece for a piece of 128 (kPieces).
template <typename T, int kJ0, int kJn, bool kAddPeer, int N>
__device__ __forceinline__ void stage_columns(const float (&acc)[N], uint32_t my_c_addr, int warp, int lane) {
#pragma unroll
  for (int j = kJ0; j < kJ0 + kJn; ++j) {
    const int chunk = (j - kJ0) / 8, u = j % 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + lane / 4 + 8 * h;
      const uint32_t addr = my_c_addr + chunk * 8192 + sw128_offset(r, u) + (lane % 4) * 4;
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
// (signalling: the NCCL and gathered layouts) it then waits for the tile's
// stores to complete and adds 2 to its group's counter, as the 3-stage
// storer does (the consumers are by then in the next tile's mainloop);
// row_shift moves the tile's rows as there.
template <int BN, int kPieceBytes>
__device__ __forceinline__ void piece_storer(const GemmKernelParams& p, const CUtensorMap* tm_c, uint8_t* c_smem,
                                             uint64_t* c_full, uint64_t* c_empty, int32_t tiles) {
  ptx::tma_prefetch_desc(tm_c);
  for (int32_t idx = blockIdx.x; idx < tiles; idx += gridDim.x) {
    const plan::TileCoord tc = p.sched.tile_of(idx);
    const int32_t shift = p.row_shift ? p.row_shift[p.group_of_tile[idx]] : 0;
    const int32_t row = tc.tm * 128 + shift, col = tc.tn * BN;
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

// One warp copies a block of nrows rows x `units` 16-byte units (of kUnits
// per row: the lanes' layout) from src (src_ld elements per row) to dst
// (dst_ld), kInFlight loads per lane in flight before their stores (so src
// and dst may alias unit for unit). L2 loads (.cg): the data was written by
// another SM or GPU.
template <typename T, int kUnits, int kInFlight>
__device__ __forceinline__ void warp_copy_block(const T* src, int64_t src_ld, T* dst, int64_t dst_ld, int nrows,
                                                int units, int lane) {
  const int total = nrows * kUnits;
  for (int base = lane; base < total; base += 32 * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int x = 0; x < kInFlight; ++x) {
      const int u = base + 32 * x;
      if (u < total && u % kUnits < units)
        v[x] = __ldcg(reinterpret_cast<const uint4*>(src + int64_t(u / kUnits) * src_ld + (u % kUnits) * 8));
    }
#pragma unroll
    for (int x = 0; x < kInFlight; ++x) {
      const int u = base + 32 * x;
      if (u < total && u % kUnits < units)
        *reinterpret_cast<uint4*>(dst + int64_t(u / kUnits) * dst_ld + (u % kUnits) * 8) = v[x];
    }
  }
}

// The owner layout with kPieces: one warp pushes rows [r0, r0 + rows) of
// tile idx from C, where it sits in L2, to the peer: a final
// into the peer's C (Owner::finals_in_c), else into its window from row0
// (rows < m), 16-byte loads and stores, then a system fence for the count
// that follows. After a timed-out wait (failed), a tile this rank owns is
// neither stored into the peer's C nor counted there (finals_in_c): the
// peer's caller buffer is only written by calls that have reached it, and
// the peer's own bounded wait reports the failure. Returns that withholding.
template <typename T, int BN, bool kWorld = false>
__device__ __forceinline__ bool owner_push_rows(const GemmKernelParams& p, int32_t idx, int32_t r0, int32_t rows,
                                                bool failed, int lane) {
  const Owner& o = p.owner;
  const plan::Schedule& s = p.sched;
  const plan::TileCoord tc = s.tile_of(idx);
  const bool own = owner_owns<kWorld>(o, idx);
  const bool to_c = own && o.finals_in_c;  // (a final into the other ranks' C)
  const bool withhold = to_c && failed;
  const int32_t row = tc.tm * 128 + r0, col = tc.tn * BN;
  const int32_t nrows = min(rows, s.m - row), units = min(BN, s.n - col) / 8;
  const T* src = static_cast<const T*>(p.out) + int64_t(row) * p.ld_out + col;
  if constexpr (!kWorld) {
    if (!withhold && nrows > 0 && !(o.diag_no_final_bytes && own)) {
      const int64_t dst_ld = to_c ? o.peer_ld : s.n;
      T* dst = to_c ? static_cast<T*>(o.peer_out) + int64_t(row) * dst_ld + col
                    : static_cast<T*>(p.push.peer_c[0]) + int64_t(o.row0 + row) * s.n + col;
      warp_copy_block<T, BN / 8, 4>(src, p.ld_out, dst, dst_ld, nrows, units, lane);  // (dst and src may alias)
    }
  } else if (!withhold && nrows > 0) {  // Owner::world: a final to every other rank, a partial to its owner
    const int32_t owner = owner_of_tile(idx, s.tiles(), o.world);
    const int32_t targets = own ? (o.diag_no_final_bytes ? 0 : o.world - 1) : 1;
    for (int32_t k = 1; k <= targets; ++k) {
      const int32_t t = own ? (o.rank + k) % o.world : owner;
      const int32_t slot = own ? 0 : owner_slot_of_sender(o.rank, owner, o.world);
      const int64_t dst_ld = to_c ? o.lds_of[t] : s.n;
      T* dst = to_c ? static_cast<T*>(o.outs_of[t]) + int64_t(row) * dst_ld + col
                    : static_cast<T*>(o.windows_of[t]) + (int64_t(slot) * o.window_rows + o.row0 + row) * s.n + col;
      warp_copy_block<T, BN / 8, 4>(src, p.ld_out, dst, dst_ld, nrows, units, lane);
    }
  }
  __threadfence_system();  // every lane's stores to the peer are visible system-wide before the count
  return withhold;
}

// The count after owner_push_rows (one lane): 2 ranks, in the peer's flags;
// more (Owner::world), a final in every other rank's, a partial in its owner's.
template <bool kWide>
__device__ __forceinline__ void owner_count(const GemmKernelParams& p, int32_t idx) {
  const Owner& o = p.owner;
  if constexpr (!kWide) {
    ptx::red_release_sys_add(o.peer_flags + idx, 1);
  } else {
    const int32_t owner = owner_of_tile(idx, p.sched.tiles(), o.world);
    for (int32_t t = 0; t < o.world; ++t)
      if (t != o.rank && (owner == o.rank || t == owner)) ptx::red_release_sys_add(o.flags_of[t] + idx, 1);
  }
}

// More than 2 ranks (Owner::world), a tile this rank owns: the partials in
// its window's slots 1..world-2 added to a consumer warpgroup's
// accumulators of piece Q (the storer loads slot 0's into the staging), in
// fp32 slot by slot after rounding the own sum (the rounded partials' sum,
// as NCCL's ring sums them; within rounding of it, not bitwise), once the
// tile's flag has counted them (each warp waits for it itself, before piece
// 0: the storer's wait orders its TMA load, not these loads; not at all once
// a wait of the storer's has timed out (`failed`, its sticky flag in shared
// memory; not err, in host memory: a read of it per warp and tile, over
// PCIe, made the calls 6-10x slower), so that a missing rank costs one
// timeout, not one per owned tile); 8 loads in flight (16 spilled).
// Returns whether the partials were there (piece 1 passes it on).
template <typename T, int Q>
__device__ __forceinline__ bool add_window_partials(float (&acc)[128], const GemmKernelParams& p, int32_t idx, int cw,
                                                    int warp, int lane, const volatile int32_t* failed,
                                                    bool arrived = true) {
  const Owner& o = p.owner;
  const plan::Schedule& s = p.sched;
  if constexpr (Q == 0) {
    int ok = 0;
    if (lane == 0)
      ok = *failed == 0 &&
           bounded_wait<64, kOwnerPollMaxNs>(o.flags + idx, o.epoch * uint32_t(o.world - 1), o.timeout_ns, o.err,
                                             p.group_of_tile[idx], 3u, idx);
    arrived = __shfl_sync(0xffffffffu, ok, 0) != 0;
    __syncwarp();  // (lane 0's acquire before every lane's loads: shfl.sync does not order memory)
  }
  if (!arrived) return false;  // (recorded in err: the call fails)
  const plan::TileCoord tc = s.tile_of(idx);
  const int64_t row = o.row0 + tc.tm * 128 + cw * 64 + warp * 16 + lane / 4;
  const int32_t col0 = tc.tn * 256 + Q * 128 + 2 * (lane % 4);
#pragma unroll
  for (int j = 16 * Q; j < 16 * Q + 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[4 * j + e] = static_cast<float>(T(acc[4 * j + e]));
  for (int32_t slot = 1; slot < o.world - 1; ++slot) {
    const T* base = static_cast<const T*>(o.window) + (int64_t(slot) * o.window_rows + row) * s.n + col0;
#pragma unroll
    for (int quarter = 0; quarter < 4; ++quarter) {
      uint32_t v[4][2];
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          v[x][h] = col0 + 8 * (4 * quarter + x) < s.n
                        ? __ldcg(reinterpret_cast<const unsigned int*>(base + 8 * h * s.n + 8 * (4 * quarter + x)))
                        : 0u;
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = 16 * Q + 4 * quarter + x;
          const T* two = reinterpret_cast<const T*>(&v[x][h]);
          acc[4 * j + 2 * h] += static_cast<float>(two[0]);
          acc[4 * j + 2 * h + 1] += static_cast<float>(two[1]);
        }
    }
  }
  return true;
}

// The hand-over of tiles from owner_piece_storer to owner_pusher (kPieces
// owners): kPushRing slots, each a full barrier (the storer's arrive: the
// tile is in C) and an empty one (one arrive per pusher warp); `failed`
// (shared memory, sticky): a wait of the storer's timed out.
constexpr int kPushRing = 4;
constexpr int kPushBarrier = 3;  // named barrier of the two pusher warps (1, 2: the consumer warpgroups)
struct PushRing {
  uint64_t* full;
  uint64_t* empty;
  volatile int32_t* failed;
};

// The owner layout with kPieces (4 stages): lane 0 stores each piece by TMA
// into C, the final of a tile this rank owns, the partial of one it does
// not (there, in the tile's own rows, the peer's final lands or is copied
// later, only after this partial has been pushed and counted), and frees the
// buffer once the TMA has read it, after loading into it the peer's partial
// of the piece that comes next if this rank owns that tile (bounded wait for
// the tile's flag first). Once all four pieces are in C, it hands the tile
// to the pusher warps (owner_pusher), which copy it to the peer from there,
// and is free for the next tile's pieces (Owner::pushers; else this warp
// copies it). So the shared buffer is held ~0.5 µs per piece, not for the
// NVLink transfer.
template <typename T, int BN, int kPieceBytes, bool kWide>
__device__ __forceinline__ void owner_piece_storer(const GemmKernelParams& p, const CUtensorMap* tm_c,
                                                   const CUtensorMap* tm_w, const CUtensorMap* tm_p,
                                                   const CUtensorMap* tm_q, uint8_t* c_smem, uint64_t* c_full,
                                                   uint64_t* c_empty, uint64_t* p_ready, const PushRing& ring,
                                                   int32_t tiles, int lane) {
  const Owner& o = p.owner;
  const plan::Schedule& s = p.sched;
  const bool leader = lane == 0;
  bool failed = false;  // (lane 0) a wait timed out: later owned pieces do not wait again
  auto wait_flag = [&](int32_t idx) {
    failed = failed ||
             !bounded_wait<64, kOwnerPollMaxNs>(o.flags + idx, kWide ? o.epoch * uint32_t(o.world - 1) : o.epoch,
                                                o.timeout_ns, o.err, p.group_of_tile[idx], 3u, idx);
    if constexpr (kWide)  // (the consumers' waits for the other slots stop too: add_window_partials)
      if (failed) *reinterpret_cast<volatile int32_t*>(ring.failed) = 1;
    ptx::fence_proxy_async_global();  // the TMA loads below read what the flag released
  };
  auto load_partial = [&](int32_t idx, int q, int h) {  // piece q of tile idx, half h, into buffer h
    if (failed) {
      ptx::mbar_arrive(&p_ready[h]);
      return;
    }
    const plan::TileCoord tc = s.tile_of(idx);
    ptx::mbar_arrive_expect_tx(&p_ready[h], kPieceBytes);
#pragma unroll
    for (int c = 0; c < 2; ++c)
      ptx::tma_load_2d(c_smem + h * kPieceBytes + c * 8192, tm_w, &p_ready[h], tc.tn * BN + q * 128 + c * 64,
                       o.row0 + tc.tm * 128 + h * 64);
  };
  if (leader) {
    ptx::tma_prefetch_desc(tm_c);
    ptx::tma_prefetch_desc(tm_w);
    if (o.push_tma > 0) ptx::tma_prefetch_desc(tm_p);
    if (o.push_tma > 0 && o.finals_in_c) ptx::tma_prefetch_desc(tm_q);
    if (int32_t(blockIdx.x) < tiles && owner_owns<kWide>(o, owner_tile_at<kWide>(o, blockIdx.x, tiles))) {
      const int32_t first = owner_tile_at<kWide>(o, blockIdx.x, tiles);
      wait_flag(first);
      load_partial(first, 0, 0);
      load_partial(first, 0, 1);
    }
  }
  uint32_t handed = 0;  // (lane 0) tiles handed to the pushers
  for (int32_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    const int32_t idx = owner_tile_at<kWide>(o, i, tiles);
    const plan::TileCoord tc = s.tile_of(idx);
    const bool own = owner_owns<kWide>(o, idx);
    const int32_t row = tc.tm * 128, col = tc.tn * BN;
    const int32_t next = i + int32_t(gridDim.x) < tiles ? owner_tile_at<kWide>(o, i + int32_t(gridDim.x), tiles) : -1;
    const bool next_own = next >= 0 && owner_owns<kWide>(o, next);
    // Owner::push_tma: this tile goes to the peer by TMA from the pieces (a
    // partial then needs no copy in C: the peer's final lands there).
    const bool tma_push = owner_pushed_by_tma(o, next < 0);
    const bool final_to_peer_c = own && o.finals_in_c;  // (pushed by TMA: by tm_q into the peer's C)
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Every lane waits, then the warp converges before lane 0 frees the
        // buffer: a lane running behind could otherwise miss this completion
        // (a parity wait tells only even from odd), wait for a later one that
        // needs lane 0, stopped at the push's __syncwarp, and hang (seen on
        // 2xH200). Lane 0 waiting alone, the others parked at a __syncwarp,
        // was correct but made the call 7-35% slower (measured; why, not known).
        ptx::mbar_wait(&c_full[h], uint32_t(q));
        __syncwarp();
        if (!leader) continue;
        if (q == 1 && h == 1 && next < 0) record_phase(p.monitor_phases, 0);  // (trace) the last tile staged
        const uint8_t* piece = c_smem + h * kPieceBytes;
        if (own || !tma_push)
#pragma unroll
          for (int c = 0; c < 2; ++c) ptx::tma_store_2d(tm_c, piece + c * 8192, col + q * 128 + c * 64, row + h * 64);
        // A final into the peer's C (Owner::finals_in_c), else into its window
        // from row0 (rows < m). After a timed-out wait (failed) an owned
        // "final" is not one: it is not stored into the peer's C at all.
        if (tma_push && !(final_to_peer_c && failed) && !(own && o.diag_no_final_bytes))
#pragma unroll
          for (int c = 0; c < 2; ++c)
            ptx::tma_store_2d(final_to_peer_c ? tm_q : tm_p, piece + c * 8192, col + q * 128 + c * 64,
                              row + h * 64);
        ptx::tma_store_commit();
        ptx::tma_store_wait_read();
        // The buffer's next piece: this tile's piece 1, or the next tile's
        // piece 0. From a tile this rank does not own to one it owns, the
        // wait for the peer's partial comes after this tile's push: the
        // peer's CTA computing that tile may be waiting for this partial
        // (tiles = 2 x CTAs: every CTA of both ranks at once).
        if (q == 0 && own) load_partial(idx, 1, h);
        const bool defer = q == 1 && next_own && !own;
        if (q == 1 && next_own && !defer) {
          if (h == 0) wait_flag(next);
          load_partial(next, 0, h);
        }
        if (!defer) ptx::mbar_arrive(&c_empty[h]);
      }
    // The tile is in C (and, pushed by TMA, at the peer): count a TMA-pushed
    // one here; else hand it to the pusher warps (owner_pusher), or, without
    // them (Owner::pushers), push it from C with this warp and count it.
    if (leader) {
      ptx::tma_store_wait_all();        // its writes are done (the peer's too),
      ptx::fence_proxy_async_global();  // and ordered before the loads from C (or the count)
    }
    __syncwarp();
    if (tma_push) {
      if (leader && !(final_to_peer_c && failed) && p.group_of_tile[idx] != o.drop_group) {
        // (after a timed-out wait an owned tile is not counted: owner_push_rows)
        __threadfence_system();
        ptx::red_release_sys_add(o.peer_flags + idx, 1);
      }
    } else if (o.pushers) {
      if (leader) {
        const uint32_t slot = handed % kPushRing;
        ptx::mbar_wait(&ring.empty[slot], ((handed / kPushRing) & 1) ^ 1);
        if (failed) *ring.failed = 1;
        ptx::mbar_arrive(&ring.full[slot]);
        ++handed;
      }
    } else {
      ptx::fence_proxy_async_global();
      const bool withhold = owner_push_rows<T, BN>(p, idx, 0, 128, __shfl_sync(0xffffffffu, failed, 0), lane);
      __syncwarp();
      if (leader && !withhold && p.group_of_tile[idx] != o.drop_group) owner_count<false>(p, idx);  // (2 ranks)
    }
    __syncwarp();
    if (leader && !own && next_own) {  // deferred (above): the next tile's piece 0, then both buffers back
      wait_flag(next);
      load_partial(next, 0, 0);
      load_partial(next, 0, 1);
      ptx::mbar_arrive(&c_empty[0]);
      ptx::mbar_arrive(&c_empty[1]);
    }
    if (leader && next < 0) record_phase(p.monitor_phases, 1);  // (trace) its last tile stored (pushed, if by TMA)
  }
}

// The owner layout with kPieces: warps 2 and 3 of the producer warpgroup
// push each tile that owner_piece_storer hands them (in the CTA's tile
// order, those not pushed by TMA) from C, where it sits in L2, to the peer
// (Push::peer_c, or its C for a final under Owner::finals_in_c), 64 rows
// each, with 16-byte loads and stores; then one count in the peer's flags.
// So the storer warp is free for the next tile's pieces while the tile
// crosses NVLink: when it pushed each tile itself, the next tile's second
// piece waited for that push (on one GPU, with the peer's buffers local,
// bench-gemm --modes owners: 8.6% over the plain GEMM on 4096^3, 4% without
// the copy, 26% with half the loads in flight). After a timed-out wait of
// the storer (ring.failed, sticky) every owned final pushed from then on is
// withheld, also one handed over before the timeout: the call fails anyway.
template <typename T, int BN, bool kWide>
__device__ __forceinline__ void owner_pusher(const GemmKernelParams& p, const PushRing& ring, int32_t tiles, int w,
                                             int lane) {
  const Owner& o = p.owner;
  uint32_t taken = 0;
  for (int32_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    const int32_t idx = owner_tile_at<kWide>(o, i, tiles);
    const bool last = i + int32_t(gridDim.x) >= tiles;
    if (owner_pushed_by_tma(o, last)) continue;  // by TMA (owner_piece_storer)
    const uint32_t slot = taken % kPushRing;
    ptx::mbar_wait(&ring.full[slot], (taken / kPushRing) & 1);
    ++taken;
    ptx::fence_proxy_async_global();  // the storer's TMA stores into C before the loads below
    const bool withhold = owner_push_rows<T, BN, kWide>(p, idx, w * 64, 64, *ring.failed != 0, lane);
    ptx::named_barrier_sync(kPushBarrier, 64);
    if (w == 0 && lane == 0 && !withhold && p.group_of_tile[idx] != o.drop_group) owner_count<kWide>(p, idx);
    if (lane == 0) ptx::mbar_arrive(&ring.empty[slot]);
  }
  // (trace) the CTA's pushes done: its last tiles may leave after the storer's record
  if (w == 0 && lane == 0 && taken > 0) record_phase(p.monitor_phases, 1);
}

// The owner layout's storer warp: per tile, every lane copies both halves to
// Push::peer_c (the peer's window; this GPU's when pulled: a partial, or the
// final tile), lane 0 stores a final tile into C by TMA and counts the tile
// in the peer's flags; before handing
// the staging halves back, lane 0 loads the peer's partial of the CTA's next
// tile into them if this rank owns it (bounded wait for its flag first).
template <typename T, int BN, int kHalfCBytes>
__device__ __forceinline__ void owner_storer(const GemmKernelParams& p, const CUtensorMap* tm_c, const CUtensorMap* tm_w,
                                             uint8_t* c_smem, uint64_t* c_full, uint64_t* c_empty, uint64_t* p_ready,
                                             int32_t tiles, int lane) {
  const Owner& o = p.owner;
  const bool leader = lane == 0;
  // Once a wait has timed out (recorded in err: the call fails), later owned
  // tiles do not wait again: the consumers go on with what is in the buffer,
  // so a missing peer costs one timeout, not one per owned tile.
  bool failed = false;  // (lane 0)
  auto prefetch = [&](int32_t idx) {
    const plan::TileCoord tc = p.sched.tile_of(idx);
    failed = failed ||
             !bounded_wait<64, kOwnerPollMaxNs>(o.flags + idx, o.epoch, o.timeout_ns, o.err, p.group_of_tile[idx], 3u,
                                                idx);
    ptx::fence_proxy_async_global();  // the TMA loads below read what the flag released
    ptx::fence_proxy_async_smem();    // the lanes' reads of the buffer (push_half) before the loads overwrite it
    for (int h = 0; h < 2; ++h) {
      if (failed) {
        ptx::mbar_arrive(&p_ready[h]);
        continue;
      }
      ptx::mbar_arrive_expect_tx(&p_ready[h], kHalfCBytes);
      for (int c = 0; c < BN / 64; ++c)
        ptx::tma_load_2d(c_smem + h * kHalfCBytes + c * 8192, tm_w, &p_ready[h], tc.tn * BN + c * 64,
                         o.row0 + tc.tm * 128 + h * 64);
    }
  };
  if (leader) {
    ptx::tma_prefetch_desc(tm_c);
    ptx::tma_prefetch_desc(tm_w);
    if (int32_t(blockIdx.x) < tiles && owner_owns(o, owner_tile_at(o, blockIdx.x, tiles)))
      prefetch(owner_tile_at(o, blockIdx.x, tiles));
  }
  uint32_t t = 0;
  for (int32_t i = blockIdx.x; i < tiles; i += gridDim.x, ++t) {
    const int32_t idx = owner_tile_at(o, i, tiles);
    const plan::TileCoord tc = p.sched.tile_of(idx);
    const bool own = owner_owns(o, idx);
    const int32_t row = tc.tm * 128, col = tc.tn * BN;
    const bool last = i + int32_t(gridDim.x) >= tiles;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ptx::mbar_wait(&c_full[h], t & 1);
      if (h == 1 && last && leader) record_phase(p.monitor_phases, 0);
      const uint8_t* half = c_smem + h * kHalfCBytes;
      if (own && leader) {
#pragma unroll
        for (int c = 0; c < BN / 64; ++c) ptx::tma_store_2d(tm_c, half + c * 8192, col + c * 64, row + h * 64);
        ptx::tma_store_commit();
      }
      push_half<T, BN>(half, p.push, p.sched.n, o.row0 + row + h * 64, col, p.sched.n, lane);
    }
    __threadfence_system();  // every lane's stores to the peer are visible system-wide before the count below
    __syncwarp();
    if (leader) {
      if (p.group_of_tile[idx] != o.drop_group) ptx::red_release_sys_add(o.peer_flags + idx, 1);
      if (own) ptx::tma_store_wait_read();  // the staging halves are read
      const int32_t next = i + int32_t(gridDim.x) < tiles ? owner_tile_at(o, i + int32_t(gridDim.x), tiles) : -1;
      if (next >= 0 && owner_owns(o, next)) prefetch(next);
      ptx::mbar_arrive(&c_empty[0]);
      ptx::mbar_arrive(&c_empty[1]);
    }
  }
  if (leader) {
    ptx::tma_store_wait_all();
    if (int32_t(blockIdx.x) < tiles) record_phase(p.monitor_phases, 1);  // its last tile stored and pushed
  }
}

// The owner layout's copy of the peer's final tiles from the window read from
// (Owner::window: this GPU's, or the peer's when pulled) into C (p.out, p.ld_out): chunks of `rows` rows of one tile, the peer's
// tiles in the order it computes them, claimed with o.claims, each chunk
// waiting (bounded) for its tile; rows brought into `stage` by the bulk-copy
// engine, then stored with 16-byte stores. kDirect (4 stages: no shared
// memory to spare): each lane loads its 16-byte units of the chunk into
// registers, all in flight at once, then stores them; stage and bar unused.
// In place (C is the window): one chunk per tile, only waited for.
template <typename T, int kStageBytes, int BN, bool kDirect = false, bool kWide = false>
__device__ __forceinline__ void copy_peer_tiles(const GemmKernelParams& p, uint8_t* stage, uint64_t* bar) {
  const Owner& o = p.owner;
  const plan::Schedule& s = p.sched;
  const int lane = threadIdx.x % 32;
  constexpr int32_t kRows = kStageBytes / (BN * 2) < 128 ? kStageBytes / (BN * 2) : 128;
  constexpr int kUnits = BN / 8;                   // 16-byte units per row
  constexpr int kPerLane = kRows * kUnits / 32;    // kDirect: units per lane and chunk
  static_assert(!kDirect || (kRows * kUnits) % 32 == 0, "a chunk is whole 16-byte units per lane");
  // In place, or the peer's finals pushed into C (finals_in_c): one "chunk"
  // per tile, which is only waited for.
  const bool wait_only = o.in_place || o.finals_in_c;
  const int32_t per_tile = wait_only ? 1 : 128 / kRows;
  // The tiles this rank does not own: the peer's, or (Owner::world) the
  // other ranks', from the end of its own range on, cyclically.
  const int32_t tiles = s.tiles();
  int32_t first, others;
  if constexpr (kWide) {
    first = o.own_end % tiles, others = tiles - (o.own_end - o.own_begin);
  } else {
    first = o.rank == 0 ? 0 : o.split, others = o.rank == 0 ? o.split : s.tiles() - o.split;
  }
  const int32_t chunks = others * per_tile;
  int32_t ready = -1;  // lane 0: the last tile seen arrived
  uint32_t phase = 0;
  while (true) {
    uint32_t c = 0;
    if (lane == 0) c = atomicAdd(o.claims, 1u);
    c = __shfl_sync(0xffffffffu, c, 0);
    if (c >= uint32_t(chunks)) {
      if (lane == 0) record_phase(p.monitor_phases, 2);
      return;
    }
    int32_t t = first + int32_t(c) / per_tile;
    if (kWide && t >= tiles) t -= tiles;
    const plan::TileCoord tc = s.tile_of(t);
    const int32_t row = tc.tm * 128 + (int32_t(c) % per_tile) * kRows, col = tc.tn * BN;
    const int32_t nrows = min(s.m - row, kRows), ncols = min(s.n - col, BN);
    if (nrows <= 0) continue;  // below C's last row
    int ok = 1;
    if (lane == 0) {
      if (t != ready) {
        ok = bounded_wait<64, kOwnerPollMaxNs>(o.flags + t, o.epoch, o.timeout_ns, o.err, p.group_of_tile[t], 4u, t);
        if constexpr (!kDirect) ptx::fence_proxy_async_global();  // the bulk copies below read what the flag released
        ready = t;
      }
      if (ok && !wait_only && !kDirect) {
        ptx::fence_proxy_async_smem();  // the lanes' reads of the buffer before the copies overwrite it
        ptx::mbar_arrive_expect_tx(bar, uint32_t(ncols) * 2 * uint32_t(nrows));
        const T* from = static_cast<const T*>(o.window) + (o.row0 + row) * int64_t(s.n) + col;
        for (int32_t r = 0; r < nrows; ++r) ptx::bulk_load(stage + r * BN * 2, from + r * int64_t(s.n), ncols * 2, bar);
      }
    }
    if (!__shfl_sync(0xffffffffu, ok, 0)) return;  // recorded in err; the call fails
    if (wait_only) continue;  // the final tile is in C already
    T* out = static_cast<T*>(p.out) + int64_t(row) * p.ld_out + col;
    if constexpr (kDirect) {
      __syncwarp();  // orders lane 0's acquire of the flag before every lane's loads
      const T* from = static_cast<const T*>(o.window) + (o.row0 + row) * int64_t(s.n) + col;
      // (the whole chunk in one batch; n % 8 == 0 with owners: ncols / 8 whole units)
      warp_copy_block<T, kUnits, kPerLane>(from, s.n, out, p.ld_out, nrows, ncols / 8, lane);
      continue;
    }
    ptx::mbar_wait(bar, phase);
    phase ^= 1;
    for (int32_t u = lane; u < nrows * kUnits; u += 32) {
      const int32_t r = u / kUnits, c8 = u % kUnits;
      if (c8 * 8 < ncols)
        *reinterpret_cast<uint4*>(out + int64_t(r) * p.ld_out + c8 * 8) =
            *reinterpret_cast<const uint4*>(stage + (r * BN + c8 * 8) * 2);
    }
    __syncwarp();
  }
}

template <int BN, int STAGES, typename T, bool kPieces = false, bool kWide = false>
__global__ void __launch_bounds__(kGemmThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                     const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ CUtensorMap tm_w,
                     const __grid_constant__ CUtensorMap tm_p, const __grid_constant__ CUtensorMap tm_q,
                     const GemmKernelParams p) {
  using L = GemmSmem<BN, STAGES, kPieces>;
  static_assert(!kPieces || BN == 256, "the four-stage plain store is for 128x256 tiles");
  constexpr int BM = L::kBM, BK = L::kBK;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* empty = full + STAGES;

  uint64_t* c_full = empty + STAGES;  // consumer half h written to shared memory
  uint64_t* c_empty = c_full + 2;      // storer done reading half h
  uint64_t* p_ready = c_empty + 22;    // owner layout: the peer's partial is in half h

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      ptx::mbar_init(&full[s], 1);   // the producer's arrive + the TMA bytes
      ptx::mbar_init(&empty[s], 2);  // one arrive per consumer warpgroup
    }
    for (int h = 0; h < 2; ++h) {
      ptx::mbar_init(&c_full[h], 1);
      ptx::mbar_init(&c_empty[h], 1);
      ptx::mbar_init(&c_empty[2 + h], 1);  // the sum warps' staging buffers
      ptx::mbar_init(&c_empty[4 + h], 1);
    }
    // The consumer warps' (joining the sum); kPieces: the push ring's (full, then empty: one arrive per pusher).
    for (int i = 0; i < 16; ++i) ptx::mbar_init(&c_empty[6 + i], kPieces && i >= kPushRing && i < 2 * kPushRing ? 2 : 1);
    if constexpr (kPieces) *reinterpret_cast<int32_t*>(smem + L::kPushFailed) = 0;
    for (int h = 0; h < 2; ++h) ptx::mbar_init(&p_ready[h], 1);
    ptx::fence_barrier_init();
  }
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < p.sum.claims_reset_count; i += blockDim.x) p.sum.claims_reset[i] = 0;
  __syncthreads();

  const int tiles = p.sched.tiles();
  if (threadIdx.x == 0) record_phase(p.monitor_phases, 3);
  if (wg == 0) {
    // kPieces: 80 registers for the producer warpgroup (the owner's push
    // keeps 4 loads in flight; at 40, 56 and 64 ptxas spilled 236/624, 92/236
    // and 24/60 bytes), 208 for each consumer (no spills either): 128 x 80 +
    // 256 x 208 = 63488 of the launch's 384 x 168 = 64512. kWide: 88 (its
    // pushes to W ranks spilled 28/208 bytes at 80): 64512.
    if constexpr (kWide) ptx::setmaxnreg_dec<88>();
    else if constexpr (kPieces) ptx::setmaxnreg_dec<80>();
    else ptx::setmaxnreg_dec<40>();
    if (tid == 0) {
      // ---------------- producer: TMA loads into the ring ----------------
      ptx::tma_prefetch_desc(&tm_a);
      ptx::tma_prefetch_desc(&tm_b);
      int it = 0;
      for (int i = blockIdx.x; i < tiles; i += gridDim.x) {
        const plan::TileCoord tc = p.sched.tile_of(owner_tile_at<kWide>(p.owner, i, tiles));
        for (int kb = 0; kb < p.k_blocks; ++kb, ++it) {
          const int s = it % STAGES;
          const uint32_t phase = (it / STAGES) & 1;
          ptx::mbar_wait(&empty[s], phase ^ 1);
          if (kb == 0 && p.monitor_mma) {  // (here, not in the consumers: no registers taken from the MMAs)
            p.monitor_mma[int64_t(i) * 2] = ptx::globaltimer_ns();  // by slot: CTA c's are c, c + ctas, ...
            p.monitor_mma[int64_t(i) * 2 + 1] = ptx::clock_cycles();
          }
          ptx::mbar_arrive_expect_tx(&full[s], L::kABytes + L::kBBytes);
          ptx::tma_load_2d(smem + L::kA + s * L::kABytes, &tm_a, &full[s], kb * BK, tc.tm * BM);
          ptx::tma_load_2d(smem + L::kB + s * L::kBBytes, &tm_b, &full[s], kb * BK, tc.tn * BN);
        }
      }
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
      copy_peer_tiles<T, L::kSumWarpBytes, BN>(p, smem + L::kSum + w * L::kSumStageBytes, c_empty + 2 + 2 * w);
    } else if (tid >= 32 && tid < 64 && p.owner.rank >= 0) {
      // ---------------- storer of the owner layout ----------------
      owner_storer<T, BN, L::kHalfCBytes>(p, &tm_c, &tm_w, smem + L::kC, c_full, c_empty, p_ready, tiles, tid - 32);
    } else if (tid >= 64 && p.sum.groups > 0 && p.sum.producers) {
      // ---------------- warps 2-3: the fused sum during the GEMM ----------------
      const int w = tid / 32 - 2;
      fused_sum_rows<T, L::kSumWarpBytes, BN>(p.sum, p.sched, smem + L::kSum + w * L::kSumStageBytes, c_empty + 2 + 2 * w,
                                           int32_t(blockIdx.x) * 2 + w, int32_t(gridDim.x) * 2);
    } else if (tid >= 32 && tid < 64 && p.tma_store && (tid == 32 || p.push.peers > 0)) {
      // ---------------- storer: TMA stores, completion, signal ----------------
      // Waiting for store completion here, not in a consumer, keeps the
      // tensor cores busy while the tile's data drains to global memory.
      // Lane 0 issues the TMA stores; with peers, the whole warp also copies
      // each half to the peers' buffers (see gemm.h: Push).
      const bool leader = tid == 32;
      const bool push = p.push.peers > 0;
      if (leader) ptx::tma_prefetch_desc(&tm_c);
      const bool plain = p.store == static_cast<int32_t>(Store::Plain);
      int32_t pending[2], npending = 0;  // pushed tiles stored but not yet signalled
      uint32_t t = 0;
      for (int idx = blockIdx.x; idx < tiles; idx += gridDim.x, ++t) {
        const plan::TileCoord tc = p.sched.tile_of(idx);
        // Plain: rows of C; SlotTiles: rows idx*BM.. of the slot buffer.
        const int32_t shift = p.row_shift ? p.row_shift[p.group_of_tile[idx]] : 0;
        const int32_t row = (plain ? tc.tm * BM : idx * BM) + shift;
        const int32_t col = plain ? tc.tn * BN : 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ptx::mbar_wait(&c_full[h], t & 1);
          if (h == 1 && leader && idx + int32_t(gridDim.x) >= tiles) record_phase(p.monitor_phases, 0);
          const uint8_t* half = smem + L::kC + h * L::kHalfCBytes;
          if (leader) {
#pragma unroll
            for (int c = 0; c < BN / 64; ++c) ptx::tma_store_2d(&tm_c, half + c * 8192, col + c * 64, row + h * 64);
            ptx::tma_store_commit();
          }
          if (push) push_half<T, BN>(half, p.push, p.ld_out, row + h * 64, col, plain ? p.sched.n : BN, tid - 32);
        }
        if (push) __syncwarp();  // every lane's reads of both halves are done
        if (leader) {
          ptx::tma_store_wait_read();
          ptx::mbar_arrive(&c_empty[0]);
          ptx::mbar_arrive(&c_empty[1]);
        }
        if (p.counters || p.monitor_ns) {
          // With push, the fence below waits an NVLink round trip with no
          // copy in flight; signal_every = 2 pays it once per two tiles
          // (a tile's signal waits at most one more tile; the last is never held).
          if (push) {
            pending[npending++] = idx;
            if (npending < p.push.signal_every && idx + int32_t(gridDim.x) < tiles) continue;
            __threadfence_system();  // each lane's peer stores are visible system-wide before the releases below
            __syncwarp();
          }
          if (leader) {
            ptx::tma_store_wait_all();        // the tiles are complete in global memory,
            ptx::fence_proxy_async_global();  // ordered before the generic-proxy release
            for (int q = 0; q < (push ? npending : 1); ++q) {
              const int32_t ti = push ? pending[q] : idx;
              const int32_t grp = p.group_of_tile[ti];
              if (p.counters) ptx::red_release_gpu_add(p.counters + grp, 2);
              if (push) {  // every copy of the tile is complete: count it where each is summed
                ptx::red_release_sys_add(p.push.arrivals + grp, 1);
                for (int j = 0; j < p.push.peers; ++j) ptx::red_release_sys_add(p.push.peer_arrivals[j] + grp, 1);
              }
              if (p.monitor_ns) {
                const uint64_t now = ptx::globaltimer_ns();
                p.monitor_ns[int64_t(ti) * 2] = now;
                p.monitor_ns[int64_t(ti) * 2 + 1] = now;
                p.monitor_sm[ti] = ptx::smid();
              }
            }
          }
          npending = 0;
        }
      }
      if (leader) {
        ptx::tma_store_wait_all();
        record_phase(p.monitor_phases, 1);
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  if constexpr (kPieces) ptx::setmaxnreg_inc<208>();
  else ptx::setmaxnreg_inc<232>();
  const int cw = wg - 1;  // this warpgroup computes tile rows [cw*64, cw*64+64)
  const int warp = tid / 32, lane = tid % 32;
  uint8_t* my_c = smem + L::kC + cw * L::kHalfCBytes;  // [BN/64 chunks][64 rows][128 B]
  const uint32_t my_c_addr = ptx::smem_addr(my_c);

  float acc[BN / 2];
  int it = 0;
  uint32_t t = 0, owned_tiles = 0;
  for (int i = blockIdx.x; i < tiles; i += gridDim.x, ++t) {
    const int idx = owner_tile_at<kWide>(p.owner, i, tiles);
    const plan::TileCoord tc = p.sched.tile_of(idx);

    // Main loop: one wgmma batch (4 x k16) per stage; keep one batch in
    // flight and release a stage once the batch that read it has retired.
    int prev = -1;
#if defined(FO_FAULT_SKIP_KBLOCK)
    // test-only fault (FO_TEST_FAULT=skip_kblock): see scripts/gpu_all.sh faults.
    // Tile 1 of the schedule (0 if it is the only one) is computed without
    // the MMAs of its k-block 1 (0 if it has one only; its accumulators are
    // then zeroed below). Every barrier wait and arrive, wgmma fence, commit
    // and wait still happens (a commit of no wgmma is an empty group; ptxas
    // adds a wgmma fence where the paths join: info C7519, no serialisation).
    const int fault_kb = idx == (tiles > 1 ? 1 : 0) ? (p.k_blocks > 1 ? 1 : 0) : -1;
#endif
    for (int kb = 0; kb < p.k_blocks; ++kb, ++it) {
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
        ptx::Wgmma<BN, T>::mma(acc, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
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
    if (p.monitor_phases && tid == 0 && cw == 0) {  // (trace) the MMAs of the CTA's first and last tile done
      if (i == int(blockIdx.x)) record_phase(p.monitor_phases, 4);
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

    // Epilogue. (1) my_c must be free: the storer has read the previous tile
    // (TMA path), or every thread of this warpgroup is done with it (rows path).
    if (p.tma_store)
      ptx::mbar_wait(&c_empty[cw], (t & 1) ^ 1);
    else
      ptx::named_barrier_sync(1 + cw, 128);

    // (2) Accumulators -> shared memory (stage_accumulators); a tile this
    // rank owns (owner layout) once the peer's partial is loaded there.
    if (owner_owns(p.owner, idx)) {
      ptx::mbar_wait(&p_ready[cw], owned_tiles & 1);
      ++owned_tiles;
      stage_accumulators<T, BN, true>(acc, my_c_addr, warp, lane);
    } else {
      stage_accumulators<T, BN, false>(acc, my_c_addr, warp, lane);
    }

    if (p.tma_store) {
      // (3) Hand the half to the storer warp.
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(1 + cw, 128);
      if (tid == 0) ptx::mbar_arrive(&c_full[cw]);
      continue;
    }

    // (3') Rows epilogue: 16-byte units, consecutive threads along a row.
    ptx::named_barrier_sync(1 + cw, 128);
    constexpr int kUnits = BN / 8;
    const int32_t shift = p.row_shift ? p.row_shift[p.group_of_tile[idx]] : 0;  // once per tile
    for (int i = tid; i < 64 * kUnits; i += 128) {
      const int r = i / kUnits, c8 = i % kUnits;
      const uint4 v = *reinterpret_cast<const uint4*>(my_c + (c8 / 8) * 8192 + sw128_offset(r, c8 % 8));
      const int tr = cw * 64 + r;  // row inside the tile
      if (p.row_of) {
        const int32_t dst = p.row_of[static_cast<int64_t>(idx) * BM + tr];
        if (dst >= 0) *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + int64_t(dst) * BN + c8 * 8) = v;
      } else {
        const int32_t grow = tc.tm * BM + tr, gcol = tc.tn * BN + c8 * 8;
        if (grow < p.sched.m && gcol < p.sched.n) {
          T* dst = static_cast<T*>(p.out) + int64_t(grow + shift) * p.ld_out + gcol;
          const T* src = reinterpret_cast<const T*>(&v);
          const int valid = p.sched.n - gcol < 8 ? p.sched.n - gcol : 8;
          for (int e = 0; e < valid; ++e) dst[e] = src[e];
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
  }

  // The consumer warps join the sum (the owner layout's copy) once the
  // storer has read this warpgroup's last half tile: my_c becomes 4 staging
  // buffers, one per warp.
  if constexpr (kPieces) {
    // The owner layout's copy, through registers (no shared memory).
    if (p.owner.rank >= 0) copy_peer_tiles<T, L::kSumWarpBytes, BN, true, kWide>(p, nullptr, nullptr);
  } else {
    if (p.owner.rank >= 0) {
      ptx::mbar_wait(&c_empty[cw], (t & 1) ^ 1);
      copy_peer_tiles<T, L::kSumWarpBytes, BN>(p, my_c + warp * L::kSumWarpBytes, c_empty + 6 + (cw * 4 + warp) * 2);
    }
    // (Never both in one launch: check_gemm_params refuses a fused sum with
    // owners. Both count the same barriers' phases from 0; one after the
    // other they would need their own barriers.)
    if (p.sum.groups > 0 && p.sum.consumers) {
      ptx::mbar_wait(&c_empty[cw], (t & 1) ^ 1);
      fused_sum_rows<T, L::kSumWarpBytes, BN>(p.sum, p.sched, my_c + warp * L::kSumWarpBytes,
                                               c_empty + 6 + (cw * 4 + warp) * 2, 0, 1);
    }
  }
}

}  // namespace flashoverlap::kernels
