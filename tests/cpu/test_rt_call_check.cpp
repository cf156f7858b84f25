// The NVLink forms' call check, host side: the message of each way it fails
// (runtime/transport/peer_windows.h: describe_call_check) names the rank,
// the source, the calls and what differed; the owner layout's plan digest
// (rt::owner_call_plan) tells apart the calls the ranks must agree on. The
// device side is tested on a GPU (tests/gpu/test_reducescatter.cu,
// test_alltoall.cu, test_gemm.cu).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "kernels/flags.h"
#include "runtime/ops/allreduce.h"
#include "runtime/transport/peer_windows.h"
#include "test_seed.h"

using namespace flashoverlap;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

kernels::WaitError record(int source, uint32_t seen_seq, uint32_t want_seq) {
  kernels::WaitError e{};
  e.failed = kernels::kCallCheckFailed, e.group = -1 - source;
  e.seen_seq = seen_seq, e.want_seq = want_seq;
  return e;
}

}  // namespace

TEST(CallCheckMessage, EachFailureNamesTheRanksTheCallsAndWhatDiffered) {
  const uint64_t seed = fo_test::test_seed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int trial = 0; trial < 50; ++trial) {
    const int rank = int(rng() % 8), source = int(rng() % 8);
    const uint32_t call = 1 + uint32_t(rng() % 100000);
    const std::string who = "rank " + std::to_string(rank) + ": the op (NVLink form): ";
    const std::string src = "rank " + std::to_string(source);
    {  // the same call, another m
      kernels::WaitError e = record(source, call, call);
      e.seen_m = 1 + uint32_t(rng() % 9000), e.want_m = e.seen_m + 1 + uint32_t(rng() % 9);
      e.seen_plan = uint32_t(rng() % 500), e.want_plan = uint32_t(rng() % 500);
      const std::string msg = rt::describe_call_check(e, rank, "the op (NVLink form)", "m");
      EXPECT_EQ(msg.rfind(who, 0), 0u) << msg;
      EXPECT_TRUE(has(msg, src + "'s call #" + std::to_string(call) + " has m = " + std::to_string(e.seen_m) +
                               " and plan " + std::to_string(e.seen_plan) + ", where this rank expects m = " +
                               std::to_string(e.want_m) + " and plan " + std::to_string(e.want_plan)))
          << msg;
      EXPECT_TRUE(has(msg, "build the op anew")) << msg;
    }
    {  // the source ahead (across the numbers' wrap too)
      const uint32_t want = trial % 5 ? call : 0xffffffffu;
      const kernels::WaitError e = record(source, want + 1, want);
      const std::string msg = rt::describe_call_check(e, rank, "the op (NVLink form)", "rows");
      EXPECT_TRUE(has(msg, src + " is at call #" + std::to_string(want + 1) + " where this rank is at #" +
                               std::to_string(want)))
          << msg;
    }
    {  // the source behind: not started in time
      const kernels::WaitError e = record(source, call - 1, call);
      const std::string msg = rt::describe_call_check(e, rank, "the op (NVLink form)", "m");
      EXPECT_TRUE(has(msg, src + " did not start call #" + std::to_string(call) + " in time (its latest here: #" +
                               std::to_string(call - 1) + ")"))
          << msg;
    }
    {  // its token of the call missing
      kernels::WaitError e = record(source, call - 1, call);
      e.token = 1;
      const std::string msg = rt::describe_call_check(e, rank, "the op (NVLink form)", "m");
      EXPECT_TRUE(has(msg, src + " did not confirm call #" + std::to_string(call) + " in time")) << msg;
      EXPECT_TRUE(has(msg, "its confirmed calls here: " + std::to_string(call - 1))) << msg;
    }
  }
}

// The owner layout's digest changes with each thing the ranks must agree on
// besides m (the ranks, n, k, the dtype, the tile shape, the tile rows, the
// tiles' numbering, the split, the registered output the finals go into),
// and not with what only orders a rank's own work (its CTAs) or with m
// within its tile rows (m itself is checked apart).
TEST(OwnerCallPlan, DiffersInWhatTheRanksMustShare) {
  const uint64_t seed = fo_test::test_seed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  using kernels::DType;
  for (int trial = 0; trial < 200; ++trial) {
    plan::Schedule s;
    s.m = 1 + int(rng() % 16384), s.n = 8 * (1 + int(rng() % 2048)), s.bm = 128, s.bn = rng() % 2 ? 256 : 128;
    s.ctas = 1 + int(rng() % 132), s.swizzle = 1 + int(rng() % 8);
    const int world = 2 + int(rng() % 7), k = 8 * (1 + int(rng() % 2048)), slot = int(rng() % 3) - 1;
    const DType dt = rng() % 2 ? DType::BF16 : DType::FP16, other_dt = dt == DType::BF16 ? DType::FP16 : DType::BF16;
    const int32_t split = s.tiles() / 2;
    const uint32_t h = rt::owner_call_plan(s, world, k, dt, split, slot);
    plan::Schedule same = s;
    same.ctas = 1 + int(rng() % 132);
    same.m = (s.tiles_m() - 1) * 128 + 1 + int(rng() % 128);  // (m within its tile rows)
    EXPECT_EQ(rt::owner_call_plan(same, world, k, dt, split, slot), h);
    plan::Schedule rows = s, wide = s, tile = s, swizzled = s, rastered = s, shifted = s;
    rows.m = s.m + 128;
    wide.n = s.n + 8;
    tile.bn = s.bn == 256 ? 128 : 256;
    swizzled.swizzle = s.swizzle + 1;
    rastered.raster = s.raster == plan::Raster::AlongN ? plan::Raster::AlongM : plan::Raster::AlongN;
    shifted.row_shift = s.row_shift + 1;
    for (const plan::Schedule& o : {rows, wide, tile, swizzled, rastered, shifted})
      EXPECT_NE(rt::owner_call_plan(o, world, k, dt, split, slot), h);
    for (const uint32_t other :
         {rt::owner_call_plan(s, world + 1, k, dt, split, slot), rt::owner_call_plan(s, world, k + 8, dt, split, slot),
          rt::owner_call_plan(s, world, k, other_dt, split, slot), rt::owner_call_plan(s, world, k, dt, split + 1, slot),
          rt::owner_call_plan(s, world, k, dt, split, slot + 1)})
      EXPECT_NE(other, h);
  }
}
