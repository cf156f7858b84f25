// host_reference.h — references the GPU tests compute on the host, from the
// definitions of what the kernels compute rather than from their code:
// residual + RMSNorm, and the owner layout's summation order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/check.h"
#include "kernels/gemm.h"
#include "plan/schedule.h"
#include "runtime/core/buffer.h"

namespace flashoverlap::test {

inline float value_of(kernels::DType dt, uint16_t v) {
  return dt == kernels::DType::BF16 ? __bfloat162float(__nv_bfloat16_raw{v}) : __half2float(__half_raw{v});
}
// x rounded to dt, to nearest even.
inline uint16_t rounded(kernels::DType dt, float x) {
  return dt == kernels::DType::BF16 ? __nv_bfloat16_raw(__float2bfloat16_rn(x)).x : __half_raw(__float2half_rn(x)).x;
}

// rows x cols 16-bit elements at p (ld per row), on the host.
inline std::vector<uint16_t> download(const void* p, int64_t rows, int64_t cols, int64_t ld, cudaStream_t stream) {
  std::vector<uint16_t> h(size_t(rows * cols));
  FO_CUDA_CHECK(cudaMemcpy2DAsync(h.data(), size_t(cols) * 2, p, size_t(ld) * 2, size_t(cols) * 2, size_t(rows),
                                  cudaMemcpyDeviceToHost, stream));
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

// Residual + RMSNorm by its definition, per row i of m x n row-major x:
//   h = round(x + residual) (the sum in fp32, rounded to dt before the norm);
//   out = round(h / sqrt(mean(h^2) + eps) * weight), in double.
struct HostNorm {
  std::vector<uint16_t> h, out;
};
inline HostNorm add_rmsnorm(kernels::DType dt, const std::vector<uint16_t>& x, const std::vector<uint16_t>& residual,
                            const std::vector<uint16_t>& weight, int64_t m, int64_t n, float eps) {
  HostNorm r{std::vector<uint16_t>(x.size()), std::vector<uint16_t>(x.size())};
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = size_t(i * n + j);
      r.h[at] = rounded(dt, value_of(dt, x[at]) + value_of(dt, residual[at]));
      const double hv = value_of(dt, r.h[at]);
      ss += hv * hv;
    }
    const double inv = 1.0 / std::sqrt(ss / double(n) + double(eps));
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = size_t(i * n + j);
      r.out[at] = rounded(dt, float(double(value_of(dt, r.h[at])) * inv * double(value_of(dt, weight[size_t(j)]))));
    }
  }
  return r;
}

// Device outputs of the norm (out and, where given, residual_out, both m x n
// with ld = n) against add_rmsnorm of the host copies of x, residual and
// weight: out within kernels::rmsnorm_tolerance, residual_out bitwise.
struct NormCheck {
  kernels::CompareResult out, residual_out;
};
inline NormCheck check_rmsnorm(kernels::DType dt, const void* x, int64_t ld_x, const void* residual, const void* weight,
                               float eps, const void* out, const void* residual_out, int64_t m, int64_t n,
                               cudaStream_t stream) {
  const HostNorm ref = add_rmsnorm(dt, download(x, m, n, ld_x, stream), download(residual, m, n, n, stream),
                                   download(weight, 1, n, n, stream), m, n, eps);
  NormCheck c;
  const rt::DeviceBuffer ref_out = rt::to_device(ref.out);
  c.out = kernels::compare(dt, out, n, ref_out.get(), n, m, n, stream, kernels::rmsnorm_tolerance(dt, n));
  if (residual_out) {
    const rt::DeviceBuffer ref_h = rt::to_device(ref.h);
    c.residual_out = kernels::compare(dt, residual_out, n, ref_h.get(), n, m, n, stream);
  }
  return c;
}

// An eps that matters for rows of mean square ~ms: call % 3 == 0 the usual
// 1e-6, 1: ms / 2, 2: 4 ms (so that a norm that got eps wrong is seen).
inline float eps_for_call(int call, double ms) {
  return call % 3 == 0 ? 1e-6f : float(call % 3 == 1 ? ms / 2 : 4 * ms);
}

// C of the owner layout on `world` ranks (128 x bn tiles of schedule s) from
// the ranks' partials (m x n each), as that layout defines each tile's sum:
// the tiles form `world` contiguous ranges, range q = [q T / W, (q + 1) T / W)
// (floor) owned by rank W - 1 - q; the owner o takes its own partial, adds
// in fp32 those of ranks o + 2, ..., o + W - 1 (mod W, in that order: its
// window slots 1..W-2), rounds, and adds rank o + 1's (slot 0) with one
// more rounding. (Written from that definition, not from owner_ranges.h.)
inline std::vector<uint16_t> owner_order_sum(kernels::DType dt, const std::vector<std::vector<uint16_t>>& part,
                                             const plan::Schedule& s) {
  const int world = int(part.size());
  const int64_t tiles = s.tiles();
  std::vector<uint16_t> c(part[0].size());
  for (int q = 0; q < world; ++q) {
    const int owner = world - 1 - q;
    for (int64_t idx = q * tiles / world; idx < (q + 1) * tiles / world; ++idx) {
      const plan::TileCoord tc = s.tile_of(int32_t(idx));
      for (int64_t r = int64_t(tc.tm) * s.bm; r < std::min<int64_t>(int64_t(tc.tm + 1) * s.bm, s.m); ++r)
        for (int64_t col = int64_t(tc.tn) * s.bn; col < std::min<int64_t>(int64_t(tc.tn + 1) * s.bn, s.n); ++col) {
          const size_t at = size_t(r * s.n + col);
          float x = value_of(dt, part[size_t(owner)][at]);
          for (int j = 2; j < world; ++j) x += value_of(dt, part[size_t((owner + j) % world)][at]);
          c[at] = rounded(dt, value_of(dt, rounded(dt, x)) + value_of(dt, part[size_t((owner + 1) % world)][at]));
        }
    }
  }
  return c;
}

}  // namespace flashoverlap::test
