// alltoall_tables.cu — see alltoall_tables.h.
#include "kernels/alltoall_tables.h"

#include <algorithm>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"

namespace flashoverlap::kernels {
namespace {

__global__ void expand_row_of_kernel(const int32_t* tm_of, const int32_t* sbase, const int32_t* dest,
                                     const int32_t* rrank, int64_t entries, int32_t bm, int32_t world, int64_t m,
                                     const int32_t* a_row0, const int32_t* rows_of, int32_t* row_of) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < entries; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t idx = e / bm, r = e - idx * bm, v = tm_of[idx];
    const int64_t row = a_row0 ? a_row0[v] + r : v * bm + r;
    row_of[e] = (a_row0 ? r < rows_of[v] : row < m) ? sbase[idx * world + dest[row]] + rrank[row] : -1;
  }
}

__global__ void expand_slot_of_out_kernel(const int32_t* rtab, const int32_t* rkey, int64_t entries, int32_t tiles_n,
                                          int32_t* slot_of_out) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < entries; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / tiles_n;
    slot_of_out[e] = rtab[rkey[i] + (e - i * tiles_n)] + int32_t(i);
  }
}

int blocks_for(int64_t entries) { return int(std::clamp<int64_t>((entries + 255) / 256, 1, 4096)); }

}  // namespace

void expand_row_of(const int32_t* tm_of, const int32_t* sbase, const int32_t* dest, const int32_t* rrank,
                   int32_t tiles, int32_t bm, int32_t world, int64_t m, int32_t* row_of, cudaStream_t stream,
                   const int32_t* a_row0, const int32_t* rows_of) {
  if (!a_row0 != !rows_of) throw InvalidArgument("expand_row_of: a_row0 and rows_of come together");
  const int64_t entries = int64_t(tiles) * bm;
  if (entries <= 0) return;
  expand_row_of_kernel<<<blocks_for(entries), 256, 0, stream>>>(tm_of, sbase, dest, rrank, entries, bm, world, m,
                                                                 a_row0, rows_of, row_of);
  FO_CUDA_CHECK(cudaGetLastError());
}

void expand_slot_of_out(const int32_t* rtab, const int32_t* rkey, int64_t rows, int32_t tiles_n, int32_t* slot_of_out,
                        cudaStream_t stream) {
  const int64_t entries = rows * tiles_n;
  if (entries <= 0) return;
  expand_slot_of_out_kernel<<<blocks_for(entries), 256, 0, stream>>>(rtab, rkey, entries, tiles_n, slot_of_out);
  FO_CUDA_CHECK(cudaGetLastError());
}

void preload_alltoall_table_kernels() {
  cudaFuncAttributes attr;
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, expand_row_of_kernel));
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, expand_slot_of_out_kernel));
}

}  // namespace flashoverlap::kernels
