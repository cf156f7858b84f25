// gemm_params_check.h — the CPU tests of what the GEMM's check
// (kernels::check_gemm_params) takes and refuses: parameters over host
// memory (the check reads no pointer, only their alignment), and the
// refusal with the words expected.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "flashoverlap/error.h"
#include "kernels/gemm.h"
#include "plan/tile_grid.h"

namespace fo_test {

// 4 KiB of 16-byte aligned host memory standing for every buffer.
inline char* host_buffer() {
  alignas(16) static char buffer[1 << 12];
  return buffer;
}

// A plain bf16-output GEMM of m x n x k on 128 x bn tiles over 132 CTAs, A, B and C in host_buffer().
inline flashoverlap::kernels::GemmParams host_gemm(int64_t m, int64_t n, int64_t k, int bn, bool fp8) {
  namespace fp = flashoverlap::plan;
  const fp::Schedule s = fp::make_schedule(m, n, {128, bn}, 132, fp::Raster::AlongN, 1);
  flashoverlap::kernels::GemmParams p = flashoverlap::kernels::plain_gemm(
      flashoverlap::kernels::DType::BF16, host_buffer(), host_buffer(), s, int32_t(k), host_buffer(), n);
  p.fp8.on = fp8;
  return p;
}

inline void expect_refused(const flashoverlap::kernels::GemmParams& p, const std::string& what) {
  try {
    flashoverlap::kernels::check_gemm_params(p);
    ADD_FAILURE() << "accepted: " << what;
  } catch (const flashoverlap::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace fo_test
