// test_rt_fp8_params.cpp — what the GEMM's check takes and refuses of FP8
// inputs (kernels::Fp8; host logic, no GPU): 128x128 or 128x192 tiles, k % 16, both
// scales or none, no owner layout or grouped GEMM, scales only with FP8.
#include <gtest/gtest.h>

#include <string>

#include "flashoverlap/error.h"
#include "kernels/gemm.h"
#include "plan/tile_grid.h"

namespace fo = flashoverlap;
using fo::kernels::Scales;

namespace {

alignas(16) char g_buffer[1 << 12];  // (host memory: check_gemm_params reads no pointer, only their alignment)

fo::kernels::GemmParams fp8_params(int64_t m, int64_t n, int64_t k, int bn = 128) {
  const fo::plan::Schedule s = fo::plan::make_schedule(m, n, {128, bn}, 132, fo::plan::Raster::AlongN, 1);
  fo::kernels::GemmParams p =
      fo::kernels::plain_gemm(fo::kernels::DType::BF16, g_buffer, g_buffer, s, int32_t(k), g_buffer, n);
  p.fp8.on = true;
  return p;
}

void expect_refused(const fo::kernels::GemmParams& p, const std::string& what) {
  try {
    fo::kernels::check_gemm_params(p);
    ADD_FAILURE() << "accepted: " << what;
  } catch (const fo::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Fp8Params, TakenAtEveryScaleKindOnTheirTiles) {
  for (Scales kind : {Scales::None, Scales::PerTensor, Scales::RowWise}) {
    for (int bn : {128, 192}) {
      fo::kernels::GemmParams p = fp8_params(300, 200, 4096, bn);
      p.fp8.scales = kind;
      if (kind != Scales::None) p.fp8.scale_a = reinterpret_cast<const float*>(g_buffer + 16),
                                p.fp8.scale_b = reinterpret_cast<const float*>(g_buffer + 32);
      EXPECT_NO_THROW(fo::kernels::check_gemm_params(p)) << int(kind) << " 128x" << bn;
      EXPECT_FALSE(fo::kernels::gemm_four_stages(p));
    }
  }
}

TEST(Fp8Params, EachMisuseIsRefusedSayingWhy) {
  expect_refused(fp8_params(300, 200, 24), "k must be a multiple of 16");
  expect_refused(fp8_params(300, 256, 128, 256), "128x128 or 128x192 tiles");
  fo::kernels::GemmParams wide = fp8_params(300, 256, 128, 192);
  wide.fp8.on = false;  // (128x192 is FP8's tile only)
  expect_refused(wide, "unsupported tile shape");
  wide.fp8.on = true, wide.scatter.world = 2;
  expect_refused(wide, "the scatter epilogue takes 128x128 tiles");
  fo::kernels::GemmParams p = fp8_params(300, 200, 128);
  p.fp8.scales = Scales::RowWise, p.fp8.scale_a = reinterpret_cast<const float*>(g_buffer);
  expect_refused(p, "both scale_a and scale_b");
  p.fp8.scale_b = reinterpret_cast<const float*>(g_buffer + 2);
  expect_refused(p, "4-byte aligned");
  p.fp8.scales = Scales::None, p.fp8.scale_b = reinterpret_cast<const float*>(g_buffer);
  expect_refused(p, "scale pointers given with Scales::None");
  p.fp8.scales = static_cast<Scales>(7);
  expect_refused(p, "unknown scale kind");
  fo::kernels::GemmParams q = fp8_params(300, 200, 128);
  q.fp8.on = false, q.fp8.scales = Scales::PerTensor;
  expect_refused(q, "scales are for FP8 inputs");
  fo::kernels::GemmParams g = fp8_params(300, 200, 128);
  g.grouped = {reinterpret_cast<const int32_t*>(g_buffer), reinterpret_cast<const int32_t*>(g_buffer),
               reinterpret_cast<const int32_t*>(g_buffer), 300, 200};
  expect_refused(g, "not with the owner layout or the grouped GEMM");
}
