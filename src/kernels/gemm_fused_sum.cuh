// gemm_fused_sum.cuh — the GEMM's gathered and pushed layouts (gemm.h:
// FusedSum, Push): the fused sum of a group's gathered rows by idle warps
// (fused_sum_rows) and the copy of a staged half tile to every peer's buffer
// (push_half; the owner layout's 3-stage storer uses it too). Separate:
// device code of their own, run beside the MMAs by warps that hold no
// accumulators.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_smem.cuh"
#include "kernels/ptx.cuh"
#include "kernels/wait.cuh"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

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

}  // namespace flashoverlap::kernels
