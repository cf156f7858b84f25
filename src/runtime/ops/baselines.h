// baselines.h — what users run today, behind the same harness as the
// overlapped op: GEMM then one AllReduce (cuBLAS or our GEMM), and the
// decomposition baseline (M split into chunks, each chunk's AllReduce on a
// second stream while the next chunk's GEMM runs).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <vector>

#include "kernels/gemm.h"
#include "plan/schedule.h"
#include "runtime/core/cublas.h"

namespace flashoverlap::rt {

// out (m x n, row-major) = AllReduce(A B^T): cuBLAS, then ncclAllReduce.
void sequential_cublas_allreduce(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* out,
                                 int m, int n, int k, ncclComm_t comm, cudaStream_t stream);
// The same with our GEMM (plain epilogue, full grid of `sched`).
void sequential_ours_allreduce(kernels::DType dt, const void* a, const void* b, void* out, const plan::Schedule& sched,
                               int k, ncclComm_t comm, cudaStream_t stream);

class DecompositionAllReduce {
 public:
  DecompositionAllReduce(int chunks, ncclComm_t comm);
  ~DecompositionAllReduce();
  DecompositionAllReduce(const DecompositionAllReduce&) = delete;
  DecompositionAllReduce& operator=(const DecompositionAllReduce&) = delete;
  void run(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* out, int m, int n, int k,
           cudaStream_t stream);
  int chunks() const { return chunks_; }

 private:
  int chunks_;
  ncclComm_t comm_;
  cudaStream_t comm_stream_ = nullptr;
  std::vector<cudaEvent_t> gemm_done_;
  cudaEvent_t comm_done_ = nullptr;
};

}  // namespace flashoverlap::rt
