// cublas.h — the cuBLAS GEMM users run today, as the reference, the
// baseline and the public ops' sequential GEMM where it is faster than ours:
// C = A * B^T with the same row-major conventions as our kernel.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/gemm.h"

namespace flashoverlap::rt {

class CublasGemm {
 public:
  // Lt: cuBLASLt, the algorithm its heuristic ranks first for the shape and
  // the pointers' alignment with a 32 MiB workspace (as PyTorch's cuBLASLt
  // path asks), looked up once per shape and kept: a call is one
  // cublasLtMatmul. GemmEx: cublasGemmEx with the default algorithm (as
  // PyTorch's cuBLAS path calls it).
  enum class Api { Lt, GemmEx };
  explicit CublasGemm(Api api = Api::Lt);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // C (m x n, ldc) = A (m x k) * B (n x k)^T, fp32 accumulation.
  void run(kernels::DType dtype, const void* a, const void* b, void* c, int m, int n, int k, int64_t ldc,
           cudaStream_t stream);
  // The same with e4m3 A and B and their scales (kernels::Fp8: none, per
  // tensor or row-wise), C in `out`: cuBLASLt's FP8 matmul (whatever the
  // Api), fp32 accumulation promoted as torch._scaled_mm(use_fast_accum=
  // False) asks (FAST_ACCUM off; fast_accum: on, as use_fast_accum=True).
  void run_fp8(kernels::DType out, const kernels::Fp8& f, const void* a, const void* b, void* c, int m, int n, int k,
               int64_t ldc, cudaStream_t stream, bool fast_accum = false);
  // Whether cuBLASLt has an FP8 matmul with these scales on this GPU (found
  // once per kind; row-wise scales are not on every GPU and version).
  bool takes_fp8(kernels::Scales scales);
  // Limits cuBLAS to `sms` SMs (0 = all), for comparisons with a reduced grid.
  void set_sm_target(int sms);
  Api api() const { return api_; }

 private:
  struct Prepared;
  // scales: -1 for 16-bit inputs, else the FP8 call's kernels::Scales; fast: FP8 with FAST_ACCUM on.
  const Prepared& prepared(kernels::DType dtype, const void* a, const void* b, const void* c, int m, int n, int k,
                           int64_t ldc, int scales = -1, bool fast = false);
  Api api_;
  int sm_target_ = 0;
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // (dtype, m, n, k, ldc, the pointers' alignments, scales, fast) -> descriptors and algorithm
  using Key = std::tuple<int, int, int, int, int64_t, uint32_t, int, bool>;
  std::map<Key, std::unique_ptr<Prepared>> prepared_;
  int8_t takes_fp8_[3] = {-1, -1, -1};  // per kernels::Scales: unknown, no, yes
};

// A sequential call's GEMM, p (Plain C; FP8 inputs where p.fp8.on): by
// cuBLAS's where `cublas` is given (cuBLASLt's FP8 matmul for FP8 inputs),
// else ours.
void run_plain_gemm(CublasGemm* cublas, const kernels::GemmParams& p, cudaStream_t stream);

}  // namespace flashoverlap::rt
