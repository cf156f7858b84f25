// grouped_tables.h — the grouped GEMM's tables (kernels::Grouped) built on
// the device from the experts' row offsets there (torch's `offs`: offs[e] =
// the rows of experts 0..e, non-decreasing), the arithmetic of
// plan::make_grouped_tile_rows on plan::expert_segments: a call then needs no
// counts on the host. `tile_rows` entries are written; those past the
// experts' tile rows get rows 0, which the GEMM skips.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashoverlap::kernels {

// An offset that decreases or passes `rows` sets *bad (if it is 0) to 1 + the
// first such expert, whose rows, and every later expert's, are then not
// computed. experts in [1, 4096]; tile_rows >= rows / bm + experts (the most
// the experts' rows can take).
void build_grouped_tables(const int32_t* offs, int32_t experts, int64_t rows, int64_t n, int32_t bm,
                          int32_t tile_rows, int32_t* a_row0, int32_t* b_row0, int32_t* rows_of, int32_t* bad,
                          cudaStream_t stream);

void preload_grouped_table_kernels();

}  // namespace flashoverlap::kernels
