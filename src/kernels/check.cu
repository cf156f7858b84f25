// check.cu — see check.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/check.h"
#include "kernels/cuda_check.h"

namespace flashoverlap::kernels {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void fill_random_kernel(T* p, int64_t count, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(mix(seed ^ mix(uint64_t(i))) >> 40) * (1.0f / 16777216.0f);
    p[i] = T(lo + (hi - lo) * u);
  }
}

__global__ void poison_kernel(uint16_t* p, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = 0xFFFF;
}

struct Sums {
  double err_sq, ref_sq;
  unsigned long long nan_count, mismatches;
};

template <typename T>
__global__ void compare_kernel(const T* x, int64_t ldx, const T* ref, int64_t ldref, int64_t rows, int64_t cols,
                               Sums* out) {
  double e = 0, r = 0;
  unsigned long long nans = 0, mism = 0;
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols, col = i - row * cols;
    const T a = x[row * ldx + col], b = ref[row * ldref + col];
    const float fa = float(a), fb = float(b);
    if (!isfinite(fa)) ++nans;
    if (*reinterpret_cast<const uint16_t*>(&a) != *reinterpret_cast<const uint16_t*>(&b)) ++mism;
    const double d = double(fa) - double(fb);
    e += d * d;
    r += double(fb) * double(fb);
  }
  for (int o = 16; o > 0; o /= 2) {
    e += __shfl_xor_sync(0xffffffffu, e, o);
    r += __shfl_xor_sync(0xffffffffu, r, o);
    nans += __shfl_xor_sync(0xffffffffu, nans, o);
    mism += __shfl_xor_sync(0xffffffffu, mism, o);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&out->err_sq, e);
    atomicAdd(&out->ref_sq, r);
    atomicAdd(&out->nan_count, nans);
    atomicAdd(&out->mismatches, mism);
  }
}

int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return int(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

}  // namespace

double CompareResult::rel_error() const { return ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq); }

void fill_random(DType dtype, void* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (dtype == DType::BF16)
    fill_random_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), count, seed, lo, hi);
  else
    fill_random_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<__half*>(p), count, seed, lo, hi);
  FO_CUDA_CHECK(cudaGetLastError());
}

void poison(void* p, int64_t count, cudaStream_t stream) {
  poison_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<uint16_t*>(p), count);
  FO_CUDA_CHECK(cudaGetLastError());
}

CompareResult compare(DType dtype, const void* x, int64_t ldx, const void* ref, int64_t ldref, int64_t rows,
                      int64_t cols, cudaStream_t stream) {
  Sums* d = nullptr;
  FO_CUDA_CHECK(cudaMallocAsync(&d, sizeof(Sums), stream));
  FO_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(Sums), stream));
  const int blocks = blocks_for(rows * cols, 256);
  if (dtype == DType::BF16)
    compare_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), ldx,
                                               static_cast<const __nv_bfloat16*>(ref), ldref, rows, cols, d);
  else
    compare_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __half*>(x), ldx, static_cast<const __half*>(ref),
                                               ldref, rows, cols, d);
  FO_CUDA_CHECK(cudaGetLastError());
  Sums h{};
  FO_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(Sums), cudaMemcpyDeviceToHost, stream));
  FO_CUDA_CHECK(cudaFreeAsync(d, stream));
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  return CompareResult{h.err_sq, h.ref_sq, int64_t(h.nan_count), int64_t(h.mismatches)};
}

}  // namespace flashoverlap::kernels
