// gemm_owner_warps.cuh — the owner layout's producer-warpgroup roles: the
// 4-stage storer (owner_piece_storer) and its pushers (owner_pusher, handed
// tiles through PushRing), the 3-stage storer (owner_storer), and the copy
// of the peer's final tiles into C (copy_peer_tiles, also run by the
// consumers once their tiles are done). Separate: each is a whole warp's
// loop over the CTA's tiles; the layout's helpers are in gemm_owners.cuh.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_owners.cuh"
#include "kernels/gemm_smem.cuh"
#include "kernels/ptx.cuh"
#include "kernels/wait.cuh"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

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
// copies it). So the shared buffer is held for a piece's store, not for the
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
  int checked = 0;  // (lane 0 of CTA 0) the call check's state (owner_check_call)
  owner_publish_call(o, lane);
  auto wait_flag = [&](int32_t idx) {
    owner_check_call(o, checked, false);
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
        // is correct too but measured much slower.
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
        if (tma_push && !(final_to_peer_c && failed))
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
      if (leader && !(final_to_peer_c && failed)) {
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
      if (leader && !withhold) owner_count<false>(p, idx);  // (2 ranks)
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
  if (leader) owner_check_call(o, checked, !failed);  // (after a timed-out wait, a peek: one timeout per call)
}

// The owner layout with kPieces: warps 2 and 3 of the producer warpgroup
// push each tile that owner_piece_storer hands them (in the CTA's tile
// order, those not pushed by TMA) from C, where it sits in L2, to the peer
// (Owner::peer_window, or its C for a final under Owner::finals_in_c), 64 rows
// each, with 16-byte loads and stores; then one count in the peer's flags.
// So the storer warp is free for the next tile's pieces while the tile
// crosses NVLink: when it pushed each tile itself, the next tile's second
// piece waited for that push (docs/results.md §2.3, pusher warps). After a
// timed-out wait of the storer (ring.failed, sticky) every owned final pushed
// from then on is withheld, also one handed over before the timeout: the
// call fails anyway.
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
    if (w == 0 && lane == 0 && !withhold) owner_count<kWide>(p, idx);
    if (lane == 0) ptx::mbar_arrive(&ring.empty[slot]);
  }
  // (trace) the CTA's pushes done: its last tiles may leave after the storer's record
  if (w == 0 && lane == 0 && taken > 0) record_phase(p.monitor_phases, 1);
}

// The owner layout's storer warp: per tile, every lane copies both halves to
// Owner::peer_window (the peer's window: a partial, or the
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
  int checked = 0;  // (lane 0 of CTA 0) the call check's state (owner_check_call)
  owner_publish_call(o, lane);
  auto prefetch = [&](int32_t idx) {
    owner_check_call(o, checked, false);
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
      push_half<T, BN>(half, static_cast<T*>(o.peer_window), p.sched.n, o.row0 + row + h * 64, col, p.sched.n, lane);
    }
    __threadfence_system();  // every lane's stores to the peer are visible system-wide before the count below
    __syncwarp();
    if (leader) {
      const int32_t next = i + int32_t(gridDim.x) < tiles ? owner_tile_at(o, i + int32_t(gridDim.x), tiles) : -1;
      // (an owned final made without the peer's partial, its wait timed out, is not counted, so the peer's
      // wait for it fails too, as under the 4-stage storer)
      if (!(own && failed)) ptx::red_release_sys_add(o.peer_flags + idx, 1);
      if (own) ptx::tma_store_wait_read();  // the staging halves are read
      if (next >= 0 && owner_owns(o, next)) prefetch(next);
      ptx::mbar_arrive(&c_empty[0]);
      ptx::mbar_arrive(&c_empty[1]);
    }
  }
  if (leader) {
    ptx::tma_store_wait_all();
    if (int32_t(blockIdx.x) < tiles) record_phase(p.monitor_phases, 1);  // its last tile stored and pushed
    owner_check_call(o, checked, !failed);  // (after a timed-out wait, a peek: one timeout per call)
  }
}

// The owner layout's copy of the peer's final tiles from the window read from
// (Owner::window: this GPU's) into C (p.out, p.ld_out): chunks of `rows` rows of one tile, the peer's
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

}  // namespace flashoverlap::kernels
