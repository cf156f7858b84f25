// GPU tests of rt::OverlapReduceScatter (runtime/ops/reducescatter.h):
//  - world 1 on NCCL: every layout, random plans (tile shapes, tile orders,
//    groups), ragged m, strided outputs and the RMSNorm form, bitwise against
//    our GEMM (one rank's sum is its own C);
//  - W = 2, 3, 4 ranks side by side on one GPU, each group moved by hand
//    (a transport that waits for every rank's signals of the group and sums
//    their parts in rank order): the maps, the GEMM's stores, the waits and
//    the post step at W > 1 without NCCL, bitwise against the same sum of
//    the ranks' plain GEMMs; epochs across the counters' wrap; a group that
//    never completes times out and says which;
//  - 2 GPUs (when there are two): NCCL, bitwise against our GEMM + one
//    ncclAllReduce, this rank's rows of it.
#include <cuda_bf16.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "host_reference.h"
#include "kernels/check.h"
#include "kernels/reorder.h"
#include "plan/tile_grid.h"
#include "rank_harness.h"
#include "runtime/ops/baselines.h"
#include "runtime/ops/reducescatter.h"

using namespace flashoverlap;
using rt::DeviceBuffer;
constexpr kernels::DType kBf16 = kernels::DType::BF16;

namespace {

constexpr int kMaxRanks = 8;
struct Parts {
  const __nv_bfloat16* p[kMaxRanks];
};
// dst = sum of the ranks' parts in rank order, in fp32, rounded once: NCCL's
// sum on 2 ranks; on more, the harness's own definition (for both sides).
__global__ void sum_ranks_kernel(Parts parts, int world, int64_t count, __nv_bfloat16* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int r = 0; r < world; ++r) acc += __bfloat162float(parts.p[r][i]);
    dst[i] = __float2bfloat16_rn(acc);
  }
}
void sum_ranks(const std::vector<const void*>& parts, int64_t count, void* dst, cudaStream_t st) {
  Parts p{};
  for (size_t r = 0; r < parts.size(); ++r) p.p[r] = static_cast<const __nv_bfloat16*>(parts[r]);
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 4096);
  if (count > 0) sum_ranks_kernel<<<int(blocks), 256, 0, st>>>(p, int(parts.size()), count, static_cast<__nv_bfloat16*>(dst));
  FO_CUDA_CHECK(cudaGetLastError());
}


// ctas < 0: a grid of 1/2 to 1/5 of the tiles (two waves or more: groups to overlap).
plan::Schedule random_schedule(int64_t m, int64_t n, int ctas, plan::RsLayout layout, std::mt19937_64& rng) {
  const plan::TileShape tile = rng() % 2 ? plan::TileShape{128, 256} : plan::TileShape{128, 128};
  const int64_t tiles = (m + tile.bm - 1) / tile.bm * ((n + tile.bn - 1) / tile.bn);
  if (ctas < 0) ctas = int(std::max<int64_t>(1, tiles / int64_t(2 + rng() % 4)));
  // The standard layout's even parts come from the column-major walk; the other order is tried too.
  const bool along_m = layout == plan::RsLayout::Standard && rng() % 2;
  const int32_t tiles_m = int32_t((m + 127) / 128);
  return plan::make_schedule(m, n, tile, ctas, along_m ? plan::Raster::AlongM : plan::Raster::AlongN,
                             along_m ? 1 : 1 + int32_t(rng() % uint64_t(std::min(tiles_m, 4))));
}

std::vector<plan::Group> random_groups(const plan::Schedule& s, std::mt19937_64& rng) {
  plan::Partition p = test::random_partition(s.waves(), rng);
  if (p.size() == 1 && s.waves() >= 2) p = {1, s.waves() - 1};
  return plan::make_groups(s, p);
}

std::string describe(const rt::OverlapReduceScatter& op) {
  const plan::Schedule& s = op.schedule();
  return std::string(plan::to_string(op.layout())) + " " + std::to_string(s.m) + "x" + std::to_string(s.n) + ", " +
         std::to_string(s.bm) + "x" + std::to_string(s.bn) + " tiles, " + std::to_string(s.ctas) + " CTAs, " +
         (s.raster == plan::Raster::AlongM ? "along M" : "along N, swizzle " + std::to_string(s.swizzle)) +
         ", groups " + op.describe_groups();
}

}  // namespace

// One rank on NCCL: the op's output is this rank's rows of its own GEMM.
TEST(ReduceScatterOneGpu, EveryLayoutAndPlanMatchesOurGemm) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t max_m = 1500, n = 1000, k = 256, ld_max = n + 24;
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), out(size_t(max_m) * ld_max * 2),
        ref(size_t(max_m) * n * 2), residual(size_t(max_m) * n * 2), weight(size_t(n) * 2), y(size_t(max_m) * n * 2),
        h(size_t(max_m) * n * 2);
    int overlapped = 0, by_tma = 0;
    const int sms = rt::current_device_sms();  // the full grid: one CTA per SM
    for (int trial = 0; trial < 24; ++trial) {
      const plan::RsLayout layout = trial % 2 ? plan::RsLayout::SubTile : plan::RsLayout::Standard;
      int64_t m = 1 + int64_t(rng() % uint64_t(max_m));
      if (trial % 3 == 0) m = std::max<int64_t>(128, m - m % 128);  // (whole tiles: stored by TMA)
      rt::OverlapReduceScatterOptions o;
      o.sched = random_schedule(m, n, trial % 4 == 1 ? sms : -1, layout, rng);
      o.groups = trial % 6 == 5 ? plan::make_groups(o.sched, {o.sched.waves()}) : random_groups(o.sched, rng);
      o.layout = layout, o.k = int(k), o.comm = nccl;
      o.testing.rows_store = trial % 6 == 3;
      rt::OverlapReduceScatter op(o);
      overlapped += !op.sequential();
      by_tma += op.tiles_by_tma();
      const std::string where = describe(op) + (op.tiles_by_tma() ? ", tiles by TMA" : "") + " seed " + std::to_string(seed);
      ASSERT_EQ(op.out_rows(), m) << where;
      const int64_t ld = trial % 3 == 0 ? ld_max : n;
      for (int call = 0; call < 2; ++call) {
        const uint64_t sd = seed + 100 * uint64_t(trial) + uint64_t(call);
        kernels::fill_random(kBf16, a.get(), m * k, sd, -1.f, 1.f, st);
        kernels::fill_random(kBf16, b.get(), n * k, sd + 1, -1.f, 1.f, st);
        kernels::poison(out.get(), m * ld, st);
        op.run(a.get(), b.get(), out.get(), ld, st);
        const plan::Schedule full = plan::make_schedule(m, n, {128, 256}, sms, plan::Raster::AlongN, 1);
        kernels::launch_gemm(kernels::plain_gemm(kBf16, a.get(), b.get(), full, int(k), ref.get(), n), st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        op.check();
        EXPECT_TRUE(test::rows_equal(out.get(), ld, ref.get(), m, n, op.rows_of_rank())) << where << " call " << call;
      }
      // The RMSNorm form: the same rows, then the row-wise step, as add_rmsnorm_rows does it.
      const float eps = test::eps_for_call(trial, double(k) / 9 + 1.0 / 3);
      kernels::fill_random(kBf16, residual.get(), m * n, seed + 7 * uint64_t(trial), -1.f, 1.f, st);
      kernels::fill_random(kBf16, weight.get(), n, seed + 9 * uint64_t(trial), 0.5f, 1.5f, st);
      op.run_rmsnorm(a.get(), b.get(), rt::RmsNormArgs{residual.get(), weight.get(), eps, h.get()}, y.get(), st);
      op.run(a.get(), b.get(), out.get(), n, st);  // (this rank's rows, in the layout's order)
      kernels::add_rmsnorm_rows(kBf16, out.get(), int32_t(m), int32_t(n), residual.get(), weight.get(), eps, ref.get(),
                                nullptr, st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, y.get(), n, ref.get(), n, m, n, st))) << where << " (RMSNorm)";
    }
    EXPECT_GT(overlapped, 14);
    EXPECT_GT(by_tma, 3);  // (both stores run)
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

namespace {

// W ranks' ops on one GPU, each with its own core and the hand transport.
struct RanksOnOneGpu {
  int world;
  std::vector<std::unique_ptr<rt::OverlapReduceScatter>> ops;
  std::vector<cudaStream_t> streams;

  RanksOnOneGpu(int w, const rt::OverlapReduceScatterOptions& base, int drop_rank = -1, int drop_group = -1)
      : world(w) {
    // The hand transport's kernel loaded before any wait spins: under lazy
    // loading (CUDA's default) its first launch would wait for the spinning
    // waits, which then time out.
    cudaFuncAttributes fa{};
    FO_CUDA_CHECK(cudaFuncGetAttributes(&fa, sum_ranks_kernel));
    for (int r = 0; r < w; ++r) {
      rt::OverlapReduceScatterOptions o = base;
      o.comm = nullptr, o.rank = r, o.world = w;
      if (r == drop_rank) o.testing.fault_drop_group = drop_group;
      o.transport = [this, r](const rt::RsGroupCall& c) { move(r, c); };
      ops.push_back(std::make_unique<rt::OverlapReduceScatter>(o));
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      streams.push_back(st);
    }
  }
  ~RanksOnOneGpu() {
    ops.clear();
    for (cudaStream_t st : streams) cudaStreamDestroy(st);
  }
  // Rank r's share of group c.group: once every rank signalled the group,
  // the sum of part r of every rank's send slots of it.
  void move(int r, const rt::RsGroupCall& c) {
    if (c.group < 0) throw Error("the one-GPU harness moves overlapped groups only");
    const rt::OverlapReduceScatter& me = *ops[size_t(r)];
    const size_t g = size_t(c.group);
    const ptrdiff_t at = static_cast<const char*>(c.send) - static_cast<const char*>(me.send_buffer());
    std::vector<const void*> parts;
    for (int w = 0; w < world; ++w) {
      kernels::launch_wait_counter(ops[size_t(w)]->counter(g), me.counter_target(g), me.timeout_ns(), me.wait_error(),
                                   c.group, c.stream);
      parts.push_back(static_cast<const char*>(ops[size_t(w)]->send_buffer()) + at + size_t(r) * c.recv_count * 2);
    }
    sum_ranks(parts, int64_t(c.recv_count), c.recv, c.stream);
  }
};

}  // namespace

TEST(ReduceScatterOneGpu, RanksSideBySideMatchTheirSum) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int64_t n = 640, k = 128;
  const int sms = rt::current_device_sms();  // the references' grid: one CTA per SM
  for (int trial = 0; trial < 12; ++trial) {
    const int world = 2 + trial % 3;  // 2, 3, 4
    const plan::RsLayout layout = world != 3 && trial % 2 ? plan::RsLayout::SubTile : plan::RsLayout::Standard;
    // m: ragged per rank (not a tile multiple), a multiple of the world for the standard layout
    int64_t m = 64 + int64_t(rng() % 1200);
    if (layout == plan::RsLayout::Standard) m -= m % world;
    if (trial % 3 == 1) m = 128 * world * (1 + int64_t(rng() % 4));  // (standard: whole tiles, stored by TMA)
    rt::OverlapReduceScatterOptions o;
    o.sched = random_schedule(m, n, -1, layout, rng);  // (W GEMMs on one GPU's SMs, in turns or side by side)
    o.groups = random_groups(o.sched, rng);
    o.layout = layout, o.k = int(k), o.wait_timeout_s = 20;
    if (trial % 4 == 3) o.testing.first_epoch = 0xFFFFFFFFu - 1;  // the counters cross 2^32 on the second call
    RanksOnOneGpu ranks(world, o);
    const std::string where = describe(*ranks.ops[0]) + (ranks.ops[0]->tiles_by_tma() ? ", tiles by TMA" : "") +
                              ", world " + std::to_string(world) + ", seed " + std::to_string(seed);
    std::vector<DeviceBuffer> a, b, c, out;
    for (int r = 0; r < world; ++r) {
      a.emplace_back(size_t(m) * k * 2), b.emplace_back(size_t(n) * k * 2), c.emplace_back(size_t(m) * n * 2);
      out.emplace_back(size_t(m) * n * 2);
    }
    DeviceBuffer sum(size_t(m) * n * 2);
    for (int call = 0; call < 3; ++call) {
      std::vector<const void*> cs;
      for (int r = 0; r < world; ++r) {
        const uint64_t sd = seed + 1000 * uint64_t(trial) + 10 * uint64_t(call) + uint64_t(r);
        kernels::fill_random(kBf16, a[r].get(), m * k, sd, -1.f, 1.f, st);
        kernels::fill_random(kBf16, b[r].get(), n * k, sd + 5, -1.f, 1.f, st);
        kernels::poison(out[r].get(), ranks.ops[size_t(r)]->out_rows() * n, st);
        const plan::Schedule full = plan::make_schedule(m, n, {128, 256}, sms, plan::Raster::AlongN, 1);
        kernels::launch_gemm(kernels::plain_gemm(kBf16, a[r].get(), b[r].get(), full, int(k), c[r].get(), n), st);
        cs.push_back(c[r].get());
      }
      sum_ranks(cs, m * n, sum.get(), st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      for (int r = 0; r < world; ++r)  // in rank order: each rank's waits spin for the later ranks' GEMMs
        ranks.ops[size_t(r)]->run(a[r].get(), b[r].get(), out[r].get(), n, ranks.streams[size_t(r)]);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      for (int r = 0; r < world; ++r) {
        ranks.ops[size_t(r)]->check();
        EXPECT_TRUE(test::rows_equal(out[r].get(), n, sum.get(), m, n, ranks.ops[size_t(r)]->rows_of_rank()))
            << where << ", rank " << r << ", call " << call;
      }
    }
  }
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}

// W ranks' ops in the NVLink form side by side on one GPU (rank_harness.h).
using NvlinkRanks = test::NvlinkRanks<rt::OverlapReduceScatter, rt::OverlapReduceScatterOptions>;

// The NVLink form at W = 2, 3, 4, 8 on one GPU: m ragged per rank (not a
// tile multiple) or whole tiles, strided outputs, several calls per op (the
// window's halves in turn, the counters' running totals), the RMSNorm form:
// bitwise the sum of the ranks' plain GEMMs in rank order in fp32 rounded
// once (NCCL's on 2 ranks).
TEST(ReduceScatterNvlinkOnOneGpu, RanksSideBySideMatchTheirSum) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  {  // (the harness's kernel loaded before any wait spins)
    cudaFuncAttributes fa{};
    FO_CUDA_CHECK(cudaFuncGetAttributes(&fa, sum_ranks_kernel));
  }
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  static const int kWorlds[] = {2, 3, 4, 8};
  const int sms = rt::current_device_sms();  // one CTA per SM: the bound of the random grids, the references' grid
  int calls = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int world = kWorlds[trial % 4];
    const int64_t n = 8 * (1 + int64_t(rng() % 128)), k = trial % 2 ? 128 : 64;
    int64_t m = world * (1 + int64_t(rng() % (1200 / world)));
    if (trial % 3 == 1) m = 128 * world * (1 + int64_t(rng() % 3));
    rt::OverlapReduceScatterOptions o;
    o.sched = random_schedule(m, n, int(1 + rng() % uint64_t(sms)), plan::RsLayout::Standard, rng);
    o.groups = plan::make_groups(o.sched, {o.sched.waves()});
    o.k = int(k), o.wait_timeout_s = 20;
    NvlinkRanks ranks(world, o);
    const int64_t q = m / world, ld = trial % 2 ? n : n + 8;
    const std::string where = describe(*ranks.ops[0]) + ", world " + std::to_string(world) + ", ld " +
                              std::to_string(ld) + ", seed " + std::to_string(seed);
    ASSERT_EQ(ranks.ops[0]->out_rows(), q) << where;
    ASSERT_EQ(ranks.ops[0]->describe_groups(), "nvlink") << where;
    std::vector<DeviceBuffer> a, b, c, out, h;
    for (int r = 0; r < world; ++r) {
      a.emplace_back(size_t(m) * k * 2), b.emplace_back(size_t(n) * k * 2), c.emplace_back(size_t(m) * n * 2);
      out.emplace_back(size_t(q) * ld * 2), h.emplace_back(size_t(q) * n * 2);
    }
    DeviceBuffer sum(size_t(m) * n * 2), residual(size_t(q) * n * 2), weight(size_t(n) * 2);
    for (int call = 0; call < 4; ++call) {
      const bool norm = call == 2;
      std::vector<const void*> cs;
      for (int r = 0; r < world; ++r) {
        const uint64_t sd = seed + 1000 * uint64_t(trial) + 10 * uint64_t(call) + uint64_t(r);
        kernels::fill_random(kBf16, a[r].get(), m * k, sd, -1.f, 1.f, st);
        kernels::fill_random(kBf16, b[r].get(), n * k, sd + 5, -1.f, 1.f, st);
        kernels::poison(out[r].get(), q * ld, st);
        const plan::Schedule full = plan::make_schedule(m, n, {128, 256}, sms, plan::Raster::AlongN, 1);
        kernels::launch_gemm(kernels::plain_gemm(kBf16, a[r].get(), b[r].get(), full, int(k), c[r].get(), n), st);
        cs.push_back(c[r].get());
      }
      sum_ranks(cs, m * n, sum.get(), st);
      kernels::fill_random(kBf16, residual.get(), q * n, seed + 77 * uint64_t(call), -1.f, 1.f, st);
      kernels::fill_random(kBf16, weight.get(), n, seed + 78 * uint64_t(call), 0.5f, 1.5f, st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      for (int r = 0; r < world; ++r) {  // in rank order: each rank's wait spins for the later ranks' GEMMs
        rt::OverlapReduceScatter& op = *ranks.ops[size_t(r)];
        if (norm)  // (every rank's residual the same buffer: only read)
          op.run_rmsnorm(a[r].get(), b[r].get(), {residual.get(), weight.get(), 1e-5f, h[r].get()}, out[r].get(),
                         ranks.streams[size_t(r)]);
        else
          op.run(a[r].get(), b[r].get(), out[r].get(), ld, ranks.streams[size_t(r)]);
      }
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      ++calls;
      for (int r = 0; r < world; ++r) {
        const std::string at = where + ", rank " + std::to_string(r) + ", call " + std::to_string(call);
        try {
          ranks.ops[size_t(r)]->check();
        } catch (const std::exception& e) {
          ADD_FAILURE() << at << ": " << e.what();
          continue;
        }
        const char* rows = static_cast<const char*>(sum.get()) + size_t(r) * q * n * 2;
        if (norm) {
          const test::NormCheck nc = test::check_rmsnorm(kBf16, rows, n, residual.get(), weight.get(), 1e-5f,
                                                         out[r].get(), h[r].get(), q, n, st);
          EXPECT_TRUE(test::within(nc.out)) << at << " (RMSNorm)";
          EXPECT_TRUE(test::bitwise(nc.residual_out)) << at << " (residual_out)";
        } else {
          EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out[r].get(), ld, rows, n, q, n, st))) << at;
        }
      }
    }
  }
  EXPECT_EQ(calls, 12 * 4) << "seed " << seed;
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}

// A rank whose counts never arrive (rank 1's): every rank's wait times out
// (no hang) and check() names rank 1; a CUDA graph capture is refused.
TEST(ReduceScatterNvlinkOnOneGpu, LostCountsTimeOutAndGraphsAreRefused) {
  REQUIRE_HOPPER();
  const int64_t m = 768, n = 512, k = 64;
  rt::OverlapReduceScatterOptions o;
  o.sched = plan::make_schedule(m, n, {128, 128}, 16, plan::Raster::AlongN, 1);
  o.groups = plan::make_groups(o.sched, {o.sched.waves()});
  o.k = int(k), o.wait_timeout_s = 0.5;
  NvlinkRanks ranks(3, o, [](rt::OverlapReduceScatterOptions& x, int r) { x.testing.fault_drop_group = r == 1 ? 0 : -1; });
  DeviceBuffer a(size_t(m) * k * 2), b(size_t(n) * k * 2), out(size_t(m) * n * 2);
  kernels::fill_random(kBf16, a.get(), m * k, 1, -1.f, 1.f, nullptr);
  kernels::fill_random(kBf16, b.get(), n * k, 2, -1.f, 1.f, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  {
    cudaStream_t cap;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    FO_CUDA_CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
    EXPECT_THROW(ranks.ops[0]->run(a.get(), b.get(), out.get(), n, cap), InvalidArgument);
    FO_CUDA_CHECK(cudaStreamEndCapture(cap, &graph));
    if (graph) cudaGraphDestroy(graph);
    FO_CUDA_CHECK(cudaStreamDestroy(cap));
  }
  for (int r = 0; r < 3; ++r)
    ranks.ops[size_t(r)]->run(a.get(), b.get(), static_cast<char*>(out.get()) + size_t(r) * (m / 3) * n * 2, n,
                              ranks.streams[size_t(r)]);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  test::expect_every_check_reports(
      3, [&](int r) { ranks.ops[size_t(r)]->check(); }, {"partial sums from rank 1 ", "did not arrive within"},
      "the lost counts");
}

// Ranks that disagree on a call, in the NVLink form (docs/design.md §5.8):
// rank 1 built for another m (the windows shared, sized for both, as the
// public op's are for max_m) fails the call check on every rank at once,
// naming both m; a rank whose peer went on after a failed call (its call #2
// published) finds it ahead and fails at once. Nothing waits unbounded.
TEST(ReduceScatterNvlinkOnOneGpu, RanksThatDisagreeOnACallFailOnEveryRank) {
  REQUIRE_HOPPER();
  const int64_t m = 768, n = 512, k = 64;
  DeviceBuffer a(size_t(2 * m) * k * 2), b(size_t(n) * k * 2), out(size_t(2 * m) * n * 2);
  kernels::fill_random(kBf16, a.get(), 2 * m * k, 3, -1.f, 1.f, nullptr);
  kernels::fill_random(kBf16, b.get(), n * k, 4, -1.f, 1.f, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  const auto options = [&](int64_t rows) {
    rt::OverlapReduceScatterOptions o;
    o.sched = plan::make_schedule(rows, n, {128, 128}, 16, plan::Raster::AlongN, 1);
    o.groups = plan::make_groups(o.sched, {o.sched.waves()});
    o.k = int(k), o.wait_timeout_s = 0.3;
    return o;
  };
  const auto windows = [&](int world) {
    std::vector<std::unique_ptr<rt::PeerWindows>> w;
    for (int r = 0; r < world; ++r)
      w.push_back(std::make_unique<rt::PeerWindows>(r, world, size_t(2 * m) * n * 2, nullptr, "test"));
    return w;
  };
  {  // rank 1 calls with 2m where rank 0 calls with m
    auto w = windows(2);
    NvlinkRanks ranks(2, options(m), [&](rt::OverlapReduceScatterOptions& x, int r) {
      if (r == 1) x.sched = options(2 * m).sched, x.groups = plan::make_groups(x.sched, {x.sched.waves()});
      x.peers = w[size_t(r)].get();
    });
    for (int r = 0; r < 2; ++r) ranks.ops[size_t(r)]->run(a.get(), b.get(), out.get(), n, ranks.streams[size_t(r)]);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    test::expect_every_check_reports(
        2, [&](int r) { ranks.ops[size_t(r)]->check(); }, {"call #1 has m = ", "where this rank expects m = "},
        "the ranks' different m");
    EXPECT_THROW(ranks.ops[0]->check(), Error);  // (sticky: every later call of the public op reports it)
  }
  {  // rank 0's call #1 times out alone; it goes on to call #2; then rank 1 makes its call #1
    auto w = windows(2);
    NvlinkRanks ranks(2, options(m), [&](rt::OverlapReduceScatterOptions& x, int r) { x.peers = w[size_t(r)].get(); });
    for (int call = 0; call < 2; ++call) {
      ranks.ops[0]->run(a.get(), b.get(), out.get(), n, ranks.streams[0]);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
    }
    ranks.ops[1]->run(a.get(), b.get(), out.get(), n, ranks.streams[1]);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    test::expect_every_check_reports(
        1, [&](int r) { ranks.ops[size_t(r)]->check(); }, {"rank 1 did not start call #1 in time"},
        "the missing rank");
    try {
      ranks.ops[1]->check();
      ADD_FAILURE() << "rank 1: the peer's later call was not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0 is at call #2 where this rank is at #1"), std::string::npos)
          << e.what();
    }
  }
}

// A group whose signals never come: every rank's wait for it times out (no
// hang), and check() names the group, its counter and what it waited for.
TEST(ReduceScatterOneGpu, AStuckGroupTimesOutWithItsName) {
  REQUIRE_HOPPER();
  const int64_t m = 1024, n = 512, k = 64;
  rt::OverlapReduceScatterOptions o;
  o.sched = plan::make_schedule(m, n, {128, 128}, 8, plan::Raster::AlongM, 1);
  o.groups = plan::make_groups(o.sched, {1, 1, o.sched.waves() - 2});
  o.k = int(k), o.wait_timeout_s = 0.5;
  RanksOnOneGpu ranks(2, o, /*drop_rank=*/1, /*drop_group=*/1);
  DeviceBuffer a(size_t(m) * k * 2), b(size_t(n) * k * 2), out(size_t(m) * n * 2);
  kernels::fill_random(kBf16, a.get(), m * k, 1, -1.f, 1.f, nullptr);
  kernels::fill_random(kBf16, b.get(), n * k, 2, -1.f, 1.f, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < 2; ++r) ranks.ops[size_t(r)]->run(a.get(), b.get(), out.get(), n, ranks.streams[size_t(r)]);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  test::expect_every_check_reports(
      2, [&](int r) { ranks.ops[size_t(r)]->check(); }, {"group 1 ", "did not complete within"}, "the stuck group");
}

// Two GPUs through NCCL: bitwise this rank's rows of our GEMM + ncclAllReduce.
TEST(ReduceScatterTwoGpus, EveryLayoutAndPlanMatchesOurGemmAndNccl) {
  FO_REQUIRE_HOPPER_GPUS(2);
  const uint64_t seed = test::fresh_seed();
  test::on_each_rank(2, [&](int rank, ncclComm_t nccl) {
    std::mt19937_64 rng(seed);  // (the same plans on both ranks)
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t max_m = 4096, n = 1536, k = 512;
    DeviceBuffer a(size_t(max_m) * k * 2), b(size_t(n) * k * 2), out(size_t(max_m) * n * 2), ref(size_t(max_m) * n * 2);
    for (int trial = 0; trial < 16; ++trial) {
      const plan::RsLayout layout = trial % 2 ? plan::RsLayout::SubTile : plan::RsLayout::Standard;
      int64_t m = 2 + int64_t(rng() % uint64_t(max_m - 2));
      if (layout == plan::RsLayout::Standard) m -= m % 2;
      rt::OverlapReduceScatterOptions o;
      o.sched = random_schedule(m, n, 100 + int(rng() % 30), layout, rng);
      o.groups = random_groups(o.sched, rng);
      o.layout = layout, o.k = int(k), o.comm = nccl;
      rt::OverlapReduceScatter op(o);
      const uint64_t sd = seed + 100 * uint64_t(trial) + 7 * uint64_t(rank);
      kernels::fill_random(kBf16, a.get(), m * k, sd, -1.f, 1.f, st);
      kernels::fill_random(kBf16, b.get(), n * k, sd + 1, -1.f, 1.f, st);
      kernels::poison(out.get(), op.out_rows() * n, st);
      op.run(a.get(), b.get(), out.get(), n, st);
      const plan::Schedule full = plan::make_schedule(m, n, {128, 256}, rt::current_device_sms(), plan::Raster::AlongN, 8);
      rt::sequential_ours_allreduce(kBf16, a.get(), b.get(), ref.get(), full, int(k), nccl, st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      op.check();
      EXPECT_TRUE(test::rows_equal(out.get(), n, ref.get(), m, n, op.rows_of_rank()))
          << describe(op) << ", rank " << rank << ", seed " << seed;
    }
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
