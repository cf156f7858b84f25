// one_rank_alltoall.h — the MoE combine on one rank (world 1), with the
// routing's per-row arrays in device memory: nothing waits for the host.
// Every row comes back to this rank, so the call is the GEMM and the post
// step, in the caller's stream:
//
//   GEMM      Y = A B^T (m x n, row-major) into scratch: cuBLAS's or ours
//             (or the caller's: a grouped GEMM of several experts)
//   keys      per row its token, or `tokens` where the routing is bad (the
//             row is then left out, and the fault recorded: check())
//   combine:  the rows sorted by token, stably (cub's radix sort), each
//             token's first row by binary search: plan::CombineTable's
//             token_rows and token_begin; then the combine kernel of the
//             host-planned calls, so the sums are the same bits
//   or not:   Y copied into out, and each row's token into tokens_out
//
// What the host-planned call checks before it runs (a token out of range,
// a row not for this rank, a gate not finite) is checked here on the GPU:
// such rows are left out of the combine (the rows-only form copies them as
// they are), and one of them is reported once, by check() or by the next
// call (before it runs).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "kernels/combine_tables.h"
#include "kernels/gemm.h"
#include "plan/schedule.h"
#include "runtime/core/buffer.h"

namespace flashoverlap::rt {

class CublasGemm;
class OverlapCore;

struct OneRankAllToAllOptions {
  int64_t n = 0, k = 0;
  kernels::DType dtype = kernels::DType::BF16;
  int64_t max_rows = 0, max_tokens = 0;
  OverlapCore* core = nullptr;  // required: call order and the GEMM's scratch (its slot 0)
};

struct OneRankCall {
  int64_t rows = 0, tokens = 0;
  const int32_t* dest_rank = nullptr;   // device, [rows]
  const int32_t* dest_token = nullptr;  // device, [rows]
  const float* gate = nullptr;          // device, [rows]; required to combine
  bool combine = true;
  CublasGemm* cublas = nullptr;  // set: cuBLAS's GEMM; else ours on `sched`
  plan::Schedule sched;
  kernels::Fp8 fp8;  // FP8 inputs (with the call's scales): cuBLASLt's FP8 matmul or ours on 128x128 tiles
  // Set: the GEMM instead, Y (rows x n, ld n) in `stream` (several experts: the caller's grouped GEMM).
  std::function<void(void* y, cudaStream_t stream)> gemm;
};

class OneRankAllToAll {
 public:
  // Its tables' buffers, and their fixed part written in `stream` (so: the
  // first call's stream, or one ordered before it).
  OneRankAllToAll(const OneRankAllToAllOptions& o, cudaStream_t stream);
  ~OneRankAllToAll();  // waits for the core's last call (its buffers may be in use)
  OneRankAllToAll(const OneRankAllToAll&) = delete;
  OneRankAllToAll& operator=(const OneRankAllToAll&) = delete;

  // out: the combine (tokens x n) or the rows (rows x n), ld_out per row;
  // tokens_out (optional, device): each row's token. Sizes and pointers
  // are the caller's to check (InvalidArgument here only for what would
  // write out of bounds).
  void run(const void* a, const void* b, const OneRankCall& c, void* out, int64_t ld_out, int32_t* tokens_out,
           cudaStream_t stream);
  // InvalidArgument naming the first bad row of an earlier call, once
  // (synchronise the call's stream first to be sure of seeing it).
  void check();
  bool failed() const;

 private:
  OneRankAllToAllOptions opts_;
  int64_t most_ = 0;  // max(max_rows, 1): the rows the buffers hold
  DeviceBuffer keys_, sorted_keys_, iota_, token_rows_, token_begin_, sort_temp_;
  size_t sort_temp_bytes_ = 0;
  PinnedBuffer error_;  // kernels::RoutingError, written by the GPU
};

}  // namespace flashoverlap::rt
