// GPU tests of flashoverlap::GemmAllToAll (include/flashoverlap/
// flashoverlap.h) on every local GPU up to 2 (one GPU: a communicator of one
// rank): a new routing every call on every path, combined and unweighted,
// against our GEMM + the baseline's ncclSend/ncclRecv + the combine kernel
// (bitwise); bad routings refused on every rank.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashoverlap/flashoverlap.h"
#include "kernels/check.h"
#include "plan/routing.h"
#include "plan/tile_grid.h"
#include "rank_harness.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/baselines_alltoall.h"

using namespace flashoverlap;
using rt::DeviceBuffer;
constexpr kernels::DType kBf16 = kernels::DType::BF16;

namespace {

using Path = GemmAllToAllOptions::Path;
const char* name(Path p) {
  return p == Path::Sequential ? "sequential" : p == Path::Slots ? "slots" : p == Path::NVLink ? "nvlink" : "auto";
}
int world_here() { return std::min(rt::hopper_device_count(), 2); }

// This rank's part of a routing, as the op takes it (host arrays kept here).
struct Local {
  std::vector<int64_t> send, recv;
  AllToAllRouting r;
  Local(const plan::MoeRouting& routing, int rank) {
    for (int d = 0; d < routing.world; ++d) send.push_back(routing.send_count(rank, d));
    for (int s = 0; s < routing.world; ++s) recv.push_back(routing.send_count(s, rank));
    r.rows = routing.rows(rank);
    r.dest_rank = routing.dest_rank[size_t(rank)].data();
    r.dest_token = routing.dest_token[size_t(rank)].data();
    r.gate = routing.gate[size_t(rank)].data();
    r.tokens = routing.tokens[size_t(rank)];
    r.send_counts = send.data(), r.recv_counts = recv.data();
  }
};

}  // namespace

TEST(GemmAllToAllApi, ANewRoutingEveryCallOnEveryPathMatchesOurGemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  std::fprintf(stderr, "world %d, seed %llu\n", world, static_cast<unsigned long long>(seed));
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_tokens = 1200, n = 4096, k = 256;  // (most calls 2 waves or more on the overlap grid)
    const int topk = world;
    const int64_t max_rows = max_tokens * topk * world;  // (every token of every rank could pick this one)
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t recv_max = max_tokens * topk;
    DeviceBuffer a(size_t(max_rows) * k * 2), b(size_t(n) * k * 2), y(size_t(max_rows) * n * 2),
        out(size_t(recv_max) * (n + 8) * 2), ref(size_t(recv_max) * n * 2), rows_ref(size_t(recv_max) * n * 2),
        tokens(size_t(recv_max) * 4);
    static const char* kinds[] = {"uniform", "zipf:1.2", "one:0", "empty:1"};
    rt::CublasGemm cublas;
    for (Path path : {Path::Sequential, Path::Slots, Path::Auto, Path::NVLink}) {
      GemmAllToAllOptions o;
      o.path = path;
      GemmAllToAll op(comm, max_rows, max_tokens, topk, n, k, DType::BF16, o);
      ASSERT_EQ(op.world(), world);
      std::mt19937_64 rng(seed + 10 * uint64_t(path));  // (the same routings on every rank)
      int overlapped = 0, nvlinked = 0, by_cublas_calls = 0;
      for (int call = 0; call < 16; ++call) {
        std::string kind = kinds[rng() % 4];
        if (kind == "empty:1" && topk >= world) kind = "zipf:3";  // (K distinct of W leave no rank out)
        // (every other call the most tokens: 2 waves or more, so that the slots path overlaps)
        const int64_t t = call % 2 == 0 ? max_tokens : int64_t(rng() % uint64_t(max_tokens + 1));
        const plan::MoeRouting routing = plan::make_moe_routing(kind, world, t, topk, rng());
        const Local local(routing, rank);
        const int64_t rows = local.r.rows, recv = std::accumulate(local.recv.begin(), local.recv.end(), int64_t{0});
        const bool combine = call % 3 != 1;
        const int64_t ld = call % 4 == 3 ? n + 8 : n;
        const uint64_t sd = seed + 1000 * uint64_t(call) + 17 * uint64_t(rank);
        kernels::fill_random(kBf16, a.get(), std::max<int64_t>(rows, 1) * k, sd, -1.f, 1.f, st);
        kernels::fill_random(kBf16, b.get(), n * k, sd + 1, -1.f, 1.f, st);
        kernels::poison(out.get(), recv_max * (n + 8), st);
        op.run(a.get(), b.get(), local.r, out.get(), st, combine, ld, combine ? nullptr : tokens.as<int32_t>());
        overlapped += op.last_plan().rfind("slots", 0) == 0, nvlinked += op.last_plan().rfind("nvlink", 0) == 0;
        // The reference: the op's GEMM (ours on the full grid, or cuBLAS's where its
        // sequential call took it), the baseline's all-to-all, its combine.
        rt::MoeCombineBaseline base(routing, rank, n, kBf16, nccl);
        const bool by_cublas = op.last_plan().find("cuBLAS") != std::string::npos;
        by_cublas_calls += by_cublas;
        if (rows > 0 && by_cublas) {
          cublas.run(kBf16, a.get(), b.get(), y.get(), int(rows), int(n), int(k), n, st);
        } else if (rows > 0) {
          const plan::Schedule s = plan::make_schedule(rows, n, {128, 256}, rt::current_device_sms(),
                                                       plan::Raster::AlongN, 8);
          kernels::launch_gemm(kernels::plain_gemm(kBf16, a.get(), b.get(), s, int(k), y.get(), n), st);
        }
        base.all_to_all(y.get(), rows_ref.get(), st);
        base.combine(rows_ref.get(), ref.get(), st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
        const std::string where = std::string(name(path)) + " path, call " + std::to_string(call) + ", " + kind +
                                  ", " + std::to_string(t) + " tokens, rank " + std::to_string(rank) + " (" +
                                  std::to_string(rows) + " rows, " + std::to_string(recv) + " received), " +
                                  (combine ? "combined" : "unweighted") + ", plan " + op.last_plan() + ", seed " +
                                  std::to_string(seed);
        const int64_t out_rows = combine ? t : recv;
        if (out_rows > 0)
          EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), ld, (combine ? ref : rows_ref).get(), n,
                                                     out_rows, n, st)))
              << where;
        if (!combine && recv > 0) {
          std::vector<int32_t> got(static_cast<size_t>(recv));
          FO_CUDA_CHECK(cudaMemcpy(got.data(), tokens.get(), got.size() * 4, cudaMemcpyDeviceToHost));
          std::vector<int32_t> want;
          for (int s = 0; s < world; ++s)
            for (int64_t i = 0; i < routing.rows(s); ++i)
              if (routing.dest_rank[size_t(s)][size_t(i)] == rank) want.push_back(routing.dest_token[size_t(s)][size_t(i)]);
          EXPECT_EQ(got, want) << where << " (tokens)";
        }
      }
      if (path == Path::Slots) EXPECT_GE(overlapped, 8) << "the slots path overlapped too rarely";
      if (path == Path::Sequential) EXPECT_EQ(overlapped, 0);
      EXPECT_EQ(nvlinked, path == Path::NVLink ? 16 : 0) << name(path) << " path";
      if (path == Path::Sequential) std::fprintf(stderr, "sequential path: %d of 16 calls by cuBLAS\n", by_cublas_calls);
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

TEST(GemmAllToAllApi, BadRoutingsAreRefusedOnEveryRank) {
  REQUIRE_HOPPER();
  const int world = world_here();
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const Communicator comm = Communicator::adopt(nccl);
    const int64_t n = 256, k = 64, max_tokens = 100;
    GemmAllToAll op(comm, 400, max_tokens, 1, n, k, DType::BF16);
    DeviceBuffer a(400 * k * 2), b(n * k * 2), out(400 * n * 2);
    const plan::MoeRouting routing = plan::make_moe_routing("uniform", world, 50, 1, 7);
    // Rank 0's send_counts disagree with its dest_rank: every rank throws.
    {
      Local local(routing, rank);
      if (rank == 0) local.send[0] += 1;
      EXPECT_THROW(op.run(a.get(), b.get(), local.r, out.get(), nullptr), InvalidArgument);
    }
    // A token beyond max_tokens, rows beyond max_rows: refused.
    {
      Local local(routing, rank);
      local.r.tokens = max_tokens + 1;
      EXPECT_THROW(op.run(a.get(), b.get(), local.r, out.get(), nullptr), InvalidArgument);
    }
    // A bad ld_out or a null output on one rank: refused on every rank.
    {
      const Local local(routing, rank);
      EXPECT_THROW(op.run(a.get(), b.get(), local.r, out.get(), nullptr, true, rank == 0 ? n - 1 : 0), InvalidArgument);
      EXPECT_THROW(op.run(a.get(), b.get(), local.r, rank == 0 ? nullptr : out.get(), nullptr), InvalidArgument);
      if (world > 1)  // ranks that disagree on combining
        EXPECT_THROW(op.run(a.get(), b.get(), local.r, out.get(), nullptr, rank == 0), InvalidArgument);
    }
    // The op still runs a good routing after refusals.
    const Local good(routing, rank);
    op.run(a.get(), b.get(), good.r, out.get(), nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    op.check();
    // Shapes the op cannot take.
    EXPECT_THROW(GemmAllToAll(comm, 0, 10, 1, n, k, DType::BF16), InvalidArgument);
    EXPECT_THROW(GemmAllToAll(comm, 10, 10, world + 1, n, k, DType::BF16), InvalidArgument);
    EXPECT_THROW(GemmAllToAll(comm, 10, 10, 1, n, 60, DType::BF16), InvalidArgument);
    GemmAllToAllOptions nv;
    nv.path = Path::NVLink;
    EXPECT_THROW(GemmAllToAll(comm, 10, 10, 1, 1001, k, DType::BF16, nv), InvalidArgument);  // (n % 8 != 0)
  });
}
