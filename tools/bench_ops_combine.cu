// bench_ops_combine.cu — the baseline's MoE combine (bench_ops_combine.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "bench_ops_combine.h"

namespace flashoverlap::cli {
namespace {

__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }
template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

// One block per token (grid-stride over tokens), its threads over the
// columns, VEC of them each (VEC 8: 16-byte loads and stores, for n % 8 == 0).
template <typename T, int VEC>
__global__ void moe_combine(const T* __restrict__ rows, int64_t n, const int64_t* __restrict__ offsets,
                            const int64_t* __restrict__ index, const float* __restrict__ gates, int64_t tokens,
                            T* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int64_t first = offsets[t], last = offsets[t + 1];
    for (int64_t c = int64_t(threadIdx.x) * VEC; c < n; c += int64_t(blockDim.x) * VEC) {
      float acc[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
      for (int64_t i = first; i < last; ++i) {
        const float g = gates[i];
        alignas(16) T x[VEC];
        if constexpr (VEC == 8)
          *reinterpret_cast<uint4*>(x) = *reinterpret_cast<const uint4*>(rows + index[i] * n + c);
        else
          x[0] = rows[index[i] * n + c];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] += g * to_float(x[v]);
      }
      alignas(16) T y[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) y[v] = from_float<T>(acc[v]);
      if constexpr (VEC == 8)
        *reinterpret_cast<uint4*>(out + t * n + c) = *reinterpret_cast<const uint4*>(y);
      else
        out[t * n + c] = y[0];
    }
  }
}

template <typename T>
void launch(const void* rows, int64_t n, const int64_t* offsets, const int64_t* index, const float* gates,
            int64_t tokens, void* out, cudaStream_t stream) {
  const unsigned blocks = unsigned(tokens < 65535 ? tokens : 65535);
  const bool wide = n % 8 == 0 && reinterpret_cast<uintptr_t>(rows) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t lanes = wide ? n / 8 : n;
  const unsigned threads = lanes >= 256 ? 256 : unsigned((lanes + 31) / 32 * 32);
  if (wide)
    moe_combine<T, 8><<<blocks, threads, 0, stream>>>(static_cast<const T*>(rows), n, offsets, index, gates, tokens,
                                                      static_cast<T*>(out));
  else
    moe_combine<T, 1><<<blocks, threads, 0, stream>>>(static_cast<const T*>(rows), n, offsets, index, gates, tokens,
                                                      static_cast<T*>(out));
}

}  // namespace

void launch_moe_combine(bool bf16, const void* rows, int64_t n, const int64_t* offsets, const int64_t* index,
                        const float* gates, int64_t tokens, void* out, cudaStream_t stream) {
  if (tokens <= 0 || n <= 0) return;
  if (bf16)
    launch<__nv_bfloat16>(rows, n, offsets, index, gates, tokens, out, stream);
  else
    launch<__half>(rows, n, offsets, index, gates, tokens, out, stream);
}

}  // namespace flashoverlap::cli
