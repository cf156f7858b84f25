// GPU tests of the public C++ API (include/flashoverlap/flashoverlap.h) on
// every local GPU up to 2 (one GPU: a communicator of one rank, whose
// AllReduce moves nothing but runs every step of the op): any m per op on
// every path against our GEMM + one ncclAllReduce (bitwise: on at most 2
// ranks NCCL's sum is a + b), the RMSNorm form against the host's
// definition, CUDA graph capture and replay mixed with eager calls, the
// time to plan a new m, m checked across ranks (check_m, and the owners
// path's call check), and bad arguments.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "flashoverlap/flashoverlap.h"
#include "host_reference.h"
#include "kernels/check.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/cublas.h"
#include "kernels/gemm.h"
#include "plan/tile_grid.h"
#include "host_cost.h"
#include "op_reference.h"
#include "rank_harness.h"
#include "runtime/ops/baselines.h"
#include "runtime/tune/host_gate.h"
#include "runtime/tune/timing.h"

using namespace flashoverlap;
using rt::DeviceBuffer;
constexpr kernels::DType kBf16 = kernels::DType::BF16;  // (the kernels' name; flashoverlap::DType is the API's)

namespace {

using Path = GemmAllReduceOptions::Path;
const char* name(Path p) {
  return p == Path::Sequential ? "sequential"
         : p == Path::RowBands ? "row bands"
         : p == Path::Slots    ? "slots"
         : p == Path::NVLink   ? "owners"
                               : "auto";
}
// Every path this world runs (owners: 2-8 ranks).
std::vector<Path> paths_for(int world) {
  std::vector<Path> p = {Path::Sequential, Path::RowBands, Path::Slots, Path::Auto};
  if (world >= 2) p.push_back(Path::NVLink);
  return p;
}

int world_here() { return std::min(rt::hopper_device_count(), 2); }


struct Buffers {
  DeviceBuffer a, b, out, ref;
  Buffers(int64_t max_m, int64_t n, int64_t k, int64_t ld)
      : a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), out(size_t(max_m) * ld * 2), ref(size_t(max_m) * n * 2) {}
};

// 200 calls with m drawn in [1, max_m] (each new m planned on the way; some
// repeat), on each path in turn, every output checked.
TEST(GemmAllReduceApi, AnyMOnEveryPathMatchesOurGemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  std::fprintf(stderr, "world %d, seed %llu\n", world, static_cast<unsigned long long>(seed));
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 3000, n = 2048, k = 512, ld_max = n + 8;
    const Communicator comm = Communicator::adopt(nccl);
    ASSERT_EQ(comm.world(), world);
    ASSERT_EQ(comm.rank(), rank);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Buffers buf(max_m, n, k, ld_max);
    DeviceBuffer residual(size_t(max_m) * n * 2), weight(size_t(n) * 2), y(size_t(max_m) * n * 2),
        h(size_t(max_m) * n * 2);
    for (Path path : paths_for(world)) {
      GemmAllReduceOptions o;
      o.path = path;
      GemmAllReduce op(comm, max_m, n, k, DType::BF16, o);
      std::mt19937_64 rng(seed + uint64_t(path));  // (the same m on every rank)
      int overlapped = 0;
      for (int call = 0; call < 200; ++call) {
        const int64_t m = call % 50 == 0 ? max_m : 1 + int64_t(rng() % uint64_t(max_m));
        const int64_t ld = rng() % 4 == 0 ? ld_max : n;
        const uint64_t sd = seed + 1000 * uint64_t(call) + 17 * uint64_t(rank);
        kernels::fill_random(kBf16, buf.a.get(), m * k, sd, -1.f, 1.f, st);
        kernels::fill_random(kBf16, buf.b.get(), n * k, sd + 1, -1.f, 1.f, st);
        kernels::poison(buf.out.get(), m * ld, st);
        kernels::poison(buf.ref.get(), m * n, st);
        op.run(buf.a.get(), buf.b.get(), buf.out.get(), m, st, ld);
        test::op_reference(op.plan(m), buf.a.get(), buf.b.get(), buf.ref.get(), m, n, k, nccl, st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
        const std::string plan = op.plan(m);
        overlapped += plan.find("sequential") == std::string::npos;
        const std::string where = std::string(name(path)) + " m=" + std::to_string(m) + " ld=" + std::to_string(ld) +
                                  " rank " + std::to_string(rank) + " (" + plan + ") seed " + std::to_string(seed);
        EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, buf.out.get(), ld, buf.ref.get(), n, m, n, st)))
            << where;
        if (call % 20 == 7) {  // the RMSNorm form, against the host's definition from the reference
          const float eps = test::eps_for_call(call / 20, world * double(k) / 9 + 1.0 / 3);
          kernels::fill_random(kBf16, residual.get(), m * n, sd + 2, -1.f, 1.f, st);
          kernels::fill_random(kBf16, weight.get(), n, sd + 3, 0.5f, 1.5f, st);
          op.run_rmsnorm(buf.a.get(), buf.b.get(), residual.get(), weight.get(), eps, y.get(), h.get(), m, st);
          const test::NormCheck norm = test::check_rmsnorm(kBf16, buf.ref.get(), n, residual.get(), weight.get(),
                                                           eps, y.get(), h.get(), m, n, st);
          EXPECT_TRUE(test::within(norm.out)) << where << " (RMSNorm)";
          EXPECT_TRUE(test::bitwise(norm.residual_out)) << where << " (residual_out)";
        }
      }
      // The forced paths overlap wherever m leaves two groups (most m here).
      if (path == Path::RowBands || path == Path::Slots || path == Path::NVLink) EXPECT_GT(overlapped, 100) << name(path);
      if (path == Path::Sequential) EXPECT_EQ(overlapped, 0);
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// FP8 inputs (InputType::E4M3) on every path they take, each scale kind:
// small integers in e4m3 and power-of-two scales, so that every rank's
// product is exact before its one rounding whichever GEMM runs it (ours or
// cuBLASLt's); the output bitwise our FP8 GEMM's + one ncclAllReduce. Scales
// that the options do not ask for, or that are missing, are refused.
TEST(GemmAllReduceApi, Fp8InputsOnEveryPathMatchOurFp8GemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  std::fprintf(stderr, "world %d, seed %llu\n", world, static_cast<unsigned long long>(seed));
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 2500, n = 1536, k = 512;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DeviceBuffer out(size_t(max_m) * n * 2), ref(size_t(max_m) * n * 2);
    const ScaleKind kinds[] = {ScaleKind::None, ScaleKind::PerTensor, ScaleKind::RowWise};
    for (Path path : {Path::Sequential, Path::RowBands, Path::Slots, Path::Auto}) {
      for (ScaleKind kind : kinds) {
        GemmAllReduceOptions o;
        o.path = path, o.input = InputType::E4M3, o.scales = kind;
        GemmAllReduce op(comm, max_m, n, k, DType::BF16, o);
        std::mt19937_64 rng(seed + 10 * uint64_t(path) + uint64_t(kind));  // (the same m on every rank)
        for (int call = 0; call < 12; ++call) {
          const int64_t m = call == 0 ? max_m : 1 + int64_t(rng() % uint64_t(max_m));
          std::mt19937_64 mine(seed + 1000 * uint64_t(call) + 17 * uint64_t(rank));
          const test::Fp8Inputs in(m, n, k, kind, mine);
          kernels::poison(out.get(), m * n, st);
          op.run(in.a.get(), in.b.get(), out.get(), m, st, 0, in.scales);
          // The reference: our FP8 GEMM, then one AllReduce of it.
          test::fp8_gemm(in.a.get(), in.b.get(), ref.get(), m, n, k, kind, in.scales, st);
          FO_NCCL_CHECK_CTX(ncclAllReduce(ref.get(), ref.get(), size_t(m * n), ncclBfloat16, ncclSum, nccl, st), "reference");
          FO_CUDA_CHECK(cudaStreamSynchronize(st));
          op.check();
          const std::string where = std::string(name(path)) + ", scales " + std::to_string(int(kind)) + ", m=" +
                                    std::to_string(m) + " rank " + std::to_string(rank) + " (" + op.plan(m) +
                                    ") seed " + std::to_string(seed);
          EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), n, ref.get(), n, m, n, st))) << where;
          EXPECT_THROW(op.run(in.a.get(), in.b.get(), out.get(), m, st, 0, in.wrong(kind)), InvalidArgument) << where;
          if (kind != ScaleKind::None)  // (one of the two missing)
            EXPECT_THROW(op.run(in.a.get(), in.b.get(), out.get(), m, st, 0, {in.scales.a, nullptr}), InvalidArgument);
        }
      }
    }
    GemmAllReduceOptions bad;
    bad.input = InputType::E4M3;
    EXPECT_THROW(GemmAllReduce(comm, 64, 256, 264, DType::BF16, bad), InvalidArgument);  // (k % 16)
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// A call captured into a CUDA graph, replayed between eager calls of the
// same op and m (and of another m), each with fresh inputs: every output is
// the reference of its inputs. (The counters of a captured op are reset per
// call, so replays and eager calls both wait for their own signals.)
TEST(GemmAllReduceApi, GraphReplaysMixedWithEagerCalls) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 2048, n = 4096, k = 1024, m = 1900, m2 = 777;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st, st2;
    cudaEvent_t ev;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
    FO_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    Buffers buf(max_m, n, k, n);
    if (world >= 2) {  // the owner layout's epochs and halves are passed per call: refused, nothing enqueued
      GemmAllReduceOptions o;
      o.path = Path::NVLink;
      GemmAllReduce op(comm, max_m, n, k, DType::BF16, o);
      op.prepare(m);
      FO_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      EXPECT_THROW(op.run(buf.a.get(), buf.b.get(), buf.out.get(), m, st), InvalidArgument);
      cudaGraph_t refused = nullptr;
      FO_CUDA_CHECK(cudaStreamEndCapture(st, &refused));
      size_t nodes = 0;
      FO_CUDA_CHECK(cudaGraphGetNodes(refused, nullptr, &nodes));
      EXPECT_EQ(nodes, 0u) << "the refused call enqueued work";
      FO_CUDA_CHECK(cudaGraphDestroy(refused));
    }
    for (Path path : {Path::Sequential, Path::RowBands, Path::Slots}) {
      GemmAllReduceOptions o;
      o.path = path;
      GemmAllReduce op(comm, max_m, n, k, DType::BF16, o);
      op.prepare(m);  // (planning allocates: before the capture)
      kernels::fill_random(kBf16, buf.b.get(), n * k, seed + 1 + rank, -1.f, 1.f, st);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      FO_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      op.run(buf.a.get(), buf.b.get(), buf.out.get(), m, st);
      FO_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
      FO_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      // replay, eager, replay, replay, eager of another m, replay, eager,
      // replay, eager on another stream (3: the order a captured call keeps
      // must not be an event of the graph), replay
      const std::vector<int> kinds = {0, 1, 0, 0, 2, 0, 1, 0, 3, 0};
      for (size_t i = 0; i < kinds.size(); ++i) {
        const int64_t mm = kinds[i] == 2 ? m2 : m;
        kernels::fill_random(kBf16, buf.a.get(), mm * k, seed + 100 * i + 7 * uint64_t(rank), -1.f, 1.f, st);
        kernels::poison(buf.out.get(), mm * n, st);
        if (kinds[i] == 0) {
          FO_CUDA_CHECK(cudaGraphLaunch(exec, st));
        } else if (kinds[i] == 3) {
          FO_CUDA_CHECK(cudaEventRecord(ev, st));
          FO_CUDA_CHECK(cudaStreamWaitEvent(st2, ev, 0));
          op.run(buf.a.get(), buf.b.get(), buf.out.get(), mm, st2);
          FO_CUDA_CHECK(cudaEventRecord(ev, st2));
          FO_CUDA_CHECK(cudaStreamWaitEvent(st, ev, 0));
        } else {
          op.run(buf.a.get(), buf.b.get(), buf.out.get(), mm, st);
        }
        test::op_reference(op.plan(mm), buf.a.get(), buf.b.get(), buf.ref.get(), mm, n, k, nccl, st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
        EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, buf.out.get(), n, buf.ref.get(), n, mm, n, st)))
            << name(path) << " launch " << i << (kinds[i] == 0 ? " (replay)" : " (eager)") << " rank " << rank
            << " seed " << seed << " (" << op.plan(m) << ")";
      }
      FO_CUDA_CHECK(cudaGraphExecDestroy(exec));
      FO_CUDA_CHECK(cudaGraphDestroy(graph));
      // An m not planned yet is refused under capture (planning allocates), with the way out named.
      FO_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      try {
        op.run(buf.a.get(), buf.b.get(), buf.out.get(), 555, st);
        ADD_FAILURE() << name(path) << ": an unplanned m was captured";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("prepare(m)"), std::string::npos) << e.what();
      }
      cudaGraph_t aborted = nullptr;
      (void)cudaStreamEndCapture(st, &aborted);
      if (aborted) cudaGraphDestroy(aborted);
      (void)cudaGetLastError();
    }
    FO_CUDA_CHECK(cudaEventDestroy(ev));
    FO_CUDA_CHECK(cudaStreamDestroy(st2));
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// The registered-output form: two outputs registered (one strided), calls
// into either with random m on every path, each the reference of its inputs
// (on the owners path the peers' finals land in it straight from their GEMMs).
TEST(GemmAllReduceApi, RegisteredOutputsOnEveryPath) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 2048, n = 1024, k = 512, ld2 = n + 64;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Buffers buf(max_m, n, k, n);
    DeviceBuffer out2(size_t(max_m) * ld2 * 2);
    for (Path path : paths_for(world)) {
      GemmAllReduceOptions o;
      o.path = path;
      GemmAllReduce op(comm, max_m, n, k, DType::BF16, o);
      EXPECT_THROW(op.register_output(buf.out.get(), n + 3), InvalidArgument);
      const int s0 = op.register_output(buf.out.get()), s1 = op.register_output(out2.get(), ld2);
      ASSERT_EQ(s0, 0);
      ASSERT_EQ(s1, 1);
      EXPECT_THROW(op.run_registered(buf.a.get(), buf.b.get(), 2, 100, st), InvalidArgument);
      std::mt19937_64 rng(seed + uint64_t(path));  // (the same m on every rank)
      for (int call = 0; call < 24; ++call) {
        const int64_t m = 1 + int64_t(rng() % uint64_t(max_m));
        const int slot = int(rng() % 2);
        void* out = slot == 0 ? buf.out.get() : out2.get();
        const int64_t ld = slot == 0 ? n : ld2;
        const uint64_t sd = seed + 1000 * uint64_t(call) + 17 * uint64_t(rank);
        kernels::fill_random(kBf16, buf.a.get(), m * k, sd, -1.f, 1.f, st);
        kernels::fill_random(kBf16, buf.b.get(), n * k, sd + 1, -1.f, 1.f, st);
        kernels::poison(out, m * ld, st);
        op.run_registered(buf.a.get(), buf.b.get(), slot, m, st);
        test::op_reference(op.plan(m), buf.a.get(), buf.b.get(), buf.ref.get(), m, n, k, nccl, st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
        EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out, ld, buf.ref.get(), n, m, n, st)))
            << name(path) << " slot " << slot << " m=" << m << " rank " << rank << " (" << op.plan(m) << ") seed "
            << seed;
      }
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// The sequential calls run the faster GEMM: on one rank (every plan
// sequential: the AllReduce moves nothing), cuBLAS's and ours (the faster
// of the op's tiles on the full grid) timed in turns here at each m; where
// one is at least 5% faster, plan(m) names it. The construction's own
// timing is what chose: the margin covers the two timings' noise.
TEST(GemmAllReduceApi, SequentialCallsRunTheFasterGemm) {
  REQUIRE_HOPPER();
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int sms = rt::current_device_sms();
    int named = 0, cublas_named = 0;
    for (auto [n, k] : {std::pair<int64_t, int64_t>{8192, 8192}, {5120, 13824}, {4096, 4096}, {5000, 8192}}) {
      const int64_t max_m = 8192;
      GemmAllReduce op(comm, max_m, n, k, DType::BF16);
      DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), c(size_t(max_m) * n * 2);
      kernels::fill_random(kBf16, a.get(), max_m * k, 5, -1.f, 1.f, st);
      kernels::fill_random(kBf16, b.get(), n * k, 6, -1.f, 1.f, st);
      rt::CublasGemm cublas;
      for (int64_t m : {1, 3, 8, 32, 100, 128, 512, 2048, 8192}) {
        std::vector<kernels::GemmParams> ours;
        for (plan::TileShape t : {plan::TileShape{128, 256}, plan::TileShape{128, 128}})
          ours.push_back(kernels::plain_gemm(kBf16, a.get(), b.get(),
                                             plan::make_schedule(m, n, t, sms, plan::Raster::AlongN,
                                                                 plan::default_swizzle(sms, t, int32_t((m + 127) / 128))),
                                             int(k), c.get(), n));
        const std::vector<rt::TimingStats> t = rt::time_interleaved(
            {[&] { cublas.run(kBf16, a.get(), b.get(), c.get(), int(m), int(n), int(k), n, st); },
             [&] { kernels::launch_gemm(ours[0], st); }, [&] { kernels::launch_gemm(ours[1], st); }},
            st, 3, 25, {}, &rt::thread_gate());
        const double cub = t[0].median_ms, our = std::min(t[1].median_ms, t[2].median_ms);
        const std::string plan = op.plan(m);
        std::fprintf(stderr, "%lldx%lldx%lld: cuBLAS %.4f ms, ours %.4f ms; plan: %s\n", (long long)m, (long long)n,
                     (long long)k, cub, our, plan.c_str());
        if (plan.rfind("sequential", 0) != 0) continue;  // (an overlapped plan's GEMM is ours by design)
        if (cub < 0.95 * our) EXPECT_TRUE(test::plan_runs_cublas(plan)) << m << "x" << n << "x" << k << ": " << plan;
        if (our < 0.95 * cub) EXPECT_NE(plan.find("our GEMM"), std::string::npos) << m << "x" << n << "x" << k << ": " << plan;
        named += cub < 0.95 * our || our < 0.95 * cub;
        cublas_named += test::plan_runs_cublas(plan);
      }
    }
    std::fprintf(stderr, "%d of the m had one GEMM 5%% faster; cuBLAS's ran %d\n", named, cublas_named);
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// What a sequential call costs the host, against what a C++ user runs
// instead (cublasGemmEx, then ncclAllReduce): at most 3 us more per call
// (host_cost.h).
TEST(GemmAllReduceApi, SequentialCallHostCost) {
  REQUIRE_HOPPER();
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t n = 4096, k = 4096, max_m = 512;
    GemmAllReduce op(comm, max_m, n, k, DType::BF16);
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), c(size_t(max_m) * n * 2), out(size_t(max_m) * n * 2);
    rt::CublasGemm gemm_ex(rt::CublasGemm::Api::GemmEx);
    test::expect_host_cost_within_3us(
        "cublasGemmEx + ncclAllReduce", "GemmAllReduce", {1, 32, 512},
        [&](int64_t m) {
          rt::sequential_cublas_allreduce(gemm_ex, kBf16, a.get(), b.get(), c.get(), int(m), int(n), int(k), nccl, st);
        },
        [&](int64_t m) { op.run(a.get(), b.get(), out.get(), m, st); }, [&](int64_t m) { return op.plan(m); }, st);
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// The time to plan (and make the op of) an m not seen before, on the host:
// the figure the API promises to keep well under a millisecond. Printed;
// asserted only as a hang guard (a loaded machine may be slower).
TEST(GemmAllReduceApi, PlanningANewM) {
  REQUIRE_HOPPER();
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    GemmAllReduce op(comm, 16384, 8192, 8192, DType::BF16);
    std::vector<double> new_bucket_us, same_bucket_us;
    for (int64_t m = 100; m <= 16384; m += 331) {
      auto t0 = std::chrono::steady_clock::now();
      op.prepare(m);
      new_bucket_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      t0 = std::chrono::steady_clock::now();
      op.prepare(m % 128 == 1 ? m + 1 : m - 1);  // (another m of the same tile rows)
      same_bucket_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    for (auto* v : {&new_bucket_us, &same_bucket_us}) std::sort(v->begin(), v->end());
    std::fprintf(stderr,
                 "planning a new m (16384 x 8192 x 8192 bf16, %zu m): new tile rows median %.0f us, max %.0f us; "
                 "another m of known tile rows median %.0f us, max %.0f us\n",
                 new_bucket_us.size(), new_bucket_us[new_bucket_us.size() / 2], new_bucket_us.back(),
                 same_bucket_us[same_bucket_us.size() / 2], same_bucket_us.back());
    EXPECT_LT(new_bucket_us.back(), 5e6);  // (a hang guard, not a speed bound)
  });
}

// What check_m costs a call as a user makes them, back to back on one
// stream (every local GPU up to 2): the time per call over 100 calls with
// and without it (the check's exchange synchronises the host with the
// stream, so calls no longer queue ahead). Printed; asserted only as a
// hang guard and that both ran.
TEST(GemmAllReduceApi, CheckMCostPerCall) {
  REQUIRE_HOPPER();
  const int world = world_here();
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    constexpr int64_t kM = 2048, kN = 8192, kK = 4096;
    Buffers buf(kM, kN, kK, kN);
    double us[2] = {0, 0};
    for (const bool check : {false, true}) {
      GemmAllReduceOptions o;
      o.check_m = check;
      GemmAllReduce op(comm, kM, kN, kK, DType::BF16, o);
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      for (int i = 0; i < 10; ++i) op.run(buf.a.get(), buf.b.get(), buf.out.get(), kM, st);  // (warm)
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 100; ++i) op.run(buf.a.get(), buf.b.get(), buf.out.get(), kM, st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      us[check] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 100;
      op.check();
      FO_CUDA_CHECK(cudaStreamDestroy(st));
    }
    if (rank == 0)
      std::fprintf(stderr, "check_m (%d rank(s), %lldx%lldx%lld bf16, path auto): %.1f us per call without, %.1f us "
                   "with (+%.1f us)\n", world, (long long)kM, (long long)kN, (long long)kK, us[0], us[1], us[1] - us[0]);
    EXPECT_GT(us[0], 0);
    EXPECT_LT(us[1], 1e6);  // (a hang guard, not a speed bound)
  });
}

// With check_m, ranks that pass different m throw InvalidArgument on every
// rank, naming each rank's m, and nothing hangs; the same m runs.
TEST(GemmAllReduceApi, CheckMFindsRanksThatDisagree) {
  FO_REQUIRE_HOPPER_GPUS(2);
  test::on_each_rank(2, [&](int rank, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    GemmAllReduceOptions o;
    o.check_m = true;
    GemmAllReduce op(comm, 1024, 1024, 256, DType::BF16, o);
    Buffers buf(1024, 1024, 256, 1024);
    try {
      op.run(buf.a.get(), buf.b.get(), buf.out.get(), rank == 0 ? 512 : 640, nullptr);
      ADD_FAILURE() << "rank " << rank << ": different m ran";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0: 512, rank 1: 640"), std::string::npos) << e.what();
    }
    op.run(buf.a.get(), buf.b.get(), buf.out.get(), 512, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    op.check();
  });
}

// On the owners path the ranks' GEMMs check each call on the GPU (the call
// check, always on): ranks whose m differ within one tile row (before the
// check, a silently wrong sum: every tile's counts arrive) fail on every
// rank, reported by check(), naming the other rank's m and this one's.
TEST(GemmAllReduceApi, OwnersCallsOfAnotherMFailOnEveryRank) {
  FO_REQUIRE_HOPPER_GPUS(2);
  test::on_each_rank(2, [&](int rank, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    GemmAllReduceOptions o;
    o.path = Path::NVLink;
    o.wait_timeout_s = 5;
    GemmAllReduce op(comm, 4096, 8192, 4096, DType::BF16, o);
    Buffers buf(4096, 8192, 4096, 8192);
    ASSERT_NE(op.plan(2000).find("with owners"), std::string::npos) << op.plan(2000);
    op.run(buf.a.get(), buf.b.get(), buf.out.get(), 2000, nullptr);  // (agreed: runs)
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    op.check();
    const int64_t m = rank == 0 ? 2000 : 2017, other = rank == 0 ? 2017 : 2000;  // (16 tile rows each)
    op.run(buf.a.get(), buf.b.get(), buf.out.get(), m, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    try {
      op.check();
      ADD_FAILURE() << "rank " << rank << ": calls of m " << m << " and " << other << " passed";
    } catch (const Error& e) {
      const std::string want = "rank " + std::to_string(1 - rank) + "'s call #2 has m = " + std::to_string(other);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("where this rank expects m = " + std::to_string(m)), std::string::npos)
          << e.what();
    }
  });
}

// Bad arguments are InvalidArgument with the problem named, before any work.
TEST(GemmAllReduceApi, RejectsBadArguments) {
  REQUIRE_HOPPER();
  EXPECT_THROW(Communicator::adopt(nullptr), InvalidArgument);
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    auto throws = [](auto fn, const std::string& part) {
      try {
        fn();
        ADD_FAILURE() << "no exception (expected one mentioning '" << part << "')";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      }
    };
    throws([&] { GemmAllReduce(comm, 0, 64, 64, DType::BF16); }, "max_m");
    throws([&] { GemmAllReduce(comm, 64, 64, 60, DType::BF16); }, "multiple of 8");
    GemmAllReduceOptions bad;
    bad.nccl_sms = 0;
    throws([&] { GemmAllReduce(comm, 64, 64, 64, DType::BF16, bad); }, "nccl_sms");
    bad = {};
    bad.wait_timeout_s = -1;
    throws([&] { GemmAllReduce(comm, 64, 64, 64, DType::BF16, bad); }, "wait_timeout_s");
    bad = {};
    bad.path = Path::NVLink;  // (one rank here)
    throws([&] { GemmAllReduce(comm, 64, 64, 64, DType::BF16, bad); }, "2 to 8 ranks");
    GemmAllReduce op(comm, 256, 128, 64, DType::BF16);
    Buffers buf(256, 128, 64, 128);
    throws([&] { op.run(buf.a.get(), buf.b.get(), buf.out.get(), 0, nullptr); }, "m must be in [1, max_m]");
    throws([&] { op.run(buf.a.get(), buf.b.get(), buf.out.get(), 257, nullptr); }, "m must be in [1, max_m]");
    throws([&] { op.run(nullptr, buf.b.get(), buf.out.get(), 8, nullptr); }, "must not be null");
    throws([&] { op.run(buf.a.get(), buf.b.get(), buf.out.get(), 8, nullptr, 100); }, "ld_out");
    throws([&] { op.run_rmsnorm(buf.a.get(), buf.b.get(), nullptr, buf.b.get(), 1e-6f, buf.out.get(), nullptr, 8,
                                nullptr); },
           "must not be null");
    EXPECT_EQ(op.max_m(), 256);
    EXPECT_EQ(op.n(), 128);
    EXPECT_EQ(op.k(), 64);
  });
}

// The public grouped GEMM on fresh random counts (0, ragged, one row, all
// rows to one expert): each path's output equals its definition, expert by
// expert — ours bitwise our plain GEMM of the expert's rows, cuBLAS's
// bitwise its own GEMM of them, Auto one of the two (its last_plan says
// which) — and within the bound of cuBLAS's for every path; strided output;
// bad calls refused before anything runs.
TEST(ApiGroupedGemm, EachPathComputesEveryExpertsRows) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int experts = 6;
  const int64_t n = 8 * int64_t(1 + rng() % 300), k = 64 * int64_t(1 + rng() % 16), max_rows = 3000;
  SCOPED_TRACE("n " + std::to_string(n) + ", k " + std::to_string(k) + ", seed " + std::to_string(seed));
  using GPath = GroupedGemmOptions::Path;
  for (GPath path : {GPath::Ours, GPath::Cublas, GPath::Auto}) {
    GroupedGemmOptions o;
    o.path = path;
    GroupedGemm op(max_rows, experts, n, k, DType::BF16, o);
    EXPECT_EQ(op.last_plan(), "no call yet");
    for (int call = 0; call < 4; ++call) {
      std::vector<int64_t> counts(static_cast<size_t>(experts));
      for (auto& c : counts) c = rng() % 3 == 0 ? 0 : rng() % 4 == 0 ? 1 : int64_t(rng() % 500);
      if (call == 3) std::fill(counts.begin(), counts.end(), 0), counts[rng() % experts] = max_rows;
      int64_t rows = 0;
      for (int64_t c : counts) rows += c;
      const int64_t ld = n + 8 * (call % 2);
      DeviceBuffer a(size_t(std::max<int64_t>(rows, 1)) * k * 2), b(size_t(experts) * n * k * 2),
          out(size_t(std::max<int64_t>(rows, 1)) * ld * 2), ours(size_t(std::max<int64_t>(rows, 1)) * n * 2),
          theirs(size_t(std::max<int64_t>(rows, 1)) * n * 2);
      kernels::fill_random(kernels::DType::BF16, a.get(), rows * k, seed + call, -1.f, 1.f, nullptr);
      kernels::fill_random(kernels::DType::BF16, b.get(), int64_t(experts) * n * k, seed + call + 9, -1.f, 1.f, nullptr);
      kernels::poison(out.get(), std::max<int64_t>(rows, 1) * ld, nullptr);
      rt::CublasGemm gemm_ex(rt::CublasGemm::Api::GemmEx);
      int64_t row = 0;
      for (int e = 0; e < experts; ++e) {  // each expert's rows, by our plain GEMM and by cuBLAS's
        if (counts[size_t(e)] > 0) {
          const char* ae = static_cast<const char*>(a.get()) + row * k * 2;
          const char* be = static_cast<const char*>(b.get()) + int64_t(e) * n * k * 2;
          const plan::Schedule s =
              plan::make_schedule(counts[size_t(e)], n, {128, 256}, rt::current_device_sms(), plan::Raster::AlongN, 2);
          kernels::launch_gemm(kernels::plain_gemm(kernels::DType::BF16, ae, be, s, int32_t(k),
                                                   static_cast<char*>(ours.get()) + row * n * 2, n), nullptr);
          gemm_ex.run(kernels::DType::BF16, ae, be, static_cast<char*>(theirs.get()) + row * n * 2,
                      int(counts[size_t(e)]), int(n), int(k), n, nullptr);
        }
        row += counts[size_t(e)];
      }
      op.run(a.get(), b.get(), counts.data(), out.get(), nullptr, ld);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      const std::string plan = op.last_plan();
      if (path == GPath::Auto && rows > 0) EXPECT_NE(plan.find(" rows per expert: ours "), std::string::npos) << plan;
      SCOPED_TRACE("call " + std::to_string(call) + ": " + plan);
      if (rows == 0) {
        EXPECT_EQ(plan, "nothing to compute (0 rows)");
        continue;
      }
      const bool by_cublas = plan.rfind("cuBLAS", 0) == 0;
      EXPECT_EQ(by_cublas, path == GPath::Cublas || (path == GPath::Auto && by_cublas));
      EXPECT_EQ(plan.rfind("ours: ", 0) == 0, !by_cublas);
      if (!by_cublas || ld == n)  // (cuBLAS may choose another kernel for another ld)
        EXPECT_TRUE(test::bitwise(kernels::compare(kernels::DType::BF16, out.get(), ld,
                                                   by_cublas ? theirs.get() : ours.get(), n, rows, n, nullptr)));
      EXPECT_TRUE(test::within(kernels::compare(kernels::DType::BF16, out.get(), ld, theirs.get(), n, rows, n, nullptr,
                                                kernels::gemm_tolerance(kernels::DType::BF16, k))));
      // The offsets on the GPU: our GEMM, bitwise, the host waiting for nothing.
      std::vector<int32_t> offs;
      int64_t end = 0;
      for (int64_t c : counts) offs.push_back(int32_t(end += c));
      const DeviceBuffer d_offs = rt::to_device(offs);
      kernels::poison(out.get(), rows * ld, nullptr);
      op.run_offsets(a.get(), b.get(), d_offs.as<int32_t>(), rows, out.get(), nullptr, ld);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_NO_THROW(op.check());
      EXPECT_EQ(op.last_plan().rfind("ours, offsets on the GPU", 0), 0u) << op.last_plan();
      EXPECT_TRUE(test::bitwise(kernels::compare(kernels::DType::BF16, out.get(), ld, ours.get(), n, rows, n, nullptr)))
          << "run_offsets";
    }
    {  // offsets that decrease: found on the GPU, reported once by check()
      const std::vector<int32_t> offs = {10, 5, 20, 20, 30, 40};
      const DeviceBuffer d_offs = rt::to_device(offs);
      DeviceBuffer a(size_t(40) * k * 2), b(size_t(experts) * n * k * 2), out(size_t(40) * n * 2);
      op.run_offsets(a.get(), b.get(), d_offs.as<int32_t>(), 40, out.get(), nullptr);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      try {
        op.check();
        ADD_FAILURE() << "bad offsets not reported";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("offsets[1]"), std::string::npos) << e.what();
      }
      EXPECT_NO_THROW(op.check());  // (once)
    }
    std::vector<int64_t> bad(static_cast<size_t>(experts), 0);
    bad[0] = -1;
    DeviceBuffer any(1 << 20);
    EXPECT_THROW(op.run(any.get(), any.get(), bad.data(), any.get(), nullptr), InvalidArgument);
    bad[0] = max_rows + 1;
    EXPECT_THROW(op.run(any.get(), any.get(), bad.data(), any.get(), nullptr), InvalidArgument);
    bad[0] = 1;
    EXPECT_THROW(op.run(any.get(), any.get(), bad.data(), any.get(), nullptr, n - 1), InvalidArgument);  // ld_out
    EXPECT_THROW(op.run(static_cast<char*>(any.get()) + 2, any.get(), bad.data(), any.get(), nullptr),
                 InvalidArgument);  // misaligned a
    EXPECT_THROW(op.run(any.get(), any.get(), nullptr, any.get(), nullptr), InvalidArgument);
  }
  EXPECT_THROW(GroupedGemm(64, 0, 64, 64, DType::BF16), InvalidArgument);
  EXPECT_THROW(GroupedGemm(64, 2, 64, 60, DType::BF16), InvalidArgument);
}

// The host queues many calls, each with its own counts, while the GPU is held
// (an eager loop far ahead of the GPU): no call waits for an earlier one's
// upload, and each computes with its own tables.
TEST(ApiGroupedGemm, CallsQueueAheadOfTheGpuEachWithItsOwnCounts) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int experts = 5, calls = 150;
  const int64_t n = 128, k = 64, max_rows = 400;
  SCOPED_TRACE("seed " + std::to_string(seed));
  GroupedGemmOptions o;
  o.path = GroupedGemmOptions::Path::Ours;
  GroupedGemm op(max_rows, experts, n, k, DType::BF16, o);
  DeviceBuffer a(size_t(max_rows) * k * 2), b(size_t(experts) * n * k * 2), out(size_t(calls) * max_rows * n * 2),
      again(size_t(max_rows) * n * 2);
  kernels::fill_random(kernels::DType::BF16, a.get(), max_rows * k, seed, -1.f, 1.f, nullptr);
  kernels::fill_random(kernels::DType::BF16, b.get(), int64_t(experts) * n * k, seed + 1, -1.f, 1.f, nullptr);
  std::vector<std::vector<int64_t>> counts(calls, std::vector<int64_t>(size_t(experts)));
  for (auto& c : counts)
    for (auto& x : c) x = int64_t(rng() % (max_rows / experts + 1));
  rt::ScopedStream st;
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  rt::HostGate gate;
  gate.hold(st.s);
  auto out_of = [&](int i) { return static_cast<char*>(out.get()) + size_t(i) * max_rows * n * 2; };
  for (int i = 0; i < calls; ++i) op.run(a.get(), b.get(), counts[size_t(i)].data(), out_of(i), st.s);
  EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady) << "the host waited for the GPU while queueing the calls";
  gate.release();
  FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
  gate.check();
  for (int i = 0; i < calls; ++i) {  // each against the same call run alone
    int64_t rows = 0;
    for (int64_t c : counts[size_t(i)]) rows += c;
    if (rows == 0) continue;
    op.run(a.get(), b.get(), counts[size_t(i)].data(), again.get(), st.s);
    FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_TRUE(test::bitwise(kernels::compare(kernels::DType::BF16, out_of(i), n, again.get(), n, rows, n, st.s)))
        << "call " << i;
  }
}

}  // namespace
