// combine_tables.cu — see combine_tables.h.
#include "kernels/combine_tables.h"

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda_check.h"

namespace flashoverlap::kernels {
namespace {

__device__ void report(RoutingError* e, uint32_t fault, int32_t row, int32_t value, float gate) {
  // (a plain read first: a routing of many bad rows costs reads, not an atomic each, over PCIe)
  if (*reinterpret_cast<volatile uint32_t*>(&e->claimed) == 0u && atomicCAS(&e->claimed, 0u, 1u) == 0u) {
    e->row = row, e->value = value, e->gate = gate;
    __threadfence_system();
    *reinterpret_cast<volatile uint32_t*>(&e->failed) = fault;
    __threadfence_system();
  }
}

__global__ void combine_keys_kernel(const int32_t* dest_rank, const int32_t* dest_token, const float* gate,
                                    int32_t rows, int32_t rank, int32_t tokens, uint32_t* keys, int32_t* tokens_out,
                                    RoutingError* error) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t d = dest_rank[i], t = dest_token[i];
    const float g = gate ? gate[i] : 0.0f;
    uint32_t fault = 0;
    if (d != rank) fault = kBadRank;
    else if (t < 0 || t >= tokens) fault = kBadToken;
    else if (gate && !isfinite(g)) fault = kBadGate;
    if (fault) report(error, fault, int32_t(i), fault == kBadRank ? d : t, g);
    keys[i] = fault ? uint32_t(tokens) : uint32_t(t);
    if (tokens_out) tokens_out[i] = t;
  }
}

__global__ void token_begins_kernel(const uint32_t* sorted, int32_t rows, int32_t tokens, int32_t* token_begin) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t <= tokens; t += int64_t(gridDim.x) * blockDim.x) {
    int32_t lo = 0, hi = rows;  // the first sorted key >= t
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (sorted[mid] < uint32_t(t)) lo = mid + 1;
      else hi = mid;
    }
    token_begin[t] = lo;
  }
}

__global__ void iota_kernel(int32_t* p, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = int32_t(i);
}

int blocks_for(int64_t entries) { return int(std::clamp<int64_t>((entries + 255) / 256, 1, 1024)); }

}  // namespace

void combine_keys(const int32_t* dest_rank, const int32_t* dest_token, const float* gate, int32_t rows, int32_t rank,
                  int32_t tokens, uint32_t* keys, int32_t* tokens_out, RoutingError* error, cudaStream_t stream) {
  if (rows <= 0) return;
  combine_keys_kernel<<<blocks_for(rows), 256, 0, stream>>>(dest_rank, dest_token, gate, rows, rank, tokens, keys,
                                                             tokens_out, error);
  FO_CUDA_CHECK(cudaGetLastError());
}

size_t sort_rows_temp_bytes(int32_t max_rows) {
  size_t bytes = 0;
  FO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), std::max(max_rows, 1), 0, 32));
  return bytes;
}

void sort_rows_by_key(void* temp, size_t temp_bytes, const uint32_t* keys, uint32_t* keys_out, const int32_t* iota,
                      int32_t* rows_out, int32_t rows, int bits, cudaStream_t stream) {
  if (rows <= 0) return;
  FO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_out, iota, rows_out, rows, 0,
                                                std::clamp(bits, 1, 32), stream));
}

void token_begins(const uint32_t* sorted_keys, int32_t rows, int32_t tokens, int32_t* token_begin,
                  cudaStream_t stream) {
  if (tokens < 0) return;
  token_begins_kernel<<<blocks_for(int64_t(tokens) + 1), 256, 0, stream>>>(sorted_keys, std::max(rows, 0), tokens,
                                                                           token_begin);
  FO_CUDA_CHECK(cudaGetLastError());
}

void fill_iota(int32_t* p, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  iota_kernel<<<blocks_for(count), 256, 0, stream>>>(p, count);
  FO_CUDA_CHECK(cudaGetLastError());
}

void preload_combine_table_kernels() {
  cudaFuncAttributes attr;
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, combine_keys_kernel));
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, token_begins_kernel));
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, iota_kernel));
}

}  // namespace flashoverlap::kernels
