// cublas.h — the cuBLAS GEMM users run today, as the reference and the
// baseline: C = A * B^T with the same row-major conventions as our kernel.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm.h"

namespace flashoverlap::rt {

class CublasGemm {
 public:
  CublasGemm();
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // C (m x n, ldc) = A (m x k) * B (n x k)^T, fp32 accumulation.
  void run(kernels::DType dtype, const void* a, const void* b, void* c, int m, int n, int k, int64_t ldc,
           cudaStream_t stream);
  // Limits cuBLAS to `sms` SMs (0 = all), for comparisons with a reduced grid.
  void set_sm_target(int sms);

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace flashoverlap::rt
