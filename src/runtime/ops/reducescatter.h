// reducescatter.h — GEMM + ReduceScatter overlapped through tile signals
// (docs/design.md §3, §10). Each rank r holds A_r (m x k) and B_r (n x k);
// the result on rank r is its rows of sum over ranks of A_r B_r^T. Built
// once for a plan (schedule, groups, layout); each call only enqueues work:
//
//   caller stream: signalling GEMM, each tile row stored to its send slot
//                  row (plan/slot_map_reducescatter.h: the group's rows for
//                  each destination contiguous), group counters += 2/tile
//   comm stream:   for each group g: wait(counter[g] >= epoch * target[g]);
//                  ncclReduceScatter(send slots of g -> receive slots of g)
//   caller stream: wait(comm done); gather the received slot rows into the
//                  output's rows (fused with residual + RMSNorm when asked)
//
// Layouts (plan::RsLayout): Standard — rank r ends with rows [r m/W, (r+1)
// m/W), what ncclReduceScatter on row-major C gives (m % W == 0); SubTile —
// the paper's: row slice p of every tile goes to rank p (bm % W == 0), so
// rank r holds rows tm*bm + r*bm/W + [0, bm/W) of every tile row tm, in
// that order (rows_of_rank()).
// The NVLink form (`nvlink`, standard layout; groups unused): no NCCL call.
// Every rank's window (runtime/transport/peer_windows.h: two halves of W
// blocks of m/W rows, n wide) is mapped in every rank's process; the GEMM
// stores each row of C straight into block `rank` of its owner's window
// (plan::rs_peer_row_of), counting each half tile at every rank; the owner
// waits for every source's count, then sums its W blocks in rank order in
// fp32, rounded once (for 2 ranks bitwise ncclReduceScatter's sum), fused
// with residual + RMSNorm when asked. (W-1)/W of C leaves each GPU and
// nothing comes back. Halves by call, as the All-to-All's NVLink form.
// Not for CUDA graphs (its counters run across calls: refused).
//
// A plan with one group runs the sequential fallback: standard, our GEMM
// (or cuBLAS) into row-major C and one ncclReduceScatter on the caller's
// stream; sub-tile, the slot layout with one call on the caller's stream.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/flags.h"
#include "kernels/gemm.h"
#include "plan/partition.h"
#include "plan/schedule.h"
#include "plan/slot_map_reducescatter.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/core/overlap_core.h"
#include "runtime/ops/allreduce.h"  // RmsNormArgs
#include "runtime/transport/peer_windows.h"

namespace flashoverlap::rt {

// One group's reduction, as the op hands it to its transport: every rank's
// `send` (world * recv_count elements, destination d's part at d *
// recv_count) summed into this rank's `recv` (recv_count elements), on
// `stream` (the communication stream; the caller's for the sequential call).
struct RsGroupCall {
  int32_t group = 0;   // -1: the sequential call (the whole output)
  const void* send = nullptr;
  void* recv = nullptr;
  size_t recv_count = 0;
  cudaStream_t stream = nullptr;
};
// What moves a group once its tiles are signalled: by default
// ncclReduceScatter on the op's communicator. The one-GPU tests pass their
// own (several ranks' ops side by side, the sum done by hand).
using RsTransport = std::function<void(const RsGroupCall&)>;

struct OverlapReduceScatterOptions {
  plan::Schedule sched;            // m = the M of every call (the rows of A on each rank), m % W == 0 (standard)
  std::vector<plan::Group> groups; // consecutive tile ranges; one group: sequential
  plan::RsLayout layout = plan::RsLayout::Standard;
  int k = 0;
  kernels::DType dtype = kernels::DType::BF16;  // the output's (C and the ReduceScatter)
  // FP8 inputs (fp8.on, fp8.scales; the pointers are each call's: set_input_scales): 128x128 tiles.
  kernels::Fp8 fp8;
  ncclComm_t comm = nullptr;       // the groups beside the GEMM (e.g. bounded to the SMs it leaves)
  ncclComm_t tail_comm = nullptr;  // optional: the last group and the sequential call (NCCL's default CTAs)
  // The ranks, where there is no communicator (a transport of one's own); else read from comm.
  int rank = 0, world = 1;
  RsTransport transport;           // empty: NCCL on comm
  double wait_timeout_s = 30.0;    // a group not complete by then fails the call (check())
  bool fallback_cublas = false;    // sequential standard plan: cuBLAS's GEMM (where it measured faster)
  CublasGemm* cublas = nullptr;    // fallback_cublas's, the caller's (shared by its ops); nullptr: the op's own
  // The NVLink form (standard layout, world <= 8, n % 8 == 0; the GEMM on
  // sched's grid, all SMs as a rule): windows mapped over comm, or with a
  // transport of one's own connect_peers.
  bool nvlink = false;
  PeerWindows* peers = nullptr;    // the NVLink form: windows shared with other ops (halves >= m x n); nullptr: its own
  // Shared with other ops whose calls come in order with this one's (the
  // public op's plans for each m): streams, order of calls, wait record,
  // scratch. nullptr: the op's own.
  OverlapCore* core = nullptr;
  struct Testing {
    int fault_drop_group = -1;  // this group's signals go nowhere: its wait times out (NVLink form, >= 0: all of
                                // this rank's counts go nowhere: every rank's wait times out)
    uint32_t first_epoch = 0;   // start as if this many calls had run (the counters' wrap)
    bool rows_store = false;    // the GEMM stores row by row even where whole tiles could go by TMA (A/B)
  } testing;
};

// Calls, streams, several ops, destruction: as OverlapAllReduce (allreduce.h).
// CUDA graphs: calls may be captured (the counters are then zeroed per call).
// "waves 3,2,2", "1 (sequential)" for one group, or "nvlink": what the op
// running the groups and the planner's text (api::ReduceScatterPlanner) say.
std::string describe_rs_groups(bool nvlink, const std::vector<plan::Group>& groups);

class OverlapReduceScatter {
 public:
  explicit OverlapReduceScatter(const OverlapReduceScatterOptions& opts);
  ~OverlapReduceScatter();
  OverlapReduceScatter(const OverlapReduceScatter&) = delete;
  OverlapReduceScatter& operator=(const OverlapReduceScatter&) = delete;

  // out (out_rows() x n, ld_out) = this rank's rows of the sum over ranks of A B^T.
  void run(const void* a, const void* b, void* out, int64_t ld_out, cudaStream_t stream);
  // FP8 inputs: the scales of the calls from here on (device fp32, as
  // OverlapReduceScatterOptions::fp8.scales says; captured with a graph's call).
  void set_input_scales(const float* a, const float* b) { opts_.fp8.scale_a = a, opts_.fp8.scale_b = b; }
  // out = RMSNorm(h) * weight, h = those rows + residual (out_rows() x n,
  // in the layout's row order; ld n); residual_out = h if set.
  void run_rmsnorm(const void* a, const void* b, const RmsNormArgs& norm, void* out, cudaStream_t stream);
  // Throws Error naming rank, group, counter and expected value if a wait of
  // an earlier call timed out. Call after synchronising the stream.
  void check() const;
  // A call was captured into a CUDA graph (which then reads this op's
  // tables and counters for as long as it lives).
  bool captured() const { return graph_; }

  int64_t out_rows() const { return out_rows_; }
  // The global rows of C this rank's output holds, in order (layout).
  std::vector<int32_t> rows_of_rank() const;
  const plan::Schedule& schedule() const { return opts_.sched; }
  const std::vector<plan::Group>& groups() const { return opts_.groups; }
  plan::RsLayout layout() const { return opts_.layout; }
  bool sequential() const { return !opts_.nvlink && opts_.groups.size() <= 1; }
  bool nvlink() const { return opts_.nvlink; }
  // The NVLink form's window, and (tests: ranks side by side) every rank's.
  void* window() const { return peers_->window(); }
  void connect_peers(const std::vector<void*>& windows) { peers_->connect(windows); }
  int world() const { return world_; }
  std::string describe_groups() const;  // "waves 3,2,2" or "1 (sequential)"
  int64_t padding_rows() const { return padding_rows_; }  // standard: send rows carrying nothing
  bool tiles_by_tma() const { return half_row_.get() != nullptr; }  // tiles stored by TMA (plan::half_rows_of)

  // For transports of one's own (tests): group g's signal counter and what
  // this call waits for in it, and the op's wait record.
  const uint32_t* counter(size_t g) const { return counters_.as<uint32_t>() + g; }
  uint32_t counter_target(size_t g) const { return graph_ ? target_[g] : epoch_ * target_[g]; }
  kernels::WaitError* wait_error() const { return wait_error_; }
  const void* send_buffer() const { return send_; }  // (as of the last call, or construction)
  uint64_t timeout_ns() const { return uint64_t(opts_.wait_timeout_s * 1e9); }

 private:
  void begin_call(cudaStream_t stream);
  // The GEMM and the groups' calls, into the receive slots (the sequential
  // standard plan: this rank's rows into `rows`, row-major).
  void enqueue_reduced(const void* a, const void* b, void* rows, cudaStream_t stream);
  void move(const RsGroupCall& c);  // transport or NCCL
  bool plain_sequential() const { return sequential() && opts_.layout == plan::RsLayout::Standard; }
  // The NVLink form's GEMM and wait; returns the half of the window read.
  const void* enqueue_nvlink(const void* a, const void* b, cudaStream_t stream);
  void check_out(const void* out, const char* call) const;

  OverlapReduceScatterOptions opts_;
  int world_ = 1, rank_ = 0;
  int64_t out_rows_ = 0, padding_rows_ = 0, send_rows_ = 0;
  std::vector<plan::GroupCall> calls_;  // the map's spans per group
  std::vector<uint32_t> target_;        // signals per group per call
  DeviceBuffer counters_, group_of_tile_, row_of_, slot_of_out_;
  DeviceBuffer half_row_;  // every half tile one run of slot rows: their first (TMA stores); else empty
  // The core's scratch, fetched per call (another op of the core may have
  // grown it): send slots (sequential standard: row-major C), receive slots
  // (sequential standard: the rows, for strided or normed outputs).
  size_t send_bytes_ = 0, recv_bytes_ = 0;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  static constexpr int kSendScratch = 0, kRecvScratch = 1;
  uint32_t epoch_ = 0;
  bool graph_ = false;  // captured once: counters zeroed per call from then on
  kernels::WaitError* wait_error_ = nullptr;
  std::unique_ptr<OverlapCore> own_core_;
  OverlapCore* core_ = nullptr;
  std::unique_ptr<CublasGemm> own_cublas_;  // fallback_cublas without the caller's
  CublasGemm* cublas_ = nullptr;
  PeerWindows own_peers_;           // the NVLink form's, where none is shared
  PeerWindows* peers_ = &own_peers_;
};

}  // namespace flashoverlap::rt
