// GPU tests of flashoverlap::GemmAllToAll (include/flashoverlap/
// flashoverlap.h) on every local GPU up to 2 (one GPU: a communicator of one
// rank): a new routing every call on every path, combined and unweighted,
// against our GEMM + the baseline's ncclSend/ncclRecv + the combine kernel
// (bitwise); bad routings refused on every rank.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashoverlap/flashoverlap.h"
#include "kernels/check.h"
#include "op_reference.h"
#include "plan/grouped.h"
#include "plan/routing.h"
#include "plan/tile_grid.h"
#include "rank_harness.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/baselines_alltoall.h"
#include "runtime/tune/host_gate.h"

using namespace flashoverlap;
using rt::DeviceBuffer;
constexpr kernels::DType kBf16 = kernels::DType::BF16;

namespace {

using Path = GemmAllToAllOptions::Path;
const char* name(Path p) {
  return p == Path::Sequential ? "sequential" : p == Path::Slots ? "slots" : p == Path::NVLink ? "nvlink" : "auto";
}
int world_here() { return std::min(rt::hopper_device_count(), 2); }

// This rank's part of a routing, as the op takes it (host arrays kept here;
// with several experts, its rows per (source, expert)).
struct Local {
  std::vector<int64_t> send, recv;
  AllToAllRouting r;
  Local(const plan::MoeRouting& routing, int rank) {
    for (int d = 0; d < routing.world; ++d) send.push_back(routing.send_count(rank, d));
    for (int s = 0; s < routing.world; ++s) recv.push_back(routing.send_count(s, rank));
    if (routing.experts > 1) r.expert_counts = routing.expert_rows[size_t(rank)].data();
    r.rows = routing.rows(rank);
    r.dest_rank = routing.dest_rank[size_t(rank)].data();
    r.dest_token = routing.dest_token[size_t(rank)].data();
    r.gate = routing.gate[size_t(rank)].data();
    r.tokens = routing.tokens[size_t(rank)];
    r.send_counts = send.data(), r.recv_counts = recv.data();
  }
};

// A call's GEMM operands: A (rows x k) and B (n x k, or experts x n x k).
struct Operands {
  const DeviceBuffer &a, &b;
  int64_t rows, n, k;
};

// The reference of a call: each of this rank's segments (one expert's rows;
// with one expert, every row) times its expert's weight by the GEMM the
// call's plan names (cuBLAS's where by_cublas, through `cublas`, or ours on
// the full grid) into y, the baseline's all-to-all into rows_ref and its
// combine into ref (st synchronised: the baseline's tables go with it).
void reference(bool by_cublas, const plan::MoeRouting& routing, int rank, ncclComm_t nccl, rt::CublasGemm& cublas,
               const Operands& o, const DeviceBuffer& y, const DeviceBuffer& rows_ref, const DeviceBuffer& ref,
               cudaStream_t st) {
  rt::MoeCombineBaseline base(routing, rank, o.n, kBf16, nccl);
  for (const plan::RowSegment& seg : plan::moe_segments(routing, rank)) {
    const char* a = o.a.as<char>() + seg.a_row0 * o.k * 2;
    const char* b = o.b.as<char>() + int64_t{seg.expert} * o.n * o.k * 2;
    char* c = y.as<char>() + seg.a_row0 * o.n * 2;
    if (by_cublas) {
      cublas.run(kBf16, a, b, c, int(seg.rows), int(o.n), int(o.k), o.n, st);
    } else {
      const plan::Schedule s = plan::make_schedule(seg.rows, o.n, {128, 256}, rt::current_device_sms(),
                                                   plan::Raster::AlongN, 8);
      kernels::launch_gemm(kernels::plain_gemm(kBf16, a, b, s, int(o.k), c, o.n), st);
    }
  }
  base.all_to_all(y.get(), rows_ref.get(), st);
  base.combine(rows_ref.get(), ref.get(), st);
  FO_CUDA_CHECK(cudaStreamSynchronize(st));
}

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
        by_cublas_calls += op.last_plan().find("cuBLAS") != std::string::npos;
        const Operands ops{a, b, rows, n, k};
        reference(op.last_plan().find("cuBLAS") != std::string::npos, routing, rank, nccl, cublas, ops, y, rows_ref,
                  ref, st);
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

// FP8 inputs (e4m3 small integers, power-of-two scales: every sum exact in
// fp32, so any GEMM's product rounds alike) with each scale kind, on every
// path, a new routing every call: against our FP8 GEMM + the baseline's
// all-to-all and combine, bitwise; scales that do not fit the kind refused
// on every rank.
TEST(GemmAllToAllApi, Fp8InputsOnEveryPathMatchOurFp8GemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  std::fprintf(stderr, "world %d, seed %llu\n", world, static_cast<unsigned long long>(seed));
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_tokens = 700, n = 2048, k = 256;
    const int topk = world;
    const int64_t max_rows = max_tokens * topk * world, recv_max = max_tokens * topk;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DeviceBuffer y(size_t(max_rows) * n * 2), out(size_t(recv_max) * n * 2), ref(size_t(recv_max) * n * 2),
        rows_ref(size_t(recv_max) * n * 2);
    for (ScaleKind kind : {ScaleKind::None, ScaleKind::PerTensor, ScaleKind::RowWise}) {
      std::mt19937_64 data(seed + 7 * uint64_t(kind) + 101 * uint64_t(rank));
      const test::Fp8Inputs in(max_rows, n, k, kind, data);
      for (Path path : {Path::Sequential, Path::Slots, Path::Auto, Path::NVLink}) {
        GemmAllToAllOptions o;
        o.path = path, o.input = InputType::E4M3, o.scales = kind;
        GemmAllToAll op(comm, max_rows, max_tokens, topk, n, k, DType::BF16, o);
        std::mt19937_64 rng(seed + 10 * uint64_t(path) + uint64_t(kind));  // (the same routings on every rank)
        for (int call = 0; call < 4; ++call) {
          const int64_t t = call % 2 == 0 ? max_tokens : int64_t(rng() % uint64_t(max_tokens + 1));
          const plan::MoeRouting routing = plan::make_moe_routing(call == 3 ? "zipf:1.2" : "uniform", world, t, topk,
                                                                  rng());
          const Local local(routing, rank);
          const int64_t rows = local.r.rows;
          kernels::poison(out.get(), recv_max * n, st);
          op.run(in.a.get(), in.b.get(), local.r, out.get(), st, true, 0, nullptr, in.scales);
          rt::MoeCombineBaseline base(routing, rank, n, kBf16, nccl);
          if (rows > 0) test::fp8_gemm(in.a.get(), in.b.get(), y.get(), rows, n, k, kind, in.scales, st);
          base.all_to_all(y.get(), rows_ref.get(), st);
          base.combine(rows_ref.get(), ref.get(), st);
          FO_CUDA_CHECK(cudaStreamSynchronize(st));
          op.check();
          const std::string where = std::string(name(path)) + " path, scales " + std::to_string(int(kind)) +
                                    ", call " + std::to_string(call) + ", " + std::to_string(t) + " tokens, rank " +
                                    std::to_string(rank) + " (" + std::to_string(rows) + " rows), plan " +
                                    op.last_plan() + ", seed " + std::to_string(seed);
          if (t > 0)
            EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), n, ref.get(), n, t, n, st))) << where;
          EXPECT_EQ(op.last_plan().find("128x256"), std::string::npos) << where << " (FP8: 128x192 or 128x128 tiles)";
        }
        // The scales must fit the kind: refused on every rank, and the op goes on.
        const plan::MoeRouting routing = plan::make_moe_routing("uniform", world, max_tokens, topk, seed);
        const Local local(routing, rank);
        try {
          op.run(in.a.get(), in.b.get(), local.r, out.get(), st, true, 0, nullptr, in.wrong(kind));
          ADD_FAILURE() << name(path) << " path: scales that do not fit kind " << int(kind) << " were taken";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("scale"), std::string::npos) << e.what();
        }
        op.run(in.a.get(), in.b.get(), local.r, out.get(), st, true, 0, nullptr, in.scales);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
      }
    }
    // FP8 inputs take one expert per rank.
    GemmAllToAllOptions o;
    o.input = InputType::E4M3, o.experts = 2;
    EXPECT_THROW(GemmAllToAll(comm, max_rows, max_tokens, topk, n, k, DType::BF16, o), InvalidArgument);
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// Several experts per rank (b of [E, n, k], rows by (source, expert)): on
// the Sequential, Slots, Auto and NVLink paths, combined and unweighted, each
// segment's rows times its expert's weight by our plain GEMM + the
// baseline's all-to-all and combine, bitwise; ragged cases (experts without
// rows, every row to one rank) among the routings; bad expert counts refused.
TEST(GemmAllToAllApi, SeveralExpertsPerRankMatchEachExpertsGemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const int world = world_here();
  std::fprintf(stderr, "world %d, seed %llu\n", world, static_cast<unsigned long long>(seed));
  test::on_each_rank(world, [&](int rank, ncclComm_t nccl) {
    const int64_t max_tokens = 900, n = 2048, k = 256;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    static const char* kinds[] = {"uniform", "zipf:1.2", "one:0"};
    rt::CublasGemm cublas_ex(rt::CublasGemm::Api::GemmEx);  // (the grouped GEMM's per-expert loop's)
    int calls = 0, overlapped = 0, idle_experts = 0;
    for (int E : {2, 3, 4}) {
      const int topk = std::min(world * E - 1, 3);  // (fewer than the experts: some get no rows)
      const int64_t max_rows = max_tokens * topk * world, recv_max = max_tokens * topk;
      DeviceBuffer a(size_t(max_rows) * k * 2), b(size_t(E) * n * k * 2), y(size_t(max_rows) * n * 2),
          out(size_t(recv_max) * (n + 8) * 2), ref(size_t(recv_max) * n * 2), rows_ref(size_t(recv_max) * n * 2),
          tokens(size_t(recv_max) * 4);
      for (Path path : {Path::Sequential, Path::Slots, Path::Auto, Path::NVLink}) {
        GemmAllToAllOptions o;
        o.path = path, o.experts = E;
        GemmAllToAll op(comm, max_rows, max_tokens, topk, n, k, DType::BF16, o);
        ASSERT_EQ(op.experts(), E);
        std::mt19937_64 rng(seed + 10 * uint64_t(path) + 1000 * uint64_t(E));  // (the same routings on every rank)
        for (int call = 0; call < 6; ++call, ++calls) {
          const std::string kind = kinds[rng() % 3];
          // (call 5: one or two tokens, whose picks leave experts without rows)
          const int64_t t = call % 2 == 0 ? max_tokens : call == 5 ? 1 + int64_t(rng() % 2)
                                                                   : int64_t(rng() % uint64_t(max_tokens + 1));
          const plan::MoeRouting routing = plan::make_moe_routing(kind, world, t, topk, rng(), E);
          const Local local(routing, rank);
          for (int64_t c : routing.expert_rows[size_t(rank)]) idle_experts += c == 0;
          const int64_t rows = local.r.rows, recv = std::accumulate(local.recv.begin(), local.recv.end(), int64_t{0});
          const bool combine = call % 3 != 1;
          const int64_t ld = call % 4 == 3 ? n + 8 : n;
          const uint64_t sd = seed + 1000 * uint64_t(call) + 17 * uint64_t(rank);
          kernels::fill_random(kBf16, a.get(), std::max<int64_t>(rows, 1) * k, sd, -1.f, 1.f, st);
          kernels::fill_random(kBf16, b.get(), E * n * k, sd + 1, -1.f, 1.f, st);
          kernels::poison(out.get(), recv_max * (n + 8), st);
          op.run(a.get(), b.get(), local.r, out.get(), st, combine, ld, combine ? nullptr : tokens.as<int32_t>());
          overlapped += op.last_plan().rfind("slots", 0) == 0;
          // The reference: each segment's rows times its expert's weight (the GEMM the plan names: ours on the
          // full grid, or cuBLAS's per expert), then the baseline's all-to-all and combine; out against it.
          auto expect_reference = [&](const std::string& what) {
            reference(op.last_plan().find("cuBLAS's GEMM per expert") != std::string::npos, routing, rank, nccl,
                      cublas_ex, Operands{a, b, rows, n, k}, y, rows_ref, ref, st);
            op.check();
            const std::string where = std::string(name(path)) + " path, " + what + ", " + std::to_string(E) +
                                      " experts, call " + std::to_string(call) + ", " + kind + ", " +
                                      std::to_string(t) + " tokens, rank " + std::to_string(rank) + " (" +
                                      std::to_string(rows) + " rows, " + std::to_string(recv) + " received), " +
                                      (combine ? "combined" : "unweighted") + ", plan " + op.last_plan() + ", seed " +
                                      std::to_string(seed);
            const int64_t out_rows = combine ? t : recv;
            if (out_rows > 0)
              EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), ld, (combine ? ref : rows_ref).get(), n,
                                                         out_rows, n, st)))
                  << where;
          };
          expect_reference("routing on the host");
          // World 1, the routing's arrays on the GPU: the call runs there alone (Auto, Sequential) with the
          // experts' grouped GEMM, or copies them to the host (Slots, NVLink).
          if (world == 1) {
            const DeviceBuffer dr = rt::to_device(routing.dest_rank[0]), dt = rt::to_device(routing.dest_token[0]);
            const DeviceBuffer dg = rt::to_device(routing.gate[0]);
            AllToAllRouting on = local.r;
            on.on_device = true;
            on.dest_rank = dr.as<int32_t>(), on.dest_token = dt.as<int32_t>(), on.gate = dg.as<float>();
            kernels::poison(out.get(), recv_max * (n + 8), st);
            op.run(a.get(), b.get(), on, out.get(), st, combine, ld, combine ? nullptr : tokens.as<int32_t>());
            if (path == Path::Auto || path == Path::Sequential)
              EXPECT_NE(op.last_plan().find("on the GPU"), std::string::npos) << op.last_plan();
            expect_reference("routing on the GPU");
          }
        }
        // Counts that do not add up, or none: refused on every rank, the op runs on.
        const plan::MoeRouting routing = plan::make_moe_routing("uniform", world, 64, topk, seed, E);
        Local bad(routing, rank);
        std::vector<int64_t> counts = routing.expert_rows[size_t(rank)];
        if (rank == 0) counts[0] += 1;
        bad.r.expert_counts = counts.data();
        EXPECT_THROW(op.run(a.get(), b.get(), bad.r, out.get(), st), InvalidArgument);
        if (rank == 0) bad.r.expert_counts = nullptr;
        EXPECT_THROW(op.run(a.get(), b.get(), bad.r, out.get(), st), InvalidArgument);
        const Local good(routing, rank);
        op.run(a.get(), b.get(), good.r, out.get(), st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
      }
      GemmAllToAllOptions many;
      many.experts = E;
      EXPECT_THROW(GemmAllToAll(comm, 64, 64, world * E + 1, n, k, DType::BF16, many), InvalidArgument);
    }
    EXPECT_GT(idle_experts, 0);  // (experts without rows came up)
    if (world > 1) EXPECT_GT(overlapped, 0);
    std::fprintf(stderr, "rank %d: %d calls, %d overlapped\n", rank, calls, overlapped);
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

// World 1 with the routing's arrays in device memory: the call runs on the
// GPU alone (checked and tabled there) on the Auto and Sequential paths,
// with the bits of our GEMM or cuBLAS's (as its plan names) + the baseline's
// all-to-all and combine, as a routing from the host gets; the Slots and
// NVLink paths copy the arrays to the host. A bad row is left out and
// reported once, by check() or by the next call.
TEST(GemmAllToAllApi, ARoutingInDeviceMemoryMatchesOurGemmAndNccl) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::fprintf(stderr, "seed %llu\n", static_cast<unsigned long long>(seed));
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    const int64_t max_tokens = 1500, n = 2048, k = 256, max_rows = max_tokens;
    const Communicator comm = Communicator::adopt(nccl);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DeviceBuffer a(size_t(max_rows) * k * 2), b(size_t(n) * k * 2), y(size_t(max_rows) * n * 2),
        out(size_t(max_rows) * (n + 8) * 2), ref(size_t(max_rows) * n * 2), rows_ref(size_t(max_rows) * n * 2),
        tok(size_t(max_rows) * 4), dr(size_t(max_rows) * 4), dt(size_t(max_rows) * 4), dg(size_t(max_rows) * 4);
    rt::CublasGemm cublas;
    static const char* kinds[] = {"uniform", "zipf:1.2", "one:0"};
    std::mt19937_64 rng(seed);
    auto to_device = [&](const AllToAllRouting& r) {
      if (r.rows > 0) {
        FO_CUDA_CHECK(cudaMemcpyAsync(dr.get(), r.dest_rank, size_t(r.rows) * 4, cudaMemcpyHostToDevice, st));
        FO_CUDA_CHECK(cudaMemcpyAsync(dt.get(), r.dest_token, size_t(r.rows) * 4, cudaMemcpyHostToDevice, st));
        FO_CUDA_CHECK(cudaMemcpyAsync(dg.get(), r.gate, size_t(r.rows) * 4, cudaMemcpyHostToDevice, st));
      }
      AllToAllRouting d = r;
      d.dest_rank = dr.as<int32_t>(), d.dest_token = dt.as<int32_t>(), d.gate = dg.as<float>();
      d.on_device = true;
      return d;
    };
    for (Path path : {Path::Auto, Path::Sequential, Path::Slots, Path::NVLink}) {
      GemmAllToAllOptions o;
      o.path = path;
      GemmAllToAll op(comm, max_rows, max_tokens, 1, n, k, DType::BF16, o);
      for (int call = 0; call < 8; ++call) {
        const std::string kind = kinds[rng() % 3];
        const int64_t t = call == 0 ? 0 : call == 1 ? max_tokens : int64_t(rng() % uint64_t(max_tokens + 1));
        plan::MoeRouting routing = plan::make_moe_routing(kind, 1, t, 1, rng());
        // (the rows in any token order: shuffled, so that the tables' sort has work)
        std::vector<size_t> order(routing.dest_token[0].size());
        std::iota(order.begin(), order.end(), size_t{0});
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<int32_t> toks(order.size());
        std::vector<float> gates(order.size());
        for (size_t i = 0; i < order.size(); ++i)
          toks[i] = routing.dest_token[0][order[i]], gates[i] = routing.gate[0][order[i]];
        if (call % 2 == 1 && t > 0)  // (several rows per token, some tokens none: the sums' order is tested)
          for (int32_t& x : toks) x = int32_t(rng() % uint64_t(t / 3 + 1));
        routing.dest_token[0] = toks, routing.gate[0] = gates;
        const Local local(routing, 0);
        const int64_t rows = local.r.rows;
        const bool combine = call % 3 != 2;
        const int64_t ld = call % 4 == 3 ? n + 8 : n;
        kernels::fill_random(kBf16, a.get(), std::max<int64_t>(rows, 1) * k, seed + uint64_t(call), -1.f, 1.f, st);
        kernels::fill_random(kBf16, b.get(), n * k, seed + 99, -1.f, 1.f, st);
        kernels::poison(out.get(), max_rows * (n + 8), st);
        kernels::poison(tok.get(), max_rows * 2, st);
        op.run(a.get(), b.get(), to_device(local.r), out.get(), st, combine, ld, tok.as<int32_t>());
        const std::string plan = op.last_plan();
        reference(plan.find("cuBLAS") != std::string::npos, routing, 0, nccl, cublas, Operands{a, b, rows, n, k}, y,
                  rows_ref, ref, st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
        const std::string where = std::string(name(path)) + " path, call " + std::to_string(call) + ", " + kind +
                                  ", " + std::to_string(t) + " tokens, " + (combine ? "combined" : "unweighted") +
                                  ", plan " + plan + ", seed " + std::to_string(seed);
        const bool alone = path == Path::Auto || path == Path::Sequential;
        EXPECT_EQ(plan.find("on the GPU") != std::string::npos, alone) << where;
        const int64_t out_rows = combine ? t : rows;
        if (out_rows > 0)
          EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), ld, (combine ? ref : rows_ref).get(), n,
                                                     out_rows, n, st)))
              << where;
        if (rows > 0) {
          std::vector<int32_t> got(static_cast<size_t>(rows));
          FO_CUDA_CHECK(cudaMemcpy(got.data(), tok.get(), got.size() * 4, cudaMemcpyDeviceToHost));
          EXPECT_EQ(got, routing.dest_token[0]) << where << " (tokens_out)";
        }
      }
      if (path != Path::Auto && path != Path::Sequential) continue;
      // Bad rows: a token out of range, a rank other than 0, a gate not finite.
      const plan::MoeRouting routing = plan::make_moe_routing("uniform", 1, 200, 1, rng());
      const Local local(routing, 0);
      for (int fault = 0; fault < 3; ++fault) {
        std::vector<int32_t> ranks = routing.dest_rank[0], toks = routing.dest_token[0];
        std::vector<float> gates = routing.gate[0];
        const char* want = fault == 0 ? "goes to token 200, outside" : fault == 1 ? "goes to rank 1, not rank 0"
                                                                                   : "not finite";
        if (fault == 0) toks[17] = 200;
        if (fault == 1) ranks[17] = 1;
        if (fault == 2) gates[17] = std::numeric_limits<float>::quiet_NaN();
        AllToAllRouting bad = local.r;
        bad.dest_rank = ranks.data(), bad.dest_token = toks.data(), bad.gate = gates.data();
        const AllToAllRouting on_dev = to_device(bad);
        op.run(a.get(), b.get(), on_dev, out.get(), st);  // (enqueued: the GPU finds the row)
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        const std::string expect = "row 17 of an earlier call's routing ";
        try {
          if (fault == 1) {  // reported by the next call, before it runs
            op.run(a.get(), b.get(), on_dev, out.get(), st);
            ADD_FAILURE() << "the next call ran";
          } else {
            op.check();
            ADD_FAILURE() << "check() found nothing (fault " << fault << ")";
          }
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
        EXPECT_NO_THROW(op.check()) << "reported once";
      }
      // Still usable after them.
      op.run(a.get(), b.get(), to_device(local.r), out.get(), st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      EXPECT_NO_THROW(op.check());
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

// The host queues calls, each with its own routing, while the GPU is held
// (an eager loop ahead of the GPU): no call waits for an earlier one's table
// upload, and each computes with its own tables: bitwise the same call run
// alone. One rank; each path whose tables the host uploads.
TEST(GemmAllToAllApi, CallsQueueAheadOfTheGpuEachWithItsOwnRouting) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::fprintf(stderr, "seed %llu\n", static_cast<unsigned long long>(seed));
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    const int64_t max_tokens = 700, n = 512, k = 256, max_rows = max_tokens;
    const int calls = 12;
    const Communicator comm = Communicator::adopt(nccl);
    rt::ScopedStream st;
    const size_t out_bytes = size_t(max_tokens) * n * 2;
    DeviceBuffer a(size_t(max_rows) * k * 2), b(size_t(n) * k * 2), want(out_bytes * calls), got(out_bytes * calls);
    kernels::fill_random(kBf16, a.get(), max_rows * k, seed, -1.f, 1.f, st.s);
    kernels::fill_random(kBf16, b.get(), n * k, seed + 1, -1.f, 1.f, st.s);
    static const char* kinds[] = {"uniform", "zipf:1.2", "one:0"};
    std::mt19937_64 rng(seed);
    std::vector<plan::MoeRouting> routings;
    for (int i = 0; i < calls; ++i) {
      const int64_t t = i == 0 ? max_tokens : 1 + int64_t(rng() % uint64_t(max_tokens));
      routings.push_back(plan::make_moe_routing(kinds[rng() % 3], 1, t, 1, rng()));
    }
    auto at = [&](const DeviceBuffer& buf, int i) { return buf.as<char>() + size_t(i) * out_bytes; };
    for (Path path : {Path::Auto, Path::Slots}) {
      GemmAllToAllOptions o;
      o.path = path;
      GemmAllToAll op(comm, max_rows, max_tokens, 1, n, k, DType::BF16, o);
      // Each call alone first (it also makes whatever the op makes at a routing's first call).
      for (int i = 0; i < calls; ++i) {
        op.run(a.get(), b.get(), Local(routings[size_t(i)], 0).r, at(want, i), st.s);
        FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
      }
      kernels::poison(got.get(), int64_t(got.bytes() / 2), st.s);
      FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
      rt::HostGate gate;
      gate.hold(st.s);
      std::vector<Local> locals;
      locals.reserve(size_t(calls));
      for (int i = 0; i < calls; ++i) {
        locals.emplace_back(routings[size_t(i)], 0);
        op.run(a.get(), b.get(), locals.back().r, at(got, i), st.s);
      }
      EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady)
          << name(path) << " path: the host waited for the GPU while queueing the calls";
      gate.release();
      FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
      EXPECT_NO_THROW(gate.check()) << name(path) << " path: a call waited for the held GPU";
      op.check();
      for (int i = 0; i < calls; ++i)
        EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, at(got, i), n, at(want, i), n, routings[size_t(i)].tokens[0],
                                                   n, st.s)))
            << name(path) << " path, call " << i << ", " << routings[size_t(i)].tokens[0] << " tokens, seed " << seed;
    }
  });
}
