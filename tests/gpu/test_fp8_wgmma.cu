// test_fp8_wgmma.cu — the FP8 GEMM's building block before the GEMM (docs/
// design.md §13): one warpgroup's e4m3 wgmma (m64nNk32, 4 per 128-byte
// k-block) on A and B laid out as the bf16 kernel lays its stages (128-byte
// rows, 128-byte swizzle, the same descriptors), against the exact product
// on the host. Small integers, so that every sum is exact in the tensor
// cores' ~14-bit accumulation and the comparison can be bitwise.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm_smem.cuh"
#include "kernels/ptx.cuh"
#include "kernels/wgmma_ops.cuh"
#include "runtime/core/buffer.h"
#include "gpu_test_util.h"

using namespace flashoverlap;

namespace {

// a [64 x 128] and b [N x 128] e4m3, row-major (K-major, as nn.Linear's);
// d [64 x N] fp32 = a b^T, by one warpgroup. first_zero: the first wgmma
// with scale-d off (d's registers hold garbage before it), as each k-block's
// promotion will.
template <int N>
__global__ void __launch_bounds__(128) fp8_tile(const uint8_t* a, const uint8_t* b, float* d) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sm = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sa = sm;             // 64 rows x 128 B (8 KiB: b stays 1024-byte aligned)
  uint8_t* sb = sm + 64 * 128;  // N rows x 128 B
  for (int i = threadIdx.x; i < 64 * 8; i += 128)
    *reinterpret_cast<uint4*>(sa + kernels::sw128_offset(i / 8, i % 8)) = reinterpret_cast<const uint4*>(a)[i];
  for (int i = threadIdx.x; i < N * 8; i += 128)
    *reinterpret_cast<uint4*>(sb + kernels::sw128_offset(i / 8, i % 8)) = reinterpret_cast<const uint4*>(b)[i];
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (the wgmma read through the async proxy)
  __syncthreads();
  float acc[N / 2];
  for (int i = 0; i < N / 2; ++i) acc[i] = 1e30f;  // (scale-d off on the first wgmma must ignore these)
  kernels::ptx::wgmma_fence();
  const uint64_t da = kernels::ptx::smem_desc_sw128(sa), db = kernels::ptx::smem_desc_sw128(sb);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)  // +32 bytes along K each, as the bf16 kernel's k16 steps
    kernels::ptx::Wgmma<N, __nv_fp8_e4m3>::mma(acc, da + 2 * kk, db + 2 * kk, kk > 0 ? 1 : 0);
  kernels::ptx::wgmma_commit();
  kernels::ptx::wgmma_wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c)  // (the fragment: register 4j + 2h + c, row warp*16 + lane/4 + 8h)
        d[(warp * 16 + lane / 4 + 8 * h) * N + 8 * j + 2 * (lane % 4) + c] = acc[4 * j + 2 * h + c];
}

template <int N>
void expect_exact(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> a(64 * 128), b(size_t(N) * 128);
  std::vector<int> ai(a.size()), bi(b.size());
  auto fill = [&](std::vector<uint8_t>& q, std::vector<int>& v) {
    for (size_t i = 0; i < q.size(); ++i) {
      v[i] = int(rng() % 7) - 3;  // (e4m3 holds every integer of [-3, 3] exactly)
      q[i] = __nv_fp8_e4m3(float(v[i])).__x;
    }
  };
  fill(a, ai), fill(b, bi);
  rt::DeviceBuffer da(a.size()), db(b.size()), dd(size_t(64) * N * 4);
  FO_CUDA_CHECK(cudaMemcpy(da.get(), a.data(), a.size(), cudaMemcpyHostToDevice));
  FO_CUDA_CHECK(cudaMemcpy(db.get(), b.data(), b.size(), cudaMemcpyHostToDevice));
  const int smem = 1024 + 64 * 128 + N * 128;
  FO_CUDA_CHECK(cudaFuncSetAttribute(fp8_tile<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  fp8_tile<N><<<1, 128, smem>>>(da.as<uint8_t>(), db.as<uint8_t>(), dd.as<float>());
  FO_CUDA_CHECK(cudaGetLastError());
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> d(size_t(64) * N);
  FO_CUDA_CHECK(cudaMemcpy(d.data(), dd.get(), d.size() * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < N; ++c) {
      int want = 0;
      for (int k = 0; k < 128; ++k) want += ai[size_t(r) * 128 + k] * bi[size_t(c) * 128 + k];
      if (d[size_t(r) * N + c] != float(want) && wrong++ < 5)
        ADD_FAILURE() << "N " << N << ": d[" << r << "][" << c << "] = " << d[size_t(r) * N + c] << ", want " << want
                      << " (seed " << seed << ")";
    }
  EXPECT_EQ(wrong, 0) << "N " << N << ", seed " << seed;
}

}  // namespace

TEST(Fp8Wgmma, OneKBlockOfFourK32MatchesTheExactProduct) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  expect_exact<128>(seed);
  expect_exact<256>(seed + 1);
}
