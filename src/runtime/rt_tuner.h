// rt_tuner.h — measuring what the planner's model needs on this machine
// (DESIGN.md 2.4: GEMM duration per wave, a bandwidth curve per collective
// and CTA budget), and timing collective work across ranks.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <vector>

#include "kernels/gemm.h"
#include "plan/latency_model.h"
#include "plan/schedule.h"
#include "runtime/bootstrap.h"
#include "runtime/rt_timing.h"

namespace flashoverlap::rt {

// Per-rank values -> the maximum over ranks, element-wise (collective).
std::vector<double> max_over_ranks(Rendezvous& rv, const std::vector<double>& mine);

// Times `enqueue` on `stream` like rt::time_on_stream, but starts every run
// right after a one-element AllReduce on `sync_comm`, so that all ranks enter
// the timed region together (skew would otherwise be charged to the first).
TimingStats time_collective(const std::function<void()>& enqueue, cudaStream_t stream, ncclComm_t sync_comm,
                            int warmup, int iters);

// AllReduce latency (max over ranks, median of `iters`) at log-spaced sizes
// from 64 KiB to `max_bytes` (powers of two), on `comm`.
plan::BandwidthCurve measure_allreduce_curve(Rendezvous& rv, ncclComm_t comm, kernels::DType dt,
                                             cudaStream_t stream, double max_bytes, int iters,
                                             const std::string& gpu);

// Median time of our plain GEMM on `sched` (its grid), in ms.
double measure_gemm_ms(const plan::Schedule& sched, int k, kernels::DType dt, const void* a, const void* b, void* c,
                       cudaStream_t stream, int iters);

}  // namespace flashoverlap::rt
