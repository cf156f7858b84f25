// reorder.cu — post-communication reorder kernels (see reorder.h). All are
// memory-bound: 16-byte accesses along rows where alignment allows, scalar
// element accesses at ragged edges or misaligned outputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>

#include "kernels/cuda_check.h"
#include "kernels/reorder.h"

namespace flashoverlap::kernels {
namespace {

template <typename T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

// Eight consecutive elements of a row, moved as one 16-byte access when the
// address is aligned and all eight are inside the row, else one by one.
template <typename T>
struct Vec8 {
  T v[8];
};
template <typename T>
__device__ __forceinline__ Vec8<T> load8(const T* p, int valid) {
  Vec8<T> r;
  if (valid >= 8 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    *reinterpret_cast<uint4*>(r.v) = *reinterpret_cast<const uint4*>(p);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) r.v[e] = e < valid ? p[e] : from_f<T>(0.f);
  }
  return r;
}
template <typename T>
__device__ __forceinline__ void store8(T* p, const Vec8<T>& r, int valid) {
  if (valid >= 8 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(r.v);
  } else {
    for (int e = 0; e < valid && e < 8; ++e) p[e] = r.v[e];
  }
}

// Address in the AllReduce slot buffer of C(i, col), col a multiple of 8.
template <typename T>
__device__ __forceinline__ const T* slot_ptr(const T* slots, const plan::Schedule& s, int32_t i, int32_t col) {
  const plan::TileCoord tc{i / s.bm, col / s.bn};
  const int64_t idx = s.index_of_tile(tc);
  return slots + ((idx * s.bm + (i - tc.tm * s.bm)) * s.bn + (col - tc.tn * s.bn));
}

// Where the element-wise kernels read x(i, col..col+7) from. `valid` =
// elements of the row left from col (>= 1).
template <typename T>
struct SlotSource {  // the AllReduce slot layout (tiles are bn wide: 8 always readable)
  const T* slots;
  plan::Schedule s;
  __device__ Vec8<T> load(int32_t i, int32_t col, int) const {
#if defined(FO_FAULT_SWAP_ROWS)
    // test-only fault (FO_TEST_FAULT=swap_rows): see scripts/gpu_all.sh faults.
    // Output rows 0 and 1 read each other's slot rows (reorder_tiles_to_rows, reorder_add_rmsnorm).
    if (i < 2 && s.m >= 2) i ^= 1;
#endif
    return load8(slot_ptr(slots, s, i, col), 8);
  }
};
template <typename T>
struct RowSource {  // row-major
  const T* x;
  int64_t ld;
  __device__ Vec8<T> load(int32_t i, int32_t col, int valid) const { return load8(x + i * ld + col, valid); }
};
template <typename T>
struct SlotRowSource {  // slot rows bn wide, x(i, col) in slot_of_out[i * tiles_n + col / bn] (bn % 8 == 0)
  const T* slots;
  const int32_t* slot_of_out;
  int32_t tiles_n, bn;
  __device__ Vec8<T> load(int32_t i, int32_t col, int) const {
    const int32_t cb = col / bn;
    return load8(slots + int64_t(slot_of_out[int64_t(i) * tiles_n + cb]) * bn + (col - cb * bn), 8);
  }
};
template <typename T>
struct GatherSource {  // sum of `world` row-major blocks, `block` elements apart, in rank order
  const T* x;
  int64_t ld, block;
  int32_t world;
  __device__ Vec8<T> load(int32_t i, int32_t col, int valid) const {
    float acc[8] = {};
    for (int32_t w = 0; w < world; ++w) {
      const Vec8<T> v = load8(x + w * block + i * ld + col, valid);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += to_f(v.v[e]);
    }
    Vec8<T> r;
#pragma unroll
    for (int e = 0; e < 8; ++e) r.v[e] = from_f<T>(acc[e]);  // one rounding, as NCCL's sum of 2
    return r;
  }
};

// The MoE combine: out row t = sum over token t's rows (token_rows[token_begin[t]
// .. token_begin[t+1])) of gate[row] * x(row), fma in fp32 in that order,
// rounded once (plan::combine_reference's arithmetic); no rows: zeros.
template <typename T, typename Src>
__global__ void combine_kernel(Src src, const int32_t* token_begin, const int32_t* token_rows, const float* gate,
                               int32_t tokens, int32_t n, T* out, int64_t ld_out) {
  const int32_t units = (n + 7) / 8;
  for (int32_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const int32_t first = token_begin[t], end = token_begin[t + 1];
    for (int32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < units; u += gridDim.x * blockDim.x) {
      const int32_t col = u * 8, valid = n - col;
      float acc[8] = {};
      for (int32_t i = first; i < end; ++i) {
        const int32_t row = token_rows[i];
        const float g = gate[row];
        const Vec8<T> x = src.load(row, col, valid);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = fmaf(g, to_f(x.v[e]), acc[e]);
      }
      Vec8<T> y;
#pragma unroll
      for (int e = 0; e < 8; ++e) y.v[e] = from_f<T>(acc[e]);
      store8(out + int64_t(t) * ld_out + col, y, valid);
    }
  }
}

// Row-major c (m x n, ldc) = x.
template <typename T, typename Src>
__global__ void rows_kernel(Src src, int32_t m, int32_t n, T* c, int64_t ldc) {
  const int32_t units = (n + 7) / 8;
  for (int32_t i = blockIdx.y; i < m; i += gridDim.y) {
    for (int32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < units; u += gridDim.x * blockDim.x) {
      const int32_t col = u * 8, valid = n - col;
      store8(c + i * ldc + col, src.load(i, col, valid), valid);
    }
  }
}

template <typename T>
__device__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch (and the cached row) reuse across rows
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < blockDim.x / 32; ++w) t += scratch[w];
  return t;
}

// One CTA per row. kCached: the rounded h = x + residual of the row is kept
// in shared memory between the two passes (one read of x and the residual);
// otherwise it is recomputed from global memory (rows too long for smem).
template <typename T, bool kCached, typename Src>
__global__ void add_rmsnorm_kernel(Src src, int32_t m, int32_t n, const T* residual, const T* weight, float eps,
                                   T* out, T* residual_out) {
  extern __shared__ __align__(16) uint8_t row_smem[];
  T* hrow = reinterpret_cast<T*>(row_smem);
  __shared__ float scratch[32];
  const int32_t units = (n + 7) / 8;
  for (int32_t i = blockIdx.x; i < m; i += gridDim.x) {
    const int64_t row = int64_t(i) * n;
    auto h_of = [&](int32_t col, int valid) {
      const Vec8<T> x = src.load(i, col, valid);
      const Vec8<T> r = load8(residual + row + col, valid);
      Vec8<T> h;
#pragma unroll
      for (int e = 0; e < 8; ++e) h.v[e] = from_f<T>(to_f(x.v[e]) + to_f(r.v[e]));
      return h;
    };
    float ss = 0.f;
    for (int32_t u = threadIdx.x; u < units; u += blockDim.x) {
      const int32_t col = u * 8, valid = n - col;
      const Vec8<T> h = h_of(col, valid);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float hf = e < valid ? to_f(h.v[e]) : 0.f;
        ss += hf * hf;
      }
      if (kCached) *reinterpret_cast<Vec8<T>*>(hrow + col) = h;
      if (residual_out) store8(residual_out + row + col, h, valid);
    }
#if defined(FO_FAULT_EPS_TWICE)
    // test-only fault (FO_TEST_FAULT=eps_twice): see scripts/gpu_all.sh faults. eps added twice, in
    // every RMSNorm of reorder.h (reorder_add_rmsnorm, add_rmsnorm_rows, sum_gathered_add_rmsnorm).
    const float inv = rsqrtf(block_sum<T>(ss, scratch) / float(n) + eps + eps);  // (its barrier orders hrow)
#else
    const float inv = rsqrtf(block_sum<T>(ss, scratch) / float(n) + eps);  // its barrier orders hrow too
#endif
    for (int32_t u = threadIdx.x; u < units; u += blockDim.x) {
      const int32_t col = u * 8, valid = n - col;
      const Vec8<T> h = kCached ? *reinterpret_cast<const Vec8<T>*>(hrow + col) : h_of(col, valid);
      const Vec8<T> w = load8(weight + col, valid);
      Vec8<T> y;
#pragma unroll
      for (int e = 0; e < 8; ++e) y.v[e] = from_f<T>(to_f(h.v[e]) * inv * to_f(w.v[e]));
      store8(out + row + col, y, valid);
    }
  }
}

template <typename T>
__global__ void scatter_slot_rows_kernel(const T* slots, int64_t slot_rows, int32_t bn, const int32_t* dst_row,
                                         const int32_t* dst_col, T* out, int64_t ld_out, int32_t n_cols) {
  const int32_t units = bn / 8;
  const int64_t total = slot_rows * units;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t srow = t / units;
    const int32_t c8 = int32_t(t - srow * units) * 8;
    const int32_t r = dst_row[srow];
    if (r < 0) continue;
    const int32_t col = dst_col[srow] + c8;
    if (col >= n_cols) continue;
    store8(out + r * ld_out + col, load8(slots + srow * bn + c8, 8), n_cols - col);
  }
}

int grid_rows(int64_t m) { return int(m < 65535 ? m : 65535); }

// Rows up to this many bytes are cached in shared memory (set at preload).
constexpr int kRowCacheBytes = 96 * 1024;

template <typename T, typename Src>
void launch_rows(const Src& src, int32_t m, int32_t n, void* c, int64_t ldc, cudaStream_t stream) {
  if (m < 1) return;
  const int threads = 128;
  const dim3 grid((((n + 7) / 8) + threads - 1) / threads, grid_rows(m));
  rows_kernel<T, Src><<<grid, threads, 0, stream>>>(src, m, n, static_cast<T*>(c), ldc);
  FO_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename Src>
void launch_add_rmsnorm(const Src& src, int32_t m, int32_t n, const void* residual, const void* weight, float eps,
                        void* out, void* residual_out, cudaStream_t stream) {
  if (m < 1) return;
  {  // the 96 KB shared-memory limit is set per device, once
    static std::once_flag once[64];
    int dev = 0;
    FO_CUDA_CHECK(cudaGetDevice(&dev));
    std::call_once(once[dev % 64], preload_reorder_kernels);
  }
  const int threads = 256, grid = grid_rows(m);
  const size_t row_bytes = (size_t(n) + 7) / 8 * 8 * sizeof(T);
  auto go = [&](auto kernel, size_t smem) {
    kernel<<<grid, threads, smem, stream>>>(src, m, n, static_cast<const T*>(residual), static_cast<const T*>(weight),
                                            eps, static_cast<T*>(out), static_cast<T*>(residual_out));
  };
  if (row_bytes <= size_t(kRowCacheBytes))
    go(add_rmsnorm_kernel<T, true, Src>, row_bytes);
  else
    go(add_rmsnorm_kernel<T, false, Src>, 0);
  FO_CUDA_CHECK(cudaGetLastError());
}

// Calls f(T{}) with the element type of `dtype`.
template <typename F>
void with_type(DType dtype, F&& f) {
  if (dtype == DType::BF16)
    f(__nv_bfloat16{});
  else
    f(__half{});
}

}  // namespace

void reorder_tiles_to_rows(DType dtype, const void* slots, const plan::Schedule& s, void* c, int64_t ldc,
                           cudaStream_t stream) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    launch_rows<T>(SlotSource<T>{static_cast<const T*>(slots), s}, s.m, s.n, c, ldc, stream);
  });
}

void reorder_add_rmsnorm(DType dtype, const void* slots, const plan::Schedule& s, const void* residual,
                         const void* weight, float eps, void* out, void* residual_out, cudaStream_t stream) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    launch_add_rmsnorm<T>(SlotSource<T>{static_cast<const T*>(slots), s}, s.m, s.n, residual, weight, eps, out,
                          residual_out, stream);
  });
}

void add_rmsnorm_rows(DType dtype, const void* x, int32_t m, int32_t n, const void* residual, const void* weight,
                      float eps, void* out, void* residual_out, cudaStream_t stream) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    launch_add_rmsnorm<T>(RowSource<T>{static_cast<const T*>(x), n}, m, n, residual, weight, eps, out, residual_out,
                          stream);
  });
}

void gather_slot_rows(DType dtype, const void* slots, int32_t bn, const int32_t* slot_of_out, int32_t tiles_n,
                      int32_t rows, int32_t n, void* out, int64_t ld_out, cudaStream_t stream) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    launch_rows<T>(SlotRowSource<T>{static_cast<const T*>(slots), slot_of_out, tiles_n, bn}, rows, n, out, ld_out,
                   stream);
  });
}

void gather_slot_rows_add_rmsnorm(DType dtype, const void* slots, int32_t bn, const int32_t* slot_of_out,
                                  int32_t tiles_n, int32_t rows, int32_t n, const void* residual, const void* weight,
                                  float eps, void* out, void* residual_out, cudaStream_t stream) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    launch_add_rmsnorm<T>(SlotRowSource<T>{static_cast<const T*>(slots), slot_of_out, tiles_n, bn}, rows, n, residual,
                          weight, eps, out, residual_out, stream);
  });
}

void combine_slot_rows(DType dtype, const void* slots, int32_t bn, const int32_t* slot_of_out, int32_t tiles_n,
                       const int32_t* token_begin, const int32_t* token_rows, const float* gate, int32_t tokens,
                       int32_t n, void* out, int64_t ld_out, cudaStream_t stream) {
  if (tokens < 1) return;
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    const SlotRowSource<T> src{static_cast<const T*>(slots), slot_of_out, tiles_n, bn};
    const int threads = 128;
    const dim3 grid((((n + 7) / 8) + threads - 1) / threads, grid_rows(tokens));
    combine_kernel<T, SlotRowSource<T>><<<grid, threads, 0, stream>>>(src, token_begin, token_rows, gate, tokens, n,
                                                                      static_cast<T*>(out), ld_out);
  });
  FO_CUDA_CHECK(cudaGetLastError());
}

void sum_gathered_rows(DType dtype, const void* gathered, int32_t world, int64_t block_elems, int32_t m, int32_t n,
                       void* out, int64_t ld_out, cudaStream_t stream) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    launch_rows<T>(GatherSource<T>{static_cast<const T*>(gathered), n, block_elems, world}, m, n, out, ld_out, stream);
  });
}

void sum_gathered_add_rmsnorm(DType dtype, const void* gathered, int32_t world, int64_t block_elems, int32_t m,
                              int32_t n, const void* residual, const void* weight, float eps, void* out,
                              void* residual_out, cudaStream_t stream) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    launch_add_rmsnorm<T>(GatherSource<T>{static_cast<const T*>(gathered), n, block_elems, world}, m, n, residual,
                          weight, eps, out, residual_out, stream);
  });
}

void scatter_slot_rows(DType dtype, const void* slots, int64_t slot_rows, int32_t bn, const int32_t* dst_row,
                       const int32_t* dst_col, void* out, int64_t ld_out, int32_t n_cols, cudaStream_t stream) {
  const int threads = 256;
  const int64_t total = slot_rows * (bn / 8);
  const int grid = int((total + threads - 1) / threads < 65535 * 16 ? (total + threads - 1) / threads : 65535 * 16);
  if (total == 0) return;
  if (dtype == DType::BF16)
    scatter_slot_rows_kernel<<<grid, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(slots), slot_rows, bn,
                                                           dst_row, dst_col, static_cast<__nv_bfloat16*>(out),
                                                           ld_out, n_cols);
  else
    scatter_slot_rows_kernel<<<grid, threads, 0, stream>>>(static_cast<const __half*>(slots), slot_rows, bn,
                                                           dst_row, dst_col, static_cast<__half*>(out), ld_out,
                                                           n_cols);
  FO_CUDA_CHECK(cudaGetLastError());
}

namespace {
template <typename T, typename Src>
void preload_source() {
  cudaFuncAttributes a{};
  FO_CUDA_CHECK(cudaFuncGetAttributes(&a, rows_kernel<T, Src>));
  FO_CUDA_CHECK(cudaFuncSetAttribute(add_rmsnorm_kernel<T, true, Src>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kRowCacheBytes));
  FO_CUDA_CHECK(cudaFuncGetAttributes(&a, add_rmsnorm_kernel<T, false, Src>));
}
template <typename T>
void preload_type() {
  preload_source<T, SlotSource<T>>();
  preload_source<T, RowSource<T>>();
  preload_source<T, GatherSource<T>>();
  preload_source<T, SlotRowSource<T>>();
  {
    cudaFuncAttributes ca{};
    FO_CUDA_CHECK(cudaFuncGetAttributes(&ca, combine_kernel<T, SlotRowSource<T>>));
  }
  cudaFuncAttributes a{};
  FO_CUDA_CHECK(cudaFuncGetAttributes(&a, scatter_slot_rows_kernel<T>));
}
}  // namespace

void preload_reorder_kernels() {
  preload_type<__nv_bfloat16>();
  preload_type<__half>();
}

}  // namespace flashoverlap::kernels
