// cublas.cpp — see cublas.h.
#include "runtime/core/cublas.h"

#include "runtime/core/checks.h"

namespace flashoverlap::rt {

CublasGemm::CublasGemm() {
  FO_CUBLAS_CHECK(cublasCreate(&handle_));
  // cuBLAS picks its best kernels with a workspace; 32 MiB covers Hopper's.
  workspace_bytes_ = size_t(32) << 20;
  FO_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  FO_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
}

CublasGemm::~CublasGemm() {
  if (handle_) cublasDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

void CublasGemm::set_sm_target(int sms) { FO_CUBLAS_CHECK(cublasSetSmCountTarget(handle_, sms)); }

void CublasGemm::run(kernels::DType dtype, const void* a, const void* b, void* c, int m, int n, int k, int64_t ldc,
                     cudaStream_t stream) {
  // Row-major C = A B^T is column-major C^T = B^T(col) ... i.e. with cuBLAS's
  // column-major view: C^T (n x m, ld ldc) = op_T(B: k x n, ld k) * A (k x m, ld k).
  const cudaDataType_t t = dtype == kernels::DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.f, beta = 0.f;
  FO_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  // (cublasSetStream puts the handle back on cuBLAS's default workspace
  // pool, unconditionally: ours again, as PyTorch does for every call)
  FO_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
  FO_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, t, k, a, t, k, &beta, c, t,
                               int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace flashoverlap::rt
