// test_rt_fp8_params.cpp — what the GEMM's check takes and refuses of FP8
// inputs (kernels::Fp8; host logic, no GPU): 128x112, 128x128, 128x144, 128x160 or 128x192 tiles (and
// 64x48, 64x144 into a plain C), k % 16, both
// scales or none, no owner layout or grouped GEMM, scales only with FP8; where
// its loads take L2 policies.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <string>

#include "gemm_params_check.h"
#include "test_seed.h"

namespace fo = flashoverlap;
using fo::kernels::Scales;

namespace {

fo::kernels::GemmParams fp8_params(int64_t m, int64_t n, int64_t k, int bn = 128) {
  return fo_test::host_gemm(m, n, k, bn, true);
}

using fo_test::expect_refused;

}  // namespace

TEST(Fp8Params, TakenAtEveryScaleKindOnTheirTiles) {
  for (Scales kind : {Scales::None, Scales::PerTensor, Scales::RowWise}) {
    for (int bn : {112, 128, 144, 160, 192}) {
      fo::kernels::GemmParams p = fp8_params(300, 200, 4096, bn);
      p.fp8.scales = kind;
      if (kind != Scales::None) p.fp8.scale_a = reinterpret_cast<const float*>(fo_test::host_buffer() + 16),
                                p.fp8.scale_b = reinterpret_cast<const float*>(fo_test::host_buffer() + 32);
      EXPECT_NO_THROW(fo::kernels::check_gemm_params(p)) << int(kind) << " 128x" << bn;
      EXPECT_FALSE(fo::kernels::gemm_four_stages(p));
      uint64_t phases[8] = {};
      p.monitor_phases = phases;  // (the phase trace: bench-fp8 --phases)
      EXPECT_NO_THROW(fo::kernels::check_gemm_params(p)) << int(kind) << " 128x" << bn << " with the phase monitor";
    }
  }
}

TEST(Fp8Params, EachMisuseIsRefusedSayingWhy) {
  expect_refused(fp8_params(300, 200, 24), "k must be a multiple of 16");
  // (every FP8 tile named: the ops' list, then the lab's 64-row tiles)
  const std::string tiles = "fp8: tiles " + fo::kernels::op_tile_names(true) + ", 64x48, 64x144";
  expect_refused(fp8_params(300, 256, 128, 256), tiles);
  expect_refused(fp8_params(300, 256, 128, 96), tiles);
  fo::kernels::GemmParams wide = fp8_params(300, 256, 128, 192);
  wide.fp8.on = false;  // (128x192 and 128x160 are FP8's tiles only)
  expect_refused(wide, "unsupported tile shape");
  fo::kernels::GemmParams narrow = fp8_params(300, 320, 128, 160);
  narrow.fp8.on = false;
  expect_refused(narrow, "unsupported tile shape");
  narrow.fp8.on = true;  // (128x160 stores a plain C or slot tiles, as 128x192)
  narrow.store = fo::kernels::Store::SlotTiles, narrow.slots = fo_test::host_buffer(), narrow.slot_rows = 1 << 20;
  EXPECT_NO_THROW(fo::kernels::check_gemm_params(narrow));
  fo::kernels::GemmParams n112 = fp8_params(300, 320, 128, 112);  // (128x112 likewise; FP8's only)
  n112.store = fo::kernels::Store::SlotTiles, n112.slots = fo_test::host_buffer(), n112.slot_rows = 1 << 20;
  EXPECT_NO_THROW(fo::kernels::check_gemm_params(n112));
  fo::kernels::GemmParams n144 = n112;  // (128x144 likewise, with signals as well)
  n144.sched = flashoverlap::plan::make_schedule(300, 320, {128, 144}, 132, flashoverlap::plan::Raster::AlongN, 1);
  n144.counters = reinterpret_cast<uint32_t*>(fo_test::host_buffer());
  n144.group_of_tile = reinterpret_cast<const int32_t*>(fo_test::host_buffer() + 64);
  EXPECT_NO_THROW(fo::kernels::check_gemm_params(n144));
  n144.fp8.on = false;
  expect_refused(n144, "unsupported tile shape");
  n112.store = fo::kernels::Store::Plain, n112.scatter.world = 2;
  expect_refused(n112, "the scatter epilogue takes 128x128 tiles");
  n112.scatter.world = 0, n112.fp8.on = false;
  expect_refused(n112, "unsupported tile shape");
  // The 64-row tiles (64x48, 64x144): a plain C, whole, no signals or tile monitors; FP8's only.
  for (int bn : {48, 144}) {
    fo::kernels::GemmParams t = fp8_params(300, 320, 128, bn);
    t.sched = flashoverlap::plan::make_schedule(300, 320, {64, bn}, 132, flashoverlap::plan::Raster::AlongN, 1);
    EXPECT_NO_THROW(fo::kernels::check_gemm_params(t)) << "64x" << bn;
    fo::kernels::GemmParams slots = t;
    slots.store = fo::kernels::Store::SlotTiles, slots.slots = fo_test::host_buffer(), slots.slot_rows = 1 << 20;
    expect_refused(slots, "64-row tiles store a plain C, whole");
    fo::kernels::GemmParams signals = t;
    signals.counters = reinterpret_cast<uint32_t*>(fo_test::host_buffer());
    signals.group_of_tile = reinterpret_cast<const int32_t*>(fo_test::host_buffer());
    expect_refused(signals, "64-row tiles store a plain C, whole");
    fo::kernels::GemmParams pair = t;
    pair.pair_k = true;
    expect_refused(pair, "64-row tiles store a plain C, whole");
    fo::kernels::GemmParams split = fp8_params(300, 320, 1024, bn);  // (8 k-blocks over few tiles: split)
    split.sched = t.sched;
    split.stream_k = flashoverlap::plan::stream_k_split(t.sched.tiles(), 132, 8);
    split.stream_k_work = fo_test::host_buffer();
    EXPECT_TRUE(split.stream_k.on());
    expect_refused(split, "64-row tiles store a plain C, whole");
    fo::kernels::GemmParams tile_monitor = t;
    uint64_t ns[2] = {};
    tile_monitor.monitor_mma = ns;
    expect_refused(tile_monitor, "64-row tiles store a plain C, whole");
    t.fp8.on = false;
    expect_refused(t, "unsupported tile shape");
  }
  expect_refused([] {
    fo::kernels::GemmParams t = fp8_params(300, 320, 128, 128);
    t.sched = flashoverlap::plan::make_schedule(300, 320, {64, 128}, 132, flashoverlap::plan::Raster::AlongN, 1);
    return t;
  }(), tiles);
  narrow.store = fo::kernels::Store::Plain, narrow.scatter.world = 2;
  expect_refused(narrow, "the scatter epilogue takes 128x128 tiles");
  wide.fp8.on = true, wide.scatter.world = 2;
  expect_refused(wide, "the scatter epilogue takes 128x128 tiles");
  fo::kernels::GemmParams p = fp8_params(300, 200, 128);
  p.fp8.scales = Scales::RowWise, p.fp8.scale_a = reinterpret_cast<const float*>(fo_test::host_buffer());
  expect_refused(p, "both scale_a and scale_b");
  p.fp8.scale_b = reinterpret_cast<const float*>(fo_test::host_buffer() + 2);
  expect_refused(p, "4-byte aligned");
  p.fp8.scales = Scales::None, p.fp8.scale_b = reinterpret_cast<const float*>(fo_test::host_buffer());
  expect_refused(p, "scale pointers given with Scales::None");
  p.fp8.scales = static_cast<Scales>(7);
  expect_refused(p, "unknown scale kind");
  fo::kernels::GemmParams q = fp8_params(300, 200, 128);
  q.fp8.on = false, q.fp8.scales = Scales::PerTensor;
  expect_refused(q, "scales are for FP8 inputs");
  fo::kernels::GemmParams g = fp8_params(300, 200, 128);
  g.grouped = {reinterpret_cast<const int32_t*>(fo_test::host_buffer()), reinterpret_cast<const int32_t*>(fo_test::host_buffer()),
               reinterpret_cast<const int32_t*>(fo_test::host_buffer()), 300, 200};
  expect_refused(g, "not with the owner layout or the grouped GEMM");
}

// The pair split (GemmParams::pair_k): taken on every FP8 tile with two CTAs
// a tile and two k-blocks or more, into C or slot tiles; refused, saying
// why, on another grid, one k-block, 16-bit inputs, with stream-K, PDL,
// signals or another store.
TEST(Fp8Params, PairSplitTakesTwoCtasATileAndRefusesTheRest) {
  namespace fp = flashoverlap::plan;
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 30; ++trial) {
    const int bn = std::array{112, 128, 160, 192}[trial % 4];
    const int64_t m = 1 + int64_t(rng() % 1024), n = 16 * (1 + int64_t(rng() % 64)),
                  k = 256 + 16 * int64_t(rng() % 512);
    fo::kernels::GemmParams p = fp8_params(m, n, k, bn);
    const int32_t tiles = p.sched.tiles();
    p.sched = fp::make_schedule(m, n, {128, bn}, 2 * tiles, fp::Raster::AlongN, 1);
    p.pair_k = true;
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " on 128x" + std::to_string(bn));
    EXPECT_NO_THROW(fo::kernels::check_gemm_params(p));
    fo::kernels::GemmParams slots = p;
    slots.store = fo::kernels::Store::SlotTiles, slots.slots = fo_test::host_buffer(), slots.slot_rows = 1 << 20;
    EXPECT_NO_THROW(fo::kernels::check_gemm_params(slots));
    fo::kernels::GemmParams grid = p;
    grid.sched = fp::make_schedule(m, n, {128, bn}, 2 * tiles + 1, fp::Raster::AlongN, 1);
    expect_refused(grid, "two CTAs a tile");
    fo::kernels::GemmParams pdl = p;
    pdl.pdl = true;
    expect_refused(pdl, "not with stream-K or PDL");
    fo::kernels::GemmParams rows = p;
    rows.store = fo::kernels::Store::SlotRows, rows.slots = fo_test::host_buffer(), rows.slot_rows = 1 << 20;
    rows.row_of = reinterpret_cast<const int32_t*>(fo_test::host_buffer());
    expect_refused(rows, "Plain or SlotTiles stores");
  }
  fo::kernels::GemmParams one = fp8_params(300, 200, 128);
  one.sched = fp::make_schedule(300, 200, {128, 128}, 2 * one.sched.tiles(), fp::Raster::AlongN, 1);
  one.pair_k = true;
  expect_refused(one, "two k-blocks");
  fo::kernels::GemmParams bf16 = one;
  bf16.fp8.on = false, bf16.k = 4096;
  expect_refused(bf16, "pair_k: FP8 inputs only");
}

// L2 policies on the loads exactly where an FP8 B (n x k bytes; a grouped
// GEMM's: all experts' rows) is larger than the L2; never for 16-bit inputs.
TEST(Fp8Params, L2PoliciesWhereBIsLargerThanTheL2) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 16 * (1 + int64_t(rng() % 1024)), k = 16 * (1 + int64_t(rng() % 1024));
    const int64_t l2 = int64_t(rng() % uint64_t(2 * n * k));
    fo::kernels::GemmParams p = fp8_params(256, n, k);
    EXPECT_EQ(fo::kernels::gemm_l2_hints(p, l2), n * k > l2) << n << " x " << k << ", L2 " << l2;
    p.fp8.on = false;
    EXPECT_FALSE(fo::kernels::gemm_l2_hints(p, l2));
    fo::kernels::GemmParams g = fp8_params(256, n, k);
    g.grouped.a_row0 = reinterpret_cast<const int32_t*>(fo_test::host_buffer()), g.grouped.b_rows = 8 * n;
    EXPECT_EQ(fo::kernels::gemm_l2_hints(g, l2), 8 * n * k > l2);
  }
}

// The ops' tiles: one list (kernels::op_tiles), each taken by the kernel's
// checks; the lab's 64-row tiles not among them; the names for messages.
TEST(Fp8Params, OpTilesAreOneListTheKernelTakes) {
  for (bool fp8 : {false, true}) {
    const auto& tiles = fo::kernels::op_tiles(fp8);
    ASSERT_FALSE(tiles.empty());
    for (const auto& t : tiles) {
      EXPECT_TRUE(fo::kernels::op_tile_supported(t.bm, t.bn, fp8)) << t.bm << "x" << t.bn;
      EXPECT_TRUE(fo::kernels::tile_supported(t.bm, t.bn, fp8)) << t.bm << "x" << t.bn;
      EXPECT_NE(fo::kernels::op_tile_names(fp8).find(flashoverlap::plan::to_string(t)), std::string::npos);
    }
    for (size_t i = 1; i < tiles.size(); ++i) EXPECT_GT(tiles[i - 1].bn, tiles[i].bn) << "the widest first";
  }
  EXPECT_FALSE(fo::kernels::op_tile_supported(128, 256, true));  // (no room for a part sum beside the sum)
  EXPECT_FALSE(fo::kernels::op_tile_supported(128, 112, false));
  for (int bn : {48, 144}) {
    EXPECT_FALSE(fo::kernels::op_tile_supported(64, bn, true));
    EXPECT_TRUE(fo::kernels::tile_supported(64, bn, true));
  }
  EXPECT_EQ(fo::kernels::op_tile_names(true), "128x192, 128x160, 128x144, 128x128, 128x112");
}
