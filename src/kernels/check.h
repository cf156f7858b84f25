// check.h — device helpers for checks and benchmarks: deterministic random
// fills, poisoning, and comparisons of two tensors computed on the device.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm.h"

namespace flashoverlap::kernels {

// Uniform values in [lo, hi), a pure function of (seed, index).
void fill_random(DType dtype, void* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t stream);
// Every element set to NaN (bit pattern 0xFFFF): unwritten outputs show up.
void poison(void* p, int64_t count, cudaStream_t stream);

struct CompareResult {
  double err_sq = 0;     // sum over elements of (x - ref)^2
  double ref_sq = 0;     // sum of ref^2
  int64_t nan_count = 0; // non-finite x
  int64_t mismatches = 0;  // elements whose bits differ
  double rel_error() const;  // sqrt(err_sq / ref_sq)
};
// Compares x against ref, both `rows` x `cols` with their own leading dims.
CompareResult compare(DType dtype, const void* x, int64_t ldx, const void* ref, int64_t ldref, int64_t rows,
                      int64_t cols, cudaStream_t stream);

}  // namespace flashoverlap::kernels
