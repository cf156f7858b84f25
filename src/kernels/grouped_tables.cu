// grouped_tables.cu — see grouped_tables.h.
#include "kernels/grouped_tables.h"

#include <cub/block/block_scan.cuh>

#include "kernels/cuda_check.h"

namespace flashoverlap::kernels {
namespace {

constexpr int kThreads = 1024, kPerThread = 4;  // 4096 experts at most

__global__ void __launch_bounds__(kThreads) grouped_tables_kernel(const int32_t* offs, int32_t experts, int64_t rows,
                                                                   int64_t n, int32_t bm, int32_t tile_rows,
                                                                   int32_t* a_row0, int32_t* b_row0, int32_t* rows_of,
                                                                   int32_t* bad) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int32_t first_bad;
  if (threadIdx.x == 0) first_bad = experts;
  __syncthreads();
  // Each thread's experts: e = threadIdx.x * kPerThread + j (consecutive, so that the scan keeps their order).
  int32_t start[kPerThread], count[kPerThread], tiles[kPerThread];
  for (int j = 0; j < kPerThread; ++j) {
    const int32_t e = int32_t(threadIdx.x) * kPerThread + j;
    start[j] = count[j] = 0;
    if (e >= experts) continue;
    const int64_t lo = e == 0 ? 0 : offs[e - 1], hi = offs[e];
    if (hi < lo || hi > rows || lo < 0) atomicMin(&first_bad, e);
    start[j] = int32_t(lo), count[j] = int32_t(hi - lo);
  }
  __syncthreads();
  for (int j = 0; j < kPerThread; ++j) {
    const int32_t e = int32_t(threadIdx.x) * kPerThread + j;
    if (e >= first_bad) count[j] = 0;  // (a bad offset: it and every later expert get no rows)
    tiles[j] = (count[j] + bm - 1) / bm;
  }
  int32_t first_tile[kPerThread];
  Scan(scan).ExclusiveSum(tiles, first_tile);
  for (int j = 0; j < kPerThread; ++j) {
    const int32_t e = int32_t(threadIdx.x) * kPerThread + j;
    for (int32_t t = 0; t < tiles[j]; ++t) {
      const int32_t v = first_tile[j] + t;
      if (v >= tile_rows) break;
      a_row0[v] = start[j] + t * bm;
      b_row0[v] = int32_t(int64_t(e) * n);
      rows_of[v] = min(bm, count[j] - t * bm);
    }
  }
  // The tile rows past the experts': no rows.
  int32_t used = 0;
  if (threadIdx.x == kThreads - 1) used = first_tile[kPerThread - 1] + tiles[kPerThread - 1];
  __shared__ int32_t total;
  if (threadIdx.x == kThreads - 1) total = used;
  __syncthreads();
  for (int32_t v = total + int32_t(threadIdx.x); v < tile_rows; v += kThreads) a_row0[v] = b_row0[v] = rows_of[v] = 0;
  if (threadIdx.x == 0 && first_bad < experts && *bad == 0) *bad = first_bad + 1;
}

}  // namespace

void build_grouped_tables(const int32_t* offs, int32_t experts, int64_t rows, int64_t n, int32_t bm,
                          int32_t tile_rows, int32_t* a_row0, int32_t* b_row0, int32_t* rows_of, int32_t* bad,
                          cudaStream_t stream) {
  grouped_tables_kernel<<<1, kThreads, 0, stream>>>(offs, experts, rows, n, bm, tile_rows, a_row0, b_row0, rows_of,
                                                    bad);
  FO_CUDA_CHECK(cudaGetLastError());
}

void preload_grouped_table_kernels() {
  cudaFuncAttributes attr;
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, grouped_tables_kernel));
}

}  // namespace flashoverlap::kernels
