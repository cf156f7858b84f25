// one_rank_alltoall.cpp — see one_rank_alltoall.h.
#include "runtime/ops/one_rank_alltoall.h"

#include <bit>
#include <cstring>
#include <string>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "kernels/reorder.h"
#include "runtime/core/cublas.h"
#include "runtime/core/overlap_core.h"

namespace flashoverlap::rt {

OneRankAllToAll::OneRankAllToAll(const OneRankAllToAllOptions& o, cudaStream_t stream) : opts_(o) {
  if (!o.core || o.n < 1 || o.k < 8 || o.max_rows < 0 || o.max_tokens < 0 || o.max_rows >= (int64_t(1) << 31) ||
      o.max_tokens >= (int64_t(1) << 30))
    throw InvalidArgument("OneRankAllToAll: needs a core, n >= 1, k >= 8 and sizes below 2^31 rows, 2^30 tokens");
  most_ = std::max<int64_t>(o.max_rows, 1);
  keys_ = DeviceBuffer(size_t(most_) * 4), sorted_keys_ = DeviceBuffer(size_t(most_) * 4);
  iota_ = DeviceBuffer(size_t(most_) * 4), token_rows_ = DeviceBuffer(size_t(most_) * 4);
  token_begin_ = DeviceBuffer(size_t(o.max_tokens + 1) * 4);
  sort_temp_bytes_ = kernels::sort_rows_temp_bytes(int32_t(most_));
  sort_temp_ = DeviceBuffer(std::max<size_t>(sort_temp_bytes_, 16));
  error_ = PinnedBuffer(sizeof(kernels::RoutingError));
  std::memset(error_.get(), 0, sizeof(kernels::RoutingError));
  kernels::fill_iota(iota_.as<int32_t>(), most_, stream);  // (before any call's use: in its stream)
  // Every kernel a call may launch loads now, not within a call (a module
  // load waits for the device): ours, and the sort's for one row and for
  // the most (cub picks its kernels by size).
  kernels::preload_kernels();
  for (int32_t rows : {int32_t(1), int32_t(most_)})
    kernels::sort_rows_by_key(sort_temp_.get(), sort_temp_bytes_, iota_.as<uint32_t>(), sorted_keys_.as<uint32_t>(),
                              iota_.as<int32_t>(), token_rows_.as<int32_t>(), rows, 32, stream);
}

OneRankAllToAll::~OneRankAllToAll() { opts_.core->wait_last_call(); }

void OneRankAllToAll::run(const void* a, const void* b, const OneRankCall& c, void* out, int64_t ld_out,
                          int32_t* tokens_out, cudaStream_t stream) {
  const std::string who = "OneRankAllToAll::run";
  if (failed()) check();  // (an earlier call's routing was bad: reported before anything else runs)
  if (c.rows < 0 || c.rows > opts_.max_rows || c.tokens < 0 || c.tokens > opts_.max_tokens)
    throw InvalidArgument(who + ": " + std::to_string(c.rows) + " rows and " + std::to_string(c.tokens) +
                          " tokens: beyond the op's " + std::to_string(opts_.max_rows) + " and " +
                          std::to_string(opts_.max_tokens));
  if (ld_out < opts_.n) throw InvalidArgument(who + ": ld_out < n");
  if (c.rows > 0 && (!a || !b || !c.dest_rank || !c.dest_token || (c.combine && !c.gate)))
    throw InvalidArgument(who + ": null input");
  if (!out && (c.combine ? c.tokens : c.rows) > 0) throw InvalidArgument(who + ": null output");
  const int32_t rows = int32_t(c.rows), tokens = int32_t(c.tokens), n = int32_t(opts_.n);
  OverlapCore& core = *opts_.core;
  core.begin_call(stream);
  void* y = core.scratch(0, size_t(std::max<int64_t>(c.rows, 1)) * size_t(n) * 2);
  if (rows > 0) {
    if (c.gemm) {
      c.gemm(y, stream);
    } else {  // (cuBLAS's call has no schedule: the shape given here, as ours has it)
      kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, c.sched, int32_t(opts_.k), y, n);
      p.m = rows, p.n = n, p.fp8 = c.fp8;
      run_plain_gemm(c.cublas, p, stream);
    }
  }
  auto* error = error_.as<kernels::RoutingError>();
  kernels::combine_keys(c.dest_rank, c.dest_token, c.gate, rows, /*rank=*/0, tokens, keys_.as<uint32_t>(),
                        tokens_out, error, stream);
  if (c.combine) {
    // Keys run to `tokens` (a bad row's): bit_width(tokens) bits hold them.
    const int bits = std::max(1, int(std::bit_width(uint32_t(tokens))));
    kernels::sort_rows_by_key(sort_temp_.get(), sort_temp_bytes_, keys_.as<uint32_t>(), sorted_keys_.as<uint32_t>(),
                              iota_.as<int32_t>(), token_rows_.as<int32_t>(), rows, bits, stream);
    kernels::token_begins(sorted_keys_.as<uint32_t>(), rows, tokens, token_begin_.as<int32_t>(), stream);
    kernels::combine_slot_rows(opts_.dtype, y, n, iota_.as<int32_t>(), 1, token_begin_.as<int32_t>(),
                               token_rows_.as<int32_t>(), c.gate, tokens, n, out, ld_out, stream);
  } else if (rows > 0) {
    FO_CUDA_CHECK(cudaMemcpy2DAsync(out, size_t(ld_out) * 2, y, size_t(n) * 2, size_t(n) * 2, size_t(rows),
                                    cudaMemcpyDeviceToDevice, stream));
  }
  core.end_call(stream);
}

bool OneRankAllToAll::failed() const {
  return reinterpret_cast<volatile const uint32_t&>(error_.as<kernels::RoutingError>()->failed) != 0;
}

void OneRankAllToAll::check() {
  auto* word = error_.as<kernels::RoutingError>();
  if (!failed()) return;
  const kernels::RoutingError e = *word;  // (complete: the GPU sets `failed` last)
  // Reported once: `failed` cleared before `claimed`, so that a later row's report starts afresh.
  reinterpret_cast<volatile uint32_t&>(word->failed) = 0;
  reinterpret_cast<volatile uint32_t&>(word->claimed) = 0;
  std::string what;
  if (e.failed == kernels::kBadRank)
    what = "goes to rank " + std::to_string(e.value) + ", not rank 0 (the only rank)";
  else if (e.failed == kernels::kBadToken)
    what = "goes to token " + std::to_string(e.value) + ", outside [0, tokens)";
  else
    what = "has the gate " + std::to_string(e.gate) + ", not finite";
  throw InvalidArgument("GemmAllToAll (world 1): row " + std::to_string(e.row) + " of an earlier call's routing " +
                        what + ": that call's output does not follow its routing (a combine leaves the row out)");
}

}  // namespace flashoverlap::rt
