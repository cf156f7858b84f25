// op_reference.h — the reference of a public op's call of m rows: the GEMM
// its sequential calls run where plan(m) names cuBLAS's (the op then runs
// cuBLAS's, the same algorithm for the same shape), else ours on the full
// grid (every plan of ours gives the same bits), then one ncclAllReduce of
// all m rows.
#pragma once
#include <nccl.h>

#include <cstdint>
#include <string>

#include "plan/tile_grid.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/baselines.h"

namespace flashoverlap::test {

inline bool plan_runs_cublas(const std::string& plan) { return plan.find("cuBLAS's GEMM") != std::string::npos; }

inline void op_reference(const std::string& plan, const void* a, const void* b, void* ref, int64_t m, int64_t n,
                         int64_t k, ncclComm_t comm, cudaStream_t st) {
  if (plan_runs_cublas(plan)) {
    thread_local rt::CublasGemm cublas;  // (one per rank: each rank is a thread on its own GPU)
    rt::sequential_cublas_allreduce(cublas, kernels::DType::BF16, a, b, ref, int(m), int(n), int(k), comm, st);
    return;
  }
  const plan::Schedule s = plan::make_schedule(m, n, {128, 256}, rt::current_device_sms(), plan::Raster::AlongN, 8);
  rt::sequential_ours_allreduce(kernels::DType::BF16, a, b, ref, s, int(k), comm, st);
}

}  // namespace flashoverlap::test
