// gemm_owners.cuh — the owner layout (gemm.h: Owner) as the GEMM's warps
// use it: each rank's tile order and ownership (owner_tile_at, owner_owns,
// owner_pushed_by_tma, kOwnerPollMaxNs), a warp's 16-byte block copy
// (warp_copy_block), a staged half's push to the peer (push_half), the push
// of a tile's rows to the peer and its count (owner_push_rows, owner_count), the other ranks' partials added to a
// consumer's accumulators (add_window_partials, more than 2 ranks), and the
// call check (owner_publish_call, owner_check_call).
// Separate from the warps that run the layout (gemm_owner_warps.cuh): these
// are the pieces the storer, the pushers and the consumers share.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_smem.cuh"
#include "kernels/owner_ranges.h"
#include "kernels/ptx.cuh"
#include "kernels/wait.cuh"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

// The owner layout's waits for a tile's flag (the peer's partial, or its
// final) sleep at most this long between polls (the flags are in this GPU's
// memory: a poll costs no NVLink traffic); a shorter sleep measured no
// faster.
constexpr uint32_t kOwnerPollMaxNs = 1024;

// One 64 x BN half of a finished tile (in shared memory, TMA's 128-byte
// swizzle) copied by one warp to rows [row, row+64), columns [col, col+BN) of
// `dst` (ld elements per row), 16 bytes per lane per row step (a whole
// 512-byte row of 256 columns per warp instruction); columns from n on are
// not stored.
template <typename T, int BN>
__device__ __forceinline__ void push_half(const uint8_t* half, T* dst_base, int64_t ld, int32_t row, int32_t col,
                                          int32_t n, int lane) {
  constexpr int kUnits = BN / 8;  // 16-byte units per row
  T* dst = dst_base + int64_t(row) * ld + col;
#pragma unroll 2
  for (int i = lane; i < 64 * kUnits; i += 32) {
    const int r = i / kUnits, c8 = i % kUnits;
    if (col + c8 * 8 >= n) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(half + (c8 / 8) * 8192 + sw128_offset(r, c8 % 8));
    *reinterpret_cast<uint4*>(dst + int64_t(r) * ld + c8 * 8) = v;
  }
}

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

// The call check (Owner::publish, Owner::check), by CTA 0's storer warp:
// lane d publishes this call's descriptor at rank d as the warp starts.
// Lane 0 peeks once before its first wait for a peer's tile (wait false:
// a descriptor of this call already here that differs fails the call at
// once, before a wait on tiles that will not come could time out), and
// checks every other rank's after its tiles (wait true: bounded, as the
// other checks; after a wait of its own timed out, only a peek, so that a
// missing peer costs one timeout). Neither holds up the tiles: a check that waited there
// would keep this CTA's tiles from a peer. A failure is recorded (err) and
// nothing else changes: where the ranks' m differ within one tile row
// every wait still completes and every rank reports the other's m.
// state (lane 0): 0 not yet, 1 peeked, 2 checked.
__device__ __forceinline__ void owner_publish_call(const Owner& o, int lane) {
  if (blockIdx.x == 0 && o.publish.slots && lane < o.world) publish_call(o.publish, lane);
}
__device__ __forceinline__ void owner_check_call(const Owner& o, int& state, bool wait) {
  if (state == 2 || (!wait && state == 1) || blockIdx.x != 0 || !o.check.slots) return;
  state = wait ? 2 : 1;
  for (int s = 0; s < o.world; ++s) {
    if (s == o.rank) continue;
    if (!wait) {  // (the peek: only a descriptor of this call that differs)
      const CallDesc* d = o.check.slots + o.check.parity * kMaxCounters + s;
      if (ptx::ld_acquire_sys(&d->seq) != o.check.seq ||
          (ptx::ld_relaxed_sys(&d->m) == o.check.m[s] && ptx::ld_relaxed_sys(&d->plan) == o.check.plan[s]))
        continue;
    }
    if (!check_call(o.check, s, o.timeout_ns, o.err)) {
      state = 2;
      return;
    }
  }
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
    if (!withhold && nrows > 0) {
      const int64_t dst_ld = to_c ? o.peer_ld : s.n;
      T* dst = to_c ? static_cast<T*>(o.peer_out) + int64_t(row) * dst_ld + col
                    : static_cast<T*>(o.peer_window) + int64_t(o.row0 + row) * s.n + col;
      warp_copy_block<T, BN / 8, 4>(src, p.ld_out, dst, dst_ld, nrows, units, lane);  // (dst and src may alias)
    }
  } else if (!withhold && nrows > 0) {  // Owner::world: a final to every other rank, a partial to its owner
    const int32_t owner = owner_of_tile(idx, s.tiles(), o.world);
    const int32_t targets = own ? o.world - 1 : 1;
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

}  // namespace flashoverlap::kernels
