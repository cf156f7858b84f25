// alltoall_tables.h — the All-to-All's per-call tables expanded on the
// device from their compact form (plan::AllToAllTables, plan/slot_map_alltoall.h):
// the GEMM's row_of and the post step's slot_of_out, the same arithmetic as
// plan::expand_row_of / expand_slot_of_out.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashoverlap::kernels {

// row_of[idx * bm + r] = row < m ? sbase[idx * world + dest[row]] + rrank[row] : -1,
// row = tm_of[idx] * bm + r, for idx < tiles. With the grouped GEMM's tile
// rows (a_row0 and rows_of, [tile rows], both or neither): row = a_row0[v] +
// r, stored only for r < rows_of[v], v = tm_of[idx] (a ragged tile row's idle
// rows -1).
void expand_row_of(const int32_t* tm_of, const int32_t* sbase, const int32_t* dest, const int32_t* rrank,
                   int32_t tiles, int32_t bm, int32_t world, int64_t m, int32_t* row_of, cudaStream_t stream,
                   const int32_t* a_row0 = nullptr, const int32_t* rows_of = nullptr);
// slot_of_out[i * tiles_n + cb] = rtab[rkey[i] + cb] + i, for i < rows.
void expand_slot_of_out(const int32_t* rtab, const int32_t* rkey, int64_t rows, int32_t tiles_n, int32_t* slot_of_out,
                        cudaStream_t stream);

void preload_alltoall_table_kernels();

}  // namespace flashoverlap::kernels
