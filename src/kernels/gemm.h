// gemm.h — host interface of the signalling Hopper GEMM (sm_90a).
//
//   C = A * B^T,  A: m x k row-major, B: n x k row-major (nn.Linear weight),
//   bf16 or fp16 inputs, fp32 accumulation, output in the input type; or
//   e4m3 inputs with their scales, output bf16 or fp16 (Fp8 below).
//
// The kernel is persistent: `sched.ctas` CTAs walk the tiles in the order of
// plan::Schedule (tile index -> CTA, round), so SMs can be left to NCCL.
// Where each finished tile goes is the store mode:
//   Plain     row-major C (ldc elements per row)
//   SlotTiles the AllReduce slot layout: tile idx -> rows [idx*bm, idx*bm+bm)
//             of a [tiles*bm x bn] buffer (one TMA store per 64-column chunk)
//   SlotRows  tile row r of tile idx -> slot row row_of[idx*bm + r] of a
//             [rows x bn] buffer, -1 = not stored (ReduceScatter, All-to-All;
//             with Scatter, into the ranks' receive rows instead)
// With `counters` set, each tile, once its data is complete in global memory,
// adds kSignalsPerTile (one per consumer warpgroup, each after its own half)
// to counters[group_of_tile[idx]] with release semantics at GPU scope.
// Counters are never reset: call n of a group of t tiles waits for
// counter >= n * t * kSignalsPerTile (cyclic compare).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/flags.h"
#include "kernels/owner_ranges.h"
#include "plan/schedule.h"
#include "plan/stream_k.h"
#include "plan/tile_grid.h"

namespace flashoverlap::kernels {

enum class DType : int32_t { BF16 = 0, FP16 = 1 };
enum class Store : int32_t { Plain = 0, SlotTiles = 1, SlotRows = 2 };

constexpr int kSignalsPerTile = 2;
constexpr int kGemmThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kPhaseSlots = 6;     // GemmParams::monitor_phases: values per CTA

// The MoE combine's NVLink form (SlotRows with row_of, no slot buffer):
// each stored row goes straight into its destination's receive rows, rank
// d = row_of / rows_per_rank, row row_of % rows_per_rank of rows[d] (n
// elements per row; column tn * bn + c), by plain 16-byte stores from two
// producer warps out of the tile's staging (n % 8 == 0; gemm_scatter.cuh),
// so the consumers go on with the next tile while the stores and their
// system fence drain; once a 64-row half is stored everywhere, 1 is added
// with release at system scope to arrivals[d] of every rank d (this
// source's counter there), whether the half had rows for d or not: a
// source's count per call is then 2 per tile, known to every receiver.
struct Scatter {
  int32_t world = 0;                    // 0: off; else the ranks, at most 8
  void* const* rows = nullptr;          // device [world]: each rank's receive rows, as addressed here
  int32_t rows_per_rank = 0;
  uint32_t* const* arrivals = nullptr;  // device [world]: this source's arrival counter at each rank
  CallPublish publish;                  // optional: this call's descriptor, published as the GEMM starts (flags.h)
};

// Which owner walk a launch takes: Pair (2 ranks, `split`) or Ranges
// (owner_ranges.h, any world; its own kernel).
enum class OwnerWalk : uint8_t { Pair = 0, Ranges = 1 };

// The AllReduce with owners, 2 ranks: each tile is summed by one
// rank, its owner (rank 1 owns tiles [0, split), rank 0 [split, tiles)).
// Each rank walks its tiles it does not own first (rank 1 starts at tile
// `split`, rank 0 at tile 0): those partials are stored only into the
// owner's window (peer_window, ld n) and counted in its flags. Then
// its own: before such a tile's epilogue the storer warp waits (bounded)
// for the peer's partial, long since arrived, and loads it by TMA into the
// tile's staging buffer; the consumers add their rounded accumulators to it
// in fp32 and round once (what a 2-rank NCCL sum gives); the storer stores
// the final tile into C (Plain, TMA) and into the peer's window, and counts
// it there. Meanwhile the producer's idle warps (and every consumer warp
// after its CTA's last tile) copy the peer's final tiles from this GPU's
// window into C as they arrive. Two calls in flight use the two halves of
// the window (row0); the flags count one arrival per tile and call.
// In place: C is this call's half of this GPU's window, so the
// peer's final tiles land where they belong and nothing is copied; the
// copy warps only wait until every one of them has arrived (the kernel's
// end then means C is complete).
struct Owner {
  int32_t rank = -1;                // -1: off; else 0 or 1
  int32_t split = 0;
  const void* window = nullptr;     // the window read from, [window_rows x n], n elements per row
  void* peer_window = nullptr;      // the peer's window (2 ranks), as addressed here: where this rank's tiles go
  int64_t window_rows = 0;
  int32_t row0 = 0;                 // this call's half: window rows [row0, row0 + tiles_m * 128)
  uint32_t* flags = nullptr;        // this GPU's [tiles] arrival counters
  uint32_t* peer_flags = nullptr;   // the peer's, mapped
  uint32_t epoch = 0;               // this call: every flag reaches epoch (cyclic compare)
  uint32_t* claims = nullptr;       // [1], zero at launch: the copy's chunks
  // Zeroed by block 0 at launch: the next call's claims (a call's GEMM has
  // finished before the next call's starts, so each call zeroes the other
  // of two).
  uint32_t* claims_reset = nullptr;
  bool producers = true;            // the producer's idle warps copy during the GEMM
  bool in_place = false;            // C is the window at row0 (this GPU's window): wait for the peer's finals, no copy
  // 4 stages: a tile goes to the peer's window (push_window, the address
  // peer_window holds, rows like `window`; rows from row0 + m on
  // are not written) by TMA stores straight
  // from the staging pieces, instead of from C by the storer warp's loads and
  // stores. 0: never; 1: each CTA's last tile (its operand loads are done, so
  // the TMA unit held for the NVLink transfer starves nothing; the last
  // wave's push decides the GEMM's end); 2: every tile (measurement).
  int32_t push_tma = 0;
  const void* push_window = nullptr;
  // 4 stages: the final tiles this rank owns go straight into
  // the peer's C (peer_out: its address here, peer_ld elements per row), not
  // into its window, and the peer's finals land in this rank's C the same
  // way (finals_in_c), so the copy only waits for them. Each rank's C then
  // needs no copy; a final of call n + 1 reaches the peer's C only after
  // the peer's own call n + 1 has pushed its partial of that tile, so
  // nothing lands there before the peer's kernel of that call has started.
  // The partials still go to the windows.
  void* peer_out = nullptr;
  int64_t peer_ld = 0;
  bool finals_in_c = false;
  // 4 stages: warps 2 and 3 push each tile from C (not by TMA) to the peer,
  // handed over by the storer warp, which goes on with the next tile's
  // pieces; false: the storer pushes each tile itself before them (the
  // runtime picks by k, owner_pushers_by_k, unless
  // rt::OverlapAllReduceOptions::owner_pushers says otherwise).
  bool pushers = true;
  uint64_t timeout_ns = 0;
  WaitError* err = nullptr;
  // The walk of any world (walk = Ranges; needed where world > 2, and at
  // 2 it runs too; Pair: the 2-rank walk above): the ranges and walks of
  // owner_ranges.h (rank = 0..world-1, split unused). Each partial goes to its owner's window, slot
  // owner_slot_of_sender (the windows hold world - 1 slots of window_rows
  // rows, slot 0 first), each final to every other rank (its C under
  // finals_in_c, else slot 0 of its window), counted in that rank's flags:
  // an owned tile's flag counts world - 1 partials per call, another's its
  // final. The storer loads slot 0's partial into the staging pieces by
  // TMA; the consumers add slots 1..world-2 from the window first (fp32, in
  // slot order, after rounding their own sum: within rounding of NCCL's
  // ring, not bitwise). 4 stages, push_tma 0.
  int32_t world = 2;
  OwnerWalk walk = OwnerWalk::Pair;
  int32_t own_begin = 0, own_end = 0;   // world > 2: this rank's tiles (owned_begin, owned_end)
  uint32_t* const* flags_of = nullptr;  // device [world]: each rank's flags, mapped (this rank's unused)
  void* const* windows_of = nullptr;    // device [world]: each rank's window, mapped (this rank's unused)
  void* const* outs_of = nullptr;       // finals_in_c: device [world], each rank's C, mapped
  const int64_t* lds_of = nullptr;      // finals_in_c: device [world], their elements per row
  // The call check (flags.h, without tokens; docs/design.md §5.8), CTA 0's
  // storer warp: it publishes this call's descriptor at every rank as it
  // starts, and checks every other rank's of this call (the same m and plan
  // as this rank's) after its tiles, having peeked before its first wait
  // for a peer's tile (owner_check_call). A failure is recorded in err and
  // the call goes on (its data moves as planned, or its waits time out);
  // null slots: off.
  CallPublish publish;
  CallCheck check;
};

// The grouped GEMM (plan/grouped.h: several experts' rows and weights in
// one launch): tile row tm of the schedule reads A's rows a_row0[tm] .. and
// B's rows b_row0[tm] + tn * bn .. (B: the experts' n x k weights stacked,
// b_rows rows in all), and of its bm rows the first rows[tm] are stored:
// row tm * bm + r of the schedule's C is row a_row0[tm] + r of C (Plain,
// a_rows rows: a whole tile row's tiles by TMA where C allows, a ragged
// one's rows by the consumers, masked), or slot row row_of[idx * bm + r]
// (SlotRows; the host marks the rows past rows[tm] -1). A tile row with
// rows[tm] = 0 is skipped by every warp (tables built on the device for up
// to so many tile rows: grouped_tables.h); its tiles are not signalled.
// The schedule's m is tile rows x bm. Off where a_row0 is null.
// FP8 inputs (docs/design.md §13): A and B e4m3 (k % 16 == 0), C in the
// GEMM's dtype; the MMAs' part sums (the tensor cores' own sum keeps ~14
// bits) added into fp32 registers apart, then C = (acc * scale_a) *
// scale_b, rounded once, as torch._scaled_mm scales. 128 x 128 tiles (a
// part per k-block, two parts: the next k-block's MMAs issued before this
// one's promotion), or 128 x 192, 128 x 160 and 128 x 144 (one part of two
// k-blocks; Plain or slot stores only: no scatter); 128 x 112 (as 128 x 128,
// Plain or slot stores) and 64 x 48 and 64 x 144 (one consumer warpgroup,
// two parts; Plain C, whole tiles); no owner layout, no grouped GEMM yet.
enum class Scales : int32_t { None = 0, PerTensor = 1, RowWise = 2 };
struct Fp8 {
  bool on = false;
  Scales scales = Scales::None;
  const float* scale_a = nullptr;  // PerTensor: [1]; RowWise: [m], one per row of A
  const float* scale_b = nullptr;  // PerTensor: [1]; RowWise: [n], one per row of B (column of C)
};

struct Grouped {
  const int32_t* a_row0 = nullptr;  // device [tiles_m]
  const int32_t* b_row0 = nullptr;  // device [tiles_m]
  const int32_t* rows = nullptr;    // device [tiles_m], 1..bm
  int64_t a_rows = 0;               // rows of A (and of Plain C)
  int64_t b_rows = 0;               // rows of B
};

struct GemmParams {
  DType dtype = DType::BF16;
  const void* a = nullptr;  // m x k
  const void* b = nullptr;  // n x k
  int32_t m = 0, n = 0, k = 0;
  plan::Schedule sched;     // m, n must match; bm x bn one of the supported tiles

  Store store = Store::Plain;
  void* c = nullptr;        // Plain: output, ldc elements per row (>= n)
  int64_t ldc = 0;
  void* slots = nullptr;    // SlotTiles / SlotRows: [slot_rows x bn]
  int64_t slot_rows = 0;
  const int32_t* row_of = nullptr;  // SlotRows: [tiles * bm]
  // SlotRows, optional: where each 64-row half of every tile (the storer's
  // unit) is one run of slot rows (plan::half_rows_of: all its rows stored,
  // consecutive), the slot row of each half's first row, [tiles * 2]: the
  // halves then go by TMA, as SlotTiles' do, instead of row by row from the
  // consumer warps (row_of unused). 128-row tiles.
  const int32_t* half_row = nullptr;

  uint32_t* counters = nullptr;        // non-null: signal each group
  const int32_t* group_of_tile = nullptr;  // [tiles] -> counter index (any contiguous tile ranges)
  Scatter scatter;                     // optional (SlotRows by row_of to the ranks' receive rows)
  Owner owner;                         // optional (Plain C by TMA, group_of_tile; no counters)
  Grouped grouped;                     // optional (Plain C, or SlotRows by row_of)
  Fp8 fp8;                             // optional: e4m3 inputs and their scales
  uint64_t* monitor_ns = nullptr;      // non-null: [tiles * 2] finish time of each half (globaltimer)
  uint32_t* monitor_sm = nullptr;      // [tiles] SM that computed the tile
  // Non-null: [tiles * 2] = {globaltimer ns, SM cycle count} when the tile's
  // first operand stage is requested (the producer runs a few stages ahead of
  // the MMAs, always by the same amount): consecutive tiles of one CTA give
  // its SM clock and cycles per tile (rt::summarize_tile_clocks).
  uint64_t* monitor_mma = nullptr;
  // Non-null, zeroed: [ctas * kPhaseSlots] globaltimer ns per CTA at the end
  // of its phases: {0: its last tile staged (the storer has both halves), 1:
  // that tile's stores and the CTA's pushes done (the later of the storer's
  // and the owner pusher warps'), 2: its share of the owner layout's copy
  // done, 3: its start, 4: its first tile's MMAs done, 5: its last tile's
  // MMAs done (consumer warpgroup 0's, before the epilogue's waits)}. Where
  // the GEMM's end goes (rt::summarize_phases). Stream-K launches (no owner
  // layout): 2 is when the CTA's partial was put, 4 when a finisher's own
  // k-blocks were done, before it added the other pieces' partials. FP8
  // whole tiles: 2 is when the CTA's first k-block was in shared memory.
  uint64_t* monitor_phases = nullptr;
  // 128x256 tiles, Plain C stored by TMA, alone, signalling (counters) or
  // with the owner layout (no tile-end monitor; the MMA and phase monitors
  // may be on; gemm_four_stages says whether
  // a launch qualifies): 4 pipeline stages instead of 3,
  // each consumer staging its output half in two pieces in half the shared
  // memory (the 4th stage's room). Bitwise the same C. false: 3 stages (A/B).
  bool four_stages = true;
  // Stream-K (plan/stream_k.h; docs/design.md §13, stream-K): the tiles from
  // stream_k.whole on cut along K so that every CTA computes as many
  // k-blocks (stream_k.on(): tiles, ctas and k-blocks those of this launch).
  // Plain or SlotTiles stores, without the owner layout, the scatter, the
  // grouped GEMM or monitors; a signal per tile as before (its finisher
  // sends it). stream_k_work: device memory of stream_k_workspace_bytes for
  // at least this grid and tile, zero before the first launch (each launch
  // leaves its flags so); one launch at a time per workspace. Off (the
  // default): every tile whole.
  plan::StreamK stream_k;
  void* stream_k_work = nullptr;
  // Launched as a programmatic dependent launch: the launch and the CTAs'
  // set-up overlap the end of the kernel before it on the stream, whose
  // memory the CTAs wait for before touching any. Off: a plain launch.
  bool pdl = false;
  // FP8, an experiment for grids of few tiles: each tile's k-blocks split
  // between the two CTAs of a cluster (sched.ctas = 2 x tiles, at most one
  // tile a cluster; k_blocks >= 2), each CTA storing one 64-row half of the
  // tile, the sum of its own partial and the peer's, sent by distributed
  // shared memory. Plain or SlotTiles stores; no stream-K, signals,
  // monitors of tiles or PDL.
  bool pair_k = false;
};

// A stream-K workspace: the flags first, in a region of fixed size (so
// that launches of any tile and grid can share one workspace: none writes
// a partial where another keeps a flag), then the partials.
constexpr int32_t kStreamKMaxCtas = 1024;
constexpr size_t kStreamKFlagBytes = size_t(kStreamKMaxCtas) * 2 * 4;
// The bytes of a stream-K workspace for up to `ctas` CTAs of tiles of up to bn columns.
constexpr size_t stream_k_workspace_bytes(int32_t ctas, int32_t bn) {
  return kStreamKFlagBytes + size_t(ctas) * 2 * (size_t(bn) / 2) * 128 * 4;
}

// TMA and the 16-byte copies need 16-byte aligned buffers.
inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// The runtime's default for Owner::pushers: on where a tile's mainloop is
// short (k <= 4096). The pusher warps free the storer for the next tile,
// which pays where the push outlasts a mainloop, and costs a little where
// k is larger (docs/results.md §2.3).
constexpr bool owner_pushers_by_k(int64_t k) { return k <= 4096; }

// Plain row-major C (ldc elements per row) = A B^T on the grid of `sched`.
inline GemmParams plain_gemm(DType dtype, const void* a, const void* b, const plan::Schedule& sched, int32_t k,
                             void* c, int64_t ldc) {
  GemmParams p;
  p.dtype = dtype, p.a = a, p.b = b, p.m = sched.m, p.n = sched.n, p.k = k, p.sched = sched;
  p.store = Store::Plain, p.c = c, p.ldc = ldc;
  return p;
}

// The tiles the GEMM is compiled for: op_tiles(fp8), then (FP8) the lab's
// 64x48 and 64x144; tile_supported: one of them.
const std::vector<plan::TileShape>& kernel_tiles(bool fp8);
bool tile_supported(int bm, int bn, bool fp8 = false);
// The tiles the overlapped ops (slots, signals, the owner layout) take,
// the widest first: 128x256 and 128x128; FP8 128x192, 128x160, 128x144,
// 128x128 and 128x112 (the lab's 64-row tiles are the kernel's only).
const std::vector<plan::TileShape>& op_tiles(bool fp8);
bool op_tile_supported(int bm, int bn, bool fp8 = false);
// Tiles as "128x192, 128x160, ...", for messages; op_tile_names: op_tiles(fp8)'s.
std::string tile_names(const std::vector<plan::TileShape>& tiles);
std::string op_tile_names(bool fp8);

// Throws flashoverlap::InvalidArgument naming the shape and the problem
// (unsupported tile, k not a multiple of 8, misaligned pointer, ...).
void check_gemm_params(const GemmParams& p);

// Enqueues the GEMM on `stream`. Throws on invalid input or launch failure.
void launch_gemm(const GemmParams& p, cudaStream_t stream);

// Whether launch_gemm runs `p` with 4 stages (GemmParams::four_stages).
bool gemm_four_stages(const GemmParams& p);
// Whether launch_gemm loads `p`'s blocks with L2 policies: FP8 whose B is
// larger than this GPU's L2 (l2_bytes; -1: ask the current device). B's
// blocks are then evicted first, A's last: B streams through once per tile
// row while A's few rows are read by every tile column.
bool gemm_l2_hints(const GemmParams& p, int64_t l2_bytes = -1);

// Loads every kernel of this library into the current context now. CUDA's
// lazy loading would otherwise load a module at its first launch, which
// synchronises the context and deadlocks against a stream already waiting on
// a flag that this kernel will set (docs/design.md §5.4).
void preload_kernels();

}  // namespace flashoverlap::kernels
