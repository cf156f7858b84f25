// FlashOverlap from C++: C = A * B^T summed over the ranks (AllReduce) while
// the GEMM still runs, for a few m, each checked against cuBLAS followed by
// ncclAllReduce. How to build and run it: README.md here.
//
// Exit status: 0 every result matched, or there is no CUDA GPU (it says
// "no CUDA GPU: nothing to run"); 1 a result outside the tolerance; 2 an
// error (a flashoverlap::Error, or a CUDA / cuBLAS / NCCL call failed).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <flashoverlap/flashoverlap.h>

namespace {

// The reference's own calls: a failure throws (the library throws flashoverlap::Error itself).
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasGetStatusString(s));
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

// `count` bf16 values, uniform in [-1, 1), on the GPU.
__nv_bfloat16* random_bf16(size_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<__nv_bfloat16> host(count);
  for (auto& x : host) x = __float2bfloat16(dist(gen));
  __nv_bfloat16* dev = nullptr;
  check(cudaMalloc(&dev, count * sizeof(__nv_bfloat16)), "cudaMalloc");
  check(cudaMemcpy(dev, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
  return dev;
}

// max |out - ref| / max |ref| over `count` elements on the GPU.
double relative_error(const __nv_bfloat16* out, const __nv_bfloat16* ref, size_t count) {
  std::vector<__nv_bfloat16> o(count), r(count);
  check(cudaMemcpy(o.data(), out, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(r.data(), ref, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost), "cudaMemcpy");
  double err = 0, scale = 0;
  for (size_t i = 0; i < count; ++i) {
    const double x = __bfloat162float(o[i]), y = __bfloat162float(r[i]);
    err = std::max(err, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return scale > 0 ? err / scale : err;
}

// bf16 keeps 8 significant bits (0.4%); the two GEMMs accumulate in other
// orders and the AllReduces may round at other steps.
constexpr double kTolerance = 2e-2;

}  // namespace

int main() {
  std::printf("FlashOverlap %s\n", flashoverlap::version());
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA GPU: nothing to run\n");
    return 0;
  }
  try {
    // torchrun's (or OpenMPI's) variables make this one rank of a job, on GPU
    // LOCAL_RANK; a single process without them is a communicator of one rank.
    flashoverlap::Communicator comm = flashoverlap::Communicator::from_env();
    const int rank = comm.rank();
    constexpr int64_t max_m = 4096, n = 4096, k = 4096;
    flashoverlap::GemmAllReduce op(comm, max_m, n, k, flashoverlap::DType::BF16);  // collective

    // Each rank its own A (max_m x k) and B (n x k: nn.Linear's weight), row-major.
    __nv_bfloat16* a = random_bf16(max_m * k, 2 * rank);
    __nv_bfloat16* b = random_bf16(n * k, 2 * rank + 1);
    __nv_bfloat16 *out = nullptr, *ref = nullptr;
    check(cudaMalloc(&out, max_m * n * sizeof(__nv_bfloat16)), "cudaMalloc");
    check(cudaMalloc(&ref, max_m * n * sizeof(__nv_bfloat16)), "cudaMalloc");
    cudaStream_t stream;
    check(cudaStreamCreate(&stream), "cudaStreamCreate");
    cublasHandle_t cublas;
    check(cublasCreate(&cublas), "cublasCreate");
    check(cublasSetStream(cublas, stream), "cublasSetStream");

    int failures = 0;
    for (int m : {1, 300, 4096}) {
      if (rank == 0) std::printf("m=%d: %s\n", m, op.plan(m).c_str());
      op.run(a, b, out, m, stream);

      // The reference: cuBLAS's GEMM (column-major, so ref^T = B * A^T), then one ncclAllReduce.
      const float one = 1, zero = 0;
      check(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), m, int(k), &one, b, CUDA_R_16BF, int(k), a,
                         CUDA_R_16BF, int(k), &zero, ref, CUDA_R_16BF, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
      check(ncclAllReduce(ref, ref, size_t(m) * n, ncclBfloat16, ncclSum, comm.get(), stream), "ncclAllReduce");

      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      op.check();  // throws if a wait of that call timed out
      const double err = relative_error(out, ref, size_t(m) * n);
      const bool ok = err <= kTolerance;
      failures += !ok;
      std::printf("rank %d m=%d: %s (max |out - ref| / max |ref| = %.1e, tolerance %.0e)\n", rank, m,
                  ok ? "ok" : "MISMATCH", err, kTolerance);
    }

    check(cublasDestroy(cublas), "cublasDestroy");
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(out), static_cast<void*>(ref)})
      check(cudaFree(p), "cudaFree");
    return failures ? 1 : 0;
  } catch (const flashoverlap::Error& e) {
    std::fprintf(stderr, "flashoverlap: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reference: %s\n", e.what());
    return 2;
  }
}
