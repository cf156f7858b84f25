// check.cu — see check.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdio>
#include <cstring>

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

__global__ void e4m3_to_float_kernel(const __nv_fp8_e4m3* src, float* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = float(src[i]);
}

__global__ void apply_fp8_scales_kernel(float* c, int64_t rows, int64_t cols, Fp8 f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols, col = i - row * cols;
    if (f.scales == Scales::PerTensor) c[i] = c[i] * f.scale_a[0] * f.scale_b[0];
    else if (f.scales == Scales::RowWise) c[i] = c[i] * f.scale_a[row] * f.scale_b[col];
  }
}

template <typename T>
__global__ void error_to_fp32_kernel(const T* x, int64_t ldx, const float* ref, int64_t rows, int64_t cols,
                                     double* sums) {
  double e = 0, r = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols, col = i - row * cols;
    const double d = double(float(x[row * ldx + col])) - double(ref[i]);
    e += d * d, r += double(ref[i]) * double(ref[i]);
  }
  atomicAdd(&sums[0], e);
  atomicAdd(&sums[1], r);
}

__global__ void poison_kernel(uint16_t* p, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = 0xFFFF;
}

struct Sums {
  double err_sq, ref_sq;
  unsigned long long nan_count, mismatches, beyond;
  // (bits of the float ratio |x - ref| / bound) << 32 | (2^32 - 1 - index):
  // the largest ratio, the first index among equals.
  unsigned long long worst_key;
  unsigned long long first_mismatch;  // index; ~0 when none
};

template <typename T>
__global__ void compare_kernel(const T* x, int64_t ldx, const T* ref, int64_t ldref, int64_t rows, int64_t cols,
                               double atol, double rtol, Sums* out) {
  double e = 0, r = 0;
  unsigned long long nans = 0, mism = 0, beyond = 0, worst = 0, first = ~0ull;
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols, col = i - row * cols;
    const T a = x[row * ldx + col], b = ref[row * ldref + col];
    const float fa = float(a), fb = float(b);
    const bool finite = isfinite(fa) && isfinite(fb);
    if (!isfinite(fa)) ++nans;
    if (*reinterpret_cast<const uint16_t*>(&a) != *reinterpret_cast<const uint16_t*>(&b)) {
      ++mism;
      first = min(first, static_cast<unsigned long long>(i));
    }
    const double d = double(fa) - double(fb);
    e += d * d;
    r += double(fb) * double(fb);
    const double bound = atol + rtol * fabs(double(fb));
    const double ad = fabs(d);
    float ratio = 0.f;  // (non-finite, or beyond a zero bound: infinitely far)
    if (!finite || (ad > 0 && bound <= 0)) ratio = INFINITY;
    else if (ad > 0) ratio = float(fmin(ad / bound, 3.0e38));
    if (!finite || ad > bound) ++beyond;
    const unsigned long long key =
        (static_cast<unsigned long long>(__float_as_uint(ratio)) << 32) | (0xFFFFFFFFull - uint64_t(i & 0xFFFFFFFF));
    if (ratio > 0.f && key > worst) worst = key;
  }
  for (int o = 16; o > 0; o /= 2) {
    e += __shfl_xor_sync(0xffffffffu, e, o);
    r += __shfl_xor_sync(0xffffffffu, r, o);
    nans += __shfl_xor_sync(0xffffffffu, nans, o);
    mism += __shfl_xor_sync(0xffffffffu, mism, o);
    beyond += __shfl_xor_sync(0xffffffffu, beyond, o);
    worst = max(worst, __shfl_xor_sync(0xffffffffu, worst, o));
    first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&out->err_sq, e);
    atomicAdd(&out->ref_sq, r);
    atomicAdd(&out->nan_count, nans);
    atomicAdd(&out->mismatches, mism);
    atomicAdd(&out->beyond, beyond);
    if (worst) atomicMax(&out->worst_key, worst);
    if (first != ~0ull) atomicMin(&out->first_mismatch, first);
  }
}

int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return int(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

}  // namespace

double CompareResult::rel_error() const { return ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq); }

Tolerance gemm_tolerance(DType dtype, int64_t k, int summands, double input_bound) {
  const double u = dtype == DType::BF16 ? 0x1p-7 : 0x1p-10;
  const double sigma = input_bound * input_bound * std::sqrt(double(k) / 9.0);
  Tolerance t;
  t.rtol = u * (1 + 0x1p-4);  // (one spacing is exactly u |ref| where ref is a power of two: 1/16 to spare)
  t.atol = double(k) * 0x1p-20 * sigma + (summands > 1 ? summands * u * 7.0 * sigma : 0.0);
  return t;
}

Tolerance rmsnorm_tolerance(DType dtype, int64_t n) {
  const double u = dtype == DType::BF16 ? 0x1p-7 : 0x1p-10;
  // (fp16's subnormal spacing, 2^-24, for outputs near zero; rsqrtf and the
  // two fp32 products: a few fp32 ulps)
  return Tolerance{dtype == DType::FP16 ? 0x1p-24 : 0x1p-126, u * (1 + 0x1p-4) + double(n) * 0x1p-24 + 0x1p-20};
}

namespace {
std::string at_text(int64_t index, int64_t cols) {
  const int64_t c = cols > 0 ? cols : 1;
  return "row " + std::to_string(index / c) + ", col " + std::to_string(index % c);
}
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
std::string hex16(uint16_t v) {
  char b[8];
  std::snprintf(b, sizeof b, "0x%04x", v);
  return b;
}
}  // namespace

std::string CompareResult::describe() const {
  std::string s = std::to_string(beyond) + " of " + std::to_string(elements) + " elements beyond " + num(tol.atol) +
                  " + " + num(tol.rtol) + "|ref|";
  if (worst >= 0)
    s += " (worst at " + at_text(worst, cols) + ": " + num(worst_x) + " vs " + num(worst_ref) + ", " +
         num(worst_ratio) + "x the bound)";
  s += "; " + std::to_string(mismatches) + " differ in their bits";
  if (first_mismatch >= 0)
    s += " (first at " + at_text(first_mismatch, cols) + ": " + hex16(first_x_bits) + " vs " + hex16(first_ref_bits) +
         ")";
  s += "; " + std::to_string(nan_count) + " non-finite";
  return s;
}

void fill_random(DType dtype, void* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (dtype == DType::BF16)
    fill_random_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), count, seed, lo, hi);
  else
    fill_random_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<__half*>(p), count, seed, lo, hi);
  FO_CUDA_CHECK(cudaGetLastError());
}

void fill_random_e4m3(void* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  fill_random_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<__nv_fp8_e4m3*>(p), count, seed, lo, hi);
  FO_CUDA_CHECK(cudaGetLastError());
}

void e4m3_to_float(const void* src, float* dst, int64_t count, cudaStream_t stream) {
  e4m3_to_float_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<const __nv_fp8_e4m3*>(src), dst, count);
  FO_CUDA_CHECK(cudaGetLastError());
}

void apply_fp8_scales(float* c, int64_t rows, int64_t cols, const Fp8& f, cudaStream_t stream) {
  if (f.scales == Scales::None) return;
  apply_fp8_scales_kernel<<<blocks_for(rows * cols, 256), 256, 0, stream>>>(c, rows, cols, f);
  FO_CUDA_CHECK(cudaGetLastError());
}

double relative_error_to_fp32(DType dtype, const void* x, int64_t ldx, const float* ref, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
  double* d = nullptr;
  FO_CUDA_CHECK(cudaMallocAsync(&d, 2 * sizeof(double), stream));
  FO_CUDA_CHECK(cudaMemsetAsync(d, 0, 2 * sizeof(double), stream));
  const int blocks = blocks_for(rows * cols, 256);
  if (dtype == DType::BF16)
    error_to_fp32_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), ldx, ref, rows, cols, d);
  else
    error_to_fp32_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __half*>(x), ldx, ref, rows, cols, d);
  FO_CUDA_CHECK(cudaGetLastError());
  double h[2] = {0, 0};
  FO_CUDA_CHECK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, stream));
  FO_CUDA_CHECK(cudaFreeAsync(d, stream));
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h[1] > 0 ? std::sqrt(h[0] / h[1]) : (h[0] > 0 ? INFINITY : 0.0);
}

void poison(void* p, int64_t count, cudaStream_t stream) {
  poison_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(static_cast<uint16_t*>(p), count);
  FO_CUDA_CHECK(cudaGetLastError());
}

CompareResult compare(DType dtype, const void* x, int64_t ldx, const void* ref, int64_t ldref, int64_t rows,
                      int64_t cols, cudaStream_t stream, Tolerance tol) {
  Sums* d = nullptr;
  FO_CUDA_CHECK(cudaMallocAsync(&d, sizeof(Sums), stream));
  FO_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(Sums), stream));
  FO_CUDA_CHECK(cudaMemsetAsync(&d->first_mismatch, 0xff, sizeof(d->first_mismatch), stream));
  const int blocks = blocks_for(rows * cols, 256);
  if (dtype == DType::BF16)
    compare_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), ldx,
                                               static_cast<const __nv_bfloat16*>(ref), ldref, rows, cols, tol.atol,
                                               tol.rtol, d);
  else
    compare_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __half*>(x), ldx, static_cast<const __half*>(ref),
                                               ldref, rows, cols, tol.atol, tol.rtol, d);
  FO_CUDA_CHECK(cudaGetLastError());
  Sums h{};
  FO_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(Sums), cudaMemcpyDeviceToHost, stream));
  FO_CUDA_CHECK(cudaFreeAsync(d, stream));
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  CompareResult c;
  c.err_sq = h.err_sq, c.ref_sq = h.ref_sq, c.nan_count = int64_t(h.nan_count), c.mismatches = int64_t(h.mismatches);
  c.elements = rows * cols, c.cols = cols, c.tol = tol, c.beyond = int64_t(h.beyond);
  // The two elements' values, read back (row-major indices of rows x cols).
  auto element = [&](const void* base, int64_t ld, int64_t index) {
    uint16_t v = 0;
    const int64_t row = index / cols, col = index % cols;
    FO_CUDA_CHECK(cudaMemcpyAsync(&v, static_cast<const uint16_t*>(base) + row * ld + col, 2, cudaMemcpyDeviceToHost,
                                  stream));
    FO_CUDA_CHECK(cudaStreamSynchronize(stream));
    return v;
  };
  auto value = [&](uint16_t v) {
    return dtype == DType::BF16 ? __bfloat162float(__nv_bfloat16_raw{v}) : __half2float(__half_raw{v});
  };
  if (h.worst_key) {
    const uint32_t ratio_bits = uint32_t(h.worst_key >> 32);
    float ratio = 0;
    std::memcpy(&ratio, &ratio_bits, 4);
    c.worst = int64_t(0xFFFFFFFFull - (h.worst_key & 0xFFFFFFFFull));  // (low 32 bits of the index)
    if (c.worst < c.elements) {
      c.worst_ratio = ratio;
      c.worst_x = value(element(x, ldx, c.worst)), c.worst_ref = value(element(ref, ldref, c.worst));
    } else {
      c.worst = -1;
    }
  }
  if (h.first_mismatch != ~0ull) {
    c.first_mismatch = int64_t(h.first_mismatch);
    c.first_x_bits = element(x, ldx, c.first_mismatch), c.first_ref_bits = element(ref, ldref, c.first_mismatch);
  }
  return c;
}

}  // namespace flashoverlap::kernels
