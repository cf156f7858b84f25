// reorder.h — post-communication reorder kernels: slot buffers back to
// row-major C, optionally fused with the element-wise step that follows the
// collective in a transformer layer (residual add + RMSNorm).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm.h"
#include "plan/schedule.h"

namespace flashoverlap::kernels {

// AllReduce slot layout (tile idx at slot rows [idx*bm, idx*bm+bm), bn wide)
// -> row-major C (m x n, ldc elements per row).
void reorder_tiles_to_rows(DType dtype, const void* slots, const plan::Schedule& sched, void* c, int64_t ldc,
                           cudaStream_t stream);

// Same source, fused with the transformer's next step, per row i of C:
//   h = x + residual;  residual_out = h (if non-null);
//   out = h * rsqrt(mean(h^2) + eps) * weight
// h is rounded to the output type before the norm, as an unfused
// add-then-norm in that type would do. out/residual/residual_out are m x n
// row-major (n elements per row); weight has n elements.
void reorder_add_rmsnorm(DType dtype, const void* slots, const plan::Schedule& sched, const void* residual,
                         const void* weight, float eps, void* out, void* residual_out, cudaStream_t stream);

// The same element-wise step on row-major x (m x n, n per row). x may be
// out (in place): a row is read whole before any of it is written.
void add_rmsnorm_rows(DType dtype, const void* x, int32_t m, int32_t n, const void* residual, const void* weight,
                      float eps, void* out, void* residual_out, cudaStream_t stream);

// The ranks' blocks of a gathered buffer (one block per rank, `block_elems`
// apart, each m x n row-major; the ReduceScatter's NVLink form): x = sum of
// the `world` blocks, in rank order in fp32, rounded once (for 2 ranks
// bitwise what an NCCL sum gives). Then
// out (ld_out per row) = x, or the residual + RMSNorm step above.
void sum_gathered_rows(DType dtype, const void* gathered, int32_t world, int64_t block_elems, int32_t m, int32_t n,
                       void* out, int64_t ld_out, cudaStream_t stream);
void sum_gathered_add_rmsnorm(DType dtype, const void* gathered, int32_t world, int64_t block_elems, int32_t m,
                              int32_t n, const void* residual, const void* weight, float eps, void* out,
                              void* residual_out, cudaStream_t stream);

// Generic gather for the ReduceScatter / All-to-All layouts: slot row s
// (bn wide) goes to output row dst_row[s], columns [dst_col[s], +bn) clipped
// to n_cols; dst_row[s] < 0 skips it.
void scatter_slot_rows(DType dtype, const void* slots, int64_t slot_rows, int32_t bn, const int32_t* dst_row,
                       const int32_t* dst_col, void* out, int64_t ld_out, int32_t n_cols, cudaStream_t stream);

// The inverse direction, by output row (ReduceScatter's post-reorder):
// output row i (of `rows`, n columns) gathered from slot rows
// slot_of_out[i * tiles_n + cb], one per column block cb (bn wide, bn % 8 ==
// 0), into out (ld_out per row); or fused with the residual + RMSNorm step
// above (out, residual, residual_out: rows x n, n per row).
void gather_slot_rows(DType dtype, const void* slots, int32_t bn, const int32_t* slot_of_out, int32_t tiles_n,
                      int32_t rows, int32_t n, void* out, int64_t ld_out, cudaStream_t stream);
void gather_slot_rows_add_rmsnorm(DType dtype, const void* slots, int32_t bn, const int32_t* slot_of_out,
                                  int32_t tiles_n, int32_t rows, int32_t n, const void* residual, const void* weight,
                                  float eps, void* out, void* residual_out, cudaStream_t stream);

// The MoE combine (All-to-All, plan::CombineTable): out (tokens x n, ld_out)
// row t = sum over token t's rows token_rows[token_begin[t] ..
// token_begin[t+1]) (output rows, gathered from the slot rows as
// gather_slot_rows does) of gate[row] * row, fma in fp32 in that order,
// rounded once: bitwise plan::combine_reference. No rows: zeros.
void combine_slot_rows(DType dtype, const void* slots, int32_t bn, const int32_t* slot_of_out, int32_t tiles_n,
                       const int32_t* token_begin, const int32_t* token_rows, const float* gate, int32_t tokens,
                       int32_t n, void* out, int64_t ld_out, cudaStream_t stream);

void preload_reorder_kernels();

}  // namespace flashoverlap::kernels
