// GPU tests of the overlapped GEMM + AllReduce on 2 GPUs (one thread per
// GPU, one NCCL communicator per GPU from ncclCommInitAll). Skipped visibly
// with fewer than 2 Hopper GPUs.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/check.h"
#include "kernels/gemm.h"
#include "kernels/reorder.h"
#include "plan/partition.h"
#include "runtime/ops/baselines.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/communicator.h"
#include "runtime/core/cublas.h"
#include "runtime/core/exchange.h"
#include "runtime/ops/allreduce.h"
#include "runtime/tune/tuner.h"
#include "process/bootstrap.h"
#include "runtime/transport/peers.h"
#include "host_reference.h"
#include "rank_harness.h"

using namespace flashoverlap;
using kernels::DType;
using rt::DeviceBuffer;

namespace {

constexpr int kWorld = 2;

#define REQUIRE_TWO_GPUS() FO_REQUIRE_HOPPER_GPUS(kWorld)

using test::fresh_seed;
using test::kFullGrid;
using test::random_groups;
using test::sched_for;

// Every case here runs on GPUs 0 and 1 (test_overlap_allreduce_world runs
// on all of them).
void on_each_rank(const std::function<void(int, ncclComm_t)>& body) { test::on_each_rank(kWorld, body); }

struct Case {
  int m, n, k, bn, ctas;  // ctas: kFullGrid, one CTA per SM; another count, at most the SMs (test::grid_ctas)
  DType dt;
  rt::ArLayout layout = rt::ArLayout::Slots;
  bool copy_in_gemm = true;  // owners: the producer warps copy the peer's finals during the GEMM
  bool misaligned_out = false;  // both outputs 2 bytes off 16-byte alignment (owners: through the op's scratch)
  bool four_stages = true;  // 128x256 tiles: 4 stages, the output in pieces, where the store qualifies (false: 3)
  bool trace = false;        // the op's trace on (phase and tile monitors); checked after the calls
  // owners, 4 stages: the tiles sent by TMA from the staging (0 none, 1 each CTA's last, 2 all)
  int push_tma = rt::OverlapAllReduceOptions{}.push_tma;
  bool owners_wide = false;  // owners: the path of 3-8 ranks at 2 (OverlapAllReduceOptions::testing.owners_wide)
  bool fallback = false;     // one group: the sequential fallback (else the op must overlap)
};

// What the case is (FO_TEST_CASES matches against it), before the random
// swizzle, groups and seed; its grid as it runs on this device.
std::string case_name(const Case& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " tile 128x" +
         std::to_string(c.bn) + (c.four_stages ? "" : " 3 stages") +
         " ctas=" + std::to_string(test::grid_ctas(c.ctas)) +
         (c.push_tma == rt::OverlapAllReduceOptions{}.push_tma ? ""
          : " push_tma=" + std::to_string(c.push_tma)) +
         (c.owners_wide ? " wide" : "") + (c.fallback ? " fallback" : "");
}

// Overlapped output == our GEMM + one ncclAllReduce, bit for bit (a + b
// commutes), over several calls (epochs, from 0 or across the counters'
// 2^32 wrap), for plain outputs and in place (the RMSNorm form keeps C in
// the owners' window); within the per-element bound
// of cuBLAS + NCCL; the RMSNorm path (out and residual_out) against the
// host's definition of it from that AllReduce, with an eps that matters on
// some calls. On `world` ranks (1: the layouts NCCL moves, on one GPU).
void check_case(const Case& c, uint64_t seed, int world = kWorld) {
  std::mt19937_64 rng(seed);
  // Row bands: a swizzle that leaves at least two bands where the tile rows allow.
  const int tiles_m = (c.m + 127) / 128;
  const int swizzle = 1 + int(rng() % 8);
  const plan::Schedule s =
      sched_for(c.m, c.n, c.bn, test::grid_ctas(c.ctas),
                rt::is_banded(c.layout) ? std::min(swizzle, std::max(1, tiles_m / 2)) : swizzle);
  const std::vector<plan::Group> groups =
      c.fallback ? plan::make_groups(s, {s.waves()}) : random_groups(s, c.layout, rng);
  const uint32_t first_epoch = rng() % 2 ? 0u : 0xFFFFFFFEu - uint32_t(rng() % 4);  // (calls 1-9 across the wrap)
  const std::string where = case_name(c) + (c.trace ? " traced" : "") + " swizzle " + std::to_string(s.swizzle) +
                            " " + rt::layout_name(c.layout) + " groups " + std::to_string(groups.size()) +
                            " world " + std::to_string(world) + " first epoch " + std::to_string(first_epoch) +
                            " seed=" + std::to_string(seed);
  std::fprintf(stderr, "case: %s\n", where.c_str());  // (unbuffered: names the case a hang is in)
  test::on_each_rank(world, [&](int rank, ncclComm_t comm) {
    const size_t cb = size_t(c.m) * c.n * 2;
    DeviceBuffer a(size_t(c.m) * c.k * 2), b(size_t(c.n) * c.k * 2), ref(cb), cub(cb), residual(cb),
        weight(size_t(c.n) * 2), y_buf(cb + 16), h_out(cb), first(cb);
    // The outputs; 2 bytes in (misaligned_out), the GEMM cannot store them by TMA: through the op's scratch
    void* const y = static_cast<char*>(y_buf.get()) + (c.misaligned_out ? 2 : 0);
    DeviceBuffer out_buf(cb + 16);
    void* const outp = static_cast<char*>(out_buf.get()) + (c.misaligned_out ? 2 : 0);
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    rt::OverlapAllReduceOptions o;
    o.sched = s, o.groups = groups, o.layout = c.layout, o.k = c.k, o.dtype = c.dt, o.comm = comm, o.rank = rank;
    o.wait_timeout_s = 5;  // a missing flag fails the case in seconds (a call takes milliseconds)
    o.owner_copy_in_gemm = c.copy_in_gemm;
    o.four_stages = c.four_stages;
    o.trace = c.trace;
    o.push_tma = c.push_tma;
    o.testing.owners_wide = c.owners_wide;
    o.testing.first_epoch = first_epoch;
    rt::OverlapAllReduce op(o);
    ASSERT_EQ(op.sequential(), c.fallback) << where << (c.fallback ? "" : ": the overlapped case took the fallback");
    EXPECT_EQ(op.epoch(), first_epoch) << where;
    if (!c.trace) {  // no trace buffers: nothing to turn on, an empty timeline
      EXPECT_THROW(op.set_tracing(true), InvalidArgument) << where;
      EXPECT_EQ(op.timeline().phases.ctas, 0) << where;
    }
    rt::CublasGemm cublas;
    plan::Schedule full = s;
    full.ctas = rt::current_device_sms();
    rt::Timeline traced;  // (trace: call 1's timeline; calls 0 and 2 run untraced)
    for (int call = 0; call < 3; ++call) {  // fresh inputs each call
      if (c.trace) op.set_tracing(call == 1);
      const uint64_t sd = seed + 1000 * call + 17 * rank;
      // (h = the sum over ranks + residual: mean square ~ world k / 9 + 1 / 3)
      const float eps = test::eps_for_call(call, world * double(c.k) / 9 + 1.0 / 3);
      kernels::fill_random(c.dt, a.get(), int64_t(c.m) * c.k, sd, -1.f, 1.f, st);
      kernels::fill_random(c.dt, b.get(), int64_t(c.n) * c.k, sd + 1, -1.f, 1.f, st);
      kernels::fill_random(c.dt, residual.get(), int64_t(c.m) * c.n, sd + 2, -1.f, 1.f, st);
      kernels::fill_random(c.dt, weight.get(), c.n, sd + 3, 0.5f, 1.5f, st);
      for (auto* p : {&ref, &cub, &h_out}) kernels::poison(p->get(), int64_t(c.m) * c.n, st);
      kernels::poison(y, int64_t(c.m) * c.n, st);
      kernels::poison(outp, int64_t(c.m) * c.n, st);
      kernels::poison(first.get(), int64_t(c.m) * c.n, st);
      rt::sequential_ours_allreduce(c.dt, a.get(), b.get(), ref.get(), full, c.k, comm, st);
      rt::sequential_cublas_allreduce(cublas, c.dt, a.get(), b.get(), cub.get(), c.m, c.n, c.k, comm, st);
      // Three calls a round, so that each runs on either half of the owners'
      // windows in turn; the first finds its half holding the previous
      // round's result, from other inputs.
      op.run(a.get(), b.get(), first.get(), c.n, st);
      op.run(a.get(), b.get(), outp, c.n, st);
      op.run_rmsnorm(a.get(), b.get(), rt::RmsNormArgs{residual.get(), weight.get(), eps, h_out.get()}, y, st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      // A timed-out wait is a failure, not a throw: this rank goes on with
      // the same NCCL calls as the other, which would otherwise block in
      // them for ever.
      try {
        op.check();
      } catch (const Error& e) {
        ADD_FAILURE() << where << " call " << call << ": " << e.what();
      }
      const std::string at = where + " rank " + std::to_string(rank) + " call " + std::to_string(call);
      EXPECT_TRUE(test::bitwise(kernels::compare(c.dt, first.get(), c.n, ref.get(), c.n, c.m, c.n, st))) << at
                                                                                                      << " (first)";
      EXPECT_TRUE(test::bitwise(kernels::compare(c.dt, outp, c.n, ref.get(), c.n, c.m, c.n, st))) << at;
      EXPECT_TRUE(test::within(kernels::compare(c.dt, outp, c.n, cub.get(), c.n, c.m, c.n, st,
                                                kernels::gemm_tolerance(c.dt, c.k, world))))
          << at << " (against cuBLAS + NCCL)";
      const test::NormCheck norm = test::check_rmsnorm(c.dt, ref.get(), c.n, residual.get(), weight.get(), eps, y,
                                                       h_out.get(), c.m, c.n, st);
      EXPECT_TRUE(test::within(norm.out)) << at << " (RMSNorm path, eps " << eps << ")";
      EXPECT_TRUE(test::bitwise(norm.residual_out)) << at << " (RMSNorm path's residual_out)";
      if (c.trace && !op.sequential()) {  // an untraced call records nothing: the timeline stays call 1's
        const rt::Timeline tl = op.timeline();
        if (call == 0) EXPECT_EQ(tl.phases.ctas, 0) << where << ": a timeline before any traced call";
        if (call == 1) traced = tl;
        if (call == 2) {
          EXPECT_EQ(tl.gemm_end, traced.gemm_end) << where << ": the untraced call 2 moved the timeline";
          EXPECT_EQ(tl.phases.end_us, traced.phases.end_us) << where;
          EXPECT_EQ(tl.clocks.mhz, traced.clocks.mhz) << where;
        }
      }
    }
    EXPECT_EQ(op.epoch(), op.sequential() ? first_epoch : first_epoch + 9u);  // (3 calls, 3 rounds)
    if (c.trace && c.layout == rt::ArLayout::Owners) {  // the traced call's phases: every CTA with a tile staged, stored, copied
      EXPECT_EQ(op.four_stages(), c.four_stages && c.bn == 256) << where;
      const rt::Timeline tl = op.timeline();
      EXPECT_EQ(tl.phases.ctas, std::min(s.ctas, s.tiles())) << where;
      EXPECT_GT(tl.phases.staged_median_us, 0.0) << where;
      EXPECT_GE(tl.phases.stored_max_us, tl.phases.staged_max_us) << where;
      EXPECT_GT(tl.phases.copied_max_us, 0.0) << where;
      EXPECT_GT(tl.clocks.mhz, 0) << where;  // (any clock: throttled GPUs run low)
    }
    cudaStreamDestroy(st);
  });
}

// check_case for each case, each with a fresh seed (printed with the case:
// FO_TEST_SEED=<it> replays it). FO_TEST_CASES=text runs only the cases
// whose case_name (e.g. "n=4104") contains it.
void check_cases(const std::vector<Case>& cases, int world = kWorld) {
  const char* only = std::getenv("FO_TEST_CASES");
  for (const Case& c : cases)
    if (!only || case_name(c).find(only) != std::string::npos)
      check_case(c, fresh_seed(), world);
}

TEST(OverlapAllReduce, MatchesSequentialBitwiseAcrossShapesAndEpochs) {
  REQUIRE_TWO_GPUS();
  check_cases({
      {4096, 8192, 4096, 256, 116, DType::BF16}, {3001, 7168, 2048, 128, 120, DType::BF16},
      {2048, 4096, 8192, 256, 124, DType::FP16}, {777, 4104, 512, 128, 100, DType::FP16},
      {1000, 1000, 1000, 128, 7, DType::BF16}});
}

TEST(OverlapAllReduce, RowBandsMatchSequentialBitwise) {
  REQUIRE_TWO_GPUS();
  check_cases({
      {4096, 8192, 4096, 256, 114, DType::BF16, rt::ArLayout::RowBands},
      {3001, 7168, 2048, 128, 120, DType::BF16, rt::ArLayout::RowBands},
      {2048, 4096, 8192, 256, 124, DType::FP16, rt::ArLayout::RowBands},
      {777, 4104, 512, 128, 100, DType::FP16, rt::ArLayout::RowBands},
      {1000, 1000, 1000, 128, 7, DType::BF16, rt::ArLayout::RowBands}});
}

// The owner cases: both dtypes, ragged M and N, 7 CTAs, a misaligned
// output (through the op's scratch), T < CTAs, the copy of the peer's
// finals in the GEMM and after it.
std::vector<Case> owner_cases() {
  constexpr auto O = rt::ArLayout::Owners;
  return {{4096, 8192, 4096, 256, kFullGrid, DType::BF16, O, true, false},
          {3001, 7168, 2048, 128, kFullGrid, DType::FP16, O, false, false},
          {777, 4104, 512, 128, 100, DType::BF16, O, true, false},
          {1000, 1000, 1000, 128, 7, DType::BF16, O, true, false},
          {2048, 4096, 8192, 256, 124, DType::FP16, O, true, false},
          {2048, 4096, 1024, 256, kFullGrid, DType::BF16, O, true, true},  // misaligned output
          // 128 tiles on one CTA per SM (fewer tiles than CTAs on an H100 SXM or H200)
          {1024, 2048, 256, 128, kFullGrid, DType::BF16, O, true, false},
          {1024, 2048, 256, 128, kFullGrid, DType::BF16, O, false, false},
          // 128x256 with 3 stages (the output pushed from shared memory) beside the 4-stage cases above
          {4096, 8192, 4096, 256, kFullGrid, DType::BF16, O, true, false, false},
          {3001, 4104, 1024, 256, kFullGrid, DType::FP16, O, false, false, false},
          {3001, 4104, 1024, 256, kFullGrid, DType::FP16, O, false, false},  // ragged, 4 stages
          // tiles = 2 x CTAs (264 tiles on an H100 SXM's or H200's one CTA per SM): each CTA's two
          // tiles are computed by the peer in the other order
          {1408, 6144, 512, 256, kFullGrid, DType::BF16, O, true, false},
          // traced (the phase monitor), on 4 and on 3 stages
          {2048, 4096, 1024, 256, kFullGrid, DType::BF16, O, true, false, true, true},
          {2048, 4096, 1024, 256, kFullGrid, DType::BF16, O, true, false, false, true}};
}

// Row bands on 2 ranks with owners: each tile summed in its owner's epilogue
// (the peer's partial loaded into the staging buffer), the final stored into
// the output and the peer's window, copied into the peer's output during its
// GEMM (owner_copy_in_gemm: by the producer's warps too) or, for a
// misaligned output, through the op's scratch.
TEST(OverlapAllReduce, OwnersMatchSequentialBitwise) {
  REQUIRE_TWO_GPUS();
  check_cases(owner_cases());
}

// Registered outputs (run_registered): with owners on 4 stages the
// peer stores its finals straight into this rank's output, which then needs
// no copy; bitwise our GEMM + one ncclAllReduce, in two registered buffers
// used in turns and again (the same buffer in consecutive calls), one of
// them strided; every push mode (each CTA's last tile by TMA, none, all);
// on other plans (128x128 tiles: 3 stages) run_registered is run; and the
// path of 3-8 ranks at 2 (owners_wide: every rank's output by rank).
TEST(OverlapAllReduce, RegisteredOutputsTakeThePeersFinalsDirectly) {
  REQUIRE_TWO_GPUS();
  struct Shape {
    int m, n, k, bn;
    DType dt;
    int push_tma = rt::OverlapAllReduceOptions{}.push_tma;
    bool wide = false;  // owners_wide: the path of 3-8 ranks (every rank's output by rank)
  };
  for (const Shape& sh : {Shape{2048, 4096, 1024, 256, DType::BF16}, Shape{3001, 4104, 1024, 256, DType::FP16},
                          Shape{1408, 6144, 512, 256, DType::BF16}, Shape{777, 4104, 512, 128, DType::BF16},
                          Shape{2048, 4096, 1024, 256, DType::BF16, 0}, Shape{3001, 4104, 1024, 256, DType::FP16, 2},
                          Shape{2048, 4096, 1024, 256, DType::BF16, 1, true},
                          Shape{3001, 4104, 1024, 256, DType::FP16, 1, true}}) {
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    const plan::Schedule s = sched_for(sh.m, sh.n, sh.bn, rt::current_device_sms(), 1 + int(rng() % 4));
    const std::vector<plan::Group> groups = random_groups(s, rt::ArLayout::Owners, rng);
    const std::string where = std::to_string(sh.m) + "x" + std::to_string(sh.n) + "x" + std::to_string(sh.k) +
                              " tile 128x" + std::to_string(sh.bn) + " push_tma=" + std::to_string(sh.push_tma) +
                              (sh.wide ? " wide" : "") + " seed=" + std::to_string(seed);
    std::fprintf(stderr, "case: registered outputs %s\n", where.c_str());
    on_each_rank([&](int rank, ncclComm_t comm) {
      const int64_t ld1 = sh.n + 8 * (rank + 1);  // the second output strided, differently on each rank
      DeviceBuffer a(size_t(sh.m) * sh.k * 2), b(size_t(sh.n) * sh.k * 2), ref(size_t(sh.m) * sh.n * 2),
          out0(size_t(sh.m) * sh.n * 2), out1(size_t(sh.m) * ld1 * 2);
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      rt::OverlapAllReduceOptions o;
      o.sched = s, o.groups = groups, o.layout = rt::ArLayout::Owners, o.k = sh.k, o.dtype = sh.dt, o.comm = comm;
      o.rank = rank, o.wait_timeout_s = 5, o.push_tma = sh.push_tma;
      o.testing.owners_wide = sh.wide;
      rt::OverlapAllReduce op(o);
      EXPECT_EQ(op.finals_into_outputs(), sh.bn == 256) << where;
      EXPECT_THROW(op.register_output(static_cast<char*>(out0.get()) + 2, sh.n), InvalidArgument);  // misaligned
      const int slot0 = op.register_output(out0.get(), sh.n), slot1 = op.register_output(out1.get(), ld1);
      EXPECT_EQ(slot0, 0);
      EXPECT_EQ(slot1, 1);
      EXPECT_THROW(op.run_registered(a.get(), b.get(), 2, st), InvalidArgument);
      plan::Schedule full = s;
      full.ctas = rt::current_device_sms();
      for (int call = 0; call < 4; ++call) {  // slots 0, 0, 1, 0: a buffer reused in consecutive calls too
        const int slot = call == 2 ? slot1 : slot0;
        void* out = slot == slot1 ? out1.get() : out0.get();
        const int64_t ld = slot == slot1 ? ld1 : sh.n;
        const uint64_t sd = seed + 1000 * call + 17 * rank;
        kernels::fill_random(sh.dt, a.get(), int64_t(sh.m) * sh.k, sd, -1.f, 1.f, st);
        kernels::fill_random(sh.dt, b.get(), int64_t(sh.n) * sh.k, sd + 1, -1.f, 1.f, st);
        kernels::poison(out, int64_t(sh.m) * ld, st);
        rt::sequential_ours_allreduce(sh.dt, a.get(), b.get(), ref.get(), full, sh.k, comm, st);
        op.run_registered(a.get(), b.get(), slot, st);
        FO_CUDA_CHECK(cudaStreamSynchronize(st));
        try {
          op.check();
        } catch (const Error& e) {
          ADD_FAILURE() << where << " call " << call << ": " << e.what();
        }
        EXPECT_TRUE(test::bitwise(kernels::compare(sh.dt, out, ld, ref.get(), sh.n, sh.m, sh.n, st)))
            << where << " rank " << rank << " call " << call << " slot " << slot;
      }
      // Back to back into one buffer, no sync between the calls, rank 1
      // enqueueing late: each call's result is snapshot on the stream right
      // after it (the peer's finals of the next call must not land before).
      constexpr int kCalls = 3;
      std::vector<DeviceBuffer> refs, snaps, as;
      for (int call = 0; call < kCalls; ++call) {
        as.emplace_back(size_t(sh.m) * sh.k * 2);
        refs.emplace_back(size_t(sh.m) * sh.n * 2);
        snaps.emplace_back(size_t(sh.m) * sh.n * 2);
        kernels::fill_random(sh.dt, as.back().get(), int64_t(sh.m) * sh.k, seed + 77 * (call + 1) + rank, -1.f, 1.f, st);
        rt::sequential_ours_allreduce(sh.dt, as.back().get(), b.get(), refs.back().get(), full, sh.k, comm, st);
      }
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int call = 0; call < kCalls; ++call) {
        op.run_registered(as[size_t(call)].get(), b.get(), slot0, st);
        FO_CUDA_CHECK(cudaMemcpyAsync(snaps[size_t(call)].get(), out0.get(), size_t(sh.m) * sh.n * 2,
                                      cudaMemcpyDeviceToDevice, st));
      }
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      try {
        op.check();
      } catch (const Error& e) {
        ADD_FAILURE() << where << " back to back: " << e.what();
      }
      for (int call = 0; call < kCalls; ++call) {
        EXPECT_TRUE(test::bitwise(kernels::compare(sh.dt, snaps[size_t(call)].get(), sh.n, refs[size_t(call)].get(),
                                                   sh.n, sh.m, sh.n, st)))
            << where << " back to back, rank " << rank << " call " << call;
      }
      cudaStreamDestroy(st);
    });
  }
}

// Owners with 4 stages and the push modes besides the default (each
// CTA's last tile by TMA from the staging): every tile from C by the storer
// warp, every tile by TMA. The 128x256 owner cases above (ragged, fp16, 124
// CTAs, misaligned, tiles = 2 x CTAs, traced).
TEST(OverlapAllReduce, OwnersOtherPushModesMatchSequentialBitwise) {
  REQUIRE_TWO_GPUS();
  std::vector<Case> cases;
  for (int mode : {0, 2})
    for (Case c : owner_cases())
      if (c.bn == 256 && c.four_stages) {
        c.push_tma = mode;
        cases.push_back(c);
      }
  check_cases(cases);
}

// Owners on 2 ranks through the path of 3-8 (owners_wide: every rank's
// window, flags and output passed by rank, the final to "every other
// rank", the pusher warps, no TMA pushes): the same bits as the 2-rank
// path, so 2 GPUs test that runtime (window pointers, registered outputs
// by rank) across processes. The 128x256 owner cases above.
TEST(OverlapAllReduce, OwnersWidePathMatchesSequentialBitwise) {
  REQUIRE_TWO_GPUS();
  std::vector<Case> cases;
  for (Case c : owner_cases())
    if (c.bn == 256 && c.four_stages) {
      c.owners_wide = true;
      cases.push_back(c);
    }
  check_cases(cases);
}

// One group (a plan the model finds no gain in, or one tile): our GEMM into
// the output, then one ncclAllReduce; into a strided output too.
TEST(OverlapAllReduce, SequentialFallbackMatches) {
  REQUIRE_TWO_GPUS();
  std::vector<Case> cases = {{128, 256, 64, 256, 4, DType::BF16}, {1000, 2048, 1024, 256, kFullGrid, DType::FP16}};
  for (Case& c : cases) c.fallback = true;
  check_cases(cases);
  const uint64_t seed = fresh_seed();
  on_each_rank([&](int rank, ncclComm_t comm) {
    const int m = 1000, n = 2048, k = 1024;
    const plan::Schedule s = sched_for(m, n, 256, rt::current_device_sms(), 4);
    rt::OverlapAllReduceOptions o;
    o.sched = s, o.groups = plan::make_groups(s, {s.waves()}), o.k = k, o.comm = comm, o.rank = rank;
    rt::OverlapAllReduce op(o);
    EXPECT_TRUE(op.sequential());
    DeviceBuffer a(size_t(m) * k * 2), b(size_t(n) * k * 2), ref(size_t(m) * n * 2), out(size_t(m) * (n + 8) * 2);
    kernels::fill_random(DType::BF16, a.get(), int64_t(m) * k, seed + rank, -1.f, 1.f, nullptr);
    kernels::fill_random(DType::BF16, b.get(), int64_t(n) * k, seed + 7 + rank, -1.f, 1.f, nullptr);
    kernels::poison(out.get(), int64_t(m) * (n + 8), nullptr);
    rt::sequential_ours_allreduce(DType::BF16, a.get(), b.get(), ref.get(), s, k, comm, nullptr);
    op.run(a.get(), b.get(), out.get(), n + 8, nullptr);  // strided output
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::bitwise(kernels::compare(DType::BF16, out.get(), n + 8, ref.get(), n, m, n, nullptr)))
        << "seed=" << seed;
  });
}

// What one GPU can test of the op: the layouts NCCL moves at world 1 (each
// AllReduce a copy), so the signalling GEMM, the groups' waits,
// the slot reorder and the element-wise steps (plain, residual + RMSNorm),
// checked as check_case checks them on 2 GPUs; the fallback too.
TEST(OverlapAllReduceOneGpu, NcclLayoutsMatchTheirReferences) {
  REQUIRE_HOPPER();
  using L = rt::ArLayout;
  std::vector<Case> cases = {
      {4096, 8192, 2048, 256, 116, DType::BF16, L::Slots},       {3001, 7168, 1024, 128, 120, DType::FP16, L::Slots},
      {777, 4104, 512, 128, 100, DType::BF16, L::Slots},         {4096, 8192, 2048, 256, 114, DType::BF16, L::RowBands},
      {3001, 7168, 1024, 128, 120, DType::FP16, L::RowBands},    {777, 4104, 512, 128, 100, DType::FP16, L::RowBands},
      {128, 256, 64, 256, 4, DType::BF16},                       {1000, 2048, 1024, 256, kFullGrid, DType::FP16}};
  cases[cases.size() - 1].fallback = cases[cases.size() - 2].fallback = true;
  check_cases(cases, 1);
}

// NCCL_P2P_DISABLE=1 (the GPUs then talk through host memory, as on PCIe
// machines without P2P): no rank counts as within load/store reach, so the
// ops and the tuner leave out every NVLink path (owners, the NVLink forms)
// and plan NCCL's. On one GPU, where a
// rank reaches itself without the variable.
TEST(OverlapAllReduceOneGpu, P2pDisabledLeavesNoRankWithinReach) {
  REQUIRE_HOPPER();
  const char* was = std::getenv("NCCL_P2P_DISABLE");
  const std::string saved = was ? was : "";
  // (the variable read as NCCL reads it; on this thread, before any communicator)
  for (const auto& [value, off] : {std::pair<const char*, bool>{"1", true}, {"2", true}, {"0", false}, {"", false}}) {
    setenv("NCCL_P2P_DISABLE", value, 1);
    EXPECT_EQ(rt::p2p_disabled(), off) << "NCCL_P2P_DISABLE='" << value << "'";
  }
  unsetenv("NCCL_P2P_DISABLE");
  EXPECT_FALSE(rt::p2p_disabled());
  bool plain = false, disabled = true;
  test::on_each_rank(1, [&](int, ncclComm_t comm) {
    plain = rt::all_ranks_reachable(comm);
    setenv("NCCL_P2P_DISABLE", "1", 1);  // (NCCL read its own at the communicator's creation)
    disabled = rt::all_ranks_reachable(comm);
  });
  if (was) setenv("NCCL_P2P_DISABLE", saved.c_str(), 1);
  else unsetenv("NCCL_P2P_DISABLE");
  if (!plain) GTEST_SKIP() << "no rank within reach here even without NCCL_P2P_DISABLE (no NCCL device API?)";
  EXPECT_FALSE(disabled) << "NCCL_P2P_DISABLE=1 left a rank within reach";
}

// The contract of allreduce.h's "Calls and streams", on one GPU
// (world 1), with no host sync between calls: one op's calls on two streams
// in turn (the op orders them: they share its slots and counters); two ops'
// calls interleaved on one stream; an op destroyed with its calls still
// queued behind other work. Every output is bitwise our GEMM + NCCL of its
// call's inputs.
TEST(OverlapAllReduceOneGpu, CallsOnTwoStreamsTwoOpsAndDestroyInFlight) {
  REQUIRE_HOPPER();
  const uint64_t seed = fresh_seed();
  test::on_each_rank(1, [&](int rank, ncclComm_t comm) {
    const int m = 2048, n = 4096, k = 1024, calls = 6;
    const plan::Schedule s = sched_for(m, n, 256, test::grid_ctas(116), 4);
    auto options = [&](rt::ArLayout layout) {
      rt::OverlapAllReduceOptions o;
      o.sched = s, o.layout = layout, o.k = k, o.comm = comm, o.rank = rank, o.wait_timeout_s = 5;
      o.groups = layout == rt::ArLayout::RowBands ? plan::band_groups(s, std::vector<int>(size_t(plan::band_count(s)), 1))
                                                  : plan::make_groups(s, plan::Partition(size_t(s.waves()), 1));
      return o;
    };
    cudaStream_t st[2];
    for (auto& x : st) FO_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    const int64_t busy_elems = int64_t(256) << 20;  // 512 MiB of writes: the calls queue up behind them
    DeviceBuffer b(size_t(n) * k * 2), ref(size_t(m) * n * 2), busy(size_t(busy_elems) * 2);
    std::vector<DeviceBuffer> as, outs;
    for (int c = 0; c < calls; ++c) {
      as.emplace_back(size_t(m) * k * 2);
      outs.emplace_back(size_t(m) * n * 2);
      kernels::fill_random(DType::BF16, as.back().get(), int64_t(m) * k, seed + 100 * c, -1.f, 1.f, st[0]);
    }
    kernels::fill_random(DType::BF16, b.get(), int64_t(n) * k, seed + 1, -1.f, 1.f, st[0]);
    auto check_outputs = [&](const std::string& what) {
      for (int c = 0; c < calls; ++c) {
        kernels::poison(ref.get(), int64_t(m) * n, st[0]);
        rt::sequential_ours_allreduce(DType::BF16, as[size_t(c)].get(), b.get(), ref.get(), s, k, comm, st[0]);
        EXPECT_TRUE(test::bitwise(kernels::compare(DType::BF16, outs[size_t(c)].get(), n, ref.get(), n, m, n, st[0])))
            << what << ", call " << c << ", seed " << seed;
      }
    };
    auto poison_outputs = [&] {
      for (auto& o : outs) kernels::poison(o.get(), int64_t(m) * n, st[0]);
      FO_CUDA_CHECK(cudaStreamSynchronize(st[0]));
    };
    {  // one op, calls on two streams in turn, stream 0 held back by other work
      poison_outputs();
      rt::OverlapAllReduce op(options(rt::ArLayout::Slots));
      for (int c = 0; c < calls; ++c) {
        if (c % 2 == 0) kernels::fill_random(DType::BF16, busy.get(), busy_elems, c, -1.f, 1.f, st[0]);
        op.run(as[size_t(c)].get(), b.get(), outs[size_t(c)].get(), n, st[c % 2]);
      }
      for (auto& x : st) FO_CUDA_CHECK(cudaStreamSynchronize(x));
      op.check();
      check_outputs("one op on two streams");
    }
    {  // two ops (slots, row bands) interleaved on one stream
      poison_outputs();
      rt::OverlapAllReduce op0(options(rt::ArLayout::Slots)), op1(options(rt::ArLayout::RowBands));
      for (int c = 0; c < calls; ++c) (c % 2 ? op1 : op0).run(as[size_t(c)].get(), b.get(), outs[size_t(c)].get(), n, st[1]);
      FO_CUDA_CHECK(cudaStreamSynchronize(st[1]));
      op0.check();
      op1.check();
      check_outputs("two ops on one stream");
    }
    {  // destroyed with its calls queued behind other work
      poison_outputs();
      {
        rt::OverlapAllReduce op(options(rt::ArLayout::Slots));
        kernels::fill_random(DType::BF16, busy.get(), busy_elems, 7, -1.f, 1.f, st[1]);
        for (int c = 0; c < calls; ++c) op.run(as[size_t(c)].get(), b.get(), outs[size_t(c)].get(), n, st[1]);
      }  // (the destructor waits for the last call)
      EXPECT_EQ(cudaStreamQuery(st[1]), cudaSuccess) << "the destructor returned before the op's last call ended";
      check_outputs("destroyed in flight");
    }
    for (auto& x : st) FO_CUDA_CHECK(cudaStreamDestroy(x));
  });
}

// Runs one call of the op that options_for(rank, comm) describes, on every
// rank, 2048x4096x512 with a group made to never complete
// (fault_drop_group = 1, 0.25 s bound), and returns what check() threw on
// each rank and the seconds it all took. check_copy: the op must copy where
// the options ask it to (owners).
std::pair<std::vector<std::string>, double> stuck_group_messages(
    const std::function<rt::OverlapAllReduceOptions(int, ncclComm_t)>& options_for, bool check_copy) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> messages(kWorld);
  on_each_rank([&](int rank, ncclComm_t comm) {
    const int m = 2048, n = 4096, k = 512;
    rt::OverlapAllReduceOptions o = options_for(rank, comm);
    o.k = k, o.comm = comm, o.rank = rank;
    o.wait_timeout_s = 0.25;
    o.testing.fault_drop_group = 1;
    rt::OverlapAllReduce op(o);
    if (check_copy) EXPECT_EQ(op.owner_copy_in_gemm(), o.owner_copy_in_gemm);
    DeviceBuffer a(size_t(m) * k * 2), b(size_t(n) * k * 2), out(size_t(m) * n * 2);
    kernels::fill_random(DType::BF16, a.get(), int64_t(m) * k, 1, -1.f, 1.f, nullptr);
    kernels::fill_random(DType::BF16, b.get(), int64_t(n) * k, 2, -1.f, 1.f, nullptr);
    op.run(a.get(), b.get(), out.get(), n, nullptr);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
    try {
      op.check();
    } catch (const Error& e) {
      messages[rank] = e.what();
    }
  });
  return {messages, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// A group whose tiles never signal must fail with rank, group, counter and
// expected value within the bound, not hang.
TEST(OverlapAllReduce, StuckGroupFailsWithMessageInsteadOfHanging) {
  REQUIRE_TWO_GPUS();
  const auto [messages, secs] = stuck_group_messages([](int, ncclComm_t) {
    const plan::Schedule s = sched_for(2048, 4096, 256, test::grid_ctas(116), 4);
    rt::OverlapAllReduceOptions o;
    o.sched = s, o.groups = plan::make_groups(s, {1, 1, s.waves() - 2});
    return o;
  }, false);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(messages[r].find("rank " + std::to_string(r)), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("group 1"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("counter 0, expected"), std::string::npos) << messages[r];
  }
  // (no hang: each wait gives up after 0.25 s; 60 s leaves the communicators' set-up on a loaded machine room)
  EXPECT_LT(secs, 60.0);
}

// The runtime's host exchanges over NCCL (exchange.h) are bounded: a rank
// that does not join (it failed or returned before the step) fails the
// others after their timeout with a message, instead of leaving them
// waiting for ever; the step stays enqueued and completes if it joins late,
// after which the communicator works on. (Ordered by flags, not by sleeps:
// rank 1 joins only once rank 0 has failed, whatever the machine's speed.)
TEST(RankExchange, ARankThatDoesNotJoinFailsTheOthersInBoundedTime) {
  REQUIRE_TWO_GPUS();
  std::atomic<bool> rank0_gave_up{false}, late_joined{false};
  on_each_rank([&](int rank, ncclComm_t comm) {
    // First both together: NCCL connects the ranks at a communicator's first
    // collective of a kind, blocking inside the call (not bounded here).
    EXPECT_EQ(rt::gather_from_all(comm, rank, int64_t(rank), "the first exchange", std::chrono::seconds(30)),
              (std::vector<int64_t>{0, 1}));
    const int64_t mine = 1000 + rank;
    auto wait_for = [](const std::atomic<bool>& flag) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!flag && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return bool(flag);
    };
    if (rank == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        rt::gather_from_all(comm, rank, mine, "the test's exchange", std::chrono::milliseconds(300));
        ADD_FAILURE() << "rank 0's exchange returned although rank 1 had not joined";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("rank 0: the test's exchange: the other ranks did not join within 0.3 s"), std::string::npos)
            << m;
      }
      // (a timeout cannot fire early; there is no upper bound a loaded machine could break)
      EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.3);
      rank0_gave_up = true;
      ASSERT_TRUE(wait_for(late_joined)) << "rank 1 did not complete the late exchange";
    } else {
      ASSERT_TRUE(wait_for(rank0_gave_up)) << "rank 0's exchange did not time out";
      const auto all = rt::gather_from_all(comm, rank, mine, "the test's exchange", std::chrono::seconds(30));
      ASSERT_EQ(all.size(), 2u);
      EXPECT_EQ(all[0], 1000);  // rank 0's value, from the step it left enqueued
      EXPECT_EQ(all[1], 1001);
      late_joined = true;
    }
    const auto next = rt::gather_from_all(comm, rank, int64_t(2000 + rank), "the next exchange",
                                          std::chrono::seconds(30));
    EXPECT_EQ(next, (std::vector<int64_t>{2000, 2001})) << "rank " << rank;
  });
}

// Back-to-back calls with no host sync between them, one rank held back
// before every other call by extra work on its stream: each call's output
// must still be exactly our GEMM + one ncclAllReduce of that call's inputs
// (the two halves of the owners' window keep a fast rank's next call from
// overwriting tiles a slow rank still reads).
TEST(OverlapAllReduce, OwnersBackToBackCallsWithASlowRank) {
  REQUIRE_TWO_GPUS();
  const uint64_t seed = fresh_seed();
  for (const int bn : {256, 128}) {
    on_each_rank([&](int rank, ncclComm_t comm) {
      const int m = 2048, n = 4096, k = 1024, calls = 8;
      std::mt19937_64 rng(seed);  // the same schedule on both ranks
      const plan::Schedule s = sched_for(m, n, bn, rt::current_device_sms(), 1 << int(rng() % 3));
      rt::OverlapAllReduceOptions o;
      o.sched = s, o.layout = rt::ArLayout::Owners, o.k = k, o.comm = comm, o.rank = rank;
      o.groups = plan::band_groups(s, std::vector<int>(size_t(plan::band_count(s)), 1));
      ASSERT_GE(o.groups.size(), 2u);
      rt::OverlapAllReduce op(o);
      ASSERT_FALSE(op.sequential());
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      const int64_t busy_elems = int64_t(256) << 20;  // 512 MiB: ~0.2 ms of writes
      DeviceBuffer b(size_t(n) * k * 2), ref(size_t(m) * n * 2), busy(size_t(busy_elems) * 2);
      std::vector<DeviceBuffer> as, outs;
      kernels::fill_random(DType::BF16, b.get(), int64_t(n) * k, seed + 1 + rank, -1.f, 1.f, st);
      for (int c = 0; c < calls; ++c) {
        as.emplace_back(size_t(m) * k * 2);
        outs.emplace_back(size_t(m) * n * 2);
        kernels::fill_random(DType::BF16, as.back().get(), int64_t(m) * k, seed + 100 * c + 7 * rank, -1.f, 1.f, st);
        kernels::poison(outs.back().get(), int64_t(m) * n, st);
      }
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      for (int c = 0; c < calls; ++c) {
        if (rank == 1 && c % 2 == 0) kernels::fill_random(DType::BF16, busy.get(), busy_elems, c, -1.f, 1.f, st);
        op.run(as[c].get(), b.get(), outs[c].get(), n, st);
      }
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      op.check();
      for (int c = 0; c < calls; ++c) {
        kernels::poison(ref.get(), int64_t(m) * n, st);
        rt::sequential_ours_allreduce(DType::BF16, as[c].get(), b.get(), ref.get(), s, k, comm, st);
        EXPECT_TRUE(test::bitwise(kernels::compare(DType::BF16, outs[c].get(), n, ref.get(), n, m, n, st)))
            << "tile 128x" << bn << " rank " << rank << " call " << c << " seed " << seed;
      }
      cudaStreamDestroy(st);
    });
  }
}

// A call refused by the GEMM's checks (a misaligned A) enqueues no GEMM and
// leaves the epoch as it was, so the next call's flags and buffer half are
// the ones both ranks expect: it still matches our GEMM + one ncclAllReduce.
// (Row bands: NCCL per group on the SMs the GEMM leaves.)
TEST(OverlapAllReduce, CallThatThrowsKeepsTheEpoch) {
  REQUIRE_TWO_GPUS();
  const uint64_t seed = fresh_seed();
  for (const auto [layout, ctas] :
       {std::pair{rt::ArLayout::Owners, kFullGrid}, std::pair{rt::ArLayout::RowBands, 120}}) {
    on_each_rank([&](int rank, ncclComm_t comm) {
      const int m = 1024, n = 2048, k = 512;
      const plan::Schedule s = sched_for(m, n, 256, test::grid_ctas(ctas), 2);
      rt::OverlapAllReduceOptions o;
      o.sched = s, o.layout = layout, o.k = k, o.comm = comm, o.rank = rank;
      o.groups = plan::band_groups(s, std::vector<int>(size_t(plan::band_count(s)), 1));
      rt::OverlapAllReduce op(o);
      ASSERT_FALSE(op.sequential());
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      DeviceBuffer a(size_t(m) * k * 2 + 16), b(size_t(n) * k * 2), out(size_t(m) * n * 2), ref(size_t(m) * n * 2);
      kernels::fill_random(DType::BF16, a.get(), int64_t(m) * k, seed + 7 * rank, -1.f, 1.f, st);
      kernels::fill_random(DType::BF16, b.get(), int64_t(n) * k, seed + 1 + 7 * rank, -1.f, 1.f, st);
      kernels::poison(out.get(), int64_t(m) * n, st);
      const void* bad_a = static_cast<const char*>(a.get()) + 2;
      EXPECT_THROW(op.run(bad_a, b.get(), out.get(), n, st), InvalidArgument) << rt::layout_name(layout);
      EXPECT_EQ(op.epoch(), 0u) << rt::layout_name(layout);
      op.run(a.get(), b.get(), out.get(), n, st);
      EXPECT_EQ(op.epoch(), 1u);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      op.check();
      rt::sequential_ours_allreduce(DType::BF16, a.get(), b.get(), ref.get(), s, k, comm, st);
      EXPECT_TRUE(test::bitwise(kernels::compare(DType::BF16, out.get(), n, ref.get(), n, m, n, st)))
          << rt::layout_name(layout) << " rank " << rank << " seed " << seed;
      cudaStreamDestroy(st);
    });
  }
}

// run_rmsnorm refuses a residual (or residual_out) that overlaps the output
// or each other, and run / run_rmsnorm a null output, before enqueuing
// anything (with owners too, where C can stay in the window); separate
// buffers run.
TEST(OverlapAllReduce, RmsNormRejectsOverlappingBuffers) {
  REQUIRE_TWO_GPUS();
  for (rt::ArLayout layout : {rt::ArLayout::RowBands, rt::ArLayout::Owners}) {
    on_each_rank([&](int rank, ncclComm_t comm) {
      const int m = 1024, n = 2048, k = 256;
      const int ctas = test::grid_ctas(layout == rt::ArLayout::Owners ? kFullGrid : 120);
      const plan::Schedule s = sched_for(m, n, 256, ctas, 2);
      rt::OverlapAllReduceOptions o;
      o.sched = s, o.groups = plan::band_groups(s, {2, 2}), o.k = k, o.comm = comm, o.rank = rank;
      o.layout = layout;
      rt::OverlapAllReduce op(o);
      EXPECT_EQ(op.result_in_window(), layout == rt::ArLayout::Owners);
      const size_t cb = size_t(m) * n * 2;
      DeviceBuffer a(size_t(m) * k * 2), b(size_t(n) * k * 2), out(cb), residual(cb), h(cb), weight(size_t(n) * 2);
      kernels::fill_random(DType::BF16, a.get(), int64_t(m) * k, 1, -1.f, 1.f, nullptr);
      kernels::fill_random(DType::BF16, b.get(), int64_t(n) * k, 2, -1.f, 1.f, nullptr);
      kernels::fill_random(DType::BF16, residual.get(), int64_t(m) * n, 3, -1.f, 1.f, nullptr);
      kernels::fill_random(DType::BF16, weight.get(), n, 4, 0.5f, 1.5f, nullptr);
      char* mid = static_cast<char*>(out.get()) + cb / 2;  // overlaps the second half of out
      EXPECT_THROW(op.run_rmsnorm(a.get(), b.get(), {out.get(), weight.get(), 1e-6f, nullptr}, out.get(), nullptr),
                   InvalidArgument);
      EXPECT_THROW(op.run_rmsnorm(a.get(), b.get(), {mid, weight.get(), 1e-6f, nullptr}, out.get(), nullptr),
                   InvalidArgument);
      EXPECT_THROW(op.run_rmsnorm(a.get(), b.get(), {residual.get(), weight.get(), 1e-6f, mid}, out.get(), nullptr),
                   InvalidArgument);
      EXPECT_THROW(
          op.run_rmsnorm(a.get(), b.get(), {residual.get(), weight.get(), 1e-6f, residual.get()}, out.get(), nullptr),
          InvalidArgument);
      EXPECT_THROW(op.run_rmsnorm(a.get(), b.get(), {residual.get(), weight.get(), 1e-6f, nullptr}, nullptr, nullptr),
                   InvalidArgument);
      EXPECT_THROW(op.run(a.get(), b.get(), nullptr, n, nullptr), InvalidArgument);
      EXPECT_EQ(op.epoch(), 0u);  // nothing was enqueued
      op.run_rmsnorm(a.get(), b.get(), {residual.get(), weight.get(), 1e-6f, h.get()}, out.get(), nullptr);
      FO_CUDA_CHECK(cudaDeviceSynchronize());
      op.check();
    });
  }
}

// The measured choice, end to end on 2 GPUs with a synthetic AllReduce
// curve: every rank picks the same plan (the runoff forced over the three
// fastest of each round), the selection lists the runoff, and the pick runs
// bitwise equal to our GEMM + one ncclAllReduce (within tolerance of it for
// a cuBLAS fallback).
TEST(AllReduceTuner, MeasuredChoiceIsTheSameOnEveryRankAndRuns) {
  REQUIRE_TWO_GPUS();
  for (bool registered : {false, true}) {  // the finalists timed with run, then with run_registered
    SCOPED_TRACE(registered ? "finalists timed into a registered output" : "finalists timed with run");
    const uint64_t seed = fresh_seed();
    rt::ReservedPort hub = rt::ReservedPort::listening();  // (held from now: no other test can take it)
    const int port = hub.port();
    std::vector<std::string> picked(kWorld), selections(kWorld);
    on_each_rank([&](int rank, ncclComm_t comm) {
      rt::DistEnv env;
      env.rank = rank, env.world = kWorld, env.local_rank = rank, env.master_addr = "127.0.0.1", env.master_port = port;
      rt::Rendezvous rv = rank == 0 ? rt::Rendezvous(env, std::move(hub)) : rt::Rendezvous(env);
      const int m = 2048, n = 4096, k = 1024;
      DeviceBuffer a(size_t(m) * k * 2), b(size_t(n) * k * 2), scratch(size_t(m) * n * 2), out(size_t(m) * n * 2),
          ref(size_t(m) * n * 2);
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      kernels::fill_random(DType::BF16, a.get(), int64_t(m) * k, seed + 3 * rank, -1.f, 1.f, st);
      kernels::fill_random(DType::BF16, b.get(), int64_t(n) * k, seed + 5 + 3 * rank, -1.f, 1.f, st);
      const plan::BandwidthCurve curve(plan::Collective::AllReduce, kWorld, {{65536.0, 0.02}, {67108864.0, 0.26}});
      rt::AllReduceTuning t;
      t.rv = &rv, t.stream = st, t.world = kWorld, t.push_reachable = true;
      t.curve_for = [&](int) -> const plan::BandwidthCurve& { return curve; };
      // Registered: owner plans only (the ones run_registered stores into straight).
      t.layouts = registered ? std::vector<rt::ArLayout>{rt::ArLayout::Owners}
                             : std::vector<rt::ArLayout>{rt::ArLayout::RowBands, rt::ArLayout::Owners};
      t.options_for = [&](const rt::AllReducePlan& pl) {
        rt::OverlapAllReduceOptions o;
        o.sched = pl.sched, o.groups = pl.groups, o.layout = pl.layout, o.k = k, o.comm = comm, o.tail_comm = comm;
        o.rank = rank, o.owner_copy_in_gemm = pl.copy_in_gemm, o.fallback_cublas = pl.fallback_cublas;
        return o;
      };
      t.sync_comm = comm, t.selection = &selections[rank];
      t.registered_output = registered;
      t.select_iters = 3, t.runoff_within = 10.0, t.runoff_iters = 4;  // a runoff in every round
      const rt::AllReducePlan plan = rt::tune_allreduce(t, m, n, k, a.get(), b.get(), scratch.get(), 1.0);
      picked[rank] = rt::describe(plan);
      rt::OverlapAllReduce op(t.options_for(plan));
      kernels::poison(out.get(), int64_t(m) * n, st);
      op.run(a.get(), b.get(), out.get(), n, st);
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      op.check();
      rt::sequential_ours_allreduce(DType::BF16, a.get(), b.get(), ref.get(), plan.sched, k, comm, st);
      if (plan.fallback_cublas)  // (cuBLAS's GEMM: within the bound of ours, summed over the ranks)
        EXPECT_TRUE(test::within(kernels::compare(DType::BF16, out.get(), n, ref.get(), n, m, n, st,
                                                  kernels::gemm_tolerance(DType::BF16, k, kWorld))))
            << picked[rank];
      else
        EXPECT_TRUE(test::bitwise(kernels::compare(DType::BF16, out.get(), n, ref.get(), n, m, n, st)))
            << picked[rank] << " seed " << seed;
      cudaStreamDestroy(st);
    });
    EXPECT_EQ(picked[0], picked[1]);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_NE(selections[r].find("runoff (4 runs)"), std::string::npos) << selections[r];
      EXPECT_NE(selections[r].find("* "), std::string::npos) << selections[r];
      if (registered) EXPECT_NE(selections[r].find("owners"), std::string::npos) << selections[r];
    }
  }
}

// Owners: a group whose tiles never arrive fails inside the GEMM's waits
// with the arrival counter, not a hang (the copy in the GEMM or after it).
TEST(OverlapAllReduce, OwnersStuckGroupFailsWithMessage) {
  REQUIRE_TWO_GPUS();
  for (const bool copy : {true, false}) {
    const auto [messages, secs] = stuck_group_messages([&](int, ncclComm_t) {
      const plan::Schedule s = sched_for(2048, 4096, 256, rt::current_device_sms(), 4);
      rt::OverlapAllReduceOptions o;
      o.sched = s, o.groups = plan::band_groups(s, {1, 1, 2});
      o.layout = rt::ArLayout::Owners;
      o.owner_copy_in_gemm = copy;
      return o;
    }, true);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_NE(messages[r].find("rank " + std::to_string(r)), std::string::npos) << messages[r];
      EXPECT_NE(messages[r].find("group 1"), std::string::npos) << messages[r];
      EXPECT_NE(messages[r].find("arrival counter"), std::string::npos) << messages[r];
    }
    EXPECT_LT(secs, 60.0) << "copy in the GEMM " << copy;  // (as in StuckGroupFails...)
  }
}

}  // namespace

namespace {

// Host-side validation, before any CUDA call: runs on any machine.
TEST(OverlapAllReduceOptions, RejectsBadGroupsAndOutOfRangeKnobs) {
  const plan::Schedule s = sched_for(4096, 8192, 256, 114, 4);  // bands of 4 tile rows x 32 tiles
  rt::OverlapAllReduceOptions o;
  o.sched = s, o.k = 512, o.comm = reinterpret_cast<ncclComm_t>(uintptr_t(1));  // never used: validation throws first
  o.layout = rt::ArLayout::RowBands;
  o.groups = {plan::Group{0, 1, 0, 32}, plan::Group{1, 9, 32, s.tiles()}};  // splits band 0
  EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument);
  o.groups = {plan::Group{0, 1, 0, 128}, plan::Group{1, 8, 130, s.tiles()}};  // gap
  EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument);
  o.groups = {plan::Group{0, 1, 0, 128}};  // does not cover all tiles
  EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument);
  o.groups = plan::band_groups(s, {1, 2, 5});
  EXPECT_EQ(o.groups.back().end_tile, s.tiles());
  EXPECT_THROW(plan::band_groups(s, {1, 2, 4}), InvalidArgument);  // 7 of 8 bands
  o.push_tma = 3;  // none, last or all
  EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument);
  o.push_tma = -1;
  EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument);
  o.push_tma = 1;
  for (const int pushers : {-2, 2}) {  // -1 (by k), 0 or 1
    o.owner_pushers = pushers;
    EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument) << "owner_pushers " << pushers;
  }
  o.owner_pushers = -1;
  for (const double t : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e9}) {  // (0, a week]
    o.wait_timeout_s = t;
    EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument) << "wait_timeout_s " << t;
    o.wait_timeout_s = 30, o.exchange_timeout_s = t;
    EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument) << "exchange_timeout_s " << t;
    o.exchange_timeout_s = 120;
  }
  o.comm = nullptr;
  EXPECT_THROW(rt::OverlapAllReduce{o}, InvalidArgument);
}

// Every layout, for the tuner's host tests.
const std::vector<rt::ArLayout> kAllLayouts = {rt::ArLayout::RowBands, rt::ArLayout::Slots, rt::ArLayout::Owners};

// Host logic of the final choice: which ranked plans are measured (a plan
// of one group, the sequential one's work, never is).
TEST(AllReduceTuner, FinalistsAreEachLayoutsBestOwnersPerTileAndBandSizeAndTheFallback) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<rt::AllReducePlan> ranked;
  const std::vector<rt::ArLayout>& layouts = kAllLayouts;
  for (int i = 0; i < 60; ++i) {  // random layouts, swizzles and predictions
    rt::AllReducePlan p;
    p.layout = layouts[rng() % layouts.size()];
    p.sched = sched_for(4096, 8192, rng() % 2 ? 256 : 128, 132, 1 << (rng() % 4));
    p.predicted_ms = 0.5 + double(rng() % 1000) / 1000;
    p.copy_in_gemm = rng() % 2 == 0;
    p.groups = rng() % 4 == 0 ? plan::make_groups(p.sched, {p.sched.waves()}) : random_groups(p.sched, p.layout, rng);
    ranked.push_back(p);
  }
  std::sort(ranked.begin(), ranked.end(), [](auto& x, auto& y) { return x.predicted_ms < y.predicted_ms; });
  auto overlaps = [](const rt::AllReducePlan& p) { return !p.sequential && p.groups.size() >= 2; };
  rt::AllReducePlan seq = ranked.back();
  seq.sequential = true;
  ranked.push_back(seq);
  const std::vector<rt::AllReducePlan> f = rt::finalists_of(ranked);
  ASSERT_FALSE(f.empty());
  EXPECT_TRUE(f.back().sequential);
  EXPECT_EQ(std::count_if(f.begin(), f.end(), [](auto& p) { return p.sequential; }), 1);
  for (const auto& p : f) EXPECT_TRUE(p.sequential || p.groups.size() >= 2) << rt::describe(p);
  for (rt::ArLayout l : layouts) {
    const bool per_key = l == rt::ArLayout::Owners;
    // (bn, swizzle) of the ranked plans of l, in rank order, first time seen.
    auto key_of = [](const rt::AllReducePlan& p) { return std::make_pair(p.sched.bn, p.sched.swizzle); };
    std::vector<std::pair<int, int>> keys;
    double best = 1e9;
    for (const auto& p : ranked)
      if (overlaps(p) && p.layout == l) {
        best = std::min(best, p.predicted_ms);
        if (std::find(keys.begin(), keys.end(), key_of(p)) == keys.end()) keys.push_back(key_of(p));
      }
    std::vector<rt::AllReducePlan> of_l;
    for (const auto& p : f)
      if (!p.sequential && p.layout == l) of_l.push_back(p);
    if (keys.empty()) {
      EXPECT_TRUE(of_l.empty());
      continue;
    }
    if (!per_key) {  // the single best predicted
      ASSERT_EQ(of_l.size(), 1u) << rt::layout_name(l);
      EXPECT_EQ(of_l[0].predicted_ms, best);
      continue;
    }
    ASSERT_EQ(of_l.size(), 2 * keys.size()) << rt::layout_name(l);
    for (size_t i = 0; i < keys.size(); ++i) {  // best of each tile and band size, the copy in and after the GEMM
      EXPECT_EQ(key_of(of_l[2 * i]), keys[i]);
      EXPECT_EQ(key_of(of_l[2 * i + 1]), keys[i]);
      EXPECT_TRUE(of_l[2 * i].copy_in_gemm);
      EXPECT_FALSE(of_l[2 * i + 1].copy_in_gemm);
      double best_key = 1e9;
      for (const auto& p : ranked)
        if (overlaps(p) && p.layout == l && key_of(p) == keys[i]) best_key = std::min(best_key, p.predicted_ms);
      EXPECT_EQ(of_l[2 * i].predicted_ms, best_key);
    }
  }
}
// The runoff: the values within the tolerance of the smallest, smallest
// first, capped; on random lists against a direct count.
TEST(AllReduceTuner, RunoffTakesTheCloseOnesFastestFirst) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 30, most = 1 + rng() % 4;
    const double within = double(rng() % 10) / 100;
    std::vector<double> ms(n);
    for (auto& v : ms) v = 0.2 + double(rng() % 100) / 1000;  // ties happen
    const std::vector<size_t> got = rt::runoff_candidates(ms, within, most);
    const double best = *std::min_element(ms.begin(), ms.end());
    size_t close = 0;
    for (double v : ms) close += v <= best * (1 + within);
    ASSERT_EQ(got.size(), std::min(close, most));
    EXPECT_EQ(ms[got[0]], best);
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_LE(ms[got[j]], best * (1 + within));
      if (j) EXPECT_TRUE(ms[got[j - 1]] < ms[got[j]] || (ms[got[j - 1]] == ms[got[j]] && got[j - 1] < got[j]));
    }
    // Nothing left out is faster than something taken.
    for (size_t i = 0; i < n; ++i)
      if (std::find(got.begin(), got.end(), i) == got.end()) EXPECT_GE(ms[i], ms[got.back()]);
  }
  EXPECT_TRUE(rt::runoff_candidates({}, 0.04, 3).empty());
  EXPECT_EQ(rt::runoff_candidates({0.5, 0.3, 0.31, 0.32, 0.9}, 0.1, 3), (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(rt::runoff_candidates({0.5, 0.3, 0.31, 0.32, 0.9}, 0.04, 3), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(rt::runoff_candidates({0.5, 0.3, 0.35}, 0.04, 3), (std::vector<size_t>{1}));
}

// The second round: the pick, then (NCCL row bands with 128x256 tiles) the
// same plan with the other pipeline depth; nothing else changes.
TEST(AllReduceTuner, StageFinalistsAreThePickAndItsThreeStageTwin) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<rt::ArLayout>& layouts = kAllLayouts;
  int twins = 0;
  for (int i = 0; i < 80; ++i) {
    rt::AllReducePlan p;
    p.layout = layouts[rng() % layouts.size()];
    p.sched = sched_for(4096, 8192, rng() % 2 ? 256 : 128, 114, 1 << (rng() % 4));
    p.copy_in_gemm = rng() % 2 == 0;
    p.sequential = rng() % 6 == 0;
    p.reserve = int(rng() % 20);
    p.predicted_ms = 0.5 + double(rng() % 1000) / 1000;
    p.groups.resize(1 + rng() % 3);  // (one group: the op runs the sequential GEMM, no choice)
    const std::vector<rt::AllReducePlan> f = rt::stage_finalists(p);
    ASSERT_FALSE(f.empty());
    EXPECT_EQ(rt::describe(f[0]), rt::describe(p));
    EXPECT_TRUE(f[0].four_stages);
    const bool choice = !p.sequential && p.sched.bn == 256 && p.groups.size() >= 2 && p.layout == rt::ArLayout::RowBands;
    ASSERT_EQ(f.size(), choice ? 2u : 1u) << rt::describe(p);
    if (!choice) continue;
    ++twins;
    EXPECT_FALSE(f[1].four_stages);
    EXPECT_EQ(rt::describe(f[1]), rt::describe(p).substr(0, rt::describe(p).rfind(", ")) + ", 3 stages" +
                                      rt::describe(p).substr(rt::describe(p).rfind(", ")));
    EXPECT_EQ(f[1].layout, p.layout);
    EXPECT_EQ(f[1].sched.swizzle, p.sched.swizzle);
    EXPECT_EQ(f[1].reserve, p.reserve);
    EXPECT_EQ(f[1].copy_in_gemm, p.copy_in_gemm);
    EXPECT_EQ(f[1].predicted_ms, p.predicted_ms);
  }
  EXPECT_GT(twins, 0) << "no case had the choice (seed " << seed << ")";
}

}  // namespace
