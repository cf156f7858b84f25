// GPU tests of flashoverlap::GemmReduceScatter (include/flashoverlap/
// flashoverlap.h) on every local GPU up to 2 (one GPU: a communicator of one
// rank): any m per op on every path and layout against this rank's rows of
// our GEMM + one ncclAllReduce (bitwise: on at most 2 ranks NCCL's sum is
// a + b, in ReduceScatter as in AllReduce), the RMSNorm form, CUDA graph
// capture and replay mixed with eager calls, the time to plan a new m, and
// bad arguments.
#include <gtest/gtest.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "flashoverlap/flashoverlap.h"
#include "kernels/check.h"
#include "kernels/reorder.h"
#include "plan/tile_grid.h"
#include "host_cost.h"
#include "op_reference.h"
#include "rank_harness.h"
#include "runtime/core/checks.h"
#include "runtime/ops/baselines.h"
#include "runtime/tune/picks.h"

using namespace flashoverlap;
using rt::DeviceBuffer;
constexpr kernels::DType kBf16 = kernels::DType::BF16;

namespace {

using Path = GemmReduceScatterOptions::Path;
using Layout = GemmReduceScatterOptions::Layout;
const char* name(Path p) {
  return p == Path::Sequential ? "sequential" : p == Path::Slots ? "slots" : p == Path::NVLink ? "nvlink" : "auto";
}
const char* name(Layout l) { return l == Layout::Standard ? "standard" : "subtile"; }

int world_here() { return std::min(rt::hopper_device_count(), 2); }



}  // namespace

// FP8 inputs (InputType::E4M3) on every path of the standard layout, each
// scale kind, as the AllReduce's FP8 test: the output bitwise our FP8 GEMM's
// + one ncclReduceScatter; scales the options do not ask for refused.
TEST(GemmReduceScatterApi, Fp8InputsOnEveryPathMatchOurFp8GemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  std::fprintf(stderr, "world %d, seed %llu\n", world, static_cast<unsigned long long>(seed));
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 2048, n = 1536, k = 512;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DeviceBuffer out(size_t(max_m) * n * 2), ref(size_t(max_m) * n * 2), mine_rows(size_t(max_m) * n * 2);
    for (Path path : {Path::Sequential, Path::Slots, Path::Auto}) {
      for (ScaleKind kind : {ScaleKind::None, ScaleKind::PerTensor, ScaleKind::RowWise}) {
        GemmReduceScatterOptions o;
        o.path = path, o.input = InputType::E4M3, o.scales = kind;
        GemmReduceScatter op(comm, max_m, n, k, DType::BF16, o);
        std::mt19937_64 rng(seed + 10 * uint64_t(path) + uint64_t(kind));  // (the same m on every rank)
        for (int call = 0; call < 10; ++call) {
          int64_t m = call == 0 ? max_m : 1 + int64_t(rng() % uint64_t(max_m));
          m -= m % world;
          if (m == 0) m = world;
          std::mt19937_64 mine(seed + 1000 * uint64_t(call) + 17 * uint64_t(rank));
          const test::Fp8Inputs in(m, n, k, kind, mine);
          const int64_t rows = m / world;
          kernels::poison(out.get(), rows * n, st);
          op.run(in.a.get(), in.b.get(), out.get(), m, st, 0, in.scales);
          test::fp8_gemm(in.a.get(), in.b.get(), ref.get(), m, n, k, kind, in.scales, st);
          FO_NCCL_CHECK_CTX(ncclReduceScatter(ref.get(), mine_rows.get(), size_t(rows * n), ncclBfloat16, ncclSum, nccl,
                                              st),
                            "reference");
          FO_CUDA_CHECK(cudaStreamSynchronize(st));
          op.check();
          const std::string where = std::string(name(path)) + ", scales " + std::to_string(int(kind)) + ", m=" +
                                    std::to_string(m) + " rank " + std::to_string(rank) + " (" + op.plan(m) +
                                    ") seed " + std::to_string(seed);
          EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), n, mine_rows.get(), n, rows, n, st))) << where;
          EXPECT_THROW(op.run(in.a.get(), in.b.get(), out.get(), m, st, 0, in.wrong(kind)), InvalidArgument) << where;
        }
      }
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

TEST(GemmReduceScatterApi, AnyMOnEveryPathAndLayoutMatchesOurGemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  std::fprintf(stderr, "world %d, seed %llu\n", world, static_cast<unsigned long long>(seed));
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 3000, n = 2048, k = 512, ld_max = n + 8;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), out(size_t(max_m) * ld_max * 2),
        ref(size_t(max_m) * n * 2), residual(size_t(max_m) * n * 2), weight(size_t(n) * 2), y(size_t(max_m) * n * 2),
        h(size_t(max_m) * n * 2), y_ref(size_t(max_m) * n * 2);
    for (Layout layout : {Layout::Standard, Layout::SubTile})
      for (Path path : {Path::Sequential, Path::Slots, Path::Auto, Path::NVLink}) {
        if (path == Path::NVLink && layout != Layout::Standard) continue;  // (the standard layout's only)
        GemmReduceScatterOptions o;
        o.path = path, o.layout = layout;
        GemmReduceScatter op(comm, max_m, n, k, DType::BF16, o);
        ASSERT_EQ(op.world(), world);
        std::mt19937_64 rng(seed + 10 * uint64_t(path) + uint64_t(layout));  // (the same m on every rank)
        int overlapped = 0;
        const int calls = 80;  // (more distinct m than the op keeps: api::kOpsKept = 64, the oldest go)
        for (int call = 0; call < calls; ++call) {
          int64_t m = call % 20 == 0 ? max_m : world + int64_t(rng() % uint64_t(max_m - world));
          if (layout == Layout::Standard) m -= m % world;
          const int64_t ld = rng() % 4 == 0 ? ld_max : n;
          const int64_t rows = op.rows_out(m);
          const uint64_t sd = seed + 1000 * uint64_t(call) + 17 * uint64_t(rank);
          kernels::fill_random(kBf16, a.get(), m * k, sd, -1.f, 1.f, st);
          kernels::fill_random(kBf16, b.get(), n * k, sd + 1, -1.f, 1.f, st);
          kernels::poison(out.get(), rows * ld, st);
          op.run(a.get(), b.get(), out.get(), m, st, ld);
          test::op_reference(op.plan(m), a.get(), b.get(), ref.get(), m, n, k, nccl, st);
          FO_CUDA_CHECK(cudaStreamSynchronize(st));
          op.check();
          const std::string plan = op.plan(m);
          overlapped += plan.rfind("slots", 0) == 0;
          EXPECT_EQ(plan.rfind("nvlink", 0) == 0, path == Path::NVLink) << plan;
          const std::string where = std::string(name(path)) + "/" + name(layout) + " m=" + std::to_string(m) +
                                    " ld=" + std::to_string(ld) + " rank " + std::to_string(rank) + " (" + plan +
                                    ") seed " + std::to_string(seed);
          const std::vector<int64_t> held = op.rows(m);
          ASSERT_EQ(int64_t(held.size()), rows) << where;
          if (layout == Layout::Standard) EXPECT_EQ(held.front(), rank * (m / world)) << where;
          EXPECT_TRUE(test::rows_equal(out.get(), ld, ref.get(), m, n, held)) << where;
          if (call % 10 == 3) {  // the RMSNorm form: the rows just checked, then the row-wise step
            const float eps = 1e-5f;
            kernels::fill_random(kBf16, residual.get(), rows * n, sd + 2, -1.f, 1.f, st);
            kernels::fill_random(kBf16, weight.get(), n, sd + 3, 0.5f, 1.5f, st);
            op.run(a.get(), b.get(), out.get(), m, st);  // (contiguous: the rows the reference norms)
            kernels::add_rmsnorm_rows(kBf16, out.get(), int32_t(rows), int32_t(n), residual.get(), weight.get(), eps,
                                      y_ref.get(), nullptr, st);
            op.run_rmsnorm(a.get(), b.get(), residual.get(), weight.get(), eps, y.get(), h.get(), m, st);
            FO_CUDA_CHECK(cudaStreamSynchronize(st));
            EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, y.get(), n, y_ref.get(), n, rows, n, st)))
                << where << " (RMSNorm)";
          }
        }
        if (path == Path::Slots) EXPECT_GT(overlapped, calls / 2) << name(path) << "/" << name(layout);
        if (path == Path::Sequential) EXPECT_EQ(overlapped, 0);
      }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// Replays of a captured call mixed with eager calls (another m, another
// stream), each with fresh inputs, every output the reference of its inputs.
TEST(GemmReduceScatterApi, GraphReplaysMixedWithEagerCalls) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 2048, n = 4096, k = 1024, m = 1900, m2 = 778;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st, st2;
    cudaEvent_t ev;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
    FO_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), out(size_t(max_m) * n * 2), ref(size_t(max_m) * n * 2);
    for (Path path : {Path::Sequential, Path::Slots}) {
      GemmReduceScatterOptions o;
      o.path = path;
      GemmReduceScatter op(comm, max_m, n, k, DType::BF16, o);
      op.prepare(m);
      op.prepare(m2);
      kernels::fill_random(kBf16, b.get(), n * k, seed + 1 + rank, -1.f, 1.f, st);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      FO_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      op.run(a.get(), b.get(), out.get(), m, st);
      FO_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
      FO_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      // 0 replay, 1 eager, 2 eager of another m, 3 eager on another stream
      const std::vector<int> kinds = {0, 1, 0, 0, 2, 0, 3, 0, 1};
      for (size_t i = 0; i < kinds.size(); ++i) {
        const int64_t mm = kinds[i] == 2 ? m2 : m;
        kernels::fill_random(kBf16, a.get(), mm * k, seed + 100 * i + 7 * uint64_t(rank), -1.f, 1.f, st);
        kernels::poison(out.get(), op.rows_out(mm) * n, st);
        if (kinds[i] == 0) {
          FO_CUDA_CHECK(cudaGraphLaunch(exec, st));
        } else if (kinds[i] == 3) {
          FO_CUDA_CHECK(cudaEventRecord(ev, st));
          FO_CUDA_CHECK(cudaStreamWaitEvent(st2, ev, 0));
          op.run(a.get(), b.get(), out.get(), mm, st2);
          FO_CUDA_CHECK(cudaEventRecord(ev, st2));
          FO_CUDA_CHECK(cudaStreamWaitEvent(st, ev, 0));
        } else {
          op.run(a.get(), b.get(), out.get(), mm, st);
        }
        test::op_reference(op.plan(mm), a.get(), b.get(), ref.get(), mm, n, k, nccl, st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
        EXPECT_TRUE(test::rows_equal(out.get(), n, ref.get(), mm, n, op.rows(mm)))
            << name(path) << " launch " << i << " kind " << kinds[i] << " rank " << rank << " seed " << seed << " ("
            << op.plan(mm) << ")";
      }
      FO_CUDA_CHECK(cudaGraphExecDestroy(exec));
      FO_CUDA_CHECK(cudaGraphDestroy(graph));
      // An m not planned yet is refused under capture, with the way out named.
      FO_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      try {
        op.run(a.get(), b.get(), out.get(), 556, st);
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

// The time to plan (and make the op of) an m not seen before, on the host.
// Printed; asserted only as a hang guard.
// Auto with a tuning cache (rank 0's file): each m of a stored tile rows runs
// its pick (slots with the stored groups, the NVLink form with its windows
// built at construction, sequential with cuBLAS's GEMM), every m of other
// tile rows the model's plan; every output the reference's (bitwise, cuBLAS
// within its tolerance).
TEST(GemmReduceScatterApi, TuningCachePicksRunAsStored) {
  REQUIRE_HOPPER();
  const int world = world_here();
  const int64_t max_m = 3072, n = 2048, k = 512;
  const std::string path = "/tmp/fo_test_rs_picks_" + std::to_string(::getpid()) + ".json";
  std::remove(path.c_str());
  {
    using P = rt::ReduceScatterPick::Path;
    rt::PickKey key;
    int dev = 0;
    FO_CUDA_CHECK(cudaGetDevice(&dev));
    key.gpu = rt::device_info(dev).name, key.sms = rt::current_device_sms(), key.world = world;
    key.n = n, key.k = k, key.op = rt::reducescatter_op(plan::RsLayout::Standard);
    rt::PickCache cache(path);
    rt::ReduceScatterPick slots;
    slots.path = P::Slots, slots.bm = 128, slots.bn = 128, slots.nccl_sms = 8;
    key.tile_rows = 16;  // m in (1920, 2048]
    const int waves = plan::make_schedule(16 * 128, n, {128, 128}, key.sms - 8, plan::Raster::AlongN, 1).waves();
    ASSERT_GE(waves, 2);
    slots.waves = {waves - 1, 1};
    cache.store(key, slots);
    rt::ReduceScatterPick nvlink;
    nvlink.path = P::NVLink, nvlink.bn = 256;
    key.tile_rows = 8;  // m in (896, 1024]
    cache.store(key, nvlink);
    rt::ReduceScatterPick cublas;
    cublas.path = P::Sequential, cublas.bn = 256, cublas.cublas = true;
    key.tile_rows = 24;  // m in (2944, 3072]
    cache.store(key, cublas);
  }
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    GemmReduceScatterOptions o;
    o.tuning_cache = rank == 0 ? path : "/nonexistent/only-rank-0s-file-counts.json";
    GemmReduceScatter op(comm, max_m, n, k, DType::BF16, o);
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), out(size_t(max_m) * n * 2), ref(size_t(max_m) * n * 2);
    const int64_t ms[] = {2048, 1024 - 2 * world, 3072 - 4 * world, 512, 2000 / world * world, 1024};
    for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); ++i) {
      const int64_t m = ms[i] / world * world, rows = op.rows_out(m);
      kernels::fill_random(kBf16, a.get(), m * k, 100 + i + 7 * uint64_t(rank), -1.f, 1.f, st);
      kernels::fill_random(kBf16, b.get(), n * k, 200 + i + 7 * uint64_t(rank), -1.f, 1.f, st);
      kernels::poison(out.get(), rows * n, st);
      op.run(a.get(), b.get(), out.get(), m, st);
      test::op_reference(op.plan(m), a.get(), b.get(), ref.get(), m, n, k, nccl, st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      op.check();
      const std::string plan = op.plan(m), where = "m=" + std::to_string(m) + " rank " + std::to_string(rank) + ": " + plan;
      const int64_t tile_rows = (m + 127) / 128;
      const bool picked = tile_rows == 16 || tile_rows == 8 || tile_rows == 24;
      EXPECT_EQ(plan.find("the tuning cache's pick") != std::string::npos, picked) << where;
      if (tile_rows == 16) EXPECT_EQ(plan.rfind("slots", 0), 0u) << where;
      if (tile_rows == 16) EXPECT_NE(plan.find("128x128 tiles"), std::string::npos) << where;
      if (tile_rows == 8) EXPECT_EQ(plan.rfind("nvlink", 0), 0u) << where;
      if (tile_rows == 24) EXPECT_NE(plan.find("cuBLAS's GEMM"), std::string::npos) << where;
      const std::vector<int64_t> held = op.rows(m);
      if (tile_rows == 24) {  // (cuBLAS's sums: within the GEMM's tolerance of ours)
        const char* mine = static_cast<const char*>(ref.get()) + size_t(held.front()) * n * 2;
        EXPECT_TRUE(kernels::compare(kBf16, out.get(), n, mine, n, rows, n, st, kernels::gemm_tolerance(kBf16, k)).within())
            << where;
      } else {
        EXPECT_TRUE(test::rows_equal(out.get(), n, ref.get(), m, n, held)) << where;
      }
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
  std::remove(path.c_str());
  std::remove((path + ".lock").c_str());
}

// What a sequential call costs the host, against cublasGemmEx + one
// ncclReduceScatter: at most 3 us more per call (host_cost.h), also where
// cuBLAS splits k (two kernels: m 1 and 32 of 4096x4096).
TEST(GemmReduceScatterApi, SequentialCallHostCost) {
  REQUIRE_HOPPER();
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t n = 4096, k = 4096, max_m = 512;
    GemmReduceScatter op(comm, max_m, n, k, DType::BF16);
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), c(size_t(max_m) * n * 2), out(size_t(max_m) * n * 2),
        out2(size_t(max_m) * n * 2);
    rt::CublasGemm gemm_ex(rt::CublasGemm::Api::GemmEx);
    test::expect_host_cost_within_3us(
        "cublasGemmEx + ncclReduceScatter", "GemmReduceScatter", {1, 32, 512},
        [&](int64_t m) {
          rt::sequential_cublas_reducescatter(gemm_ex, kBf16, a.get(), b.get(), c.get(), out2.get(), int(m), int(n),
                                              int(k), nccl, st);
        },
        [&](int64_t m) { op.run(a.get(), b.get(), out.get(), m, st); }, [&](int64_t m) { return op.plan(m); }, st);
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

TEST(GemmReduceScatterApi, PlanningANewMIsFast) {
  REQUIRE_HOPPER();
  const int world = world_here();
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    GemmReduceScatter op(comm, 16384, 8192, 8192, DType::BF16);
    std::vector<double> ms;
    for (int i = 0; i < 20; ++i) {
      const int64_t m = (16384 - 2 * 131 * i) / world * world;
      const auto t0 = std::chrono::steady_clock::now();
      op.prepare(m);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    if (rank == 0)
      std::fprintf(stderr, "GemmReduceScatter 16384x8192x8192, world %d: planning a new m %.3f ms median, %.3f max (%s)\n",
                   world, ms[ms.size() / 2], ms.back(), op.plan(16384 / world * world).c_str());
    EXPECT_LT(ms[ms.size() / 2], 50.0);
  });
}

TEST(GemmReduceScatterApi, BadArgumentsAreRefusedWithTheirReason) {
  REQUIRE_HOPPER();
  const int world = world_here();
  test::on_each_rank(world, [&](int, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    auto message = [](auto&& f) -> std::string {
      try {
        f();
      } catch (const InvalidArgument& e) {
        return e.what();
      }
      return "(nothing thrown)";
    };
    EXPECT_NE(message([&] { GemmReduceScatter(comm, 1024, 512, 100, DType::BF16); }).find("multiple of 8"),
              std::string::npos);
    GemmReduceScatterOptions bad;
    bad.nccl_sms = 0;
    EXPECT_NE(message([&] { GemmReduceScatter(comm, 1024, 512, 64, DType::BF16, bad); }).find("nccl_sms"),
              std::string::npos);
    GemmReduceScatter op(comm, 1024, 512, 64, DType::BF16);
    DeviceBuffer a(1024 * 64 * 2), b(512 * 64 * 2), out(1024 * 512 * 2);
    EXPECT_NE(message([&] { op.run(a.get(), b.get(), out.get(), 1025, nullptr); }).find("max_m"), std::string::npos);
    EXPECT_NE(message([&] { op.run(a.get(), b.get(), out.get(), 0, nullptr); }).find("max_m"), std::string::npos);
    EXPECT_NE(message([&] { op.run(nullptr, b.get(), out.get(), 64, nullptr); }).find("null"), std::string::npos);
    EXPECT_NE(message([&] { op.run(a.get(), b.get(), out.get(), 64, nullptr, 100); }).find("ld_out"), std::string::npos);
    if (world == 2)
      EXPECT_NE(message([&] { op.run(a.get(), b.get(), out.get(), 101, nullptr); }).find("multiple of the world"),
                std::string::npos);
  });
}

// The sub-tile chain equals the standard one: ReduceScatter -> residual +
// RMSNorm -> AllGather (+ the sub-tile layout's row exchange) gives the same
// full rows, bitwise, where the residual each op gets is the previous
// layer's output in its own layout's rows.
TEST(GemmReduceScatterApi, SubTileChainEqualsTheStandardChain) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_m = 2048, n = 1024, k = 256;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    GemmReduceScatterOptions so, to;
    so.path = to.path = Path::Slots;
    to.layout = Layout::SubTile;
    GemmReduceScatter standard(comm, max_m, n, k, DType::BF16, so), subtile(comm, max_m, n, k, DType::BF16, to);
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), residual(size_t(max_m) * n * 2),
        mine(size_t(max_m) * n * 2), y(size_t(max_m) * n * 2), weight(size_t(n) * 2), full_std(size_t(max_m) * n * 2),
        full_sub(size_t(max_m) * n * 2);
    std::mt19937_64 rng(seed);
    for (int call = 0; call < 12; ++call) {
      int64_t m = world + int64_t(rng() % uint64_t(max_m - world));
      m -= m % world;
      const uint64_t sd = seed + 100 * uint64_t(call);
      kernels::fill_random(kBf16, a.get(), m * k, sd + uint64_t(rank), -1.f, 1.f, st);
      kernels::fill_random(kBf16, b.get(), n * k, sd + 10 + uint64_t(rank), -1.f, 1.f, st);
      kernels::fill_random(kBf16, residual.get(), m * n, sd + 20, -1.f, 1.f, st);  // (the same on every rank)
      kernels::fill_random(kBf16, weight.get(), n, sd + 30, 0.5f, 1.5f, st);
      std::vector<uint16_t> res(size_t(m) * size_t(n)), part;
      FO_CUDA_CHECK(cudaMemcpyAsync(res.data(), residual.get(), res.size() * 2, cudaMemcpyDeviceToHost, st));
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      const float eps = 1e-6f;
      for (GemmReduceScatter* op : {&standard, &subtile}) {
        part.clear();  // this rank's rows of the residual, in the op's layout
        for (int64_t row : op->rows(m)) part.insert(part.end(), res.begin() + row * n, res.begin() + (row + 1) * n);
        FO_CUDA_CHECK(cudaMemcpyAsync(mine.get(), part.data(), part.size() * 2, cudaMemcpyHostToDevice, st));
        op->run_rmsnorm(a.get(), b.get(), mine.get(), weight.get(), eps, y.get(), nullptr, m, st);
        op->all_gather_rows(y.get(), op == &standard ? full_std.get() : full_sub.get(), m, st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));  // (part is reused)
      }
      standard.check(), subtile.check();
      EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, full_sub.get(), n, full_std.get(), n, m, n, st)))
          << "m=" << m << " rank " << rank << " seed " << seed << " (" << subtile.plan(m) << ")";
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
