// combine_tables.h — the MoE combine's tables made on the device from a
// routing in device memory (plan::CombineTable's token_begin and token_rows,
// for a rank's received rows): no copy of the routing to the host, no wait.
// Rows whose routing is bad are left out of every token and reported in a
// RoutingError (mapped host memory: the first bad row).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flashoverlap::kernels {

// Written by one thread: it claims the record, writes the row, then sets
// `failed` last (the host reads `failed` first, and clears it before
// `claimed`).
struct RoutingError {
  uint32_t claimed;  // nonzero: a thread is writing (or wrote) the record
  uint32_t failed;   // 0: none; else a RoutingFault
  int32_t row;       // the bad row reported (a bad one, not necessarily the first)
  int32_t value;     // its dest_rank or dest_token
  float gate;
};
enum RoutingFault : uint32_t { kBadRank = 1, kBadToken = 2, kBadGate = 3 };

// Per row i < rows: keys[i] = dest_token[i] where dest_rank[i] == rank, the
// token is in [0, tokens) and (gate given) gate[i] is finite; else keys[i] =
// tokens (sorted after every token) and the fault goes into *error.
// tokens_out (optional): dest_token[i], as the receiver reports it.
void combine_keys(const int32_t* dest_rank, const int32_t* dest_token, const float* gate, int32_t rows, int32_t rank,
                  int32_t tokens, uint32_t* keys, int32_t* tokens_out, RoutingError* error, cudaStream_t stream);

// Device scratch of sort_rows_by_key for up to max_rows rows.
size_t sort_rows_temp_bytes(int32_t max_rows);
// rows_out = 0 .. rows-1 ordered by key, stably (each key's rows in
// increasing order); keys_out the keys in that order. Keys below 2^bits.
void sort_rows_by_key(void* temp, size_t temp_bytes, const uint32_t* keys, uint32_t* keys_out, const int32_t* iota,
                      int32_t* rows_out, int32_t rows, int bits, cudaStream_t stream);

// token_begin[t] = the sorted keys below t, for t = 0 .. tokens (so
// token_begin[tokens] = the rows of a valid token).
void token_begins(const uint32_t* sorted_keys, int32_t rows, int32_t tokens, int32_t* token_begin,
                  cudaStream_t stream);

// p[i] = i for i < count.
void fill_iota(int32_t* p, int64_t count, cudaStream_t stream);

void preload_combine_table_kernels();

}  // namespace flashoverlap::kernels
