// test_fp8_gemm.cu — the FP8 GEMM (docs/design.md §13). First its building
// block: one warpgroup's e4m3 wgmma (m64nNk32, 4 per 128-byte k-block) on A
// and B laid out as the bf16 kernel lays its stages (128-byte rows, 128-byte
// swizzle, the same descriptors). Then the signalling GEMM with e4m3 inputs,
// each scale kind, bf16 and fp16 outputs. Inputs are small integers, so
// that every k-block's sum is exact in the tensor cores' ~14-bit
// accumulation and every sum over k exact in fp32 (the promotion): the
// output is then the host's (acc * sa) * sb rounded once, bitwise. A large
// k of one sign shows the promotion: its sums pass 2^14 (those launches run
// traced: the phase monitor's records are checked against the split's walk).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gemm_smem.cuh"
#include "kernels/ptx.cuh"
#include "kernels/wgmma_ops.cuh"
#include "plan/tile_grid.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
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

namespace {

uint8_t e4m3(int v) { return __nv_fp8_e4m3(float(v)).__x; }

// A scale kind's scales for `rows` rows (one, or one per row), in [0.01, 4).
std::vector<float> random_scales(kernels::Scales kind, int64_t rows, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> scale(0.01f, 4.f);
  std::vector<float> v(kind == kernels::Scales::RowWise ? size_t(rows) : 1);
  for (float& x : v) x = scale(rng);
  return v;
}

uint16_t round_out(float x, kernels::DType dt) {
  uint16_t bits;
  if (dt == kernels::DType::BF16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    std::memcpy(&bits, &h, 2);
  } else {
    const __half h = __float2half_rn(x);
    std::memcpy(&bits, &h, 2);
  }
  return bits;
}

}  // namespace

// The GEMM with e4m3 inputs: random shapes (m and n ragged against the
// tiles, k a multiple of 16 but not always of 128), every scale kind, both
// outputs, C strided (some rows unaligned: the consumers store them), every tile (128 x 112, 128 x 128,
// 128 x 160, 128 x 192; 64 x 48 and 64 x 144 into C): bitwise the host's scaled product, and nothing written past n;
// the same into the ops' slot layouts.
TEST(Fp8Gemm, EveryScaleKindMatchesTheHostBitwise) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const kernels::Scales kinds[] = {kernels::Scales::None, kernels::Scales::PerTensor, kernels::Scales::RowWise};
  const int sms = rt::current_device_sms();  // the whole tiles' grid: one CTA per SM
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t m = 1 + int64_t(rng() % 700), n = 8 * (1 + int64_t(rng() % 80)), k = 16 * (1 + int64_t(rng() % 40));
    const kernels::Scales kind = kinds[trial % 3];
    const kernels::DType out = trial % 2 ? kernels::DType::FP16 : kernels::DType::BF16;
    // (every fourth trial an odd stride: C's rows not 16-byte aligned, the consumers store the rows)
    const int64_t ldc = trial % 4 == 3 ? n + 3 : n + 8 * int64_t(trial % 3);
    SCOPED_TRACE("m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) + ", scales " +
                 std::to_string(int(kind)) + ", out " + std::to_string(int(out)) + ", ldc " + std::to_string(ldc) +
                 ", seed " + std::to_string(seed));
    std::vector<int> ai(size_t(m * k)), bi(size_t(n * k));
    std::vector<uint8_t> a(ai.size()), b(bi.size());
    for (size_t i = 0; i < ai.size(); ++i) ai[i] = int(rng() % 7) - 3, a[i] = e4m3(ai[i]);
    for (size_t i = 0; i < bi.size(); ++i) bi[i] = int(rng() % 7) - 3, b[i] = e4m3(bi[i]);
    const std::vector<float> sa = random_scales(kind, m, rng), sb = random_scales(kind, n, rng);
    const rt::DeviceBuffer da = rt::to_device(a), db = rt::to_device(b), dsa = rt::to_device(sa),
                           dsb = rt::to_device(sb);
    rt::DeviceBuffer dc(size_t(m) * ldc * 2);
    FO_CUDA_CHECK(cudaMemset(dc.get(), 0xff, dc.bytes()));
    std::vector<uint16_t> want(size_t(m) * n);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < n; ++col) {
        int acc = 0;
        for (int64_t kk = 0; kk < k; ++kk) acc += ai[size_t(r * k + kk)] * bi[size_t(col * k + kk)];
        float x = float(acc);
        if (kind == kernels::Scales::PerTensor) x = x * sa[0] * sb[0];
        if (kind == kernels::Scales::RowWise) x = x * sa[size_t(r)] * sb[size_t(col)];
        want[size_t(r * n + col)] = round_out(x, out);
      }
    // Each tile whole, then stream-K (plan/stream_k.h) forced on few CTAs,
    // then split in pairs (GemmParams::pair_k, where k has two k-blocks): the
    // pieces' fp32 sums are exact too, so bitwise the same.
    const int stream_ctas = 2 + int(rng() % 12);
    rt::DeviceBuffer work(kernels::stream_k_workspace_bytes(stream_ctas, 192));
    FO_CUDA_CHECK(cudaMemset(work.get(), 0, work.bytes()));
    // (kRows64: the 64-row tiles, one consumer warpgroup, a plain C only; on
    // every SM, then on a few CTAs, several tiles each)
    enum Form { kWhole, kStreamK, kPair, kRows64, kRows64Few };
    // (128x128 split again after the others: launches of every tile share one workspace)
    for (auto [bn, form] : {std::pair{128, kWhole}, std::pair{192, kWhole}, std::pair{160, kWhole},
                            std::pair{112, kWhole}, std::pair{144, kWhole}, std::pair{144, kStreamK},
                            std::pair{144, kPair}, std::pair{128, kStreamK}, std::pair{192, kStreamK},
                            std::pair{160, kStreamK}, std::pair{112, kStreamK}, std::pair{128, kStreamK},
                            std::pair{128, kPair}, std::pair{160, kPair}, std::pair{112, kPair},
                            std::pair{48, kRows64}, std::pair{144, kRows64}, std::pair{48, kRows64Few},
                            std::pair{144, kRows64Few},
                            std::pair{192, kPair}}) {
      const bool split = form == kStreamK;
      const int32_t tiles_of_bn = int32_t((m + 127) / 128 * ((n + bn - 1) / bn));
      if (form == kPair && (k <= 128 || 2 * tiles_of_bn > sms)) continue;
      const int bm = form == kRows64 || form == kRows64Few ? 64 : 128;
      const int ctas = split ? stream_ctas : form == kPair ? 2 * tiles_of_bn : form == kRows64Few ? 3 : sms;
      SCOPED_TRACE("tile " + std::to_string(bm) + "x" + std::to_string(bn) +
                   (split ? ", stream-K on " + std::to_string(ctas) + " CTAs" : "") +
                   (form == kPair ? ", split in pairs" : "") +
                   (bm == 64 ? " on " + std::to_string(ctas) + " CTAs" : ""));
      FO_CUDA_CHECK(cudaMemset(dc.get(), 0xff, dc.bytes()));
      const plan::Schedule s = plan::make_schedule(m, n, {bm, bn}, ctas, plan::Raster::AlongN, 2);
      kernels::GemmParams p = kernels::plain_gemm(out, da.get(), db.get(), s, int32_t(k), dc.get(), ldc);
      if (split) {
        p.stream_k = plan::StreamK{s.tiles(), int32_t(rng() % uint64_t(s.tiles())), int32_t((k + 127) / 128), ctas};
        p.stream_k_work = work.get();
      }
      p.pair_k = form == kPair;
      p.fp8.on = true, p.fp8.scales = kind;
      if (kind != kernels::Scales::None) p.fp8.scale_a = dsa.as<float>(), p.fp8.scale_b = dsb.as<float>();
      kernels::launch_gemm(p, nullptr);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> c(size_t(m) * ldc);
      FO_CUDA_CHECK(cudaMemcpy(c.data(), dc.get(), dc.bytes(), cudaMemcpyDeviceToHost));
      int wrong = 0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = 0; col < n; ++col) {
          const uint16_t w = want[size_t(r * n + col)], got = c[size_t(r * ldc + col)];
          if (got != w && wrong++ < 5)
            ADD_FAILURE() << "C[" << r << "][" << col << "] = 0x" << std::hex << got << ", want 0x" << w << std::dec;
        }
      EXPECT_EQ(wrong, 0);
      int64_t past_n = 0;  // (C's padding, [n, ldc) of each row, as the memset left it)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = n; col < ldc; ++col) past_n += c[size_t(r * ldc + col)] != 0xffff;
      EXPECT_EQ(past_n, 0) << "values written past column n";
      if (split) {
        std::vector<uint32_t> flags(size_t(ctas) * 2, 1);  // (each launch leaves them zero)
        FO_CUDA_CHECK(cudaMemcpy(flags.data(), work.get(), flags.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::count(flags.begin(), flags.end(), 0u), int64_t(flags.size())) << "a flag left up";
      }
      // The ops' stores: whole tiles into slots (SlotTiles, split too), and
      // rows into slot rows, by halves (SlotRows with half_row: TMA) or row
      // by row (row_of: the consumers), both in reversed order.
      const int32_t tiles = s.tiles();
      const int64_t slot_rows = int64_t(tiles) * 128;
      std::vector<int32_t> half_row(size_t(tiles) * 2), row_of(static_cast<size_t>(slot_rows));
      for (int32_t t = 0; t < tiles; ++t) {
        for (int h = 0; h < 2; ++h) half_row[size_t(t * 2 + h)] = ((tiles - 1 - t) * 2 + 1 - h) * 64;
        const int64_t rows = m - int64_t(s.tile_of(t).tm) * 128;
        for (int r = 0; r < 128; ++r)
          row_of[size_t(t * 128 + r)] = r < rows ? int32_t(slot_rows - 1 - (t * 128 + r)) : -1;
      }
      const rt::DeviceBuffer dhalf = rt::to_device(half_row), drow = rt::to_device(row_of);
      rt::DeviceBuffer slots(size_t(slot_rows) * size_t(bn) * 2);
      for (int store = 0; store < (form == kWhole ? 3 : bm == 64 ? 0 : 1); ++store) {
        SCOPED_TRACE(std::string("into slots: ") + (store == 0 ? "SlotTiles" : store == 1 ? "SlotRows by halves"
                                                                                          : "SlotRows by rows"));
        kernels::GemmParams q = p;
        q.store = store == 0 ? kernels::Store::SlotTiles : kernels::Store::SlotRows;
        q.c = nullptr, q.ldc = 0, q.slots = slots.get(), q.slot_rows = slot_rows;
        if (store == 1) q.half_row = dhalf.as<int32_t>();
        if (store == 2) q.row_of = drow.as<int32_t>();
        FO_CUDA_CHECK(cudaMemset(slots.get(), 0xff, slots.bytes()));
        kernels::launch_gemm(q, nullptr);
        FO_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> y(size_t(slot_rows) * size_t(bn));
        FO_CUDA_CHECK(cudaMemcpy(y.data(), slots.get(), slots.bytes(), cudaMemcpyDeviceToHost));
        int off = 0;
        for (int32_t t = 0; t < tiles; ++t) {
          const plan::TileCoord tc = s.tile_of(t);
          for (int r = 0; r < 128 && tc.tm * 128 + r < m; ++r) {
            const int64_t srow = store == 0 ? t * 128 + r
                                 : store == 1 ? half_row[size_t(t * 2 + r / 64)] + r % 64
                                              : row_of[size_t(t * 128 + r)];
            for (int col = 0; col < bn && tc.tn * bn + col < n; ++col) {
              const uint16_t w = want[size_t((tc.tm * 128 + r) * n + tc.tn * bn + col)];
              const uint16_t got = y[size_t(srow * bn + col)];
              if (got != w && off++ < 5)
                ADD_FAILURE() << "tile " << t << " row " << r << " col " << col << ": 0x" << std::hex << got
                              << ", want 0x" << w << std::dec;
            }
          }
        }
        EXPECT_EQ(off, 0);
      }
    }
  }
}

// k = 4096 of +3 x +3: every sum is 36864, past the ~2^14 the tensor cores
// keep while they sum; exact only with the parts (one k-block's, 1152, or
// two's, 2304) added in fp32.
TEST(Fp8Gemm, LongKOfOneSignIsExactThroughThePromotion) {
  REQUIRE_HOPPER();
  const int64_t m = 256, n = 256, k = 4096;
  const std::vector<uint8_t> a(size_t(m * k), e4m3(3)), b(size_t(n * k), e4m3(3));
  const rt::DeviceBuffer da = rt::to_device(a), db = rt::to_device(b);
  rt::DeviceBuffer dc(size_t(m) * n * 2);
  const uint16_t want = round_out(36864.f, kernels::DType::BF16);
  const int sms = rt::current_device_sms();  // the full grid: one CTA per SM
  rt::DeviceBuffer work(kernels::stream_k_workspace_bytes(sms, 192));
  FO_CUDA_CHECK(cudaMemset(work.get(), 0, work.bytes()));
  // (each tile whole, stream-K, split in pairs: GemmParams::pair_k, two CTAs a tile)
  for (auto [bn, split, pair] : {std::tuple{128, false, false}, std::tuple{192, false, false},
                                 std::tuple{160, false, false}, std::tuple{112, false, false},
                                 std::tuple{144, false, false},
                                 std::tuple{128, true, false}, std::tuple{192, true, false},
                                 std::tuple{160, true, false}, std::tuple{112, true, false},
                                 std::tuple{128, false, true}, std::tuple{192, false, true}}) {
    FO_CUDA_CHECK(cudaMemset(dc.get(), 0, dc.bytes()));
    const int32_t tiles = int32_t(m / 128 * ((n + bn - 1) / bn));
    const plan::Schedule s = plan::make_schedule(m, n, {128, bn}, pair ? 2 * tiles : sms, plan::Raster::AlongN, 2);
    kernels::GemmParams p = kernels::plain_gemm(kernels::DType::BF16, da.get(), db.get(), s, int32_t(k), dc.get(), n);
    p.pair_k = pair;
    if (split) {  // (4 or 6 tiles over one CTA per SM: every tile in ~20-40 pieces)
      p.stream_k = plan::stream_k_split(s.tiles(), sms, int32_t(k / 128));
      EXPECT_TRUE(p.stream_k.on());
      p.stream_k_work = work.get();
    }
    p.fp8.on = true;
    // Traced (the phase monitor: bench-fp8 --phases), which must not change C.
    rt::DeviceBuffer phases(size_t(s.ctas) * kernels::kPhaseSlots * sizeof(uint64_t));
    FO_CUDA_CHECK(cudaMemset(phases.get(), 0, phases.bytes()));
    p.monitor_phases = phases.as<uint64_t>();
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> c(size_t(m) * n);
    FO_CUDA_CHECK(cudaMemcpy(c.data(), dc.get(), dc.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(c.begin(), c.end(), want), m * n)
        << "tile 128x" << bn << (split ? ", stream-K" : "") << (pair ? ", split in pairs" : "") << ", first: 0x"
        << std::hex << c[0] << ", want 0x" << want;
    // Every CTA recorded its start; with stream-K exactly the CTAs whose
    // walk leaves a partial recorded putting it (phase 2), and exactly those
    // that finish a split tile when their own k-blocks were done (phase 4),
    // both after their start.
    std::vector<uint64_t> ph(size_t(s.ctas) * kernels::kPhaseSlots);
    FO_CUDA_CHECK(cudaMemcpy(ph.data(), phases.get(), phases.bytes(), cudaMemcpyDeviceToHost));
    int wrong = 0, puts = 0;
    for (int cta = 0; cta < s.ctas; ++cta) {
      const uint64_t* t = ph.data() + size_t(cta) * kernels::kPhaseSlots;
      bool leaves = false, finishes_split = false;
      plan::PieceWalk walk(p.stream_k, cta);
      for (plan::Piece w; split && walk.next(w);) leaves |= !w.finishes, finishes_split |= w.finishes && !w.whole;
      puts += leaves;
      const bool ok = t[3] != 0 && (!split || ((t[2] != 0) == leaves && (t[4] != 0) == finishes_split &&
                                                (!t[2] || t[2] >= t[3]) && (!t[4] || t[4] >= t[3])));
      if (!ok && wrong++ < 3)
        ADD_FAILURE() << "tile 128x" << bn << (split ? ", stream-K" : "") << ": CTA " << cta << " phases start " << t[3]
                      << ", partial " << t[2] << " (want " << leaves << "), own k-blocks " << t[4] << " (want "
                      << finishes_split << ")";
    }
    EXPECT_EQ(wrong, 0);
    if (split) EXPECT_GT(puts, 0) << "the split leaves partials";
  }
  for (int bn : {48, 144}) {  // (the 64-row tiles, whole)
    FO_CUDA_CHECK(cudaMemset(dc.get(), 0, dc.bytes()));
    const plan::Schedule s = plan::make_schedule(m, n, {64, bn}, sms, plan::Raster::AlongN, 2);
    kernels::GemmParams p = kernels::plain_gemm(kernels::DType::BF16, da.get(), db.get(), s, int32_t(k), dc.get(), n);
    p.fp8.on = true;
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> c(size_t(m) * n);
    FO_CUDA_CHECK(cudaMemcpy(c.data(), dc.get(), dc.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(c.begin(), c.end(), want), m * n)
        << "tile 64x" << bn << ", first: 0x" << std::hex << c[0] << ", want 0x" << want;
  }
}

// Ours against cuBLASLt's FP8 matmul (the sequential path's GEMM where it
// is faster): bitwise without scales (both sums exact, one rounding); with
// scales within one unit of the output's last place (cuBLASLt may multiply
// the two scales first).
TEST(Fp8Gemm, MatchesCublasLtsFp8Matmul) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  rt::CublasGemm lt;
  const kernels::Scales kinds[] = {kernels::Scales::None, kernels::Scales::PerTensor, kernels::Scales::RowWise};
  // (Hopper's cuBLASLt always has the first two; row-wise scales where it has them)
  ASSERT_TRUE(lt.takes_fp8(kernels::Scales::None) && lt.takes_fp8(kernels::Scales::PerTensor));
  if (!lt.takes_fp8(kernels::Scales::RowWise))
    std::cout << "[ NOTE     ] this cuBLASLt has no FP8 matmul with row-wise scales: those trials are not run "
                 "(EveryScaleKindMatchesTheHostBitwise covers them)\n";
  for (int trial = 0; trial < 9; ++trial) {
    const int64_t m = 16 * (1 + int64_t(rng() % 64)), n = 16 * (1 + int64_t(rng() % 64)),
                  k = 16 * (1 + int64_t(rng() % 64));
    const kernels::Scales kind = kinds[trial % 3];
    if (!lt.takes_fp8(kind)) continue;
    SCOPED_TRACE("m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) + ", scales " +
                 std::to_string(int(kind)) + ", seed " + std::to_string(seed));
    std::vector<uint8_t> a(size_t(m * k)), b(size_t(n * k));
    for (auto& x : a) x = e4m3(int(rng() % 7) - 3);
    for (auto& x : b) x = e4m3(int(rng() % 7) - 3);
    const std::vector<float> sa = random_scales(kind, m, rng), sb = random_scales(kind, n, rng);
    const rt::DeviceBuffer da = rt::to_device(a), db = rt::to_device(b), dsa = rt::to_device(sa),
                           dsb = rt::to_device(sb);
    rt::DeviceBuffer ours(size_t(m) * n * 2), theirs(size_t(m) * n * 2);
    kernels::Fp8 f;
    f.on = true, f.scales = kind;
    if (kind != kernels::Scales::None) f.scale_a = dsa.as<float>(), f.scale_b = dsb.as<float>();
    const plan::Schedule s = plan::make_schedule(m, n, {128, 128}, rt::current_device_sms(), plan::Raster::AlongN, 2);
    kernels::GemmParams p = kernels::plain_gemm(kernels::DType::BF16, da.get(), db.get(), s, int32_t(k), ours.get(), n);
    p.fp8 = f;
    kernels::launch_gemm(p, nullptr);
    lt.run_fp8(kernels::DType::BF16, f, da.get(), db.get(), theirs.get(), int(m), int(n), int(k), n, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> x(size_t(m) * n), y(size_t(m) * n);
    FO_CUDA_CHECK(cudaMemcpy(x.data(), ours.get(), ours.bytes(), cudaMemcpyDeviceToHost));
    FO_CUDA_CHECK(cudaMemcpy(y.data(), theirs.get(), theirs.bytes(), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      // (bf16 bits of one sign are ordered as their values: one unit apart = bits one apart)
      const int d = int(x[i]) - int(y[i]);
      const bool ok = kind == kernels::Scales::None ? d == 0 : (d >= -1 && d <= 1) || ((x[i] | y[i]) & 0x7fff) == 0;
      if (!ok && wrong++ < 5)
        ADD_FAILURE() << "element " << i << ": ours 0x" << std::hex << x[i] << ", cuBLASLt's 0x" << y[i];
    }
    EXPECT_EQ(wrong, 0);
  }
}

// B larger than the L2: the loads carry L2 policies (gemm_l2_hints), which
// must not change a bit. Both tiles against cuBLASLt's FP8 matmul without
// scales (bitwise: both sums exact, one rounding); a B inside the L2 takes
// no policies.
TEST(Fp8Gemm, BLargerThanTheL2MatchesCublasLtBitwise) {
  REQUIRE_HOPPER();
  int dev = 0, l2 = 0;
  FO_CUDA_CHECK(cudaGetDevice(&dev));
  FO_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t k = 8192, n = (int64_t(l2) / k / 128 + 1 + int64_t(rng() % 8)) * 128,
                m = 16 * (1 + int64_t(rng() % 24));  // (B: n x k bytes, over the L2)
  SCOPED_TRACE("m " + std::to_string(m) + ", n " + std::to_string(n) + ", L2 " + std::to_string(l2) + " B, seed " +
               std::to_string(seed));
  std::vector<uint8_t> a(size_t(m * k)), b(size_t(n * k));
  for (auto& x : a) x = e4m3(int(rng() % 7) - 3);
  for (auto& x : b) x = e4m3(int(rng() % 7) - 3);
  const rt::DeviceBuffer da = rt::to_device(a), db = rt::to_device(b);
  rt::DeviceBuffer ours(size_t(m) * n * 2), theirs(size_t(m) * n * 2);
  rt::CublasGemm lt;
  kernels::Fp8 f;
  f.on = true;
  lt.run_fp8(kernels::DType::BF16, f, da.get(), db.get(), theirs.get(), int(m), int(n), int(k), n, nullptr);
  std::vector<uint16_t> y(size_t(m) * n);
  FO_CUDA_CHECK(cudaMemcpy(y.data(), theirs.get(), theirs.bytes(), cudaMemcpyDeviceToHost));
  for (int bn : {112, 128, 144, 160, 192}) {
    const plan::Schedule s = plan::make_schedule(m, n, {128, bn}, rt::current_device_sms(), plan::Raster::AlongN, 2);
    kernels::GemmParams p = kernels::plain_gemm(kernels::DType::BF16, da.get(), db.get(), s, int32_t(k), ours.get(), n);
    p.fp8 = f;
    ASSERT_TRUE(kernels::gemm_l2_hints(p));
    kernels::GemmParams inside = p;
    inside.n = int32_t(l2 / k / 2);
    EXPECT_FALSE(kernels::gemm_l2_hints(inside));
    FO_CUDA_CHECK(cudaMemset(ours.get(), 0xff, ours.bytes()));
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> x(size_t(m) * n);
    FO_CUDA_CHECK(cudaMemcpy(x.data(), ours.get(), ours.bytes(), cudaMemcpyDeviceToHost));
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != y[i] && wrong++ == 0) first = i;
    EXPECT_EQ(wrong, 0u) << "tile 128x" << bn << ", first at " << first << ": ours 0x" << std::hex << x[first]
                         << ", cuBLASLt's 0x" << y[first];
  }
}
