// kernel_bench_c.cpp — libflashoverlap_kernel_bench.so (built, not
// installed): our FP8 GEMM alone behind a small C interface, so that
// bench/scaled_mm.py times it and torch._scaled_mm in one process, in turns,
// with one timing (the GPU's clocks and power then the same for both). The
// launch is bench-fp8's (lab/fp8_launch.h). Internal: the ops pick their
// GEMM themselves; this is the kernel.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <memory>

#include "kernels/gemm.h"
#include "lab/fp8_launch.h"

namespace fo = flashoverlap;

namespace {

struct Fp8Gemm {
  fo::kernels::GemmParams p;
  void* work = nullptr;  // (stream-K's workspace, zeroed; null if the launch is not split)
  ~Fp8Gemm() {
    if (work) (void)cudaFree(work);
  }
};

int fail(char* err, int len, const char* what) {
  if (err && len > 0) std::snprintf(err, size_t(len), "%s", what);
  return 1;
}

}  // namespace

extern "C" {

// C (bf16, m x n, row-major) = scale(A B^T) with A (m x k) and B (n x k)
// e4m3, row-major. scales: 0 none, 1 per tensor (scale_a, scale_b: one fp32
// each), 2 row-wise (scale_a: m, scale_b: n). tile_m x tile_n: one of
// kernels::kernel_tiles(true) (the 64-row tiles whole only). stream_k:
// 0 never split; 1 the lab's rule (split where plan::stream_k_split puts
// it, on plan::stream_k_in_step_ctas' grid); 2 the pair split where two
// CTAs a tile fit the SMs (GemmParams::pair_k); 3 the tail split
// (plan::stream_k_tail_split, where the tiles fill more than a wave and the
// last is partial). pdl: nonzero to launch as a
// programmatic dependent launch (GemmParams::pdl). On the current device;
// *out: the handle. Returns 0, or 1 with the reason in err.
int fobk_fp8_gemm_create(int64_t m, int64_t n, int64_t k, int scales, const void* a, const void* b, void* c,
                         const float* scale_a, const float* scale_b, int tile_m, int tile_n, int stream_k, int pdl,
                         void** out, char* err, int err_len) {
  try {
    if (!fo::kernels::tile_supported(tile_m, tile_n, true))
      return fail(err, err_len, ("tile: " + fo::kernels::tile_names(fo::kernels::kernel_tiles(true))).c_str());
    if (scales < 0 || scales > 2) return fail(err, err_len, "scales: 0 (none), 1 (per tensor) or 2 (row-wise)");
    if (stream_k < 0 || stream_k > 3)
      return fail(err, err_len,
                  "stream_k: 0 (off), 1 (the rule, on the in-step grid), 2 (the pair split) or 3 (the tail split)");
    using fo::cli::Split;
    const Split mode = stream_k == 0   ? Split::Off
                       : stream_k == 1 ? Split::Rule
                       : stream_k == 2 ? Split::Pair
                                       : Split::Tail;
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return fail(err, err_len, "no CUDA device");
    fo::kernels::Fp8 f;
    f.on = true, f.scales = fo::kernels::Scales(scales);
    if (scales != 0) f.scale_a = scale_a, f.scale_b = scale_b;
    auto g = std::make_unique<Fp8Gemm>();
    const fo::plan::TileShape tile{tile_m, tile_n};
    if (fo::cli::fp8_split(fo::cli::fp8_schedule(m, n, tile, sms), k, mode).on()) {
      const size_t bytes = fo::kernels::stream_k_workspace_bytes(sms, 192);
      if (cudaMalloc(&g->work, bytes) != cudaSuccess || cudaMemset(g->work, 0, bytes) != cudaSuccess)
        return fail(err, err_len, "cannot allocate stream-K's workspace");
    }
    g->p = fo::cli::fp8_gemm(m, n, k, tile, sms, a, b, c, f, g->work, mode);
    g->p.pdl = pdl != 0;
    fo::kernels::check_gemm_params(g->p);
    *out = g.release();
    return 0;
  } catch (const std::exception& e) {
    return fail(err, err_len, e.what());
  }
}

// How the handle's launch is split: 0 whole tiles, 1 stream-K, 2 the pair split.
int fobk_fp8_gemm_split(void* h) {
  const fo::kernels::GemmParams& p = static_cast<Fp8Gemm*>(h)->p;
  return p.pair_k ? 2 : p.stream_k.on() ? 1 : 0;
}

// Enqueues one launch on `stream` (a cudaStream_t; null: the legacy stream).
int fobk_fp8_gemm_launch(void* h, void* stream, char* err, int err_len) {
  try {
    fo::kernels::launch_gemm(static_cast<Fp8Gemm*>(h)->p, static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(err, err_len, e.what());
  }
}

void fobk_fp8_gemm_destroy(void* h) { delete static_cast<Fp8Gemm*>(h); }

}  // extern "C"
