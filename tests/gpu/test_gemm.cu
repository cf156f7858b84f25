// GPU tests of the signalling GEMM against cuBLAS (skipped without a Hopper GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/check.h"
#include "kernels/gemm.h"
#include "kernels/ptx.cuh"
#include "kernels/reorder.h"
#include "plan/grouped.h"
#include "plan/partition.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/core/gemm_monitor.h"
#include "runtime/ops/allreduce.h"
#include "runtime/transport/peer_windows.h"
#include "runtime/tune/owner_stand_in.h"
#include "runtime/core/tile_clocks.h"
#include "gpu_test_util.h"
#include "host_reference.h"

using namespace flashoverlap;
using kernels::DType;
using rt::DeviceBuffer;

namespace {

using test::fresh_seed;

plan::Schedule make_sched(int m, int n, int bm, int bn, int ctas, plan::Raster r = plan::Raster::AlongN,
                          int swizzle = 8) {
  plan::Schedule s;
  s.m = m, s.n = n, s.bm = bm, s.bn = bn, s.ctas = ctas, s.raster = r, s.swizzle = swizzle;
  return s;
}

struct Problem {
  DType dtype;
  int m, n, k;
  DeviceBuffer a, b, ref;
  // with_ref = false: no cuBLAS reference (tests that compare with our own
  // GEMM; keeps cuBLAS's kernels out of compute-sanitizer's reports).
  Problem(DType dt, int m_, int n_, int k_, uint64_t seed, bool with_ref = true)
      : dtype(dt), m(m_), n(n_), k(k_), a(size_t(m_) * k_ * 2), b(size_t(n_) * k_ * 2),
        ref(with_ref ? size_t(m_) * n_ * 2 : 0) {
    kernels::fill_random(dt, a.get(), int64_t(m) * k, seed, -1.f, 1.f, nullptr);
    kernels::fill_random(dt, b.get(), int64_t(n) * k, seed + 1, -1.f, 1.f, nullptr);
    if (!with_ref) return;
    rt::CublasGemm cublas;
    cublas.run(dt, a.get(), b.get(), ref.get(), m, n, k, n, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

// Our GEMM against cuBLAS: the two differ by fp32 summation order and the
// output rounding only (kernels::gemm_tolerance says how far that goes).
kernels::Tolerance tolerance(DType dt, int k) { return kernels::gemm_tolerance(dt, k); }

// A device buffer of 16-bit elements, on the host.
std::vector<uint16_t> to_host(const DeviceBuffer& b) {
  std::vector<uint16_t> h(b.bytes() / 2);
  FO_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

using GemmCase = std::tuple<int, int, int>;  // m, n, k

class GemmVsCublas : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmVsCublas, PlainMatchesCublasAllTilesAndGrids) {
  REQUIRE_HOPPER();
  const auto [m, n, k] = GetParam();
  const int sms = rt::current_device_sms();  // the full grid: one CTA per SM
  for (DType dt : {DType::BF16, DType::FP16}) {
    const uint64_t seed = fresh_seed();
    Problem pr(dt, m, n, k, seed);
    DeviceBuffer c(size_t(m) * n * 2), c3(size_t(m) * n * 2);
    // 128x256 with 3 stages and (the plain store's default) 4, whose output
    // goes out in two pieces: the same k16 steps in the same order, so
    // bitwise the same C; 128x128 with 5.
    for (auto [bn, four] : {std::pair{256, false}, std::pair{256, true}, std::pair{128, true}}) {
      for (int ctas : {sms, 77, 3}) {
        SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                     " dtype=" + (dt == DType::BF16 ? "bf16" : "fp16") + " tile 128x" + std::to_string(bn) +
                     (four ? "" : " 3 stages") + " ctas=" + std::to_string(ctas) + " seed=" + std::to_string(seed));
        kernels::poison(c.get(), int64_t(m) * n, nullptr);
        kernels::GemmParams p;
        p.dtype = dt, p.a = pr.a.get(), p.b = pr.b.get(), p.m = m, p.n = n, p.k = k, p.four_stages = four;
        p.sched = make_sched(m, n, 128, bn, ctas, ctas == 77 ? plan::Raster::AlongM : plan::Raster::AlongN,
                             ctas == 3 ? 1 : 8);
        p.store = kernels::Store::Plain, p.c = c.get(), p.ldc = n;
        EXPECT_EQ(kernels::gemm_four_stages(p), bn == 256 && four && n % 8 == 0);
        kernels::launch_gemm(p, nullptr);
        FO_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(test::within(kernels::compare(dt, c.get(), n, pr.ref.get(), n, m, n, nullptr, tolerance(dt, k))));
        if (bn == 256 && !four && ctas == sms)
          FO_CUDA_CHECK(cudaMemcpy(c3.get(), c.get(), size_t(m) * n * 2, cudaMemcpyDeviceToDevice));
        if (bn == 256 && four)
          EXPECT_TRUE(test::bitwise(kernels::compare(dt, c.get(), n, c3.get(), n, m, n, nullptr)))
              << "4 stages differ from 3";
      }
    }
    // Stream-K (plan/stream_k.h), forced: none, half or all of the tiles
    // split over few or many CTAs; within the bound of cuBLAS, and a second
    // launch on the same workspace bitwise the first (each leaves its flags zero).
    for (int bn : {256, 128})
      for (int ctas : {sms, 7}) {
        const plan::Schedule s = make_sched(m, n, 128, bn, ctas);
        DeviceBuffer work(kernels::stream_k_workspace_bytes(ctas, bn));
        FO_CUDA_CHECK(cudaMemset(work.get(), 0, work.bytes()));
        for (int whole : {0, s.tiles() / 2}) {
          SCOPED_TRACE("stream-K: m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                       " tile 128x" + std::to_string(bn) + " ctas=" + std::to_string(ctas) + " whole " +
                       std::to_string(whole) + " seed=" + std::to_string(seed));
          kernels::GemmParams p = kernels::plain_gemm(dt, pr.a.get(), pr.b.get(), s, k, c.get(), n);
          p.stream_k = plan::StreamK{s.tiles(), whole, (k + 63) / 64, ctas};
          p.stream_k_work = work.get();
          EXPECT_FALSE(kernels::gemm_four_stages(p));
          kernels::poison(c.get(), int64_t(m) * n, nullptr);
          kernels::launch_gemm(p, nullptr);
          FO_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_TRUE(test::within(kernels::compare(dt, c.get(), n, pr.ref.get(), n, m, n, nullptr, tolerance(dt, k))));
          FO_CUDA_CHECK(cudaMemcpy(c3.get(), c.get(), size_t(m) * n * 2, cudaMemcpyDeviceToDevice));
          kernels::poison(c.get(), int64_t(m) * n, nullptr);
          kernels::launch_gemm(p, nullptr);
          FO_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_TRUE(test::bitwise(kernels::compare(dt, c.get(), n, c3.get(), n, m, n, nullptr)))
              << "a second launch differs";
          std::vector<uint32_t> flags(size_t(ctas) * 2, 1);  // (each launch leaves them zero)
          FO_CUDA_CHECK(cudaMemcpy(flags.data(), work.get(), flags.size() * 4, cudaMemcpyDeviceToHost));
          EXPECT_EQ(std::count(flags.begin(), flags.end(), 0u), int64_t(flags.size())) << "a flag left up";
        }
        if (ctas == sms) {  // (more CTAs than SMs: a finisher could wait for a CTA not yet dispatched)
          kernels::GemmParams q = kernels::plain_gemm(dt, pr.a.get(), pr.b.get(), make_sched(m, n, 128, bn, 1000), k,
                                                      c.get(), n);
          q.stream_k = plan::StreamK{q.sched.tiles(), 0, (k + 63) / 64, 1000};
          q.stream_k_work = work.get();
          EXPECT_THROW(kernels::launch_gemm(q, nullptr), InvalidArgument);
        }
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmVsCublas,
                         ::testing::Values(GemmCase{1, 72, 8}, GemmCase{127, 72, 5120}, GemmCase{3001, 72, 8},
                                           GemmCase{1, 7168, 5120}, GemmCase{127, 7168, 8},
                                           GemmCase{3001, 7168, 5120}, GemmCase{256, 512, 64},
                                           GemmCase{1000, 1000, 1000}, GemmCase{4096, 4096, 4096},
                                           GemmCase{200, 300, 136}),
                         [](const auto& info) {
                           return "m" + std::to_string(std::get<0>(info.param)) + "_n" +
                                  std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Outputs whose rows are not 16-byte aligned take the row-store epilogue.
TEST(Gemm, OddLeadingDimensionAndTinyN) {
  REQUIRE_HOPPER();
  for (auto [m, n, k, ldc] : std::vector<std::tuple<int, int, int, int>>{{129, 7, 64, 7}, {300, 200, 256, 203}, {5, 1, 8, 1}}) {
    const uint64_t seed = fresh_seed();
    Problem pr(DType::BF16, m, n, k, seed);
    DeviceBuffer c(size_t(m) * ldc * 2);
    kernels::poison(c.get(), int64_t(m) * ldc, nullptr);
    kernels::GemmParams p;
    p.a = pr.a.get(), p.b = pr.b.get(), p.m = m, p.n = n, p.k = k;
    p.sched = make_sched(m, n, 128, 128, rt::current_device_sms());
    p.store = kernels::Store::Plain, p.c = c.get(), p.ldc = ldc;
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::within(kernels::compare(DType::BF16, c.get(), ldc, pr.ref.get(), n, m, n, nullptr,
                                              tolerance(DType::BF16, k))))
        << "m=" << m << " n=" << n << " ldc=" << ldc << " seed=" << seed;
  }
}

// Programmatic dependent launches (GemmParams::pdl), back to back on one
// stream with no sync: a GEMM that reads as A the C of the GEMM just before
// it gives, bitwise, the C of the same two launched plainly (each waits for
// the memory of the kernel before; without the wait the second, scheduled
// as the first's CTAs leave, would read C tiles not yet written); stream-K
// launches on one workspace give each the plain launch's C and leave the
// flags zero.
TEST(Gemm, ProgrammaticDependentLaunchesWaitForTheKernelBefore) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const DType dt = DType::BF16;
  const int m = 4096, n = 4096, k = 4096, n2 = 1024, sms = rt::current_device_sms();
  Problem pr(dt, m, n, k, seed, false);
  DeviceBuffer b2(size_t(n2) * n * 2), c1(size_t(m) * n * 2), c2(size_t(m) * n2 * 2), r1(c1.bytes()), r2(c2.bytes());
  kernels::fill_random(dt, b2.get(), int64_t(n2) * n, seed + 7, -1.f, 1.f, nullptr);
  auto chain = [&](void* out1, void* out2, bool pdl, cudaStream_t stream) {
    kernels::GemmParams p1 =
        kernels::plain_gemm(dt, pr.a.get(), pr.b.get(), make_sched(m, n, 128, 256, sms), k, out1, n);
    kernels::GemmParams p2 = kernels::plain_gemm(dt, out1, b2.get(), make_sched(m, n2, 128, 128, sms), n, out2, n2);
    p1.pdl = p2.pdl = pdl;
    kernels::launch_gemm(p1, stream);
    kernels::launch_gemm(p2, stream);
  };
  chain(r1.get(), r2.get(), false, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t stream;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int round = 0; round < 3; ++round) {
    kernels::poison(c1.get(), int64_t(m) * n, stream);
    kernels::poison(c2.get(), int64_t(m) * n2, stream);
    chain(c1.get(), c2.get(), true, stream);
    FO_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(test::bitwise(kernels::compare(dt, c1.get(), n, r1.get(), n, m, n, nullptr))) << "round " << round;
    EXPECT_TRUE(test::bitwise(kernels::compare(dt, c2.get(), n2, r2.get(), n2, m, n2, nullptr)))
        << "round " << round << ": the second GEMM read its A before the first had written it";
  }
  // Stream-K, 20 tiles split over one CTA per SM, launched 4 times back to back.
  const int ms = 256, ns = 1280;
  const plan::Schedule s = make_sched(ms, ns, 128, 128, sms);
  DeviceBuffer work(kernels::stream_k_workspace_bytes(sms, 128)), cs(size_t(ms) * ns * 2), rs(cs.bytes());
  FO_CUDA_CHECK(cudaMemset(work.get(), 0, work.bytes()));
  kernels::GemmParams q = kernels::plain_gemm(dt, pr.a.get(), pr.b.get(), s, k, rs.get(), ns);
  q.stream_k = plan::StreamK{s.tiles(), 0, k / 64, sms};
  q.stream_k_work = work.get();
  kernels::launch_gemm(q, stream);
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  q.c = cs.get(), q.pdl = true;
  for (int i = 0; i < 4; ++i) kernels::launch_gemm(q, stream);
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(test::bitwise(kernels::compare(dt, cs.get(), ns, rs.get(), ns, ms, ns, nullptr)));
  std::vector<uint32_t> flags(size_t(sms) * 2, 1);
  FO_CUDA_CHECK(cudaMemcpy(flags.data(), work.get(), flags.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(flags.begin(), flags.end(), 0u), int64_t(flags.size())) << "a flag left up";
  FO_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The tile monitor records every tile without changing C, and its summary
// reads an SM clock no Hopper exceeds, with cycles per tile no fewer than the
// tensor cores' peak allows (dense bf16: 4096 flops per SM per cycle on
// Hopper) and no more than the launch lasted. (No bound that a slow,
// power-capped or shared GPU could break: each holds at any speed.)
// The phase monitor (same launch) has every CTA start, stage its last tile
// after its last tile was requested, and store it after staging it.
TEST(GemmMonitor, RecordsEveryTileWithoutChangingC) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int k = 1024 + 64 * int(rng() % 16);
  // ~2 tiles per CTA (both tile shapes), and 144 tiles on one CTA per SM: 2 x CTAs - 144 of them compute
  // one tile, the others two.
  const int m0 = 2048 + 128 * int(rng() % 16), n0 = 4096 + 256 * int(rng() % 8);
  for (auto [m, n, bn] : {std::tuple{m0, n0, 256}, std::tuple{m0, n0, 128}, std::tuple{1536, 3072, 256}}) {
    SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " bn=" +
                 std::to_string(bn) + " seed=" + std::to_string(seed));
    Problem pr(DType::BF16, m, n, k, seed, false);
    DeviceBuffer c0(size_t(m) * n * 2), c1(size_t(m) * n * 2);
    const plan::Schedule s = make_sched(m, n, 128, bn, rt::current_device_sms());
    kernels::GemmParams p = kernels::plain_gemm(DType::BF16, pr.a.get(), pr.b.get(), s, k, c0.get(), n);
    kernels::launch_gemm(p, nullptr);
    DeviceBuffer mon(size_t(s.tiles()) * 16), ph(size_t(s.ctas) * kernels::kPhaseSlots * 8);
    FO_CUDA_CHECK(cudaMemset(mon.get(), 0, mon.bytes()));
    FO_CUDA_CHECK(cudaMemset(ph.get(), 0, ph.bytes()));
    p.c = c1.get(), p.monitor_mma = mon.as<uint64_t>(), p.monitor_phases = ph.as<uint64_t>();
    EXPECT_EQ(kernels::gemm_four_stages(p), bn == 256);  // the 4-stage pieces path records its phases too
    cudaEvent_t e0, e1;
    FO_CUDA_CHECK(cudaEventCreate(&e0));
    FO_CUDA_CHECK(cudaEventCreate(&e1));
    FO_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    float launch_ms = 0;
    FO_CUDA_CHECK(cudaEventElapsedTime(&launch_ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    EXPECT_EQ(kernels::compare(DType::BF16, c1.get(), n, c0.get(), n, m, n, nullptr).mismatches, 0);
    std::vector<uint64_t> h(size_t(s.tiles()) * 2);
    FO_CUDA_CHECK(cudaMemcpy(h.data(), mon.get(), mon.bytes(), cudaMemcpyDeviceToHost));
    for (int t = 0; t < s.tiles(); ++t) ASSERT_NE(h[size_t(t) * 2], 0u) << "tile " << t << " not recorded";
    const rt::TileClocks r = rt::summarize_tile_clocks(h, s.tiles(), s.ctas);
    EXPECT_EQ(r.intervals, s.tiles() - s.ctas) << "a CTA's tiles out of order in time or cycles";
    EXPECT_GT(r.mhz, 0);     // (throttled clocks go low; a clock was measured)
    EXPECT_LT(r.mhz, 2500);  // (Hopper's highest boost clock is below 2 GHz)
    // At most 4096 flops per SM cycle (dense bf16 peak); between two tile
    // requests at least k_blocks - stages k-blocks' MMAs complete (the
    // producer runs up to `stages` ahead: 4 for 128x256 here, 5 for
    // 128x128), so a CTA's first two requests are closer than a tile's
    // time, and with at most ~2 tiles per CTA theirs is the median interval.
    const int k_blocks = k / 64, stages = bn == 256 ? 4 : 5;
    const double least_kcycles = 2.0 * 128 * bn * k / 4096 / 1e3;
    EXPECT_GE(r.kcycles_median, 0.95 * least_kcycles * (k_blocks - stages) / k_blocks)
        << "a tile's whole MMAs at peak: " << least_kcycles << " kcycles";
    // (cycles at the measured clock: an interval inside the launch, 5% for the clock's estimate)
    EXPECT_LE(r.kcycles_median * 1e3 / r.mhz, 1.05 * launch_ms * 1e3) << "a tile interval longer than the launch";
    std::vector<uint64_t> q(size_t(s.ctas) * kernels::kPhaseSlots);
    FO_CUDA_CHECK(cudaMemcpy(q.data(), ph.get(), ph.bytes(), cudaMemcpyDeviceToHost));
    int single = 0;  // CTAs with one tile
    for (int c = 0; c < s.ctas; ++c) {
      const uint64_t* x = q.data() + size_t(c) * kernels::kPhaseSlots;
      const int64_t last = c + int64_t((s.tiles() - 1 - c) / s.ctas) * s.ctas;  // its last tile (slot)
      ASSERT_NE(x[3], 0u) << "CTA " << c << " start not recorded";
      EXPECT_GT(x[0], h[size_t(last) * 2]) << "CTA " << c << " staged its last tile before requesting it";
      EXPECT_GE(x[1], x[0]) << "CTA " << c;
      EXPECT_GE(x[4], x[3]) << "CTA " << c << ": first tile's MMAs done before its start";
      EXPECT_GE(x[5], x[4]) << "CTA " << c << ": last tile's MMAs done before the first's";
      EXPECT_GE(x[0], x[5]) << "CTA " << c << ": last tile staged before its MMAs were done";
      // (one tile: both are recorded at the same point, two timer reads apart; 20 us only for a preempted warp)
      if (last == c) {
        ++single;
        EXPECT_LE(x[5] - x[4], 20000u) << "CTA " << c << ": one tile, its MMAs done once (two reads)";
      }
      EXPECT_LT(x[3], h[size_t(c) * 2] + 1) << "CTA " << c << " requested its first tile before its start";
      EXPECT_EQ(x[2], 0u) << "CTA " << c << ": no copies in a plain GEMM";
    }
    EXPECT_EQ(single, std::max(0, 2 * s.ctas - s.tiles())) << "CTAs of one tile";
    const rt::GemmPhases g = rt::summarize_phases(q, s.ctas);
    EXPECT_EQ(g.ctas, std::min<int64_t>(s.ctas, s.tiles()));
    EXPECT_GE(g.stored_max_us, g.staged_max_us);  // each CTA stores its last tile after staging it
    EXPECT_GT(g.staged_median_us, 0.0);
    EXPECT_LE(g.end_us, launch_ms * 1e3 + 2.0) << "phases outside the launch's events";  // (timer granularity)
  }
}

// The runtime's wrapper of both monitors (what OverlapAllReduce's trace and
// bench's GEMM-alone clocks use): one launch read back, summarized as the
// raw buffers are above; a monitor of another schedule is refused.
TEST(GemmMonitor, RuntimeMonitorSummarizesOneLaunch) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  // At least 256 tiles: more than CTAs, so every CTA has consecutive tiles to time.
  const int m = 2048 + 128 * int(rng() % 16), n = 4096 + 256 * int(rng() % 8), k = 512 + 64 * int(rng() % 8);
  const int ctas = std::min(100 + int(rng() % 33), rt::current_device_sms());  // (100 to one per SM)
  SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " ctas=" +
               std::to_string(ctas) + " seed=" + std::to_string(seed));
  Problem pr(DType::BF16, m, n, k, seed, false);
  DeviceBuffer c(size_t(m) * n * 2);
  const plan::Schedule s = make_sched(m, n, 128, 256, ctas);
  for (const bool phases : {true, false}) {
    kernels::GemmParams p = kernels::plain_gemm(DType::BF16, pr.a.get(), pr.b.get(), s, k, c.get(), n);
    const rt::GemmMonitor mon(s);
    mon.attach(p, phases);
    EXPECT_NE(p.monitor_mma, nullptr);
    EXPECT_EQ(p.monitor_phases != nullptr, phases);
    kernels::launch_gemm(p, nullptr);
    const rt::GemmMonitor::Reading r = mon.read();
    EXPECT_EQ(r.clocks.intervals, s.tiles() - s.ctas);
    EXPECT_GT(r.clocks.mhz, 0);  // (any speed: see RecordsEveryTileWithoutChangingC)
    EXPECT_EQ(r.phases.ctas, phases ? std::min<int64_t>(s.ctas, s.tiles()) : 0);
    if (phases) EXPECT_GE(r.phases.stored_max_us, r.phases.staged_max_us);
    plan::Schedule other = s;
    other.ctas = s.ctas - 1;
    kernels::GemmParams q = kernels::plain_gemm(DType::BF16, pr.a.get(), pr.b.get(), other, k, c.get(), n);
    EXPECT_THROW(mon.attach(q), InvalidArgument);
  }
}

// A monitor without buffers (default-constructed) refuses before any CUDA call.
TEST(GemmMonitor, WithoutBuffersRefusesAttachAndRead) {
  const rt::GemmMonitor mon;
  EXPECT_FALSE(mon.allocated());
  kernels::GemmParams p;
  EXPECT_THROW(mon.attach(p), InvalidArgument);
  EXPECT_THROW(mon.read(), InvalidArgument);
  EXPECT_EQ(p.monitor_mma, nullptr);
}

TEST(Gemm, RejectsBadInput) {
  REQUIRE_HOPPER();
  DeviceBuffer buf(1 << 20);
  kernels::GemmParams p;
  p.a = buf.get(), p.b = buf.get(), p.c = buf.get(), p.m = 64, p.n = 64, p.k = 60, p.ldc = 64;
  p.sched = make_sched(64, 64, 128, 128, rt::current_device_sms());
  EXPECT_THROW(kernels::launch_gemm(p, nullptr), InvalidArgument);  // k % 8
  p.k = 64;
  p.a = static_cast<char*>(buf.get()) + 2;
  EXPECT_THROW(kernels::launch_gemm(p, nullptr), InvalidArgument);  // misaligned A
  p.a = buf.get();
  p.sched.bn = 96;
  EXPECT_THROW(kernels::launch_gemm(p, nullptr), InvalidArgument);  // tile
  p.sched.bn = 128;
  p.ldc = 32;
  EXPECT_THROW(kernels::launch_gemm(p, nullptr), InvalidArgument);  // ldc < n
  p.ldc = 64;
  // The owner layout's fields without it.
  p.owner.push_tma = 1;
  EXPECT_THROW(kernels::launch_gemm(p, nullptr), InvalidArgument);  // TMA pushes
  p.owner.push_tma = 0;
  p.owner.claims_reset = static_cast<uint32_t*>(buf.get());
  EXPECT_THROW(kernels::launch_gemm(p, nullptr), InvalidArgument);  // claims to reset
  p.owner.claims_reset = nullptr;
  p.owner.peer_window = buf.get();
  EXPECT_THROW(kernels::launch_gemm(p, nullptr), InvalidArgument);  // a peer's window
}

// ---------------------------------------------------------------------------
// Signal mode: a checker kernel on another stream waits for each group's
// counter and, as soon as it is released, compares every element of the
// group's slots with the expected values. Any partial tile seen = failure.

struct CheckerArgs {
  const uint16_t* slots;
  const uint16_t* expected;
  const uint32_t* counters;
  const int64_t* group_begin;  // element range of group g: [begin[g], begin[g+1])
  uint32_t epoch;
  const uint32_t* target_per_epoch;  // signals per group per call
  unsigned long long* mismatches;    // per group
  uint64_t* released_ns;             // per group: when the checker saw the release
};

__global__ void checker_kernel(CheckerArgs a) {
  const int g = blockIdx.x;
  if (threadIdx.x == 0) {
    const uint32_t target = a.epoch * a.target_per_epoch[g];
    while (static_cast<int32_t>(kernels::ptx::ld_acquire_sys(a.counters + g) - target) < 0) __nanosleep(64);
    a.released_ns[g] = kernels::ptx::globaltimer_ns();
  }
  __syncthreads();
  unsigned long long bad = 0;
  for (int64_t i = a.group_begin[g] + threadIdx.x; i < a.group_begin[g + 1]; i += blockDim.x)
    bad += (a.slots[i] != a.expected[i]);
  atomicAdd(a.mismatches + g, bad);
}

// `units` in random parts of 1 to 3, at most 16 of them (the checker's
// groups: the last two merged until they fit).
std::vector<int> random_partition(int units, std::mt19937_64& rng) {
  std::vector<int> parts;
  int left = units;
  while (left > 0) {
    const int s = 1 + int(rng() % uint64_t(std::min(left, 3)));
    parts.push_back(s);
    left -= s;
  }
  while (parts.size() > 16) {
    parts[parts.size() - 2] += parts.back();
    parts.pop_back();
  }
  return parts;
}

// Groups of slot tiles (Schedule order), part g of `parts` counting units of
// `unit` tiles (a wave: ctas): each tile's group, each group's end in
// the slot buffer (elements, 128 x bn a tile, after a 0) and its signals a call.
struct SlotGroups {
  std::vector<int32_t> group_of_tile;
  std::vector<int64_t> begin{0};
  std::vector<uint32_t> target;
  SlotGroups(const std::vector<int>& parts, int unit, int tiles, int bn) : group_of_tile(size_t(tiles)) {
    for (int g = 0, u0 = 0; g < int(parts.size()); u0 += parts[g], ++g) {
      const int t_begin = u0 * unit, t_end = std::min((u0 + parts[g]) * unit, tiles);
      for (int t = t_begin; t < t_end; ++t) group_of_tile[size_t(t)] = g;
      begin.push_back(int64_t(t_end) * 128 * bn);
      target.push_back(uint32_t(t_end - t_begin) * kernels::kSignalsPerTile);
    }
  }
};

// Epoch counters are never reset, so they wrap: tests start some runs of
// calls at this epoch (calls at 2^32 - 1, 0, 1, ...), with every counter
// where that many calls would have left it, so that the cyclic compare, the
// targets epoch * t and the parities are exercised across the wrap.
constexpr uint32_t kNearWrap = 0xFFFFFFFEu;

// Counters as `epoch` calls of `per_call` counts each leave them (mod 2^32).
std::vector<uint32_t> counters_after(uint32_t epoch, const std::vector<uint32_t>& per_call) {
  std::vector<uint32_t> v(per_call.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = epoch * per_call[i];
  return v;
}

// A signal check's device side: the groups' tile map, element ranges and
// per-call targets uploaded, their counters where `first_epoch` calls left
// them, a stream for the GEMM and one for the checker (checker_kernel: one
// block per group, at most 16).
struct SignalCheck {
  int groups;
  DeviceBuffer got, begin, target, counters, mism, rel;
  cudaStream_t compute = nullptr, check = nullptr;
  SignalCheck(const std::vector<int32_t>& group_of_tile, const std::vector<int64_t>& begin_,
              const std::vector<uint32_t>& target_, uint32_t first_epoch)
      : groups(int(target_.size())), got(group_of_tile.size() * 4), begin(begin_.size() * 8), target(groups * 4),
        counters(groups * 4), mism(groups * 8), rel(groups * 8) {
    FO_CUDA_CHECK(cudaMemcpy(got.get(), group_of_tile.data(), got.bytes(), cudaMemcpyHostToDevice));
    FO_CUDA_CHECK(cudaMemcpy(begin.get(), begin_.data(), begin.bytes(), cudaMemcpyHostToDevice));
    FO_CUDA_CHECK(cudaMemcpy(target.get(), target_.data(), target.bytes(), cudaMemcpyHostToDevice));
    const std::vector<uint32_t> start = counters_after(first_epoch, target_);
    FO_CUDA_CHECK(cudaMemcpy(counters.get(), start.data(), counters.bytes(), cudaMemcpyHostToDevice));
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&check, cudaStreamNonBlocking));
    kernels::preload_kernels();
    cudaFuncAttributes attr{};  // (the checker loaded now, not while the GEMM runs)
    FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, checker_kernel));
  }
  ~SignalCheck() {
    cudaStreamDestroy(compute);
    cudaStreamDestroy(check);
  }
  // q with this check's counters: data (what q writes) poisoned, then q and
  // the checker of call `epoch` (q first in host order); waits for both.
  // Returns each group's mismatches seen at its release.
  std::vector<unsigned long long> run(kernels::GemmParams q, void* data, int64_t elems, const void* expected,
                                      uint32_t epoch) {
    kernels::poison(data, elems, compute);
    FO_CUDA_CHECK(cudaMemset(mism.get(), 0, mism.bytes()));
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    q.counters = counters.as<uint32_t>(), q.group_of_tile = got.as<int32_t>();
    kernels::launch_gemm(q, compute);
    CheckerArgs ca{static_cast<const uint16_t*>(data), static_cast<const uint16_t*>(expected), counters.as<uint32_t>(),
                   begin.as<int64_t>(), epoch, target.as<uint32_t>(), mism.as<unsigned long long>(),
                   rel.as<uint64_t>()};
    checker_kernel<<<groups, 256, 0, check>>>(ca);
    FO_CUDA_CHECK(cudaGetLastError());
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host<unsigned long long>(mism);
  }
  template <typename V>
  static std::vector<V> to_host(const DeviceBuffer& d) {
    std::vector<V> v(d.bytes() / sizeof(V));
    FO_CUDA_CHECK(cudaMemcpy(v.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
    return v;
  }
};

TEST(GemmSignal, GroupsAreCompleteWhenReleased) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  int shape = 0;
  for (auto [m, n, k, bn] : std::vector<std::tuple<int, int, int, int>>{
           {4096, 8192, 4096, 256}, {3001, 7168, 2048, 128}, {2048, 4096, 8192, 256}}) {
    const uint32_t first_epoch = shape++ == 0 ? 0u : kNearWrap;
    // Leave 16 SMs for the checker blocks (at most 16 groups): the GEMM never
    // waits for them, and they never keep a GEMM CTA from being resident.
    const int ctas = rt::current_device_sms() - 16;
    plan::Schedule s = make_sched(m, n, 128, bn, ctas);
    const int tiles = s.tiles(), waves = s.waves();
    Problem pr(DType::BF16, m, n, k, seed);
    const int64_t slot_elems = int64_t(tiles) * 128 * bn;
    DeviceBuffer slots(slot_elems * 2), expected(slot_elems * 2);

    // Expected slot contents: the same kernel without signals.
    kernels::GemmParams p;
    p.a = pr.a.get(), p.b = pr.b.get(), p.m = m, p.n = n, p.k = k, p.sched = s;
    p.store = kernels::Store::SlotTiles, p.slots = expected.get(), p.slot_rows = int64_t(tiles) * 128;
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<int> parts = random_partition(waves, rng);
    const int groups = int(parts.size());
    const SlotGroups sg(parts, ctas, tiles, bn);
    const std::vector<int32_t>& group_of_tile = sg.group_of_tile;
    const std::vector<int64_t>& begin = sg.begin;
    const std::vector<uint32_t>& target = sg.target;
    SignalCheck sc(group_of_tile, begin, target, first_epoch);
    DeviceBuffer mon_ns(size_t(tiles) * 2 * 8), mon_sm(size_t(tiles) * 4);
    for (uint32_t epoch = first_epoch + 1; epoch != first_epoch + 4; ++epoch) {
      SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " bn=" + std::to_string(bn) +
                   " epoch=" + std::to_string(epoch) + " groups=" + std::to_string(groups) +
                   " seed=" + std::to_string(seed));
      kernels::GemmParams q = p;
      q.slots = slots.get();
      q.monitor_ns = mon_ns.as<uint64_t>();
      q.monitor_sm = mon_sm.as<uint32_t>();
      const std::vector<unsigned long long> mism = sc.run(q, slots.get(), slot_elems, expected.get(), epoch);
      for (int g = 0; g < groups; ++g) EXPECT_EQ(mism[g], 0u) << "group " << g << " was released incomplete";
      // The final slots equal the expected ones everywhere.
      EXPECT_TRUE(test::bitwise(
          kernels::compare(DType::BF16, slots.get(), bn, expected.get(), bn, int64_t(tiles) * 128, bn, nullptr)));
      // Overlap is real: with more than one group, the first group was
      // released before the GEMM's last tile finished.
      if (groups > 1) {
        const std::vector<uint64_t> last_tile_ns = SignalCheck::to_host<uint64_t>(mon_ns);
        const std::vector<uint64_t> rel = SignalCheck::to_host<uint64_t>(sc.rel);
        const uint64_t last = *std::max_element(last_tile_ns.begin(), last_tile_ns.end());
        EXPECT_LT(rel[0], last) << "first group released only after the whole GEMM";
      }
    }
    const std::vector<uint32_t> counters = SignalCheck::to_host<uint32_t>(sc.counters);
    for (int g = 0; g < groups; ++g)
      EXPECT_EQ(counters[g], (first_epoch + 3) * target[g]) << "epoch counters never reset (first epoch " << first_epoch << ")";
    // Stream-K, the last 150 tiles split (their finishers signal): each group
    // complete when released, against the same split without signals (its
    // sums' order: bitwise), and within the bound of the whole tiles'.
    {
      SCOPED_TRACE("stream-K: m=" + std::to_string(m) + " n=" + std::to_string(n) + " bn=" + std::to_string(bn) +
                   " seed=" + std::to_string(seed));
      DeviceBuffer work(kernels::stream_k_workspace_bytes(ctas, bn)), expected_sk(slot_elems * 2);
      FO_CUDA_CHECK(cudaMemset(work.get(), 0, work.bytes()));
      kernels::GemmParams r = p;
      r.slots = expected_sk.get();
      r.stream_k = plan::StreamK{tiles, std::max(0, tiles - 150), (k + 63) / 64, ctas};
      r.stream_k_work = work.get();
      kernels::launch_gemm(r, nullptr);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      SignalCheck sk(group_of_tile, begin, target, 0);
      r.slots = slots.get();
      const std::vector<unsigned long long> mism = sk.run(r, slots.get(), slot_elems, expected_sk.get(), 1);
      for (int g = 0; g < groups; ++g) EXPECT_EQ(mism[g], 0u) << "group " << g << " was released incomplete";
      const int64_t rows = int64_t(tiles) * 128;
      EXPECT_TRUE(test::bitwise(kernels::compare(DType::BF16, slots.get(), bn, expected_sk.get(), bn, rows, bn, nullptr)));
      EXPECT_TRUE(test::within(
          kernels::compare(DType::BF16, slots.get(), bn, expected.get(), bn, rows, bn, nullptr, tolerance(DType::BF16, k))));
    }
  }
}

// The 4-stage store signalling row-band groups (the NCCL row-band layout's
// GEMM): Plain C with counters runs the pieces kernel, each group is
// complete in C when its counter reaches the target (the checker sees no
// partial tile, over three calls), and C is bitwise the 3-stage GEMM's.
TEST(GemmSignal, FourStageRowBandsAreCompleteWhenReleased) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  int shape = 0;
  for (auto [m, n, k, swizzle] : std::vector<std::tuple<int, int, int, int>>{
           {4096, 8192, 4096, 4}, {3001, 4096, 2048, 2}, {1024, 8192, 8192, 1}}) {
    const uint32_t first_epoch = shape++ == 1 ? 0u : kNearWrap;
    const int ctas = rt::current_device_sms() - 16;  // 16 SMs for the checker blocks (at most 16 groups)
    const plan::Schedule s = make_sched(m, n, 128, 256, ctas, plan::Raster::AlongN, swizzle);
    Problem pr(DType::BF16, m, n, k, seed, false);
    const int64_t elems = int64_t(m) * n;
    DeviceBuffer c(elems * 2), expected(elems * 2);
    kernels::GemmParams p = kernels::plain_gemm(DType::BF16, pr.a.get(), pr.b.get(), s, k, expected.get(), n);
    p.four_stages = false;  // the reference: the 3-stage kernel, unsignalled
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<int> parts = random_partition(plan::band_count(s), rng);
    const std::vector<plan::Group> groups = plan::band_groups(s, parts);
    const int ngroups = int(groups.size());
    std::vector<int32_t> group_of_tile(s.tiles());
    std::vector<int64_t> begin{0};
    std::vector<uint32_t> target;
    for (int g = 0, band = 0; g < ngroups; band += parts[g], ++g) {
      for (int t = groups[g].first_tile; t < groups[g].end_tile; ++t) group_of_tile[t] = g;
      const int64_t end_row = std::min<int64_t>(int64_t(band + parts[g]) * swizzle * 128, m);
      begin.push_back(end_row * n);
      target.push_back(uint32_t(groups[g].tiles()) * kernels::kSignalsPerTile);
    }
    SignalCheck sc(group_of_tile, begin, target, first_epoch);
    kernels::GemmParams q = p;
    q.c = c.get(), q.four_stages = true;
    q.counters = sc.counters.as<uint32_t>(), q.group_of_tile = sc.got.as<int32_t>();
    ASSERT_TRUE(kernels::gemm_four_stages(q)) << "a signalling plain store qualifies for the 4-stage kernel";
    for (uint32_t epoch = first_epoch + 1; epoch != first_epoch + 4; ++epoch) {
      SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                   " swizzle=" + std::to_string(swizzle) + " epoch=" + std::to_string(epoch) +
                   " groups=" + std::to_string(ngroups) + " seed=" + std::to_string(seed));
      const std::vector<unsigned long long> mism = sc.run(q, c.get(), elems, expected.get(), epoch);
      for (int g = 0; g < ngroups; ++g) EXPECT_EQ(mism[g], 0u) << "group " << g << " was released incomplete";
      EXPECT_TRUE(test::bitwise(kernels::compare(DType::BF16, c.get(), n, expected.get(), n, m, n, nullptr)));
    }
    const std::vector<uint32_t> counters = SignalCheck::to_host<uint32_t>(sc.counters);
    for (int g = 0; g < ngroups; ++g) EXPECT_EQ(counters[g], (first_epoch + 3) * target[g]) << "group " << g;
  }
}

// The grouped GEMM (plan/grouped.h, kernels::Grouped): several experts'
// rows of A, each expert's rows times its own weight of a stacked [E, n, k]
// B, in one launch. Each expert's rows must equal our plain GEMM of those
// rows and that weight bitwise (the same MMAs per element; the tile rows
// past an expert's end are computed and dropped), on random counts (0,
// ragged, one row), both tiles, strided C, with and without signals; then
// the same into slot rows by row_of (SlotRows), row by row on the host.
TEST(GroupedGemm, EachExpertsRowsMatchItsOwnGemmBitwise) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int sms = rt::current_device_sms();
  for (int trial = 0; trial < 10; ++trial) {
    const DType dt = trial % 3 == 2 ? DType::FP16 : DType::BF16;
    const int experts = std::vector<int>{1, 3, 8, 16}[rng() % 4];
    const int n = 8 * int(1 + rng() % 400) + (trial % 4 == 3 ? 4 : 0);  // (a ragged n now and then)
    const int k = 64 * int(1 + rng() % 24) + (trial % 5 == 4 ? 8 : 0);
    const int bn = rng() % 2 ? 256 : 128, ctas = trial % 4 == 0 ? int(1 + rng() % 40) : sms;
    std::vector<int64_t> counts(static_cast<size_t>(experts));
    for (auto& c : counts) c = rng() % 4 == 0 ? 0 : rng() % 5 == 0 ? 1 : int64_t(rng() % 700);
    const int64_t total = std::max<int64_t>(std::accumulate(counts.begin(), counts.end(), int64_t(0)), 1);
    const int64_t ldc = n + (trial % 2 ? 8 : 0);
    const std::string where = "trial " + std::to_string(trial) + ": " + std::to_string(experts) + " experts, n " +
                              std::to_string(n) + ", k " + std::to_string(k) + ", tile 128x" + std::to_string(bn) +
                              ", " + std::to_string(ctas) + " CTAs, seed " + std::to_string(seed);
    SCOPED_TRACE(where);
    DeviceBuffer a(size_t(total) * k * 2), b(size_t(experts) * n * k * 2), c(size_t(total) * ldc * 2),
        ref(size_t(total) * ldc * 2);
    kernels::fill_random(dt, a.get(), total * k, seed + trial, -1.f, 1.f, nullptr);
    kernels::fill_random(dt, b.get(), int64_t(experts) * n * k, seed + trial + 1, -1.f, 1.f, nullptr);
    kernels::poison(c.get(), total * ldc, nullptr);
    kernels::poison(ref.get(), total * ldc, nullptr);
    // The reference: our plain GEMM of each expert's rows and weight.
    const std::vector<plan::RowSegment> segs = plan::expert_segments(counts);
    for (const plan::RowSegment& sg : segs) {
      if (sg.rows == 0) continue;
      const plan::Schedule se = plan::make_schedule(sg.rows, n, {128, bn}, sms, plan::Raster::AlongN, 2);
      kernels::launch_gemm(kernels::plain_gemm(dt, static_cast<const char*>(a.get()) + sg.a_row0 * k * 2,
                                               static_cast<const char*>(b.get()) + int64_t(sg.expert) * n * k * 2, se,
                                               k, static_cast<char*>(ref.get()) + sg.a_row0 * ldc * 2, ldc),
                           nullptr);
    }
    const plan::GroupedTileRows g = plan::make_grouped_tile_rows(segs, experts, n, 128);
    if (g.tile_rows() == 0) continue;  // (no rows anywhere: nothing to launch)
    const plan::Schedule s =
        plan::make_grouped_schedule(g, n, {128, bn}, ctas, plan::Raster::AlongN, 1 + int(rng() % 8));
    const DeviceBuffer a_row0 = rt::to_device(g.a_row0), b_row0 = rt::to_device(g.b_row0), rows = rt::to_device(g.rows);
    kernels::GemmParams p = kernels::plain_gemm(dt, a.get(), b.get(), s, k, c.get(), ldc);
    p.grouped = {a_row0.as<int32_t>(), b_row0.as<int32_t>(), rows.as<int32_t>(), total, int64_t(experts) * n};
    // Signals on every other trial: groups of waves, each counted 2 per tile.
    plan::Partition part;
    for (int left = s.waves(); left > 0; left -= part.back()) part.push_back(1 + int(rng() % uint64_t(std::min(left, 3))));
    const std::vector<plan::Group> groups = plan::make_groups(s, part);
    const DeviceBuffer counters = rt::to_device(std::vector<uint32_t>(groups.size(), 0u)),
                       group_of_tile = rt::to_device(plan::group_of_tiles(groups, s.tiles()));
    if (trial % 2) p.counters = counters.as<uint32_t>(), p.group_of_tile = group_of_tile.as<int32_t>();
    ASSERT_FALSE(kernels::gemm_four_stages(p));
    kernels::launch_gemm(p, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::bitwise(kernels::compare(dt, c.get(), ldc, ref.get(), ldc, total, n, nullptr)));
    if (p.counters) {
      std::vector<uint32_t> got(groups.size());
      FO_CUDA_CHECK(cudaMemcpy(got.data(), counters.get(), got.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t gi = 0; gi < groups.size(); ++gi)
        EXPECT_EQ(got[gi], uint32_t(groups[gi].tiles()) * kernels::kSignalsPerTile) << "group " << gi;
    }
    // SlotRows: tile (tm, tn)'s row r to slot row (a_row0[tm] + r) * tiles_n + tn, -1 past its rows.
    const int32_t tiles_n = s.tiles_n();
    std::vector<int32_t> row_of(size_t(s.tiles()) * 128, -1);
    for (int32_t idx = 0; idx < s.tiles(); ++idx) {
      const plan::TileCoord tc = s.tile_of(idx);
      for (int32_t r = 0; r < g.rows[size_t(tc.tm)]; ++r)
        row_of[size_t(idx) * 128 + r] = (g.a_row0[size_t(tc.tm)] + r) * tiles_n + tc.tn;
    }
    const DeviceBuffer d_row_of = rt::to_device(row_of);
    DeviceBuffer slots(size_t(total) * tiles_n * bn * 2);
    kernels::poison(slots.get(), total * tiles_n * bn, nullptr);
    kernels::GemmParams q = p;
    q.store = kernels::Store::SlotRows, q.c = nullptr, q.slots = slots.get(), q.slot_rows = total * tiles_n;
    q.row_of = d_row_of.as<int32_t>(), q.counters = nullptr, q.group_of_tile = nullptr;
    kernels::launch_gemm(q, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> hs = to_host(slots), hr = to_host(ref);
    int64_t bad = 0;
    for (int64_t r = 0; r < total; ++r)
      for (int32_t col = 0; col < n; ++col)
        bad += hs[size_t((r * tiles_n + col / bn) * bn + col % bn)] != hr[size_t(r * ldc + col)];
    EXPECT_EQ(bad, 0) << "elements of the slot rows that differ from the expert's GEMM";
  }
  // The checks: all three tables or none, no owner layout, no TMA store of C by tiles.
  DeviceBuffer buf(1 << 20);
  kernels::GemmParams p = kernels::plain_gemm(DType::BF16, buf.get(), buf.get(),
                                              plan::make_schedule(128, 256, {128, 256}, 8, plan::Raster::AlongN, 1),
                                              64, buf.get(), 256);
  p.grouped.a_row0 = static_cast<const int32_t*>(buf.get());
  EXPECT_THROW(kernels::check_gemm_params(p), InvalidArgument);  // (two tables missing)
  p.grouped.b_row0 = p.grouped.rows = p.grouped.a_row0, p.grouped.a_rows = 128, p.grouped.b_rows = 256;
  EXPECT_NO_THROW(kernels::check_gemm_params(p));
  p.grouped.b_rows = 255;  // fewer rows of B than n
  EXPECT_THROW(kernels::check_gemm_params(p), InvalidArgument);
  p.grouped.b_rows = 256;
  p.store = kernels::Store::SlotTiles, p.slots = buf.get(), p.slot_rows = 128;
  EXPECT_THROW(kernels::check_gemm_params(p), InvalidArgument);
}

TEST(RmsNorm, MatchesItsDefinitionInAndOutOfPlace) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  // 49160 x 2 bytes > the 96 KB row cache; 70000 rows > the 65535 CTAs.
  const std::vector<std::pair<int, int>> shapes = {{37, 4104}, {37, 49160}, {53, 1001}, {70000, 40}};
  int call = 0;
  for (const DType dt : {DType::BF16, DType::FP16})
    for (const auto& [m, n] : shapes) {
      const float eps = test::eps_for_call(call++, 4.0 / 3 + 1.0 / 3);  // (h = x + residual: mean square ~5/3)
      const std::string where = std::to_string(m) + "x" + std::to_string(n) + (dt == DType::BF16 ? " bf16" : " fp16") +
                                " eps " + std::to_string(eps) + " seed " + std::to_string(seed);
      const size_t bytes = size_t(m) * n * 2;
      DeviceBuffer x(bytes), residual(bytes), weight(size_t(n) * 2), y(bytes), h(bytes), h_in(bytes);
      kernels::fill_random(dt, x.get(), int64_t(m) * n, seed, -2.f, 2.f, nullptr);
      kernels::fill_random(dt, residual.get(), int64_t(m) * n, seed + 1, -1.f, 1.f, nullptr);
      kernels::fill_random(dt, weight.get(), n, seed + 2, 0.5f, 1.5f, nullptr);
      kernels::add_rmsnorm_rows(dt, x.get(), m, n, residual.get(), weight.get(), eps, y.get(), h.get(), nullptr);
      const test::NormCheck ref =
          test::check_rmsnorm(dt, x.get(), n, residual.get(), weight.get(), eps, y.get(), h.get(), m, n, nullptr);
      EXPECT_TRUE(test::within(ref.out)) << where;
      EXPECT_TRUE(test::bitwise(ref.residual_out)) << where << " (residual_out)";
      kernels::add_rmsnorm_rows(dt, x.get(), m, n, residual.get(), weight.get(), eps, x.get(), h_in.get(), nullptr);
      EXPECT_TRUE(test::bitwise(kernels::compare(dt, x.get(), n, y.get(), n, m, n, nullptr))) << where << " (in place)";
      EXPECT_TRUE(test::bitwise(kernels::compare(dt, h_in.get(), n, h.get(), n, m, n, nullptr))) << where;
    }
}

// SlotRows: a random permutation of tile rows (with some rows dropped) lands
// each row exactly where the table says.
TEST(GemmSignal, SlotRowsFollowTheTable) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int m = 1000, n = 640, k = 512, bn = 128;
  plan::Schedule s = make_sched(m, n, 128, bn, 50);
  const int tiles = s.tiles();
  Problem pr(DType::BF16, m, n, k, seed);
  std::vector<int32_t> row_of(size_t(tiles) * 128);
  std::vector<int32_t> perm(row_of.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (size_t i = 0; i < row_of.size(); ++i) row_of[i] = (rng() % 5 == 0) ? -1 : perm[i];
  DeviceBuffer d_row_of(row_of.size() * 4), slots(row_of.size() * bn * 2), plain(size_t(m) * n * 2);
  FO_CUDA_CHECK(cudaMemcpy(d_row_of.get(), row_of.data(), d_row_of.bytes(), cudaMemcpyHostToDevice));
  kernels::poison(slots.get(), int64_t(row_of.size()) * bn, nullptr);
  kernels::GemmParams p;
  p.a = pr.a.get(), p.b = pr.b.get(), p.m = m, p.n = n, p.k = k, p.sched = s;
  p.store = kernels::Store::Plain, p.c = plain.get(), p.ldc = n;
  kernels::launch_gemm(p, nullptr);
  p.store = kernels::Store::SlotRows, p.slots = slots.get(), p.row_of = d_row_of.as<int32_t>();
  kernels::launch_gemm(p, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> h_plain = to_host(plain), h_slots = to_host(slots);
  int64_t bad = 0, stored = 0, untouched_bad = 0;
  for (int idx = 0; idx < tiles; ++idx) {
    const plan::TileCoord tc = s.tile_of(idx);
    for (int r = 0; r < 128; ++r) {
      const int32_t dst = row_of[size_t(idx) * 128 + r];
      if (dst < 0) continue;
      ++stored;
      const int row = tc.tm * 128 + r;
      for (int c = 0; c < bn; ++c) {
        const int col = tc.tn * bn + c;
        const uint16_t got = h_slots[size_t(dst) * bn + c];
        const uint16_t want = (row < m && col < n) ? h_plain[size_t(row) * n + col] : uint16_t(0);  // padding is zero
        bad += got != want;
      }
    }
  }
  // Slot rows no table entry points to stay poisoned.
  std::vector<char> hit(row_of.size(), 0);
  for (int32_t d : row_of)
    if (d >= 0) hit[d] = 1;
  for (size_t d = 0; d < hit.size(); ++d)
    if (!hit[d]) untouched_bad += h_slots[d * bn] != 0xFFFF;
  EXPECT_GT(stored, 0);
  EXPECT_EQ(bad, 0) << "seed=" << seed;
  EXPECT_EQ(untouched_bad, 0) << "seed=" << seed;
}

// The slot layout's post-reorder, on one GPU: our GEMM's tiles stored into
// slots (SlotTiles) and restored to row-major C (reorder_tiles_to_rows, into
// a strided output too) are bitwise our plain GEMM's C; fused with residual +
// RMSNorm (reorder_add_rmsnorm) they match the host's norm of that C. Any
// raster and swizzle (the tile order the slots follow), ragged M and N.
TEST(Reorder, SlotsBackToRowsAndNormed) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int sms = rt::current_device_sms();
  int call = 0;
  for (auto [m, n, k, bn] : std::vector<std::tuple<int, int, int, int>>{
           {1000, 1000, 256, 128}, {3001, 4104, 512, 256}, {129, 72, 64, 128}, {2048, 2048, 128, 256}}) {
    const DType dt = rng() % 2 ? DType::BF16 : DType::FP16;
    const plan::Schedule s = make_sched(m, n, 128, bn, 1 + int(rng() % uint64_t(sms)),
                                        rng() % 2 ? plan::Raster::AlongM : plan::Raster::AlongN, 1 + int(rng() % 8));
    const int64_t ld = n + 8 * int64_t(rng() % 3);  // (a strided output sometimes)
    const float eps = test::eps_for_call(call++, double(k) / 9 + 1.0 / 3);
    const std::string where = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " tile 128x" +
                              std::to_string(bn) + " ctas " + std::to_string(s.ctas) + " swizzle " +
                              std::to_string(s.swizzle) + (s.raster == plan::Raster::AlongM ? " along M" : "") +
                              " ld " + std::to_string(ld) + " eps " + std::to_string(eps) + " seed " +
                              std::to_string(seed);
    Problem pr(dt, m, n, k, seed + uint64_t(m), false);
    const size_t cb = size_t(m) * n * 2;
    DeviceBuffer plain(cb), slots(size_t(s.tiles()) * 128 * bn * 2), out(size_t(m) * ld * 2), residual(cb),
        weight(size_t(n) * 2), y(cb), h(cb);
    kernels::launch_gemm(kernels::plain_gemm(dt, pr.a.get(), pr.b.get(), s, k, plain.get(), n), nullptr);
    kernels::GemmParams p = kernels::plain_gemm(dt, pr.a.get(), pr.b.get(), s, k, nullptr, n);
    p.store = kernels::Store::SlotTiles, p.slots = slots.get(), p.slot_rows = int64_t(s.tiles()) * 128;
    kernels::launch_gemm(p, nullptr);
    kernels::fill_random(dt, residual.get(), int64_t(m) * n, seed + 5, -1.f, 1.f, nullptr);
    kernels::fill_random(dt, weight.get(), n, seed + 6, 0.5f, 1.5f, nullptr);
    for (DeviceBuffer* b : {&out, &y, &h}) kernels::poison(b->get(), int64_t(b->bytes() / 2), nullptr);
    kernels::reorder_tiles_to_rows(dt, slots.get(), s, out.get(), ld, nullptr);
    kernels::reorder_add_rmsnorm(dt, slots.get(), s, residual.get(), weight.get(), eps, y.get(), h.get(), nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::bitwise(kernels::compare(dt, out.get(), ld, plain.get(), n, m, n, nullptr))) << where;
    const test::NormCheck norm =
        test::check_rmsnorm(dt, plain.get(), n, residual.get(), weight.get(), eps, y.get(), h.get(), m, n, nullptr);
    EXPECT_TRUE(test::within(norm.out)) << where << " (reorder + RMSNorm)";
    EXPECT_TRUE(test::bitwise(norm.residual_out)) << where << " (its residual_out)";
  }
}

// The gathered layouts' element-wise step on one GPU, `world` blocks as the
// ranks' partials: sum_gathered_rows is bitwise the host's sum in rank order
// (fp32, one rounding), into a strided output too; sum_gathered_add_rmsnorm
// matches the host's norm of that sum.
TEST(Reorder, GatheredBlocksSumInRankOrderAndNorm) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  int call = 0;
  for (auto [m, n, world] : std::vector<std::tuple<int, int, int>>{{1000, 4104, 2}, {333, 1001, 3}, {64, 8192, 8}}) {
    for (const DType dt : {DType::BF16, DType::FP16}) {
      const int64_t ld = n + 8 * int64_t(rng() % 2), block = int64_t(m) * n + 8 * int64_t(rng() % 4);
      const float eps = test::eps_for_call(call++, world * 16.0 / 3 + 1.0 / 3);
      const std::string where = std::to_string(m) + "x" + std::to_string(n) + " world " + std::to_string(world) +
                                (dt == DType::BF16 ? " bf16" : " fp16") + " ld " + std::to_string(ld) + " eps " +
                                std::to_string(eps) + " seed " + std::to_string(seed);
      const size_t cb = size_t(m) * n * 2;
      DeviceBuffer gathered(size_t(block) * world * 2), out(size_t(m) * ld * 2), sum(cb), residual(cb),
          weight(size_t(n) * 2), y(cb), h(cb);
      kernels::fill_random(dt, gathered.get(), block * world, seed + 11 * uint64_t(call), -4.f, 4.f, nullptr);
      kernels::fill_random(dt, residual.get(), int64_t(m) * n, seed + 1, -1.f, 1.f, nullptr);
      kernels::fill_random(dt, weight.get(), n, seed + 2, 0.5f, 1.5f, nullptr);
      for (DeviceBuffer* b : {&out, &y, &h}) kernels::poison(b->get(), int64_t(b->bytes() / 2), nullptr);
      kernels::sum_gathered_rows(dt, gathered.get(), world, block, m, n, out.get(), ld, nullptr);
      kernels::sum_gathered_add_rmsnorm(dt, gathered.get(), world, block, m, n, residual.get(), weight.get(), eps,
                                        y.get(), h.get(), nullptr);
      // The host's sum: every rank's block in rank order, in fp32, rounded once.
      const std::vector<uint16_t> g = test::download(gathered.get(), world, block, block, nullptr);
      std::vector<uint16_t> want(size_t(m) * n);
      for (size_t i = 0; i < want.size(); ++i) {
        float x = 0;
        for (int w = 0; w < world; ++w) x += test::value_of(dt, g[size_t(w) * size_t(block) + i]);
        want[i] = test::rounded(dt, x);
      }
      FO_CUDA_CHECK(cudaMemcpy(sum.get(), want.data(), cb, cudaMemcpyHostToDevice));
      EXPECT_TRUE(test::bitwise(kernels::compare(dt, out.get(), ld, sum.get(), n, m, n, nullptr))) << where;
      const test::NormCheck norm =
          test::check_rmsnorm(dt, sum.get(), n, residual.get(), weight.get(), eps, y.get(), h.get(), m, n, nullptr);
      EXPECT_TRUE(test::within(norm.out)) << where << " (sum + RMSNorm)";
      EXPECT_TRUE(test::bitwise(norm.residual_out)) << where << " (its residual_out)";
    }
  }
}

}  // namespace

// The owner layout's tests (4 stages, 128x256 tiles): a shape and its grid
// (test::kFullGrid: one CTA per SM; test::grid_ctas gives it on the device).
struct OwnerShape {
  int m, n, k, ctas;
};
plan::Schedule owner_sched(const OwnerShape& sh) {
  return make_sched(sh.m, sh.n, 128, 256, sh.ctas, plan::Raster::AlongN, sh.ctas > 8 ? 8 : 1);
}
// a + b of two 16-bit values of dt, the exact sum rounded once (NCCL's 2-rank sum).
uint16_t sum_rounded(DType dt, uint16_t a, uint16_t b) {
  if (dt == DType::BF16)
    return __nv_bfloat16_raw(__float2bfloat16_rn(__bfloat162float(__nv_bfloat16_raw{a}) +
                                                 __bfloat162float(__nv_bfloat16_raw{b})))
        .x;
  return __half_raw(__float2half_rn(__half2float(__half_raw{a}) + __half2float(__half_raw{b}))).x;
}

// The owner layout's kernel of one rank on one GPU, its peer's buffers
// stand-ins here (owner_stand_in.h: the peer's partials already in the
// window, every flag set): each tile this rank does not own lands, as our
// GEMM's partial, in the peer's window; each tile it owns, as the
// sum of that partial (rounded) and the peer's, rounded once, in C and in the
// peer's C; every tile is counted once in the peer's flags. Bitwise, for
// both ranks, both halves of the window, every push mode, ragged shapes,
// grids with one and with several tiles per CTA (rank, half and push mode
// drawn per case from the printed seed), with and without the pusher warps.
TEST(GemmOwners, OneGpuStandInPeerGetsEveryTileOnce) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (DType dt : {DType::BF16, DType::FP16})
    for (const OwnerShape sh : {OwnerShape{1000, 1024, 512, test::kFullGrid},
                                OwnerShape{3001, 2048, 256, test::kFullGrid}, OwnerShape{256, 520, 64, 3},
                                OwnerShape{640, 2048, 1024, 5}, OwnerShape{4096, 4096, 512, test::kFullGrid}}) {
      Problem pr(dt, sh.m, sh.n, sh.k, seed + sh.m, false);
      const plan::Schedule s = owner_sched({sh.m, sh.n, sh.k, test::grid_ctas(sh.ctas)});
      const size_t c_elems = size_t(sh.m) * sh.n;
      DeviceBuffer partial(c_elems * 2), c(c_elems * 2);
      kernels::GemmParams p;
      p.dtype = dt, p.a = pr.a.get(), p.b = pr.b.get(), p.m = sh.m, p.n = sh.n, p.k = sh.k, p.sched = s;
      p.store = kernels::Store::Plain, p.c = partial.get(), p.ldc = sh.n;
      kernels::launch_gemm(p, nullptr);  // this rank's partial: the plain GEMM's C
      p.c = c.get();
      const int rank = int(rng() % 2), half = int(rng() % 2), push_tma = int(rng() % 3);
      SCOPED_TRACE("m=" + std::to_string(sh.m) + " n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) +
                   " ctas=" + std::to_string(s.ctas) + (dt == DType::BF16 ? " bf16" : " fp16") + " rank " +
                   std::to_string(rank) + " half " + std::to_string(half) + " push_tma " + std::to_string(push_tma) +
                   " seed " + std::to_string(seed));
      for (const bool pushers : {false, true}) {  // (a fresh stand-in each: it counts every tile)
        const rt::OwnerStandIn peer(p, rank, half, push_tma, seed + 1);
        p.owner.pushers = pushers;
        SCOPED_TRACE(pushers ? "pusher warps" : "the storer pushes");
        ASSERT_TRUE(peer.finals_in_c());
        kernels::poison(c.get(), int64_t(c_elems), nullptr);
        kernels::poison(peer.peer_c().get(), int64_t(c_elems), nullptr);
        kernels::launch_gemm(p, nullptr);
        FO_CUDA_CHECK(cudaDeviceSynchronize());
        kernels::WaitError err{};
        FO_CUDA_CHECK(cudaMemcpy(&err, peer.error().get(), sizeof(err), cudaMemcpyDeviceToHost));
        ASSERT_EQ(err.failed, 0u) << "a wait timed out (tile " << err.tile << ")";

        const auto hp = to_host(partial), hc = to_host(c), hw = to_host(peer.window()),
                   hpw = to_host(peer.peer_window()), hpc = to_host(peer.peer_c());
        std::vector<uint32_t> counted(size_t(s.tiles()));
        FO_CUDA_CHECK(cudaMemcpy(counted.data(), peer.peer_flags().get(), counted.size() * 4, cudaMemcpyDeviceToHost));
        const int split = s.tiles() / 2;
        int64_t wrong_c = 0, wrong_peer = 0, wrong_counts = 0;
        for (int idx = 0; idx < s.tiles(); ++idx) {
          const plan::TileCoord tc = s.tile_of(idx);
          const bool own = rank == 0 ? idx >= split : idx < split;
          wrong_counts += counted[size_t(idx)] != 1;
          for (int r = tc.tm * 128; r < std::min(tc.tm * 128 + 128, sh.m); ++r)
            for (int col = tc.tn * 256; col < std::min(tc.tn * 256 + 256, sh.n); ++col) {
              const size_t at = size_t(r) * sh.n + col, in_window = size_t(peer.row0() + r) * sh.n + col;
              if (own) {
                const uint16_t sum = sum_rounded(dt, hp[at], hw[in_window]);
                wrong_c += hc[at] != sum;
                wrong_peer += hpc[at] != sum;
              } else {  // (C there is the peer's to fill: its final lands there)
                wrong_peer += hpw[in_window] != hp[at];
              }
            }
        }
        EXPECT_EQ(wrong_c, 0) << "elements of C";
        EXPECT_EQ(wrong_peer, 0) << "elements pushed to the peer (its window, or its C for a final)";
        EXPECT_EQ(wrong_counts, 0) << "tiles not counted exactly once in the peer's flags";
      }
    }
}

using rt::ScopedStream;

// The owner layout's call check for W ranks side by side (kernels::Owner::
// publish, check): each rank's descriptor slots in a buffer of its own here,
// wired by rt::OwnerCallSlots as it wires the ranks' windows over NVLink.
struct OwnerCallRanks {
  DeviceBuffer descs;
  std::vector<rt::OwnerCallSlots> slots;
  explicit OwnerCallRanks(int world) : descs(size_t(world) * rt::OwnerCallSlots::kBytes) {
    FO_CUDA_CHECK(cudaMemset(descs.get(), 0, descs.bytes()));
    std::vector<char*> bases;
    for (int r = 0; r < world; ++r) bases.push_back(descs.as<char>() + size_t(r) * rt::OwnerCallSlots::kBytes);
    for (int r = 0; r < world; ++r) slots.emplace_back(bases, 0, r);
  }
};

// Both ranks of the pushed AllReduce with owners on one GPU: two kernels,
// each on its own stream and its own SMs (ctas + ctas <= SMs), wired to each
// other's windows, flags and outputs as NCCL's window would wire two GPUs.
// Six calls in a row, each after a sync (epochs, both halves of the
// windows, the finals straight into each other's C; the first three without
// the pusher warps, the last three with them): each rank's C must be, bitwise,
// round(partial 0 + partial 1) of the two ranks' own GEMMs, with no wait
// timed out. This runs the whole owner protocol (pushes, counts, waits, the
// deferred loads that keep the two ranks from waiting on each other, the
// call check) without a second GPU; not its speed. Then the call check's
// failures (docs/design.md §5.8), each on both ranks, with what differed:
// call 7 rank 1 has m - 1 rows (the same tile rows: every wait completes,
// a sum that was silently wrong before the check), call 8 another plan,
// call 9 rank 1 a call ahead (a rank that skipped one); call 10 agrees
// again and sums bitwise (the windows are still in step); call 11 agrees
// with rank 1 already at its next call; in call 12 rank 0 alone finds
// rank 1's differing descriptor there and fails on it at once.
TEST(GemmOwners, TwoRanksOnOneGpuSumBitwise) {
  REQUIRE_HOPPER();
  constexpr uint32_t kFirstEpoch = 0xFFFFFFFDu;  // (epochs 2^32 - 2 .. 3: across the wrap, as kNearWrap's tests)
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (DType dt : {DType::BF16, DType::FP16})
    for (const OwnerShape sh : {OwnerShape{1000, 1024, 512, 66}, OwnerShape{3001, 2048, 256, 66},
                                OwnerShape{256, 520, 64, 3}, OwnerShape{640, 2048, 1024, 5},
                                OwnerShape{2048, 4096, 512, 66}, OwnerShape{128, 512, 64, 1}}) {
      // (both grids resident at once: at most half the SMs each)
      const plan::Schedule s = owner_sched({sh.m, sh.n, sh.k, std::min(sh.ctas, rt::current_device_sms() / 2)});
      const int push_tma = int(rng() % 3);
      SCOPED_TRACE("m=" + std::to_string(sh.m) + " n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) +
                   " ctas=" + std::to_string(s.ctas) + (dt == DType::BF16 ? " bf16" : " fp16") + " push_tma " +
                   std::to_string(push_tma) + " seed " + std::to_string(seed));
      const size_t c_elems = size_t(sh.m) * sh.n, tiles = size_t(s.tiles());
      const int64_t half_rows = int64_t(s.tiles_m()) * 128;
      struct Rank {
        Problem pr;
        DeviceBuffer partial, c, window, flags, claims, err, group_of_tile;
      };
      std::vector<Rank> ranks;
      for (int r = 0; r < 2; ++r) {
        ranks.push_back({Problem(dt, sh.m, sh.n, sh.k, seed + 7 * r + sh.m, false), DeviceBuffer(c_elems * 2),
                         DeviceBuffer(c_elems * 2), DeviceBuffer(size_t(2 * half_rows) * sh.n * 2),
                         DeviceBuffer(tiles * 4), DeviceBuffer(8), DeviceBuffer(sizeof(kernels::WaitError)),
                         DeviceBuffer(tiles * 4)});
        Rank& k = ranks.back();
        for (const DeviceBuffer* b : {&k.claims, &k.err, &k.group_of_tile})
          FO_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
        // (each tile's flag counts once per call: the peer's partial or final)
        const std::vector<uint32_t> flags = counters_after(kFirstEpoch, std::vector<uint32_t>(tiles, 1));
        FO_CUDA_CHECK(cudaMemcpy(k.flags.get(), flags.data(), k.flags.bytes(), cudaMemcpyHostToDevice));
        kernels::GemmParams p = kernels::plain_gemm(dt, k.pr.a.get(), k.pr.b.get(), s, sh.k, k.partial.get(), sh.n);
        kernels::launch_gemm(p, nullptr);  // this rank's partial
      }
      // The expected sum, on the host.
      const auto p0 = to_host(ranks[0].partial), p1 = to_host(ranks[1].partial);
      std::vector<uint16_t> sum(c_elems);
      for (size_t i = 0; i < c_elems; ++i) sum[i] = sum_rounded(dt, p0[i], p1[i]);
      OwnerCallRanks calls(2);
      const uint32_t plan = uint32_t(rng());
      const ScopedStream streams[2];  // (after the buffers: synchronised before they are freed)
      // Rank 1's descriptor written by hand into rank 0's slot of `parity`.
      const auto publish_by_hand = [&](int parity, uint32_t seq, uint32_t m) {
        const kernels::CallDesc d{seq, m, plan, 0};
        FO_CUDA_CHECK(cudaMemcpy(calls.descs.as<kernels::CallDesc>() + parity * kernels::kMaxCounters + 1, &d,
                                 sizeof(d), cudaMemcpyHostToDevice));
      };
      for (uint32_t call = 1; call <= 12; ++call) {  // (calls 1-3 the storer pushes, 4-6 the pusher warps)
        const uint32_t epoch = kFirstEpoch + call;
        const bool pushers = call > 3;
        const bool agree = call <= 6 || call == 10 || call == 11;
        SCOPED_TRACE("call " + std::to_string(call) + (pushers ? ", pusher warps" : ", the storer pushes"));
        if (call == 9) calls.slots[1].advance();   // (rank 1 a call ahead)
        if (call == 10) calls.slots[0].advance();  // (in step again)
        // Call 11 (#12): rank 1 already at its next call (#13, the other slot)
        // where rank 0 checks #12, as a peer that ended #12 first would be:
        // no disagreement. Call 12 (#13): rank 1's descriptor of #13, with
        // m - 1, already there and rank 1 not running at all: rank 0 fails
        // at once on it (the peek before its first wait for a peer's tile,
        // or its check after its tiles where it has none), not through its
        // waits' timeouts.
        if (call == 11) publish_by_hand(0, 13, uint32_t(s.m));
        if (call == 12) publish_by_hand(0, 13, uint32_t(s.m - 1));
        for (const Rank& k : ranks) FO_CUDA_CHECK(cudaMemset(k.err.get(), 0, k.err.bytes()));
        for (Rank& k : ranks) kernels::poison(k.c.get(), int64_t(c_elems), nullptr);
        FO_CUDA_CHECK(cudaDeviceSynchronize());
        kernels::GemmParams params[2];
        for (int r : {1, 0}) {
          Rank& k = ranks[size_t(r)];
          const Rank& peer = ranks[size_t(1 - r)];
          plan::Schedule sr = s;
          if (call == 7 && r == 1) sr.m = s.m - 1;  // (every shape's m - 1 has its tile rows)
          kernels::GemmParams p = kernels::plain_gemm(dt, k.pr.a.get(), k.pr.b.get(), sr, sh.k, k.c.get(), sh.n);
          p.group_of_tile = k.group_of_tile.as<int32_t>();
          kernels::Owner& o = p.owner;
          o.rank = r, o.split = s.tiles() / 2;
          o.window = k.window.get(), o.peer_window = peer.window.get(), o.window_rows = 2 * half_rows;
          o.row0 = int32_t((epoch & 1) * half_rows);
          o.flags = k.flags.as<uint32_t>(), o.peer_flags = peer.flags.as<uint32_t>(), o.epoch = epoch;
          o.claims = k.claims.as<uint32_t>() + (epoch & 1);
          o.claims_reset = k.claims.as<uint32_t>() + ((epoch + 1) & 1);
          o.push_tma = push_tma, o.push_window = peer.window.get();
          o.finals_in_c = true, o.peer_out = peer.c.get(), o.peer_ld = sh.n;
          o.pushers = pushers;
          // (calls 9 and 12 wait in vain: a shorter bound, the tiles take milliseconds)
          o.timeout_ns = call == 9 || call == 12 ? 500'000'000ull : 3'000'000'000ull, o.err = k.err.as<kernels::WaitError>();
          calls.slots[size_t(r)].prepare(o, uint32_t(sr.m), call == 8 && r == 1 ? plan + 1 : plan);
          ASSERT_TRUE(kernels::gemm_four_stages(p));
          ASSERT_NO_THROW(kernels::check_gemm_params(p));
          params[r] = p;
        }
        for (int r : {1, 0})  // (both checked first)
          if (call != 12 || r == 0) kernels::launch_gemm(params[r], streams[r].s);
        for (rt::OwnerCallSlots& c : calls.slots) c.advance();
        for (const ScopedStream& st : streams) FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
        if (call == 12) {
          kernels::WaitError e{};
          FO_CUDA_CHECK(cudaMemcpy(&e, ranks[0].err.get(), sizeof(e), cudaMemcpyDeviceToHost));
          ASSERT_EQ(e.failed, kernels::kCallCheckFailed) << "failure code " << e.failed << " (3, 4: a wait's timeout)";
          EXPECT_EQ(e.group, -2);
          EXPECT_EQ(e.seen_seq, 13u);
          EXPECT_EQ(e.seen_m, uint32_t(s.m - 1));
          EXPECT_EQ(e.want_m, uint32_t(s.m));
          continue;
        }
        for (int r = 0; r < 2 && !agree; ++r) {  // every rank fails, naming the other's call
          kernels::WaitError e{};
          FO_CUDA_CHECK(cudaMemcpy(&e, ranks[size_t(r)].err.get(), sizeof(e), cudaMemcpyDeviceToHost));
          ASSERT_EQ(e.failed, kernels::kCallCheckFailed) << "rank " << r << ": failure code " << e.failed;
          EXPECT_EQ(e.group, -1 - (1 - r));  // (the source: the other rank)
          const uint32_t mine = call + (call == 9 && r == 1);  // (its number: rank 1 a call ahead at call 9)
          EXPECT_EQ(e.want_seq, mine);
          const std::string msg = rt::describe_call_check(e, r, "owners", "m");
          if (call == 7) {
            EXPECT_EQ(e.seen_seq, mine);
            EXPECT_EQ(e.seen_m, uint32_t(r == 0 ? s.m - 1 : s.m));
            EXPECT_EQ(e.want_m, uint32_t(r == 0 ? s.m : s.m - 1));
          } else if (call == 8) {
            EXPECT_EQ(e.seen_plan, r == 0 ? plan + 1 : plan);
            EXPECT_EQ(e.want_plan, r == 0 ? plan : plan + 1);
          } else {  // rank 0 sees rank 1 ahead; rank 1 waits in vain for rank 0's call #9
            EXPECT_EQ(e.seen_seq, r == 0 ? 10u : 9u) << msg;
            EXPECT_NE(msg.find(r == 0 ? "is at call #10 where this rank is at #9" : "did not start call #10 in time"),
                      std::string::npos)
                << msg;
          }
        }
        for (int r = 0; r < 2 && agree; ++r) {
          kernels::WaitError err{};
          FO_CUDA_CHECK(cudaMemcpy(&err, ranks[size_t(r)].err.get(), sizeof(err), cudaMemcpyDeviceToHost));
          ASSERT_EQ(err.failed, 0u) << "rank " << r << " epoch " << epoch << ": a wait timed out (tile " << err.tile
                                    << ", value " << err.value << ", expected " << err.expected
                                    << "; the two kernels may not have run at the same time)";
          const auto c = to_host(ranks[size_t(r)].c);
          int64_t wrong = 0, first = -1;
          for (size_t i = 0; i < c_elems; ++i)
            if (c[i] != sum[i]) wrong++, first = first < 0 ? int64_t(i) : first;
          EXPECT_EQ(wrong, 0) << "rank " << r << " epoch " << epoch << ": first wrong element " << first;
        }
      }
    }
}

// The owner layout on W = 3, 4 and 8 ranks (Owner::world), all on one GPU: W
// kernels on W streams and SMs of their own (W x ctas <= SMs), wired to
// each other's windows (W - 1 sender slots), flags and outputs as NCCL's
// window would wire W GPUs. Six calls in a row (epochs, both halves of the
// windows): the first three with the owners' finals copied from each
// rank's window into its C, the last three stored straight into every
// other rank's C. Every rank's C must equal, bitwise, what the owner of each
// tile sums by the layout's definition, computed on the host
// (test::owner_order_sum: its own partial rounded, plus the other partials
// in slot order in fp32, rounded, plus slot 0's, rounded once); no wait may
// time out. Epochs start at 0 (W = 4) or across the wrap. Every window is
// poisoned before each call, so that a wait that lets a read through early
// finds poison, not the previous call's data. Every call is checked across
// the ranks (the call check, which passes); in a seventh the last rank has
// one row less than the others, in the same tile rows, and every rank fails
// the check naming another's m.
TEST(GemmOwners, WRanksOnOneGpuSumTheirPartialsInSlotOrder) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  for (DType dt : {DType::BF16, DType::FP16})
    for (const int world : {3, 4, 8})
      for (const OwnerShape sh : {OwnerShape{1000, 1024, 512, test::kFullGrid},
                                  OwnerShape{3001, 2048, 256, test::kFullGrid}, OwnerShape{640, 2048, 1024, 5},
                                  OwnerShape{2048, 4104, 512, test::kFullGrid}, OwnerShape{128, 512, 64, 1}}) {
        const plan::Schedule s =
            owner_sched({sh.m, sh.n, sh.k, std::min(test::grid_ctas(sh.ctas), rt::current_device_sms() / world)});
        const uint32_t first_epoch = world == 4 ? 0u : kNearWrap;  // (across the wrap but at W = 4)
        SCOPED_TRACE("world " + std::to_string(world) + " m=" + std::to_string(sh.m) + " n=" + std::to_string(sh.n) +
                     " k=" + std::to_string(sh.k) + " ctas=" + std::to_string(s.ctas) +
                     (dt == DType::BF16 ? " bf16" : " fp16") + " seed " + std::to_string(seed));
        const size_t c_elems = size_t(sh.m) * sh.n, tiles = size_t(s.tiles());
        const int64_t half_rows = int64_t(s.tiles_m()) * 128, window_rows = 2 * half_rows;
        struct Rank {
          Problem pr;
          DeviceBuffer partial, c, window, flags, claims, err, group_of_tile, flags_of, windows_of, outs_of, lds_of;
        };
        std::vector<Rank> ranks;
        for (int r = 0; r < world; ++r) {
          ranks.push_back({Problem(dt, sh.m, sh.n, sh.k, seed + 7 * r + sh.m, false), DeviceBuffer(c_elems * 2),
                           DeviceBuffer(c_elems * 2), DeviceBuffer(size_t(world - 1) * window_rows * sh.n * 2),
                           DeviceBuffer(tiles * 4), DeviceBuffer(8), DeviceBuffer(sizeof(kernels::WaitError)),
                           DeviceBuffer(tiles * 4), DeviceBuffer(world * sizeof(void*)),
                           DeviceBuffer(world * sizeof(void*)), DeviceBuffer(world * sizeof(void*)),
                           DeviceBuffer(world * sizeof(int64_t))});
          Rank& k = ranks.back();
          for (const DeviceBuffer* b : {&k.claims, &k.err, &k.group_of_tile})
            FO_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
          // Each call counts W - 1 partials into an owned tile's flag, one final into the others'.
          std::vector<uint32_t> per_call(tiles, 1);
          for (int32_t t = kernels::owned_begin(r, s.tiles(), world); t < kernels::owned_end(r, s.tiles(), world); ++t)
            per_call[size_t(t)] = uint32_t(world - 1);
          const std::vector<uint32_t> flags = counters_after(first_epoch, per_call);
          FO_CUDA_CHECK(cudaMemcpy(k.flags.get(), flags.data(), k.flags.bytes(), cudaMemcpyHostToDevice));
          kernels::launch_gemm(kernels::plain_gemm(dt, k.pr.a.get(), k.pr.b.get(), s, sh.k, k.partial.get(), sh.n),
                               nullptr);  // this rank's partial
        }
        const size_t w = static_cast<size_t>(world);
        std::vector<void*> flags_of(w), windows_of(w), outs_of(w);
        std::vector<int64_t> lds_of(w, sh.n);
        for (int r = 0; r < world; ++r)
          flags_of[size_t(r)] = ranks[size_t(r)].flags.get(), windows_of[size_t(r)] = ranks[size_t(r)].window.get(),
          outs_of[size_t(r)] = ranks[size_t(r)].c.get();
        for (int r = 0; r < world; ++r) {
          Rank& k = ranks[size_t(r)];
          FO_CUDA_CHECK(cudaMemcpy(k.flags_of.get(), flags_of.data(), k.flags_of.bytes(), cudaMemcpyHostToDevice));
          FO_CUDA_CHECK(cudaMemcpy(k.windows_of.get(), windows_of.data(), k.windows_of.bytes(), cudaMemcpyHostToDevice));
          FO_CUDA_CHECK(cudaMemcpy(k.outs_of.get(), outs_of.data(), k.outs_of.bytes(), cudaMemcpyHostToDevice));
          FO_CUDA_CHECK(cudaMemcpy(k.lds_of.get(), lds_of.data(), k.lds_of.bytes(), cudaMemcpyHostToDevice));
        }
        // The expected result, on the host: each tile as its owner sums it (host_reference.h).
        std::vector<std::vector<uint16_t>> part;
        for (const Rank& k : ranks) part.push_back(to_host(k.partial));
        const std::vector<uint16_t> sum = test::owner_order_sum(dt, part, s);
        OwnerCallRanks calls(world);
        std::vector<ScopedStream> streams(w);  // (after the buffers: synchronised first)
        for (uint32_t call = 1; call <= 7; ++call) {  // (call 7: the last rank has m - 1 rows, the same tile rows)
          const uint32_t epoch = first_epoch + call;
          const bool into_c = call > 3;
          SCOPED_TRACE(std::string(into_c ? "finals into the other ranks' C" : "finals into the windows, copied") +
                       ", call " + std::to_string(call));
          for (Rank& k : ranks) {
            kernels::poison(k.c.get(), int64_t(c_elems), nullptr);
            kernels::poison(k.window.get(), int64_t(k.window.bytes() / 2), nullptr);
          }
          FO_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<kernels::GemmParams> params(w);
          for (int r = world - 1; r >= 0; --r) {
            Rank& k = ranks[size_t(r)];
            plan::Schedule sr = s;
            if (call == 7 && r == world - 1) sr.m = s.m - 1;
            kernels::GemmParams p = kernels::plain_gemm(dt, k.pr.a.get(), k.pr.b.get(), sr, sh.k, k.c.get(), sh.n);
            p.group_of_tile = k.group_of_tile.as<int32_t>();
            kernels::Owner& o = p.owner;
            o.peer_window = ranks[size_t((r + 1) % world)].window.get();  // (unused beyond 2 ranks, but set)
            o.rank = r, o.world = world, o.walk = kernels::OwnerWalk::Ranges, o.split = s.tiles() / 2;
            o.own_begin = kernels::owned_begin(r, s.tiles(), world), o.own_end = kernels::owned_end(r, s.tiles(), world);
            o.window = k.window.get(), o.window_rows = window_rows, o.row0 = int32_t((epoch & 1) * half_rows);
            o.flags = k.flags.as<uint32_t>(), o.peer_flags = ranks[size_t((r + 1) % world)].flags.as<uint32_t>();
            o.flags_of = k.flags_of.as<uint32_t*>(), o.windows_of = k.windows_of.as<void*>();
            o.epoch = epoch;
            o.claims = k.claims.as<uint32_t>() + (epoch & 1);
            o.claims_reset = k.claims.as<uint32_t>() + ((epoch + 1) & 1);
            o.push_tma = 0, o.pushers = true;
            if (into_c) o.finals_in_c = true, o.outs_of = k.outs_of.as<void*>(), o.lds_of = k.lds_of.as<int64_t>();
            o.timeout_ns = 3'000'000'000ull, o.err = k.err.as<kernels::WaitError>();
            calls.slots[size_t(r)].prepare(o, uint32_t(sr.m), 0x600du);
            ASSERT_TRUE(kernels::gemm_four_stages(p));
            ASSERT_NO_THROW(kernels::check_gemm_params(p));
            params[size_t(r)] = p;
          }
          for (int r = world - 1; r >= 0; --r) kernels::launch_gemm(params[size_t(r)], streams[size_t(r)].s);
          for (rt::OwnerCallSlots& c : calls.slots) c.advance();
          for (const ScopedStream& st : streams) FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
          // Every rank fails: the last names one of the others (the first
          // whose descriptor it found differing), the others name it.
          for (int r = 0; r < world && call == 7; ++r) {
            kernels::WaitError e{};
            FO_CUDA_CHECK(cudaMemcpy(&e, ranks[size_t(r)].err.get(), sizeof(e), cudaMemcpyDeviceToHost));
            ASSERT_EQ(e.failed, kernels::kCallCheckFailed) << "rank " << r << ": failure code " << e.failed;
            const bool last = r == world - 1;
            const int source = -1 - e.group;
            if (last)
              EXPECT_TRUE(source >= 0 && source < world - 1) << "rank " << r << ": source " << source;
            else
              EXPECT_EQ(source, world - 1) << "rank " << r;
            EXPECT_EQ(e.seen_seq, 7u) << "rank " << r;
            EXPECT_EQ(e.seen_m, uint32_t(last ? s.m : s.m - 1)) << "rank " << r;
            EXPECT_EQ(e.want_m, uint32_t(last ? s.m - 1 : s.m)) << "rank " << r;
          }
          for (int r = 0; r < world && call < 7; ++r) {
            kernels::WaitError err{};
            FO_CUDA_CHECK(cudaMemcpy(&err, ranks[size_t(r)].err.get(), sizeof(err), cudaMemcpyDeviceToHost));
            ASSERT_EQ(err.failed, 0u) << "rank " << r << " epoch " << epoch << ": a wait timed out (tile " << err.tile
                                      << ", value " << err.value << ", expected " << err.expected << ")";
            const auto c = to_host(ranks[size_t(r)].c);
            int64_t wrong = 0, first = -1;
            for (size_t i = 0; i < c_elems; ++i)
              if (c[i] != sum[i]) wrong++, first = first < 0 ? int64_t(i) : first;
            EXPECT_EQ(wrong, 0) << "rank " << r << " epoch " << epoch << ": first wrong element " << first;
          }
        }
      }
}
