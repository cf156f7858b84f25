// allreduce.h — GEMM + AllReduce overlapped through tile signals
// (docs/design.md §3). Built once for a plan (schedule + partition); each
// call only enqueues work on the caller's stream:
//
//   caller stream: signalling GEMM -> tiles into slots, group counters += 2/tile
//   comm stream:   for each group g: wait(counter[g] >= epoch * target[g]);
//                  ncclAllReduce(slots of g) in place
//   caller stream: wait(comm done); post-reorder (plain or + residual + RMSNorm)
//
// Three layouts of the data the AllReduces run on:
//   Slots     the paper's: tile idx at slot rows [idx*bm, idx*bm+bm) of a
//             buffer of tiles, groups are runs of waves, a post-reorder
//             (fused with RMSNorm when asked) restores row-major C;
//   RowBands  groups are runs of whole row bands of the schedule (AlongN: a
//             band is `swizzle` tile rows, consecutive tile indices), which
//             are contiguous rows of row-major C: the GEMM writes C itself
//             and the AllReduces run on it in place, no reorder at all.
//   Owners    no collective call: each tile is reduced at one rank, its
//             owner (kernels::Owner), over NVLink (every rank within
//             load/store reach; a symmetric NCCL window): each rank
//             computes the tiles it does not own first and stores them only
//             into the owner's window; the owner adds the peer's partial in
//             its tile's epilogue and stores the final tile into the output
//             and the peer's window, from which the peer copies it during
//             its GEMM. No sum pass: 3 bytes of HBM traffic per byte of C
//             instead of 5, nothing but one wave's copy after the GEMM. In
//             place (run_rmsnorm): C is the window itself, where the peer's
//             finals land, and nothing is copied. Its halves alternate by
//             call parity, so a fast rank's next call never overwrites what
//             a slow rank still reads. On 3-8 ranks (128x256 tiles on 4
//             stages; kernels::Owner::world) each rank owns a contiguous
//             range of tiles, receives the other ranks' partials of them in
//             its window's W - 1 slots and sends each final to every other
//             rank: 2 (W - 1) / W output-sizes out of each GPU, as NCCL's
//             ring, within rounding of it.
//   (The gathered layouts on the copy engines, the pushed layouts with the
//   ranks' blocks summed in the GEMM or after it, and owners pulled were
//   measured and retired: docs/results.md, the AllReduce's retired layouts.)
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

enum class ArLayout { Slots, RowBands, Owners };
// "slots", "row bands", "owners"
const char* layout_name(ArLayout l);
// "waves 3,2,2" or "bands 2,1,1": the group sizes in the layout's unit (the
// schedule's); "1 (sequential)" for one group. What the op running them and
// the planner's text (api::AllReducePlanner) say.
std::string describe_groups(ArLayout layout, const plan::Schedule& s, const std::vector<plan::Group>& groups);
// Row bands and owners: groups of whole row bands.
inline bool is_banded(ArLayout l) { return l == ArLayout::RowBands || l == ArLayout::Owners; }

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
  // partition) for Slots, plan::band_groups() for RowBands and Owners. One
  // group: sequential.
  std::vector<plan::Group> groups;
  ArLayout layout = ArLayout::Slots;
  int k = 0;
  kernels::DType dtype = kernels::DType::BF16;  // the output's (C and the AllReduce)
  // FP8 inputs (fp8.on, fp8.scales; the pointers are each call's:
  // set_input_scales): 128x128 tiles, not with the owner layout.
  kernels::Fp8 fp8;
  ncclComm_t comm = nullptr;      // for the groups that overlap the GEMM
  ncclComm_t tail_comm = nullptr; // optional: the last group (after the GEMM), e.g. with more CTAs
  // Owners: the window is registered on `comm` (construction and
  // destruction are collective over it); no NCCL call is made per call.
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
    int fault_drop_group = -1;  // this group's signals go nowhere (owners: this rank's waits for its tiles fail)
    // The op starts as if `first_epoch` calls had run (epoch(), every counter
    // and flag where they would have left them), so that tests cross the
    // counters' 2^32 wrap. The same on every rank.
    uint32_t first_epoch = 0;
    // Owners on 2 ranks take the path of 3-8 (kernels::OwnerWalk::Ranges: every
    // rank's window, flags and output by rank, the pusher warps, no TMA
    // pushes), which must give the same bits; so 2 GPUs test that runtime.
    bool owners_wide = false;
  } testing;
  // Keep the trace buffers (events around the GEMM and each group, the GEMM's
  // tile and phase monitors) and trace the calls until set_tracing(false).
  // The events cost each traced call device time (docs/results.md §2.6), so time
  // calls untraced and trace one more (see timeline()).
  bool trace = false;
  // Sequential fallback only: run cuBLAS instead of our GEMM (when the tuner
  // measured it faster on this shape: never slower than what users run).
  bool fallback_cublas = false;
  // The cuBLAS object fallback_cublas runs on, the caller's (shared by its
  // ops: one handle and workspace); nullptr: one of the op's own.
  CublasGemm* cublas = nullptr;
  // Owners: the producer's idle warps copy the peer's final tiles during
  // the GEMM (else only the consumer warps, once their tiles are done).
  bool owner_copy_in_gemm = true;
  // 128x256 tiles: the GEMM with 4 pipeline stages, its output staged in
  // pieces (kernels::GemmParams::four_stages): owners (pushed from this
  // GPU's memory, the peer's finals copied through registers), and the
  // signalling GEMM of row bands. false: 3 stages (A/B).
  bool four_stages = true;
  // Owners with 4 stages: which tiles go to the peer by TMA straight
  // from the GEMM's staging (kernels::Owner::push_tma): 0 none (every tile
  // pushed from C by the storer warp), 1 each CTA's last tile, 2 all (A/B).
  // 1: the last wave's pushes decide the GEMM's end and TMA moves them
  // faster than the storer warp's loads and stores; on every tile it would
  // hold the TMA unit from the operand loads (slower: docs/results.md §2.3).
  int push_tma = 1;
  // Owners with 4 stages: the tiles pushed from C by warps 2 and 3,
  // so that the storer warp goes on with the next tile's pieces
  // (kernels::Owner::pushers): 1 on, 0 off (the storer pushes each tile
  // before the next one's pieces), -1 by k: on where k <= 4096, where it
  // measured faster (docs/results.md, the AllReduce's kept levers).
  int owner_pushers = -1;
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
// other (long rows read the residual twice): run_rmsnorm throws
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
  // FP8 inputs: the scales of the calls from here on (device fp32, as
  // OverlapAllReduceOptions::fp8.scales says; captured with a graph's call).
  void set_input_scales(const float* a, const float* b) { opts_.fp8.scale_a = a, opts_.fp8.scale_b = b; }
  // out = RMSNorm(AllReduce(A B^T) + residual) * weight, rows of n (ld = n).
  void run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out, cudaStream_t stream);
  // Whether run_rmsnorm keeps C in the window (owners).
  bool result_in_window() const;
  // Collective (every rank, in the same order, each its own buffer): makes
  // `out` (m x n, ld_out elements per row, 16-byte aligned, ld_out % 8 == 0;
  // from cudaMalloc where the ranks are processes of their own) an output
  // of run_registered, and returns its slot (the same on every rank). The
  // buffer must outlive the op.
  int register_output(void* out, int64_t ld_out);
  // As run into registered output `slot` (every rank the same slot). With
  // owners on 4 stages the peer stores its final tiles straight into
  // it (kernels::Owner::finals_in_c): no copy of the peer's tiles after the
  // GEMM, as in place, but in the caller's buffer; other plans run as run.
  // m > 0 (owners): m rows of the plan's tile rows, as run_rows.
  void run_registered(const void* a, const void* b, int slot, cudaStream_t stream, int64_t m = 0);
  // Whether run_registered stores straight into the peer's output on this plan.
  bool finals_into_outputs() const;
  // Owners: run and run_rmsnorm for m rows, any m of the
  // planned M's tile rows (the window and the flags serve them all).
  void run_rows(const void* a, const void* b, void* out, int64_t ld_out, int64_t m, cudaStream_t stream);
  void run_rmsnorm_rows(const void* a, const void* b, const RmsNormArgs& norm, void* out, int64_t m, cudaStream_t stream);
  // (The destructor waits for the last call's work on the caller's stream:
  // with owners the peers may still be storing into this op's window.)

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
  // Owners: the producer warps copy the peer's finals during the GEMM
  // (OverlapAllReduceOptions::owner_copy_in_gemm).
  bool owner_copy_in_gemm() const { return owner_producers_; }
  // The GEMM runs 4 pipeline stages (OverlapAllReduceOptions::four_stages:
  // owners, row bands).
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
  void enqueue_run(const void* a, const void* b, void* out, int64_t ld_out, cudaStream_t stream);
  void enqueue_run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out, cudaStream_t stream);
  void enqueue_overlapped(const void* a, const void* b, void* c, cudaStream_t stream);
  void enqueue_sequential_allreduce(void* data, int64_t count, cudaStream_t stream);
  // Sequential fallback: row-major C = A B^T (n per row) on the caller's stream.
  void enqueue_sequential_gemm(const void* a, const void* b, void* c, cudaStream_t stream);
  // Elements of group g: offset into the buffer the AllReduce runs on, count.
  std::pair<int64_t, int64_t> group_elements(size_t g) const;
  uint64_t timeout_ns() const { return uint64_t(opts_.wait_timeout_s * 1e9); }
  // The timeouts' bound in seconds (a week: ns fit in 64 bits many times over).
  static constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;

  // Owners (allreduce_owners.cpp): the window [2 halves][tiles_m * bm
  // rows][n] + per-tile flags; one call = the GEMM (then RMSNorm).
  void setup_owned();
  // With norm, owners keep C in the window (kernels::Owner::in_place).
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
  bool owners() const { return opts_.layout == ArLayout::Owners; }
  DeviceBuffer windows_of_, flags_of_;     // owners on more than 2 ranks: every rank's window and flags, by rank
  bool wide() const { return world_ > 2 || opts_.testing.owners_wide; }  // owners: the path of more than 2 ranks
  int32_t owner_split_ = 0;                // rank 1 owns tiles [0, split), rank 0 the rest
  uint32_t* owner_flags_ = nullptr;        // [tiles] in the window
  uint32_t* owner_peer_flags_ = nullptr;   // the peer's
  char* owner_peer_base_ = nullptr;        // the peer's window (2 ranks; more: the next rank's)
  OwnerCallSlots own_calls_;               // the call check on the op's own window (not a shared one)
  DeviceBuffer owned_scratch_;             // C for outputs TMA cannot store to (then copied)
  SymmetricBuffer owner_window_;           // the op's own window (not a shared one)
  int64_t owner_half_rows_ = 0;            // rows of one half of a sender slot of the window
  int world_ = 1, comm_rank_ = 0;          // of the communicator (owners)
  bool owner_producers_ = false;           // the producer's warps copy the peer's finals during the GEMM
  bool four_stages_ = false;
  DeviceBuffer owner_claims_;              // owners: [2 calls] the copy's chunk claims
  // fault_drop_group as the GEMM sees it: its signals go to a sink. (Owners:
  // this rank's flags of the group's tiles are left one short instead, kernels::launch_uncount_group.)
  int gemm_drop_group() const { return owners() ? -1 : opts_.testing.fault_drop_group; }

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
