// alltoall.h — GEMM + All-to-All for the MoE combine, overlapped through
// tile signals (docs/design.md §3, §11). Rank r holds A_r (m_r x k: the rows
// its experts received in the dispatch; m_r may be 0) and their weights B_r
// (experts x n x k; with several, A_r's rows by (source rank, expert) and the
// GEMM the grouped one, §12); each row of Y_r goes back to the rank and token
// it came from. The routing changes every call, so the op is built once for
// the largest sizes and each call takes every rank's routing (the public op
// exchanges it; one-GPU tests hold all of it) and the groups' common wave
// partition (plan/moe_plan.h), and enqueues:
//
//   host:          this call's tables in compact form (plan/slot_map_alltoall.h:
//                  make_alltoall_tables, make_combine_table), uploaded on the
//                  caller's stream in one copy and expanded there
//                  (kernels/alltoall_tables.h: the GEMM's row_of, the post
//                  step's slot_of_out)
//   caller stream: counters zeroed; the signalling GEMM, each row stored
//                  where its destination's part of its group's send slots
//                  is (the pre-communication reorder), group counters +=
//                  2 per tile
//   comm stream:   per group g: wait(counter[g] >= target[g]); one NCCL
//                  group of ncclSend / ncclRecv, every peer's span (zero
//                  counts too: every rank takes part in every group)
//   caller stream: wait(comm done); the post step: the received rows in
//                  (source rank, source row) order (unweighted), or the
//                  combine, out[t] = sum of gate * row over token t's rows
//                  in that order, fp32, rounded once
//
// The NVLink form (A2aCall::nvlink; the op built with `nvlink`): no slots
// and no NCCL call. Every rank's receive window (two halves of
// max_recv_rows rows, n wide, used by calls in turn, and an arrival
// counter per source) is mapped in every rank's process; the GEMM, on the
// whole grid, stores each row straight into its destination's window, in
// the (source rank, source row) order there (plan/alltoall_peers.h), and
// counts each finished half tile at every rank (kernels::Scatter); a rank
// with no rows counts its call once. The post step waits for every
// source's count to reach its running total (the ranks' tiles per call are
// known to all from the routing: counters are never reset) and reads the
// rows where they landed. A window half is written again two calls later:
// by then every source has seen this rank's counts of the call between,
// which it sent after its post step of the earlier one (stream order), so
// the half has been read.
//
// A partition of one group runs the sequential fallback: the same GEMM into
// the slots, one all-to-all on the caller's stream, the post step; where
// every rank's rows are by destination (the dispatch's order) and n % 8 ==
// 0, directly: our GEMM into row-major C, each destination's block sent as
// it is, the post step on the received rows (direct()); there cuBLAS's
// GEMM where the caller measured it faster (A2aCall::cublas). Calls,
// streams and several ops on one core: as OverlapReduceScatter. Not for CUDA
// graphs (the maps are made on the host for each call's routing).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/flags.h"
#include "kernels/gemm.h"
#include "plan/partition.h"
#include "plan/routing.h"
#include "plan/schedule.h"
#include "plan/slot_map_alltoall.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/core/overlap_core.h"
#include "runtime/core/staging_ring.h"
#include "runtime/transport/peer_windows.h"

namespace flashoverlap::rt {

// One group's exchange as the op hands it to its transport: to each peer p,
// send_to[p] of `send`; from each, recv_from[p] into `recv` (spans in
// elements of the slot buffers, some empty), on `stream`.
struct A2aGroupCall {
  int32_t group = 0;  // -1: the sequential call
  const void* send = nullptr;
  void* recv = nullptr;
  const std::vector<plan::Span>* send_to = nullptr;
  const std::vector<plan::Span>* recv_from = nullptr;
  cudaStream_t stream = nullptr;
};
// What moves a group once its tiles are signalled: by default ncclSend /
// ncclRecv in one NCCL group on the op's communicator. The one-GPU tests
// pass their own (several ranks' ops side by side, copies by hand).
using A2aTransport = std::function<void(const A2aGroupCall&)>;

struct OverlapAllToAllOptions {
  int64_t n = 0;
  int k = 0;
  // Experts per rank: b is [experts, n, k], and every call's routing has as
  // many (plan::MoeRouting::experts): A's rows by (source rank, expert), the
  // GEMM the grouped one over the segments (plan::moe_segments), on every
  // path but cuBLAS's GEMM.
  int32_t experts = 1;
  kernels::DType dtype = kernels::DType::BF16;  // the output's (C, the rows moved, the combine)
  // FP8 inputs (fp8.on, fp8.scales; the pointers are each call's:
  // set_input_scales): one expert, 128x128 tiles.
  kernels::Fp8 fp8;
  plan::TileShape tile{128, 256};
  int32_t ctas = 132;       // the GEMM's grid when it overlaps (SMs - those left to NCCL)
  int32_t sequential_ctas = 0;  // the sequential fallback's grid (0: ctas)
  // The largest sizes of any call: rows of A on any rank (m_r), rows this
  // rank receives, tokens of its combine output. They size the buffers.
  int64_t max_rows = 0, max_recv_rows = 0;
  int32_t max_tokens = 0;
  ncclComm_t comm = nullptr;       // the groups beside the GEMM (bounded to the SMs it leaves)
  ncclComm_t tail_comm = nullptr;  // optional: the last group and the sequential call
  int rank = 0, world = 1;         // where there is no communicator (a transport of one's own)
  A2aTransport transport;          // empty: NCCL on comm
  double wait_timeout_s = 30.0;
  OverlapCore* core = nullptr;     // shared with other ops (nullptr: the op's own)
  CublasGemm* cublas = nullptr;    // A2aCall::cublas's, the caller's (nullptr: one of the op's own, made when asked)
  // The NVLink form: a receive window the peers store into (2 x
  // max_recv_rows x n elements), mapped at construction over comm (CUDA IPC
  // or peer access); with a transport of one's own, connect_peers. world
  // <= 8, n % 8 == 0.
  bool nvlink = false;
  struct Testing {
    int fault_drop_group = -1;  // this group's signals go nowhere: its wait times out
    bool fault_drop_arrivals = false;  // the NVLink form: this rank's counts go nowhere: its receivers time out
  } testing;
};

// One call's routing: every rank's (plan::MoeRouting), and the partition
// of the most waves of any rank into groups, the same on every rank.
struct A2aCall {
  const plan::MoeRouting* routing = nullptr;
  plan::Partition common;  // one group (or no waves anywhere): sequential
  bool combine = true;     // false: the received rows, unweighted
  bool nvlink = false;     // the NVLink form (`common` unused); the same on every rank
  bool cublas = false;     // a direct sequential call: cuBLAS's GEMM, not ours (where it measured faster)
  // Optional: plan::count_moe_rows(*routing, tile height), made for the plan
  // (which checked the routing with it): the routing is not checked again,
  // and the tables are made from them rather than from every rank's rows.
  const plan::MoeRowCounts* counts = nullptr;
};

class OverlapAllToAll {
 public:
  explicit OverlapAllToAll(const OverlapAllToAllOptions& opts);
  ~OverlapAllToAll();
  OverlapAllToAll(const OverlapAllToAll&) = delete;
  OverlapAllToAll& operator=(const OverlapAllToAll&) = delete;

  // FP8 inputs: the scales of the calls from here on (device fp32, as
  // OverlapAllToAllOptions::fp8.scales says).
  void set_input_scales(const float* a, const float* b) { opts_.fp8.scale_a = a, opts_.fp8.scale_b = b; }
  // combine: out (tokens x n, ld_out) = the combine of this rank's tokens;
  // else out (received rows x n, ld_out) = the rows sent to this rank, in
  // (source rank, source row) order. a: m_r x k (this rank's rows), b:
  // experts x n x k.
  // tokens_out (optional, device, received rows): each received row's token.
  void run(const void* a, const void* b, const A2aCall& call, void* out, int64_t ld_out, cudaStream_t stream,
           int32_t* tokens_out = nullptr);
  // Throws Error naming rank and group if a wait of an earlier call timed out.
  void check() const;

  // The NVLink form's window (nullptr without `nvlink`), and, for a
  // transport of one's own (the one-GPU tests: ranks side by side), every
  // rank's window as this process addresses it, once before the first call.
  void* window() const { return peers_.window(); }
  void connect_peers(const std::vector<void*>& windows) { peers_.connect(windows); }
  bool nvlink_ready() const { return peers_.connected(); }

  // The schedule of `rank`'s rows in a call (plan::make_moe_schedule with
  // this op's tile and grid, as the planner's): how many waves it has, to
  // make a common partition.
  plan::Schedule schedule_of(const plan::MoeRouting& routing, int rank, bool sequential) const;
  plan::Schedule schedule_of(int64_t rows, bool sequential) const;  // (rows alone: the same waves)
  // The last call's: rows received, groups, the slot buffers' used elements.
  int64_t recv_rows() const { return recv_rows_; }
  int64_t send_elements() const { return whole_rows() ? rows_elems_[0] : tables_host_.send_rows * opts_.tile.bn; }
  int64_t recv_elements() const { return whole_rows() ? rows_elems_[1] : tables_host_.recv_rows * opts_.tile.bn; }
  // The last call went the direct way: sequential, rows by destination on
  // every rank (the dispatch's order), n % 8 == 0: C stored whole, each
  // destination's block sent as it is, received rows row-major.
  bool direct() const { return direct_; }
  bool nvlink_call() const { return nvlink_call_; }  // the last call was the NVLink form
  bool cublas_call() const { return cublas_call_; }  // the last call's GEMM was cuBLAS's (A2aCall::cublas, direct)
  size_t groups() const { return calls_.size(); }
  bool sequential() const { return calls_.size() <= 1; }
  int rank() const { return rank_; }
  int world() const { return world_; }

  // For transports of one's own (tests): group g's counter, its target in
  // the last call, the wait record.
  const uint32_t* counter(size_t g) const { return counters_.as<uint32_t>() + g; }
  uint32_t counter_target(size_t g) const { return target_[g]; }
  kernels::WaitError* wait_error() const { return wait_error_; }
  uint64_t timeout_ns() const { return uint64_t(opts_.wait_timeout_s * 1e9); }

 private:
  void move(const A2aGroupCall& c);
  void upload(cudaStream_t stream);
  void run_nvlink(const void* a, const void* b, const A2aCall& call, void* out, int64_t ld_out, cudaStream_t stream,
                  int32_t* tokens_out);
  void post(const A2aCall& call, const void* recv, void* out, int64_t ld_out, cudaStream_t stream,
            int32_t* tokens_out);
  // Rows n wide, one each (the direct and the NVLink calls), not slot rows.
  bool whole_rows() const { return direct_ || nvlink_call_; }
  // The device copy of the call's compact table `which` (alltoall.cpp's Table).
  const int32_t* table(size_t which) const {
    return reinterpret_cast<const int32_t*>(tables_.as<char>() + offsets_[which]);
  }
  // Several experts: p becomes the grouped GEMM over this rank's segments, `rows` of A (its tile rows' tables).
  void set_grouped(kernels::GemmParams& p, int64_t rows) const;

  OverlapAllToAllOptions opts_;
  int world_ = 1, rank_ = 0;
  size_t max_groups_ = 0;
  plan::AllToAllTables tables_host_;
  plan::GroupedTileRows grouped_host_;  // with several experts: this call's tile rows (b_row0 = expert * n)
  plan::CombineTable table_;
  std::vector<plan::Group> my_groups_;  // this rank's groups in the last call
  bool direct_ = false, nvlink_call_ = false, cublas_call_ = false;
  std::unique_ptr<CublasGemm> own_cublas_;  // without OverlapAllToAllOptions::cublas: made at the first call that asks
  std::array<int64_t, 2> rows_elems_{};  // whole_rows(): the call's send and receive elements
  DeviceBuffer iota_;                      // 0, 1, ...: its received rows' slots
  std::vector<plan::GroupCall> calls_;
  std::vector<uint32_t> target_;
  int64_t recv_rows_ = 0;
  // The call's compact tables, packed into one pinned slot of a ring (so
  // that the host may queue calls ahead of the GPU; a slot is reused once
  // its copy has run) and copied to one device buffer (one copy per call),
  // and what they expand to.
  std::vector<size_t> offsets_;
  StagingRing staging_;
  DeviceBuffer tables_, row_of_, slot_of_out_;
  DeviceBuffer counters_;
  size_t send_bytes_ = 0, recv_bytes_ = 0;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  static constexpr int kSendScratch = 0, kRecvScratch = 1;
  kernels::WaitError* wait_error_ = nullptr;
  PeerWindows peers_;  // the NVLink form's windows (each half max_recv_rows x n)
  std::unique_ptr<OverlapCore> own_core_;
  OverlapCore* core_ = nullptr;
};

}  // namespace flashoverlap::rt
