// allreduce.h — GEMM + AllReduce overlapped through tile signals
// (docs/design.md §3). Built once for a plan (schedule + partition); each
// call only enqueues work on the caller's stream:
//
//   caller stream: signalling GEMM -> tiles into slots, group counters += 2/tile
//   comm stream:   for each group g: wait(counter[g] >= epoch * target[g]);
//                  ncclAllReduce(slots of g) in place
//   caller stream: wait(comm done); post-reorder (plain or + residual + RMSNorm)
//
// Two layouts of the data the AllReduces run on:
//   Slots     the paper's: tile idx at slot rows [idx*bm, idx*bm+bm) of a
//             buffer of tiles, groups are runs of waves, a post-reorder
//             (fused with RMSNorm when asked) restores row-major C;
//   RowBands  groups are runs of whole row bands of the schedule (AlongN: a
//             band is `swizzle` tile rows, consecutive tile indices), which
//             are contiguous rows of row-major C: the GEMM writes C itself
//             and the AllReduces run on it in place, no reorder at all.
//   Gathered  groups of whole row bands as for RowBands; rank r's partial of
//             group g goes to its own block of a symmetric buffer laid out
//             [group][rank][rows of g], an in-place ncclAllGather on a
//             zero-CTA communicator moves the blocks with the copy engines
//             (no SM taken from the GEMM, which runs on all of them), and
//             the element-wise step sums the ranks' blocks in rank order
//             (for 2 ranks exactly ncclAllReduce's sum), per group as soon
//             as its gather is done, fused with residual + RMSNorm if asked.
//   GatheredTiles  the same transport on the tile slots of Slots (groups
//             are any runs of tiles, so the raster keeps the GEMM's best tile
//             order); the sum writes each tile to its place in C.
//   Pushed    the blocks of Gathered, but no collective call at all: the
//             GEMM's epilogue stores each tile into its own block on this GPU
//             and, over NVLink, on every peer (the buffer is a
//             symmetric NCCL window, the peers' copies mapped by NCCL), then
//             counts it in the group's arrival counter on each GPU (release
//             at system scope). The sum (in the GEMM's idle producer warps,
//             or after it) starts on a group once all ranks' tiles of it have
//             arrived. The last tiles are exchanged as they finish, so what
//             is left after the GEMM is one tile's transfer and the last sum.
//             Needs every rank reachable by loads and stores (one NVLink
//             domain); blocks alternate between two halves of the buffer by
//             call parity, so a fast rank's next call never overwrites a
//             block a slow rank is still summing.
//   PushedTiles  the same on the tile slots of GatheredTiles: groups are
//             runs of waves, the raster keeps the GEMM's best tile order.
//   Both pushed layouts can instead move the blocks with the copy engines
//   (PushBy::CopyEngines): the GEMM stores only here, and per group a copy
//   stream waits for its tiles, copies this rank's block into each peer's
//   copy and writes the peer's flag, which the sum waits for too.
//   Pushed row bands on 2 ranks can instead reduce each tile at one rank,
//   its owner (PushBy::Owners, kernels::Owner): each rank computes the
//   tiles it does not own first and stores them only into the owner's
//   window; the owner adds the peer's partial in its tile's epilogue and
//   stores the final tile into the output and the peer's window, from which
//   the peer copies it during its GEMM. No sum pass: 3 bytes of HBM traffic
//   per byte of C instead of 5, nothing but one wave's copy after the GEMM.
//   In place (run_rmsnorm): C is the window itself, where the
//   peer's finals land, and nothing is copied.
//   On 3-8 ranks (pushed, 128x256 tiles on 4 stages; kernels::Owner::world)
//   each rank owns a contiguous range of tiles, receives the other ranks'
//   partials of them in its window's W - 1 slots and sends each final to
//   every other rank: 2 (W - 1) / W output-sizes out of each GPU, as NCCL's
//   ring, within rounding of it. Only where asked for (push_by): the tuner
//   does not yet try it on 3+ ranks.
//   (Owners pulled — each rank storing its tiles locally and the other
//   reading them over NVLink — measured as fast or up to 5% slower, never
//   faster, and was retired: docs/results.md §2.7.)
// A plan with one group runs the sequential fallback: our GEMM straight into
// the output, then one ncclAllReduce on the caller's stream.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/flags.h"
#include "kernels/gemm.h"
#include "plan/block_layout.h"
#include "plan/partition.h"
#include "plan/schedule.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/core/gemm_monitor.h"
#include "runtime/core/overlap_core.h"
#include "runtime/transport/peer_map.h"
#include "runtime/transport/symmetric.h"
#include "runtime/core/tile_clocks.h"

#include <memory>

namespace flashoverlap::rt {

enum class ArLayout { Slots, RowBands, Gathered, GatheredTiles, Pushed, PushedTiles };
// "slots", "row bands", "gathered", "gathered tiles", "pushed", "pushed tiles"
const char* layout_name(ArLayout l);
// "waves 3,2,2" or "bands 2,1,1": the group sizes in the layout's unit (the
// schedule's); "1 (sequential)" for one group. What the op running them and
// the planner's text (api::AllReducePlanner) say.
std::string describe_groups(ArLayout layout, const plan::Schedule& s, const std::vector<plan::Group>& groups);
// Where the ranks' blocks are summed, for messages: " (sum in the GEMM)", ...;
// "" for the layouts NCCL sums.
const char* sum_place(ArLayout l, bool fuse_sum);
inline bool is_gathered(ArLayout l) { return l == ArLayout::Gathered || l == ArLayout::GatheredTiles; }
inline bool is_pushed(ArLayout l) { return l == ArLayout::Pushed || l == ArLayout::PushedTiles; }
inline bool is_banded(ArLayout l) {
  return l == ArLayout::RowBands || l == ArLayout::Gathered || l == ArLayout::Pushed;
}

// Pushed layouts: what moves this rank's tiles into the peers' copies.
enum class PushBy {
  Gemm,         // the GEMM's storer warp, NVLink stores as each tile finishes
  CopyEngines,  // per group, cudaMemcpyAsync of this rank's block once its tiles are stored
  Owners,       // the GEMM's stores, each tile summed by its owner rank (row bands; 2-8 ranks)
};
inline bool is_owners(PushBy b) { return b == PushBy::Owners; }
// sum_place for a plan moved by `by`: with owners, " (summed in the
// epilogues; copies in the GEMM)" or "...; copies at the GEMM's end)".
const char* sum_place(ArLayout l, bool fuse_sum, PushBy by);

// The owner layout's call check (kernels::Owner::publish and check, without
// tokens; docs/design.md §5.8): each rank's descriptor slots [2 parities]
// [kMaxCounters sources] `at` bytes into every rank's copy of an owner
// window (zeroed on every rank before the first call), and the owner calls
// made on that window so far (every op on it counts them: the calls'
// numbers are the window's).
class OwnerCallSlots {
 public:
  static constexpr size_t kBytes = 2 * kernels::kMaxCounters * sizeof(kernels::CallDesc);
  OwnerCallSlots() = default;
  // bases: every rank's copy of the window as this process addresses it.
  OwnerCallSlots(const std::vector<char*>& bases, size_t at, int rank);
  // o's publish and check for the next call: this rank's m and plan digest
  // (owner_call_plan), expected of every other rank too.
  void prepare(kernels::Owner& o, uint32_t m, uint32_t plan) const;
  void advance() { ++calls_; }  // the prepared call is enqueued
  uint32_t count() const { return calls_; }  // owner calls enqueued so far (a shared window's halves alternate by it)
 private:
  DeviceBuffer publish_;  // device [2][world]: this rank's slot of each parity at every rank
  const kernels::CallDesc* mine_ = nullptr;
  int world_ = 0;
  uint32_t calls_ = 0;
};
// The owner call check's digest of a call's plan (FNV-1a of what the ranks
// must agree on besides m: the ranks, n, k, the dtype, the tile shape, the
// tile rows, the tiles' numbering (raster, swizzle, row shift: a tile's
// flag and rows are found by its index), the split, and the registered
// output whose peers' copies the finals go into (registered_slot; -1:
// none); not the CTAs, which only order a rank's own work).
uint32_t owner_call_plan(const plan::Schedule& s, int world, int k, kernels::DType dtype, int32_t split,
                         int registered_slot);

// The owner layout's window shared by several ops (the public
// GemmAllReduce's plans for each m's tile rows, kernels::Owner): one
// symmetric buffer for the largest m, built once and collectively, its
// flags zero on every rank before any call. Its data halves alternate with
// every owner call of any op on it (`calls.count()`: a fast rank's next call never
// overwrites what a slow rank still reads, whichever op made it); the flags
// are one region per tile rows, so that the epochs of each op count its own
// calls only. The same on every rank (every rank makes the same calls).
struct OwnerWindow {
  // Collective over comm (2-8 ranks that reach each other's memory).
  OwnerWindow(ncclComm_t comm, int rank, int64_t max_tile_rows, int64_t n, int64_t max_tiles_n, const std::string& what);
  SymmetricBuffer buffer;
  int world = 0;
  int64_t max_tile_rows = 0, max_tiles_n = 0;
  int64_t half_rows = 0;     // one half of a sender slot: max_tile_rows x 128 rows of n
  size_t flags_at = 0;       // bytes into the buffer: the flag regions
  std::vector<char*> bases;  // every rank's copy of the buffer, by rank
  OwnerCallSlots calls;      // after the flag regions; counts the owner calls (their halves alternate by it)
  // Bytes into the buffer of the flags of the ops of `tile_rows` rows: the
  // regions of 1, 2, ... tile rows, max_tiles_n flags per tile row.
  size_t flags_of(int64_t tile_rows) const {
    return flags_at + size_t((tile_rows - 1) * tile_rows / 2 * max_tiles_n) * sizeof(uint32_t);
  }
};

struct OverlapAllReduceOptions {
  plan::Schedule sched;           // m = the M of every call
  // Consecutive tile ranges covering [0, tiles): plan::make_groups(sched,
  // partition) for Slots, plan::band_groups() for RowBands. One group: sequential.
  std::vector<plan::Group> groups;
  ArLayout layout = ArLayout::Slots;
  int k = 0;
  kernels::DType dtype = kernels::DType::BF16;
  ncclComm_t comm = nullptr;      // for the groups that overlap the GEMM
  ncclComm_t tail_comm = nullptr; // optional: the last group (after the GEMM), e.g. with more CTAs
  // Pushed: the buffer is registered on `comm` (construction and destruction
  // are collective over it); no NCCL call is made per call.
  // Gathered: a communicator created with NCCL_CTA_POLICY_ZERO (copy-engine
  // AllGather); the op registers its buffer on it, so constructing and
  // destroying the op are collective over it.
  ncclComm_t gather_comm = nullptr;
  int rank = 0;                   // for messages
  double wait_timeout_s = 30.0;   // a group not complete by then fails the call
  // register_output's exchange with the other ranks fails after this long
  // (a rank that never calls it), rather than waiting for ever; the
  // communicator then holds the unfinished step and must be aborted
  // (ncclCommAbort) unless that rank still joins (exchange.h).
  double exchange_timeout_s = 120.0;
  // Shared with other ops whose calls come in order with this one's (the
  // public GemmAllReduce's plans for each m): the communication stream, the
  // order of calls, the wait record and the scratch (OverlapCore). nullptr:
  // the op's own.
  OverlapCore* core = nullptr;
  // Owners: the window, shared with other ops (OwnerWindow); nullptr: the op's own.
  OwnerWindow* owner_window = nullptr;
  // Switches for tests and measurements, never for users' calls.
  struct Testing {
    int fault_drop_group = -1;  // this group's signals go nowhere (copy engines: its flags)
    // The op starts as if `first_epoch` calls had run (epoch(), every counter
    // and flag where they would have left them), so that tests cross the
    // counters' 2^32 wrap. The same on every rank.
    uint32_t first_epoch = 0;
    // Owners on 2 ranks take the path of 3-8 (kernels::Owner::wide: every
    // rank's window, flags and output by rank, the pusher warps, no TMA
    // pushes), which must give the same bits; so 2 GPUs test that runtime.
    bool owners_wide = false;
  } testing;
  // Keep the trace buffers (events around the GEMM and each group, the GEMM's
  // tile and phase monitors) and trace the calls until set_tracing(false).
  // The events cost each traced call device time (2xH200, owners: 6 us on
  // 4096^3, 15 us on 3001x8192x8192; the monitors nothing measurable), so
  // time calls untraced and trace one more (see timeline()).
  bool trace = false;
  // Sequential fallback only: run cuBLAS instead of our GEMM (when the tuner
  // measured it faster on this shape: never slower than what users run).
  bool fallback_cublas = false;
  // The cuBLAS object fallback_cublas runs on, the caller's (shared by its
  // ops: one handle and workspace); nullptr: one of the op's own.
  CublasGemm* cublas = nullptr;
  // Gathered and Pushed: sum the groups inside the GEMM (its idle producer warps) rather
  // than in kernels after it. Taken when the output allows it (contiguous,
  // n % 8 == 0) and the wait cannot deadlock: the spin waiter needs an SM the
  // GEMM leaves free, since the GEMM now waits for the gathers.
  bool fuse_sum = true;
  // Pushed: tiles per system-scope fence and signal of the GEMM's storer
  // warp (1 or 2). The fence waits an NVLink round trip with no copy in
  // flight; 2 halves those gaps (faster where the pushes bound the call,
  // neutral on GEMM-bound shapes) and holds a tile's signal at most one tile.
  int push_signal_every = 2;
  // 128x256 tiles: the GEMM with 4 pipeline stages, its output staged in
  // pieces (kernels::GemmParams::four_stages): owners (pushed from this
  // GPU's memory, the peer's finals copied through registers), and the
  // signalling GEMM of row bands and of gathered rows summed after it.
  // false: 3 stages (A/B).
  bool four_stages = true;
  // Owners pushed with 4 stages: which tiles go to the peer by TMA straight
  // from the GEMM's staging (kernels::Owner::push_tma): 0 none (every tile
  // pushed from C by the storer warp), 1 each CTA's last tile, 2 all (A/B).
  // 1: the last wave's pushes decide the GEMM's end and TMA moves them
  // faster than the storer warp's loads and stores; on every tile it would
  // hold the TMA unit from the operand loads (slower: docs/results.md §2.3).
  int push_tma = 1;
  // Owners pushed with 4 stages: the tiles pushed from C by warps 2 and 3,
  // so that the storer warp goes on with the next tile's pieces
  // (kernels::Owner::pushers): 1 on, 0 off (the storer pushes each tile
  // before the next one's pieces), -1 by k: on where k <= 4096, where it
  // measured faster (docs/results.md, the AllReduce's kept levers).
  int owner_pushers = -1;
  // Pushed: the GEMM's stores, or the copy engines (the GEMM stores here
  // only; per group a copy stream waits for its tiles with a stream memory
  // op, copies this rank's block to each peer and writes the peer's flag for
  // it; the sum waits for its own tiles and every peer's flag). The copy
  // engines take no SM time from the GEMM.
  PushBy push_by = PushBy::Gemm;
  // Owners: fuse_sum = the producer's idle warps copy the peer's final tiles
  // during the GEMM (else only the consumer warps, once their tiles are done).
  // Copy engines: streams the groups' copies take in turn (1-8; one stream
  // runs them one after another, measured at ~280 GB/s beside the GEMM).
  int copy_streams = 2;
};

// Times of one call, in ms from the GEMM's launch on the caller's stream
// (trace mode): when each group's wait ended and its AllReduce ended.
struct Timeline {
  double gemm_end = 0;
  std::vector<double> wait_end, comm_end;
  TileClocks clocks;  // the GEMM's SM clock and cycles per tile (its tile monitor)
  GemmPhases phases;  // when its CTAs' last tiles were staged, stored and pushed, copies done
};

// The residual and residual_out must not overlap the output, nor each
// other (the pushed layouts sum into the output before the norm reads the
// residual, and long rows read the residual twice): run_rmsnorm throws
// InvalidArgument if they do.
struct RmsNormArgs {
  const void* residual = nullptr;  // m x n
  const void* weight = nullptr;    // n
  float eps = 1e-6f;
  void* residual_out = nullptr;    // optional: h = x + residual
};
// Throws InvalidArgument (after `who`) unless the residual, the weight and
// `out` are given and the residual, residual_out and `out` (`bytes` each)
// do not overlap.
void check_norm_buffers(const RmsNormArgs& norm, const void* out, size_t bytes, const std::string& who);

// Calls and streams (what the tests check):
//  - one op: calls may come on any streams; a call on another stream than
//    the previous call's waits for the end of that call first (the op
//    orders its calls itself: its buffers and counters serve one call at a
//    time), and every rank must make the same calls in the same order;
//  - several ops on one GPU: each owns its buffers, so their calls may be
//    interleaved in any order that is the same on every rank; calls of
//    different ops must not run at the same time on one GPU (order them on
//    one stream, or with events): their GEMMs need the SMs they were
//    planned for, and ops sharing a communicator order their NCCL calls as
//    NCCL requires (the same order on every rank);
//  - destroying an op waits for its last call's work (the destructor
//    synchronises with it): outputs of calls made before it are complete
//    once the destructor returns.
class OverlapAllReduce {
 public:
  explicit OverlapAllReduce(const OverlapAllReduceOptions& opts);
  ~OverlapAllReduce();
  OverlapAllReduce(const OverlapAllReduce&) = delete;
  OverlapAllReduce& operator=(const OverlapAllReduce&) = delete;

  // out (m x n, ld_out) = AllReduce over ranks of A (m x k) * B (n x k)^T.
  // m must equal the planned M (the schedule is fixed at construction).
  void run(const void* a, const void* b, void* out, int64_t ld_out, cudaStream_t stream);
  // out = RMSNorm(AllReduce(A B^T) + residual) * weight, rows of n (ld = n).
  void run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out, cudaStream_t stream);
  // Whether run_rmsnorm keeps C in the window (owners, pushed).
  bool result_in_window() const;
  // Collective (every rank, in the same order, each its own buffer): makes
  // `out` (m x n, ld_out elements per row, 16-byte aligned, ld_out % 8 == 0;
  // from cudaMalloc where the ranks are processes of their own) an output
  // of run_registered, and returns its slot (the same on every rank). The
  // buffer must outlive the op.
  int register_output(void* out, int64_t ld_out);
  // As run into registered output `slot` (every rank the same slot). With
  // owners pushed on 4 stages the peer stores its final tiles straight into
  // it (kernels::Owner::finals_in_c): no copy of the peer's tiles after the
  // GEMM, as in place, but in the caller's buffer; other plans run as run.
  // m > 0 (owners): m rows of the plan's tile rows, as run_rows.
  void run_registered(const void* a, const void* b, int slot, cudaStream_t stream, int64_t m = 0);
  // Whether run_registered stores straight into the peer's output on this plan.
  bool finals_into_outputs() const;
  // Owners (pushed row bands): run and run_rmsnorm for m rows, any m of the
  // planned M's tile rows (the window and the flags serve them all).
  void run_rows(const void* a, const void* b, void* out, int64_t ld_out, int64_t m, cudaStream_t stream);
  void run_rmsnorm_rows(const void* a, const void* b, const RmsNormArgs& norm, void* out, int64_t m, cudaStream_t stream);
  // (The destructor waits for the last call's work on the caller's stream:
  // the pushed layouts' peers may still be storing into this op's buffer.)

  // Throws Error naming rank, group, counter and expected value if a wait of
  // an earlier call timed out. Call after synchronising the stream.
  void check() const;
  // A call was captured into a CUDA graph (which then reads this op's
  // tables and counters for as long as it lives).
  bool captured() const { return graph_; }

  const plan::Schedule& schedule() const { return opts_.sched; }
  const std::vector<plan::Group>& groups() const { return opts_.groups; }
  ArLayout layout() const { return opts_.layout; }
  bool sequential() const { return opts_.groups.size() <= 1; }
  // "waves 3,2,2" or "bands 2,1,1": the group sizes in the layout's unit.
  std::string describe_groups() const;
  uint32_t epoch() const { return epoch_; }
  // Gathered: sums inside the GEMM (plain contiguous output). Pushed: the
  // producer warps sum during the GEMM (else the consumer warps only, after their tiles).
  bool fuses_sum() const { return fuse_ok_; }
  // The GEMM runs 4 pipeline stages (OverlapAllReduceOptions::four_stages:
  // owners, row bands, gathered rows summed after the GEMM).
  bool four_stages() const { return four_stages_; }
  // The last traced call's timeline (synchronises with its events; empty
  // when no call was traced).
  Timeline timeline() const;
  // Whether the next calls are traced (OverlapAllReduceOptions::trace: on
  // from the start). Throws InvalidArgument to turn it on in an op built
  // without trace buffers.
  void set_tracing(bool on);

 private:
  // RowBands: the GEMM writes row-major `c` (n per row); Slots: c unused.
  // Gathered, plain output: groups but the last are summed into `out` inside
  // the GEMM; the last is AllReduced by NCCL straight into out's rows when
  // `tail_allreduce` (contiguous out and a tail communicator), else gathered.
  struct FusedOut {
    void* out = nullptr;
    int64_t ld_out = 0;
    bool tail_allreduce = false;
    bool sum_in_gemm = true;  // else the caller sums groups but the last after the GEMM
  };
  void enqueue_run(const void* a, const void* b, void* out, int64_t ld_out, cudaStream_t stream);
  void enqueue_run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out, cudaStream_t stream);
  void enqueue_overlapped(const void* a, const void* b, void* c, cudaStream_t stream, const FusedOut* fused = nullptr);
  void enqueue_sequential_allreduce(void* data, int64_t count, cudaStream_t stream);
  // Sequential fallback: row-major C = A B^T (n per row) on the caller's stream.
  void enqueue_sequential_gemm(const void* a, const void* b, void* c, cudaStream_t stream);
  // Elements of group g: offset into the buffer the AllReduce runs on, count.
  std::pair<int64_t, int64_t> group_elements(size_t g) const;
  // Gathered: the element-wise step of group g (rows of C), after its gather.
  // (Pushed: after a bounded wait for the group's arrivals; src = this call's half.)
  void enqueue_gathered_post(size_t g, void* out, int64_t ld_out, const RmsNormArgs* norm, cudaStream_t stream);
  // Pushed: the GEMM with its pushes (and the sum inside it when `fused`),
  // then the sum of the groups it did not sum (plain or + RMSNorm).
  void enqueue_pushed(const void* a, const void* b, void* out, int64_t ld_out, const RmsNormArgs* norm,
                      cudaStream_t stream);
  const char* pushed_half() const;  // this call's half of the pushed buffer
  // The sum of groups 0..groups-1 of this call (epoch), summed from
  // `gathered` into `out` once ready[g] says they arrived.
  kernels::FusedSum fused_sum(int32_t groups, const uint32_t* ready, const void* gathered, void* out,
                              int64_t ld_out) const;
  uint64_t timeout_ns() const { return uint64_t(opts_.wait_timeout_s * 1e9); }
  // The timeouts' bound in seconds (a week: ns fit in 64 bits many times over).
  static constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;

  // Gathered and pushed layouts: each group's blocks (plan/block_layout.h).
  using GatherBlock = plan::RankBlocks;
  int64_t gather_width_ = 0;
  void setup_blocks(int64_t parities);  // gather_, gathered_rows_ (rows of one half), row_shift_, sum_table_
  // world_ and gather_rank_ from the communicator the layout registers its buffer on.
  void bind_world(ncclComm_t comm, const char* which);
  void setup_gathered();
  void setup_pushed();
  // PushBy::Owners (allreduce_owners.cpp): the window [2 halves][tiles_m * bm
  // rows][n] + per-tile flags; one call = the GEMM (then RMSNorm).
  void setup_owned();
  // With norm, pushed owners keep C in the window (kernels::Owner::in_place).
  // reg: out is that registered output (finals_into_outputs()).
  struct RegisteredOutput {
    void* out;
    int64_t ld;
    PeerMappedBuffer mapped;  // on the peer, where finals_into_outputs(); else empty
    DeviceBuffer outs_of, lds_of;  // more than 2 ranks: every rank's C and ld, by rank (kernels::Owner::outs_of)
  };
  // m: the call's rows (0: the planned M; else of its tile rows).
  void enqueue_owned(const void* a, const void* b, void* out, int64_t ld_out, const RmsNormArgs* norm,
                     cudaStream_t stream, const RegisteredOutput* reg = nullptr, int64_t m = 0);
  char* owner_base_ = nullptr;  // owners: this GPU's window (its own, or the shared one's)
  void check_rows(int64_t m, const char* call) const;  // run_rows' m: of the plan's tile rows (owners)
  // run_rmsnorm's buffers for m rows: present, not overlapping (InvalidArgument).
  void check_rmsnorm_args(const RmsNormArgs& norm, const void* out, int64_t m) const;
  std::vector<RegisteredOutput> registered_;  // register_output's buffers, by slot
  bool owners() const { return is_pushed(opts_.layout) && is_owners(opts_.push_by); }
  DeviceBuffer windows_of_, flags_of_;     // owners on more than 2 ranks: every rank's window and flags, by rank
  bool wide() const { return world_ > 2 || opts_.testing.owners_wide; }  // owners: the path of more than 2 ranks
  int32_t owner_split_ = 0;                // rank 1 owns tiles [0, split), rank 0 the rest
  uint32_t* owner_flags_ = nullptr;        // [tiles] in the window
  uint32_t* owner_peer_flags_ = nullptr;   // the peer's
  OwnerCallSlots own_calls_;               // the call check on the op's own window (not a shared one)
  DeviceBuffer owned_scratch_;             // C for outputs TMA cannot store to (then copied)
  std::vector<GatherBlock> gather_;
  int64_t gathered_rows_ = 0;
  int world_ = 1, gather_rank_ = 0;
  bool fuse_ok_ = false;  // fuse_sum, and the waits can run beside the GEMM
  bool four_stages_ = false;
  SymmetricBuffer gathered_;
  DeviceBuffer row_shift_, sum_table_, ready_;
  // Pushed: the peers' buffers and arrival counters, this GPU's (in the window).
  DeviceBuffer push_peers_, peer_arrivals_;
  DeviceBuffer claims_;      // pushed: [2 calls][groups] chunk claims of the in-GEMM sum
  bool kernel_sum_ok_ = false;  // pushed: the GEMM can sum every group (contiguous plain output)
  uint32_t* arrivals_ = nullptr;
  // Pushed by the copy engines: [groups][world] flags in the window (peers
  // write theirs once their copy of a group landed here); the peers' bases
  // and flags, by peer.
  uint32_t* peer_flags_ = nullptr;
  std::vector<char*> peer_base_;
  std::vector<uint32_t*> peer_flag_at_;
  std::vector<cudaStream_t> copy_streams_;
  std::vector<cudaEvent_t> copies_done_;  // [call parity][copy stream]: the end of that call's copies
  void enqueue_copies();  // the copy streams' work of this call
  void wait_pushed_group(size_t g, cudaStream_t stream);  // before a sum after the GEMM
  bool copy_engines() const { return is_pushed(opts_.layout) && opts_.push_by == PushBy::CopyEngines; }
  // fault_drop_group as the GEMM sees it: its signals (and stores) go to a
  // sink. With the copy engines the group's flag writes are dropped instead.
  // (Owners: the GEMM's flag counts for the group are skipped instead, kernels::Owner::drop_group.)
  int gemm_drop_group() const { return copy_engines() || owners() ? -1 : opts_.testing.fault_drop_group; }
  std::vector<uint32_t> per_epoch_;  // arrivals per group per call
  std::vector<cudaEvent_t> group_done_;

  OverlapAllReduceOptions opts_;
  std::vector<uint32_t> target_;  // signals per group per call
  DeviceBuffer counters_, group_of_tile_;
  kernels::WaitError* wait_error_ = nullptr;  // the core's (host-mapped)
  // Before each public call's work: the order of calls (OverlapCore::
  // begin_call), and under CUDA graph capture the switch to counters reset
  // per call (graph_), or a refusal where the plan cannot replay. After it:
  // its end, which the next call and the destructor wait for.
  void begin_call(cudaStream_t stream);
  void end_call(cudaStream_t stream) { core_->end_call(stream); }
  // Captured into a graph once: from then on every call zeroes its group
  // counters first and waits for one call's signals, so that a replay (its
  // launch arguments frozen) and eager calls both find what they expect.
  bool graph_ = false;
  // What call `epoch_` waits for in group g's counter.
  uint32_t counter_target(size_t g) const { return graph_ ? target_[g] : epoch_ * target_[g]; }
  std::unique_ptr<OverlapCore> own_core_;
  OverlapCore* core_ = nullptr;
  // Slots: the tile buffer; otherwise row-major scratch (strided outputs,
  // RMSNorm's input), from the core (its slot kSlotsScratch).
  void* slots_ = nullptr;
  static constexpr int kSlotsScratch = 0;
  uint32_t epoch_ = 0;
  // ++epoch for one call, taken back when it goes out of scope unless kept:
  // a call refused before its GEMM is queued (bad pointers, ...) leaves the
  // flags' count, which both ranks' next calls compare against, as it was.
  struct EpochBump {
    uint32_t& epoch;
    bool keep = false;
    explicit EpochBump(uint32_t& e) : epoch(++e) {}
    ~EpochBump() {
      if (!keep) --epoch;
    }
    EpochBump(const EpochBump&) = delete;
    EpochBump& operator=(const EpochBump&) = delete;
  };
  // The call's GEMM: checked (a refusal takes the epoch back and leaves the
  // last traced call's events whole), then launched (bump kept); while
  // tracing, with the monitors attached and trace_[0], trace_[1] around it.
  // From trace_[0] the timeline is invalid until the caller has recorded the
  // call's last event and set traced_: a throw leaves none, not a mixed one.
  void launch_call_gemm(kernels::GemmParams& p, cudaStream_t stream, EpochBump& bump);
  // trace: [0] GEMM start, [1] GEMM end, then per group wait end, comm end
  std::vector<cudaEvent_t> trace_;
  GemmMonitor monitor_;  // trace: the GEMM's tile and phase monitors
  bool tracing_ = false;  // the next calls record trace_ and the monitors (set_tracing)
  bool traced_ = false;   // a call has recorded them
  std::unique_ptr<CublasGemm> own_cublas_;  // fallback_cublas without the caller's
  CublasGemm* cublas_ = nullptr;
};

}  // namespace flashoverlap::rt
