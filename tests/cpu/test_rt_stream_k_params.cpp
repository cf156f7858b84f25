// test_rt_stream_k_params.cpp — what the GEMM's check takes and refuses of
// stream-K (GemmParams::stream_k; host logic, no GPU): the split must be this
// launch's (tiles, CTAs, k-blocks), with a workspace, on Plain or slot-tile
// stores without the owner layout, scatter, grouped GEMM or tile monitors
// (the phase monitor, per CTA, is taken); and the four-stage store is never
// taken with it.
#include <gtest/gtest.h>

#include <string>

#include "gemm_params_check.h"
#include "plan/stream_k.h"

namespace fo = flashoverlap;

namespace {

using fo_test::expect_refused;

fo::kernels::GemmParams split_params(bool fp8, int bn) {
  const int64_t k = 8192;
  fo::kernels::GemmParams p = fo_test::host_gemm(256, 1280, k, bn, fp8);
  p.stream_k = fo::plan::stream_k_split(p.sched.tiles(), p.sched.ctas, int32_t(k / (fp8 ? 128 : 64)));
  p.stream_k_work = fo_test::host_buffer();
  return p;
}

}  // namespace

TEST(StreamKParams, TakenOnPlainAndSlotTileStoresOfEveryTile) {
  for (auto [fp8, bn] : {std::pair{false, 256}, std::pair{false, 128}, std::pair{true, 128}, std::pair{true, 192}}) {
    fo::kernels::GemmParams p = split_params(fp8, bn);
    ASSERT_TRUE(p.stream_k.on()) << "the rule splits 256 x 1280 x 8192 (few tiles)";
    EXPECT_NO_THROW(fo::kernels::check_gemm_params(p));
    EXPECT_FALSE(fo::kernels::gemm_four_stages(p));
    p.store = fo::kernels::Store::SlotTiles, p.slots = fo_test::host_buffer(), p.slot_rows = int64_t(p.sched.tiles()) * 128;
    EXPECT_NO_THROW(fo::kernels::check_gemm_params(p));
    uint64_t phases[8] = {};
    p.monitor_phases = phases;  // (per CTA: when its pieces' partials went out, its start, its stores)
    EXPECT_NO_THROW(fo::kernels::check_gemm_params(p)) << "fp8 " << fp8 << ", 128x" << bn;
  }
}

TEST(StreamKParams, EachMisuseIsRefusedSayingWhy) {
  const fo::kernels::GemmParams p = split_params(true, 128);
  fo::kernels::GemmParams q = p;
  q.stream_k.k_blocks += 1;  // (another launch's split)
  expect_refused(q, "stream-K: its tiles, CTAs and k-blocks must be this launch's");
  q = p, q.stream_k.ctas = 66;
  expect_refused(q, "stream-K: its tiles, CTAs and k-blocks must be this launch's");
  q = p, q.stream_k.tiles += 1;
  expect_refused(q, "stream-K: its tiles, CTAs and k-blocks must be this launch's");
  q = p, q.stream_k_work = nullptr;
  expect_refused(q, "stream-K: needs its workspace");
  q = p, q.stream_k_work = fo_test::host_buffer() + 4;
  expect_refused(q, "stream-K: needs its workspace");
  q = p, q.store = fo::kernels::Store::SlotRows, q.slots = fo_test::host_buffer(), q.row_of = reinterpret_cast<int32_t*>(fo_test::host_buffer());
  expect_refused(q, "stream-K: Plain or SlotTiles stores only");
  uint64_t mon[4] = {};
  uint32_t sm[2] = {};
  q = p, q.monitor_ns = mon, q.monitor_sm = sm;
  expect_refused(q, "stream-K: Plain or SlotTiles stores only");
  q = p, q.monitor_mma = mon;
  expect_refused(q, "stream-K: Plain or SlotTiles stores only");
  // More CTAs than a workspace's flags hold.
  fo::plan::Schedule wide = p.sched;
  wide.ctas = fo::kernels::kStreamKMaxCtas + 1;
  q = p, q.sched = wide, q.stream_k = fo::plan::StreamK{wide.tiles(), 0, p.stream_k.k_blocks, wide.ctas};
  expect_refused(q, "stream-K: at most");
}
