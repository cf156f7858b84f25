// cublas.cpp — see cublas.h.
#include "runtime/core/cublas.h"

#include <string>

#include "runtime/core/checks.h"

namespace flashoverlap::rt {

// The descriptors of one shape and the algorithm the heuristic ranked first.
struct CublasGemm::Prepared {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Prepared() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {
// The largest power of two up to 256 dividing the address (PyTorch's rule
// for the cuBLASLt alignment preferences).
uint32_t alignment(const void* p) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && x % a != 0) a /= 2;
  return a;
}
constexpr size_t kMaxPrepared = 512;  // shapes kept; beyond, the cache starts again
}  // namespace

CublasGemm::CublasGemm(Api api) : api_(api) {
  // cuBLAS picks its best kernels with a workspace; 32 MiB covers Hopper's.
  workspace_bytes_ = size_t(32) << 20;
  FO_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  if (api_ == Api::Lt) {
    FO_CUBLAS_CHECK(cublasLtCreate(&lt_));
  } else {
    FO_CUBLAS_CHECK(cublasCreate(&handle_));
    FO_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
  }
}

CublasGemm::~CublasGemm() {
  prepared_.clear();
  if (handle_) cublasDestroy(handle_);
  if (lt_) cublasLtDestroy(lt_);
  if (workspace_) cudaFree(workspace_);
}

void CublasGemm::set_sm_target(int sms) {
  sm_target_ = sms;
  if (handle_) FO_CUBLAS_CHECK(cublasSetSmCountTarget(handle_, sms));
  prepared_.clear();  // (the algorithms were ranked for the old target)
}

const CublasGemm::Prepared& CublasGemm::prepared(kernels::DType dtype, const void* a, const void* b, const void* c,
                                                 int m, int n, int k, int64_t ldc, int scales, bool fast) {
  const uint32_t al_a = alignment(a), al_b = alignment(b), al_c = alignment(c);
  const Key key{int(dtype), m, n, k, ldc, al_a | (al_b << 9) | (al_c << 18), scales, fast};
  if (auto it = prepared_.find(key); it != prepared_.end()) return *it->second;
  if (prepared_.size() >= kMaxPrepared) prepared_.clear();
  // Row-major C = A B^T is column-major C^T (n x m, ld ldc) = B^T (B: k x n
  // column-major, ld k, transposed) * A (k x m column-major, ld k).
  const cudaDataType_t t = dtype == kernels::DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const cudaDataType_t t_in = scales >= 0 ? CUDA_R_8F_E4M3 : t;
  auto p = std::make_unique<Prepared>();
  {
    FO_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (sm_target_ > 0)
      FO_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target_, sizeof(int)));
    if (scales >= 0) {  // FP8: promoted sums (unless fast); row-wise scales as outer vectors (per tensor: the default)
      const int8_t fast_accum = fast ? 1 : 0;
      FO_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
      if (scales == int(kernels::Scales::RowWise)) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
        FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
      }
      if (scales != int(kernels::Scales::None)) {
        // Scale vectors the heuristic may require to be set (never read
        // here: each call sets its own): the workspace's address.
        const void* any = workspace_;
        FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &any, sizeof(any)));
        FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &any, sizeof(any)));
      }
    }
    FO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, t_in, k, n, k));
    FO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, t_in, k, m, k));
    FO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, t, n, m, ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    FO_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes_, sizeof(workspace_bytes_));
    // (the matrix cuBLASLt calls A is our B, its B our A)
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b, sizeof(al_b));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof(al_a));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(lt_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    FO_CUBLAS_CHECK(s);
    if (found < 1)
      throw Error("cuBLASLt has no algorithm for " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                  std::to_string(k) + " (ldc " + std::to_string(ldc) + ")");
    p->algo = result.algo;
  }
  return *prepared_.emplace(key, std::move(p)).first->second;
}

void CublasGemm::run(kernels::DType dtype, const void* a, const void* b, void* c, int m, int n, int k, int64_t ldc,
                     cudaStream_t stream) {
  const float alpha = 1.f, beta = 0.f;
  if (api_ == Api::Lt) {
    const Prepared& p = prepared(dtype, a, b, c, m, n, k, ldc);
    FO_CUBLAS_CHECK(cublasLtMatmul(lt_, p.desc, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &p.algo, workspace_,
                                   workspace_bytes_, stream));
    return;
  }
  const cudaDataType_t t = dtype == kernels::DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  FO_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  // (cublasSetStream puts the handle back on cuBLAS's default workspace
  // pool, unconditionally: ours again, as PyTorch does for every call)
  FO_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
  FO_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, t, k, a, t, k, &beta, c, t,
                               int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void run_plain_gemm(CublasGemm* cublas, const kernels::GemmParams& p, cudaStream_t stream) {
  if (!cublas) return kernels::launch_gemm(p, stream);
  if (p.fp8.on) return cublas->run_fp8(p.dtype, p.fp8, p.a, p.b, p.c, p.m, p.n, p.k, p.ldc, stream);
  cublas->run(p.dtype, p.a, p.b, p.c, p.m, p.n, p.k, p.ldc, stream);
}

bool CublasGemm::takes_fp8(kernels::Scales scales) {
  int8_t& known = takes_fp8_[int(scales) % 3];
  if (known < 0) {
    if (!lt_) FO_CUBLAS_CHECK(cublasLtCreate(&lt_));
    // (a small matmul's heuristic, pointers 256-byte aligned: nothing is read)
    const void* at = reinterpret_cast<const void*>(uintptr_t(256));
    try {
      prepared(kernels::DType::BF16, at, at, at, 256, 256, 256, 256, int(scales), false);
      known = 1;
    } catch (const Error&) {
      known = 0;
    }
  }
  return known == 1;
}

void CublasGemm::run_fp8(kernels::DType out, const kernels::Fp8& f, const void* a, const void* b, void* c, int m,
                         int n, int k, int64_t ldc, cudaStream_t stream, bool fast_accum) {
  if (!lt_) FO_CUBLAS_CHECK(cublasLtCreate(&lt_));  // (FP8 is cuBLASLt's alone)
  const Prepared& p = prepared(out, a, b, c, m, n, k, ldc, int(f.scales), fast_accum);
  // (cuBLASLt's A is our B: its A scale is our scale_b, one per column of C with row-wise scales)
  const float* sa = f.scales == kernels::Scales::None ? nullptr : f.scale_b;
  const float* sb = f.scales == kernels::Scales::None ? nullptr : f.scale_a;
  FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  FO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  const float alpha = 1.f, beta = 0.f;
  FO_CUBLAS_CHECK(cublasLtMatmul(lt_, p.desc, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &p.algo, workspace_,
                                 workspace_bytes_, stream));
}

}  // namespace flashoverlap::rt
