// op_setup.h — what the public ops (gemm_allreduce.cpp, gemm_reducescatter.cpp)
// share: their setup at construction (the GEMM's time per wave, rank 0's
// files on every rank) and the checks of each call (m agreed by the ranks,
// no planning under a CUDA graph capture).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flashoverlap/flashoverlap.h"
#include "kernels/gemm.h"
#include "plan/tile_grid.h"

namespace flashoverlap::rt {
struct PickKey;
class CublasGemm;
class CallWatch;
}

namespace flashoverlap::api {

inline kernels::DType to_kernels(DType d) { return d == DType::BF16 ? kernels::DType::BF16 : kernels::DType::FP16; }

constexpr int32_t kBm = 128;  // every tile shape's height: m's bucket is its tile rows
inline int32_t bucket_of(int64_t m) { return int32_t((m + kBm - 1) / kBm); }

// The tile shapes the public ops plan with, the widest first: 128x256 and
// 128x128 for 16-bit inputs; 128x192, 128x160, 128x144, 128x128 and 128x112
// for FP8 (a part sum beside the sum leaves no room for 128x256's
// accumulators; the narrower ones fill a wave where the wider leave SMs
// idle, as 128x160 at n = 1280, 128x144 at m = 2048, n = 8192 and 128x112
// at m = 256, n = 7168), whose NVLink forms (the
// scatter epilogue) take 128x128 only (scatter_takes_tile).
inline const std::vector<plan::TileShape>& op_tiles(InputType input = InputType::Same) {
  return kernels::op_tiles(input == InputType::E4M3);
}

// Rank 0's text on every rank (two small bounded NCCL exchanges).
std::string from_rank0(ncclComm_t comm, int rank, const std::string& mine, const std::string& what);

// Our GEMM's time per wave for each of op_tiles(input) on the largest m up
// to 4096 of max_m rows, on the full grid of `sms` CTAs: the max over ranks
// (collective), so that every rank plans from the same times.
std::vector<double> gemm_wave_ms(ncclComm_t comm, int rank, int64_t max_m, int64_t n, int64_t k, DType dtype,
                                 int sms, const std::string& who, InputType input = InputType::Same);
// The time of a GEMM the inputs do not have (cuBLASLt without FP8 row-wise scales): never the faster.
constexpr double kNoGemm = 1e30;

// Our GEMM against cuBLAS's for the sequential calls, timed in turns at
// construction at each of plan::gemm_choice_samples(max_m) (the slowest
// rank's times: every rank chooses alike). A sequential call of m runs the
// faster at the sample standing for m; cuBLAS's unless ours is at least 4%
// faster (cuBLAS's is what F.linear runs: a near tie goes to it).
struct SequentialGemms {
  struct Sample {
    int64_t m = 0;
    double ours_ms = 0, cublas_ms = 0;
    size_t ours_tile = 0;  // the faster of op_tiles(input) at m
    bool cublas = true;
  };
  std::vector<Sample> samples;
  std::vector<int64_t> ms;  // each sample's m, in order: at()'s lookup (calls look up m, so no copy per call)

  const Sample& at(int64_t m) const;
  bool cublas(int64_t m) const { return at(m).cublas; }
  // The chosen GEMM's time over ours at m's sample (<= 1): what the model's
  // sequential time (our GEMM's) is scaled by.
  double ratio(int64_t m) const;
  // E.g. "cuBLAS's GEMM (0.031 ms against ours 0.052 ms at m = 32)".
  std::string describe(int64_t m) const;
};
// (FP8 inputs: cuBLASLt's FP8 matmul against ours on its tiles.)
SequentialGemms measure_sequential_gemms(ncclComm_t comm, int rank, int64_t max_m, int64_t n, int64_t k, DType dtype,
                                         int sms, rt::CublasGemm& cublas, const std::string& who,
                                         InputType input = InputType::Same, ScaleKind scales = ScaleKind::None);

// FP8 inputs: the options' kinds (InvalidArgument naming `who`: an
// unknown kind, scales for 16-bit inputs, k % 16 != 0 with FP8), a call's
// scales against them (both pointers, 4-byte aligned, with PerTensor or
// RowWise; none otherwise), the kernel's Fp8 of them (pointers per call),
// and whether the NVLink forms' scatter epilogue takes a tile (FP8: 128x128 only).
void check_input_options(const std::string& who, InputType input, ScaleKind scales, int64_t k);
void check_input_scales(const std::string& who, InputType input, ScaleKind kind, const InputScales& s);
kernels::Fp8 fp8_of(InputType input, ScaleKind scales);
bool scatter_takes_tile(InputType input, plan::TileShape tile);

// The checks every public op makes (InvalidArgument naming `who`): its
// shape at construction (1 <= max_m, n below 2^30, k % 8 == 0), the SMs left
// to NCCL (in [1, sms / 2]) and the wait timeout (> 0, at most a week); a
// call's pointers and ld_out (0: n, or >= n); run_rmsnorm's pointers and eps.
void check_shape(const std::string& who, int64_t max_m, int64_t n, int64_t k);
void check_op_options(const std::string& who, int sms, int nccl_sms, double wait_timeout_s);
void check_run_args(const std::string& who, const void* a, const void* b, const void* out, int64_t ld_out, int64_t n);
void check_rmsnorm_args(const std::string& who, const void* a, const void* b, const void* residual,
                        const void* norm_weight, const void* out, float eps);

// The name of the current device (the curves' and the tuning cache's key).
std::string current_gpu_name();

// The tuning cache a process reads: the option's file, else
// $FLASHOVERLAP_TUNING_CACHE's, else none ("").
std::string tuning_cache_path(const std::string& option);
// The built-in model's time per wave of our GEMM for each of
// op_tiles(input): what the GPU-free planning calls take for the measured
// ones. (FP8 inputs: a wave at half the 16-bit one, the FP8 tensor cores'
// rate being twice bf16's.)
std::vector<double> model_wave_ms(int64_t k, InputType input = InputType::Same);

// Rank 0's tuning-cache entries of `shape` (any tile rows), on every rank
// (PickCache::entries_for's text): the file is `option`, else
// $FLASHOVERLAP_TUNING_CACHE, else none (""). Collective.
std::string rank0_tuning_entries(ncclComm_t comm, int rank, const std::string& option, const rt::PickKey& shape,
                                 const std::string& who);

// An op's watch over its calls (runtime/core/call_watch.h): a call whose
// work runs past twice wait_timeout_s on the GPU fails the op (a call whose
// own bounded waits time out completes within one), and revokes these
// communicators (the op's own and the library's: never one adopted from the
// caller, e.g. PyTorch's).
std::unique_ptr<rt::CallWatch> make_call_watch(const std::string& who, double wait_timeout_s,
                                               const std::vector<ncclComm_t>& revocable);

// FLASHOVERLAP_CHECK_M=1 in the environment, or the option.
bool check_m_enabled(bool option);

// Every rank's m compared (a host exchange, skipped under capture); a
// mismatch throws InvalidArgument on every rank, naming each rank's m.
void check_same_m(ncclComm_t comm, int rank, int64_t m, cudaStream_t stream, const std::string& who);

// Throws InvalidArgument (naming prepare(m)) when `stream` is capturing: a
// new m is planned and allocated for, which a capture forbids.
void refuse_planning_under_capture(cudaStream_t stream, int64_t m, const std::string& who);

}  // namespace flashoverlap::api
