// check.h — device helpers for checks and benchmarks: deterministic random
// fills, poisoning, and comparisons of two tensors computed on the device.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/gemm.h"

namespace flashoverlap::kernels {

// Uniform values in [lo, hi), a pure function of (seed, index).
void fill_random(DType dtype, void* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t stream);
// The same in e4m3 (one byte each, rounded to nearest from [lo, hi)): FP8 inputs.
void fill_random_e4m3(void* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t stream);
// Every element set to NaN (bit pattern 0xFFFF): unwritten outputs show up.
void poison(void* p, int64_t count, cudaStream_t stream);
// FP8 error measurements: e4m3 bytes decoded to fp32 (exactly); an fp32
// product C (rows x cols) scaled in place as an FP8 GEMM's epilogue scales
// it ((c * sa[row]) * sb[col], per Fp8::scales); and the normwise relative
// error ||x - ref|| / ||ref|| of a 16-bit result against such an fp32 one.
void e4m3_to_float(const void* src, float* dst, int64_t count, cudaStream_t stream);
void apply_fp8_scales(float* c, int64_t rows, int64_t cols, const Fp8& f, cudaStream_t stream);
double relative_error_to_fp32(DType dtype, const void* x, int64_t ldx, const float* ref, int64_t rows, int64_t cols,
                              cudaStream_t stream);

// An element x passes against ref when |x - ref| <= atol + rtol * |ref|
// (both finite). The default, {0, 0}, asks for equal values.
struct Tolerance {
  double atol = 0, rtol = 0;
};

// The bound for two computations of C = A B^T whose inputs are uniform in
// [-input_bound, input_bound] (fill_random's range in the checks): each
// accumulated in fp32 in its own order and rounded to dtype once, then
// `summands` (ranks) such results summed and rounded again (summands = 1:
// the GEMM alone). Why it holds:
//  - dtype's spacing at v is at most u |v| (u = 2^-7 bf16, 2^-10 fp16): two
//    roundings of nearly equal values land at most one spacing apart, so the
//    final rounding costs rtol = u (reached where ref is a power of two and
//    the other value one step above it: 1/16 more to spare);
//  - a partial is a sum of k products of variance b^4 / 9: sigma = b^2
//    sqrt(k / 9); over 10^9 elements none passes 7 sigma (p ~ 1e-12 each);
//  - with summands > 1 each rank's partial was rounded on its own: up to one
//    spacing each, u * 7 sigma per summand, whatever the cancellation in the sum;
//  - fp32 accumulation in another order (tensor cores, split or not): at
//    most k * 2^-20 * sigma apart (in each of the two, k additions that
//    round, or truncate, by at most 2^-24 of a partial sum below 4 sigma:
//    2 k 2^-24 4 sigma, the worst case where every error has one sign).
// A tile missing one k-block of 64 is off by ~ b^2 sqrt(64 / 9) = 2.7 b^2
// per element, far above this for k <= 64k.
Tolerance gemm_tolerance(DType dtype, int64_t k, int summands = 1, double input_bound = 1.0);
// RMSNorm outputs against a reference from the same rounded h: the final
// rounding (u) plus the fp32 mean of n squares (n * 2^-24 relative at most).
Tolerance rmsnorm_tolerance(DType dtype, int64_t n);

struct CompareResult {
  double err_sq = 0;       // sum over elements of (x - ref)^2
  double ref_sq = 0;       // sum of ref^2
  int64_t nan_count = 0;   // non-finite x
  int64_t mismatches = 0;  // elements whose bits differ
  int64_t elements = 0, cols = 0;
  Tolerance tol;
  int64_t beyond = 0;      // elements beyond tol (non-finite x or ref included)
  // The element furthest beyond the bound (largest |x - ref| / bound), as
  // row * cols + col, with its values and that ratio; -1 when all are equal.
  int64_t worst = -1;
  float worst_x = 0, worst_ref = 0;
  double worst_ratio = 0;
  // The first element whose bits differ, and its bits.
  int64_t first_mismatch = -1;
  uint16_t first_x_bits = 0, first_ref_bits = 0;

  double rel_error() const;  // sqrt(err_sq / ref_sq)
  bool within() const { return beyond == 0 && elements > 0; }
  bool bitwise() const { return mismatches == 0 && nan_count == 0 && elements > 0; }
  // "12 of 1048576 elements beyond 0.01 + 0.0078|ref| (worst at row 3, col 17:
  //  1.5 vs 0.25, 9.1x the bound); 40 bits differ (first at row 0, col 5:
  //  0x3f80 vs 0x3f81); 0 non-finite"
  std::string describe() const;
};
// Compares x against ref, both `rows` x `cols` with their own leading dims.
CompareResult compare(DType dtype, const void* x, int64_t ldx, const void* ref, int64_t ldref, int64_t rows,
                      int64_t cols, cudaStream_t stream, Tolerance tol = {});

}  // namespace flashoverlap::kernels
