// GPU tests of the overlapped GEMM + AllReduce on every local Hopper GPU,
// where there are more than 2 (world 3-8; the 2-GPU cases, owners among
// them, are in test_overlap_allreduce). Skipped visibly with fewer than 3.
//
// At world > 2 NCCL's ring sums in its own order, rounding at each step, so
// the layouts are checked against what each is built to give: owners sum
// each tile in its owner's order (bitwise against the host's sum by that
// definition, test::owner_order_sum); the NCCL layouts (row bands, slots)
// within the per-element bound of the same GEMM + one ncclAllReduce, and of
// the rank-order sum (our GEMM, an ncclAllGather and sum_gathered_rows). The
// RMSNorm path against the host's norm of the op's own sum.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/check.h"
#include "kernels/gemm.h"
#include "kernels/reorder.h"
#include "host_reference.h"
#include "rank_harness.h"
#include "runtime/ops/baselines.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/communicator.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/allreduce.h"

using namespace flashoverlap;
using kernels::DType;
using rt::DeviceBuffer;

namespace {

// All local Hopper GPUs, at most 8 (the layouts' limit).
int world_over_two() { return std::min(rt::hopper_device_count(), 8); }

// (3 or more GPUs; the 2-GPU cases are in test_overlap_allreduce)
#define REQUIRE_WORLD_OVER_TWO() FO_REQUIRE_HOPPER_GPUS(3)

struct WorldCase {
  int m, n, k, bn, ctas;  // ctas: test::kFullGrid, one CTA per SM; another count, at most the SMs (test::grid_ctas)
  DType dt;
  rt::ArLayout layout;
  bool copy_in_gemm = true;  // owners: the producer warps copy the other ranks' finals during the GEMM
  bool registered = false;   // run_registered into an output registered with the op (owners: finals straight into it)
};

std::string describe(const WorldCase& c, int world) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " tile 128x" +
         std::to_string(c.bn) + " ctas=" + std::to_string(test::grid_ctas(c.ctas)) + " " + rt::layout_name(c.layout) +
         (c.copy_in_gemm ? "" : " copy after") + (c.registered ? " registered output" : "") + " world " +
         std::to_string(world);
}

// Three calls with fresh inputs (epochs), run and run_rmsnorm, on every rank.
void check_world_case(const WorldCase& c, uint64_t seed) {
  const int world = world_over_two();
  std::mt19937_64 rng(seed);
  const int tiles_m = (c.m + 127) / 128;
  const int swizzle = 1 + int(rng() % 8);
  const plan::Schedule s =
      test::sched_for(c.m, c.n, c.bn, test::grid_ctas(c.ctas),
                      rt::is_banded(c.layout) ? std::min(swizzle, std::max(1, tiles_m / 2)) : swizzle);
  const std::vector<plan::Group> groups = test::random_groups(s, c.layout, rng);
  const std::string where = describe(c, world) + " swizzle " + std::to_string(s.swizzle) + " groups " +
                            std::to_string(groups.size()) + " seed=" + std::to_string(seed);
  std::fprintf(stderr, "case: %s\n", where.c_str());
  test::on_each_rank(world, [&](int rank, ncclComm_t comm) {
    const int64_t elems = int64_t(c.m) * c.n;
    const size_t cb = size_t(elems) * 2;
    DeviceBuffer a(size_t(c.m) * c.k * 2), b(size_t(c.n) * c.k * 2), part(cb), gathered(cb * size_t(world)),
        ref(cb), nccl_ref(cb), out(cb), residual(cb), weight(size_t(c.n) * 2), y(cb), h(cb);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    rt::OverlapAllReduceOptions o;
    o.sched = s, o.groups = groups, o.layout = c.layout, o.k = c.k, o.dtype = c.dt, o.comm = comm, o.rank = rank;
    o.wait_timeout_s = 5, o.owner_copy_in_gemm = c.copy_in_gemm;
    o.tail_comm = comm;
    const bool owners = c.layout == rt::ArLayout::Owners;
    rt::OverlapAllReduce op(o);
    if (owners) ASSERT_FALSE(op.sequential()) << where;
    const int slot = c.registered ? op.register_output(out.get(), c.n) : -1;  // (collective)
    if (c.registered && owners) EXPECT_TRUE(op.finals_into_outputs()) << where;
    plan::Schedule full = s;
    full.ctas = rt::current_device_sms();
    for (int call = 0; call < 3; ++call) {
      const uint64_t sd = seed + 1000 * call + 17 * rank;
      kernels::fill_random(c.dt, a.get(), int64_t(c.m) * c.k, sd, -1.f, 1.f, st);
      kernels::fill_random(c.dt, b.get(), int64_t(c.n) * c.k, sd + 1, -1.f, 1.f, st);
      kernels::fill_random(c.dt, residual.get(), elems, seed + 1000 * call + 2, -1.f, 1.f, st);  // the same on every rank
      kernels::fill_random(c.dt, weight.get(), c.n, seed + 1000 * call + 3, 0.5f, 1.5f, st);
      const float eps = test::eps_for_call(call, world * double(c.k) / 9 + 1.0 / 3);
      for (auto* p : {&ref, &nccl_ref, &out, &y, &h}) kernels::poison(p->get(), elems, st);
      // The rank-order reference: our GEMM, every rank's partial gathered, summed in rank order.
      kernels::launch_gemm(kernels::plain_gemm(c.dt, a.get(), b.get(), full, c.k, part.get(), c.n), st);
      FO_NCCL_CHECK_CTX(ncclAllGather(part.get(), gathered.get(), size_t(elems),
                                      c.dt == DType::BF16 ? ncclBfloat16 : ncclFloat16, comm, st),
                        "reference gather");
      kernels::sum_gathered_rows(c.dt, gathered.get(), world, elems, c.m, c.n, ref.get(), c.n, st);
      rt::sequential_ours_allreduce(c.dt, a.get(), b.get(), nccl_ref.get(), full, c.k, comm, st);
      if (c.registered)
        op.run_registered(a.get(), b.get(), slot, st);
      else
        op.run(a.get(), b.get(), out.get(), c.n, st);
      op.run_rmsnorm(a.get(), b.get(), rt::RmsNormArgs{residual.get(), weight.get(), eps, h.get()}, y.get(), st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      try {  // a timed-out wait is a failure, not a throw: this rank goes on making the same NCCL calls
        op.check();
      } catch (const Error& e) {
        ADD_FAILURE() << where << " rank " << rank << " call " << call << ": " << e.what();
      }
      const std::string at = where + " rank " + std::to_string(rank) + " call " + std::to_string(call);
      EXPECT_TRUE(test::within(kernels::compare(c.dt, out.get(), c.n, nccl_ref.get(), c.n, c.m, c.n, st,
                                                kernels::gemm_tolerance(c.dt, c.k, world))))
          << at << " (against our GEMM + NCCL)";
      if (op.sequential()) {
        EXPECT_TRUE(test::bitwise(kernels::compare(c.dt, out.get(), c.n, nccl_ref.get(), c.n, c.m, c.n, st))) << at;
      } else if (owners) {  // each tile in its owner's order, by the host
        const std::vector<uint16_t> all = test::download(gathered.get(), world, elems, elems, st);
        std::vector<std::vector<uint16_t>> parts;
        for (int w = 0; w < world; ++w) parts.emplace_back(all.begin() + w * elems, all.begin() + (w + 1) * elems);
        const DeviceBuffer want = rt::to_device(test::owner_order_sum(c.dt, parts, s));
        EXPECT_TRUE(test::bitwise(kernels::compare(c.dt, out.get(), c.n, want.get(), c.n, c.m, c.n, st)))
            << at << " (the owners' order)";
      } else {
        EXPECT_TRUE(test::within(kernels::compare(c.dt, out.get(), c.n, ref.get(), c.n, c.m, c.n, st,
                                                  kernels::gemm_tolerance(c.dt, c.k, world))))
            << at << " (against the rank-order sum)";
      }
      // The norm of this call's sum (out: checked above; the op sums the same way in both calls).
      const test::NormCheck norm =
          test::check_rmsnorm(c.dt, out.get(), c.n, residual.get(), weight.get(), eps, y.get(), h.get(), c.m, c.n, st);
      EXPECT_TRUE(test::within(norm.out)) << at << " (RMSNorm, eps " << eps << ")";
      EXPECT_TRUE(test::bitwise(norm.residual_out)) << at << " (RMSNorm's residual_out)";
    }
    cudaStreamDestroy(st);
  });
}

// The layouts NCCL moves on more than 2 ranks (owners: the next test), on
// 128x256 and ragged 128x128 shapes.
TEST(OverlapAllReduceWorld, EachLayoutMatchesItsReferenceOnEveryGpu) {
  REQUIRE_WORLD_OVER_TWO();
  using L = rt::ArLayout;
  std::vector<WorldCase> cases;
  for (L l : {L::RowBands, L::Slots}) {
    cases.push_back({2048, 4096, 1024, 256, 124, DType::BF16, l});
    cases.push_back({777, 4104, 512, 128, 100, DType::FP16, l});
  }
  for (const WorldCase& c : cases) check_world_case(c, test::fresh_seed());
}

// Owners on every GPU (kernels::Owner::world): each tile summed by its
// owner from the other ranks' partials in its window slots, the final sent
// to every other rank; bitwise the host's sum in the owners' order, within
// the bound of our GEMM + NCCL, copied into the output (run), stored straight into a
// registered one (run_registered) or in the window (run_rmsnorm); ragged,
// fp16, a one-wave grid, fewer CTAs.
TEST(OverlapAllReduceWorld, OwnersOnEveryGpuSumInTheirOrder) {
  REQUIRE_WORLD_OVER_TWO();
  const rt::ArLayout l = rt::ArLayout::Owners;
  constexpr int kFull = test::kFullGrid;  // (one CTA per SM)
  const std::vector<WorldCase> cases = {
      {2048, 4096, 1024, 256, kFull, DType::BF16, l},       {2048, 4096, 1024, 256, kFull, DType::BF16, l, true, true},
      {3001, 4104, 1024, 256, kFull, DType::FP16, l, false}, {3001, 4104, 1024, 256, 116, DType::FP16, l, true, true},
      {1000, 2048, 512, 256, kFull, DType::BF16, l},        {1024, 8192, 2048, 256, kFull, DType::BF16, l, true, true}};
  for (const WorldCase& c : cases) check_world_case(c, test::fresh_seed());
}

}  // namespace
