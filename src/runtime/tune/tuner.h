// tuner.h — measuring what the planner's model needs on this machine
// (docs/design.md §2.4: GEMM duration per wave, a bandwidth curve per collective
// and CTA budget), and timing collective work across ranks.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <vector>

#include "kernels/gemm.h"
#include "plan/latency_model.h"
#include "plan/schedule.h"
#include "process/bootstrap.h"
#include "runtime/tune/timing.h"
#include "runtime/core/tile_clocks.h"

namespace flashoverlap::rt {

// Per-rank values -> the maximum over ranks, element-wise (collective).
std::vector<double> max_over_ranks(Rendezvous& rv, const std::vector<double>& mine);

// Times `enqueue` on `stream` like rt::time_on_stream, but starts every run
// right after a one-element AllReduce on `sync_comm`, so that all ranks enter
// the timed region together (skew would otherwise be charged to the first).
// With `gate` (default), each run is queued whole before the GPU starts it
// (host_gate.h): device time only, not the host's enqueue.
TimingStats time_collective(const std::function<void()>& enqueue, cudaStream_t stream, ncclComm_t sync_comm,
                            int warmup, int iters, bool gate = true);

// Several alternatives timed in turns (run i of each, then run i+1 of each),
// each run started right after the sync AllReduce: drifts of clocks or
// temperature hit all alike. Per-rank stats, in the order given.
std::vector<TimingStats> time_collective_interleaved(const std::vector<std::function<void()>>& fns,
                                                     cudaStream_t stream, ncclComm_t sync_comm, int warmup, int iters,
                                                     bool gate = true);

// AllReduce latency (max over ranks, median of `iters`) at log-spaced sizes
// from 64 KiB to `max_bytes` (powers of two), on `comm`.
plan::BandwidthCurve measure_allreduce_curve(Rendezvous& rv, ncclComm_t comm, kernels::DType dt,
                                             cudaStream_t stream, double max_bytes, int iters,
                                             const std::string& gpu);

// Median time of our plain GEMM on `sched` (its grid), in ms.
double measure_gemm_ms(const plan::Schedule& sched, int k, kernels::DType dt, const void* a, const void* b, void* c,
                       cudaStream_t stream, int iters);

// Our plain GEMM on `sched` once more after `warmup` calls, with its tile
// monitor: its SM clock and cycles per tile (the reference for a trace);
// with `phases`, also when its CTAs' last tiles were staged and stored.
// four_stages: 128x256 tiles with 4 pipeline stages, as the owner layout
// runs them (else 3, as the layouts with signals do).
TileClocks measure_gemm_clocks(const plan::Schedule& sched, int k, kernels::DType dt, const void* a, const void* b,
                               void* c, cudaStream_t stream, int warmup, GemmPhases* phases = nullptr,
                               bool four_stages = false);

}  // namespace flashoverlap::rt

#include <string>

#include "plan/partition.h"
#include "runtime/ops/allreduce.h"

namespace flashoverlap::rt {

struct AllReducePlan;

// tune_allreduce found no plan for the shape with these options: thrown on
// every rank at the same step (the candidates and their measurements agree
// across ranks), so a caller may skip the shape and go on.
class NoPlan : public InvalidArgument {
 public:
  explicit NoPlan(const std::string& what) : InvalidArgument(what) {}
};

// What the AllReduce planner may choose from, and how to measure.
struct AllReduceTuning {
  Rendezvous* rv = nullptr;
  int sms = 132;
  kernels::DType dtype = kernels::DType::BF16;
  cudaStream_t stream = nullptr;
  // The AllReduce curve measured on a communicator limited to `ctas` CTAs.
  std::function<const plan::BandwidthCurve&(int ctas)> curve_for;
  std::vector<plan::TileShape> tiles = {{128, 256}, {128, 128}};
  int reserve = -1;  // SMs left to NCCL; -1: the whole-wave candidates
  // Owners: only where asked for (2 ranks: where every rank is load/store
  // reachable, rt::all_ranks_reachable; more: 128x256 tiles, not yet
  // measured against NCCL's layouts on 3+ GPUs).
  std::vector<ArLayout> layouts = {ArLayout::RowBands, ArLayout::Slots};
  // Owners' prediction: max(GEMM on all SMs x push_gemm_slowdown + the
  // copies of the last wave's tiles, which start only when they are computed
  // (with 128x128 tiles about half the bytes of 128x256), the (W-1) C bytes
  // each rank pushes, both at push_gb_s) + the last band's pass over C at
  // sum_gb_s.
  bool push_reachable = false;
  double push_gemm_slowdown = 1.03;
  double push_gb_s = 300;
  double sum_gb_s = 1500;
  std::vector<int> band_swizzles = {2, 4, 8};
  int world = 2;  // ranks (owners: the bytes each pushes)
  std::string group_sizes;  // given: evaluate these (waves for Slots, bands for RowBands) instead of searching
  // The GEMM beside concurrent NCCL calls runs slower than alone (they
  // share SMs, L2 and memory; docs/design.md §6.2).
  double slowdown = 1.05;
  // NCCL calls beside the GEMM take longer than the curve measured alone
  // (small groups the most).
  double comm_slowdown = 1.25;
  double cublas_gemm_ms = 0;  // > 0: the fallback may use cuBLAS when it is faster than ours
  // Optional: every candidate evaluated, fastest predicted first, and the
  // sequential fallback plan last.
  std::vector<AllReducePlan>* ranked = nullptr;
  // Optional, the final choice by measurement: the op's options for a plan
  // (communicators are the caller's). When set (and group_sizes is empty),
  // tune_allreduce builds an op for each of finalists_of(ranked), times them
  // in turns on a and b (max over ranks, runs started together through a
  // one-element AllReduce on sync_comm) and, with stage_round, those of
  // stage_finalists(the fastest); it returns the fastest; `selection`
  // (optional) receives the finalists with their times, the pick starred.
  std::function<OverlapAllReduceOptions(const AllReducePlan&)> options_for;
  bool stage_round = true;
  ncclComm_t sync_comm = nullptr;
  bool host_gate = true;  // time each run queued whole (host_gate.h)
  // The finalists timed as a caller with a registered output runs them:
  // `scratch` registered with each op (OverlapAllReduce::register_output),
  // run_registered. With owners on 4 stages that takes the copy of the
  // peer's tiles out of the call, which run would time in.
  bool registered_output = false;
  // Online planning (the paper's online phase: nothing measured): the
  // GEMM's time on a schedule from this model, the same on every rank, and
  // the slot reorder's from reorder_gb_s; then rv, a, b and scratch are not
  // used. Empty: the GEMMs (and the reorder) are measured, max over ranks.
  std::function<double(const plan::Schedule&)> gemm_ms;
  double reorder_gb_s = 2500;  // the reorder reads and writes C once
  int select_iters = 12;
  // Finalists within runoff_within of the fastest (at most 3) are timed
  // again in turns, runoff_iters runs each, and the fastest of that run is
  // taken: 12 runs can order plans a few percent apart wrongly.
  double runoff_within = 0.04;
  int runoff_iters = 36;
  std::string* selection = nullptr;
};

// Indices of the values within `within` (a fraction) of the smallest, the
// smallest first, at most `most` of them (ties by index).
std::vector<size_t> runoff_candidates(const std::vector<double>& ms, double within, size_t most);

struct AllReducePlan {
  ArLayout layout = ArLayout::RowBands;
  plan::Schedule sched;
  std::vector<plan::Group> groups;
  int reserve = 0;
  bool sequential = false;
  bool fallback_cublas = false;  // sequential, with cuBLAS's GEMM
  bool copy_in_gemm = true;      // owners: the producer warps copy the peer's finals during the GEMM
  // The GEMM with 4 pipeline stages where its store qualifies
  // (OverlapAllReduceOptions::four_stages); false: 3 (stage_finalists).
  bool four_stages = true;
  double predicted_ms = 0;
};

// Whether the tuner chooses the plan's pipeline depth (stage_finalists):
// the signalling GEMM of row bands, where the 4-stage store qualifies
// (kernels::gemm_four_stages: 128x256 tiles, n % 8 == 0); not a plan of one
// group, which runs the sequential GEMM, nor owners (4 stages).
bool plan_has_stage_choice(const AllReducePlan& p);

// The plan as the op's options (comms and the rest are the caller's).
std::string describe(const AllReducePlan& p);

// Reserves that leave no idle CTA in the last wave: for each wave count w the
// smallest grid covering the tiles in w waves (SMs - ceil(tiles/w)), keeping
// 2..40 SMs for NCCL; at most `max_count`, spread over that range, fewest first.
std::vector<int> whole_wave_reserves(int64_t tiles, int sms, int max_count = 5);

// The plans worth measuring among `ranked` (fastest predicted first): the
// best predicted of row bands and of slots; of owners the best per tile
// shape and band size, each with the copy of the peer's finals in and after
// the GEMM (the model leaves out what the band size costs the GEMM's cache
// reuse and how much the pushes slow the GEMM); and the sequential
// fallback. A plan of one group (the sequential one's work: the model finds
// it best where the AllReduce costs ~nothing) is none, and tune_allreduce
// never returns one.
std::vector<AllReducePlan> finalists_of(const std::vector<AllReducePlan>& ranked);

// The second round when the measured best is row bands: that plan and the
// same plan with a 3-stage GEMM. 4 stages compute faster alone, but their
// epilogue (the output in pieces through half the shared memory) stalls the
// MMAs where the memory is busy with the collective beside them
// (docs/results.md §2.4: which wins depends on the shape). Otherwise just
// `best`.
std::vector<AllReducePlan> stage_finalists(const AllReducePlan& best);

// Measures the candidates (GEMM per grid, max over ranks; curves through
// curve_for), predicts each with the paper's model, searches the groups with
// the exact DP, and returns the fastest predicted plan, or the sequential
// fallback when nothing is predicted at least 1% faster than
// `sequential_ms` (or, with options_for, the fastest finalist measured).
// Identical on every rank. a, b, scratch (m x n) are used to time GEMMs and
// the finalists.
AllReducePlan tune_allreduce(const AllReduceTuning& t, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                             void* scratch, double sequential_ms);

}  // namespace flashoverlap::rt
