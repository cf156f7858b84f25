// gemm_choice.h — where the public ops time our GEMM against cuBLAS's for
// their sequential calls, and which of those timings stands for an m. Host
// only; the timing itself is api/op_setup's (sequential_gemm_choice).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashoverlap::plan {

// Rows above which one timing stands for every larger m: both GEMMs run at
// the tensor cores' rate there, and the samples' buffers stay bounded.
inline constexpr int64_t kGemmChoiceMaxRows = 8192;

// The m timed for an op of max_m rows, increasing: every power of two up to
// 128 (cuBLAS changes kernels inside one tile row), then 2, 3, 4, 6, 8, 12,
// ... tile rows of 128 (a factor of 1.5 or 1.33 apart), and last max_m itself
// (at most kGemmChoiceMaxRows), so that every m up to max_m has a sample at
// or above it. max_m >= 1.
std::vector<int64_t> gemm_choice_samples(int64_t max_m);

// The index of the sample that stands for m (1 <= m): up to 128 rows the
// smallest sample >= m (m's power-of-two bucket); above, the nearest on a
// log scale among the samples above 128 (the smaller on a tie); the largest
// sample for m beyond it.
size_t gemm_choice_sample_of(const std::vector<int64_t>& samples, int64_t m);

}  // namespace flashoverlap::plan
