// op_reference.h — the reference of a public op's call of m rows: the GEMM
// its sequential calls run where plan(m) names cuBLAS's (the op then runs
// cuBLAS's, the same algorithm for the same shape), else ours on the full
// grid (every plan of ours gives the same bits), then one ncclAllReduce of
// all m rows.
#pragma once
#include <nccl.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashoverlap/flashoverlap.h"

#include "plan/tile_grid.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/baselines.h"

namespace flashoverlap::test {

inline bool plan_runs_cublas(const std::string& plan) { return plan.find("cuBLAS's GEMM") != std::string::npos; }

inline void op_reference(const std::string& plan, const void* a, const void* b, void* ref, int64_t m, int64_t n,
                         int64_t k, ncclComm_t comm, cudaStream_t st) {
  if (plan_runs_cublas(plan)) {
    thread_local rt::CublasGemm cublas;  // (one per rank: each rank is a thread on its own GPU)
    rt::sequential_cublas_allreduce(cublas, kernels::DType::BF16, a, b, ref, int(m), int(n), int(k), comm, st);
    return;
  }
  const plan::Schedule s = plan::make_schedule(m, n, {128, 256}, rt::current_device_sms(), plan::Raster::AlongN, 8);
  rt::sequential_ours_allreduce(kernels::DType::BF16, a, b, ref, s, int(k), comm, st);
}

// FP8 inputs whose products are exact before their one rounding, whatever
// GEMM runs them (ours, cuBLASLt's): e4m3 bytes of the integers -3..3, and
// power-of-two scales 2^-2..2^2.
inline std::vector<uint8_t> small_e4m3(size_t count, std::mt19937_64& rng) {
  static const uint8_t kE4m3[] = {0xC4, 0xC0, 0xB8, 0x00, 0x38, 0x40, 0x44};  // -3 .. 3
  std::vector<uint8_t> v(count);
  for (auto& x : v) x = kE4m3[rng() % 7];
  return v;
}
inline std::vector<float> pow2_scales(size_t count, std::mt19937_64& rng) {
  static const float kPow2[] = {0.25f, 0.5f, 1.f, 2.f, 4.f};
  std::vector<float> v(count);
  for (float& x : v) x = kPow2[rng() % 5];
  return v;
}
// One FP8 call's inputs in device memory: a (m x k) and b (n x k) of
// small_e4m3, the scales of pow2_scales as kind says (one each, or m and n).
struct Fp8Inputs {
  rt::DeviceBuffer a, b, sa, sb;
  InputScales scales;  // (none with ScaleKind::None)
  Fp8Inputs(int64_t m, int64_t n, int64_t k, ScaleKind kind, std::mt19937_64& rng)
      : a(rt::to_device(small_e4m3(size_t(m * k), rng))), b(rt::to_device(small_e4m3(size_t(n * k), rng))),
        sa(rt::to_device(pow2_scales(kind == ScaleKind::RowWise ? size_t(m) : 1, rng))),
        sb(rt::to_device(pow2_scales(kind == ScaleKind::RowWise ? size_t(n) : 1, rng))) {
    if (kind != ScaleKind::None) scales = {sa.as<float>(), sb.as<float>()};
  }
  // Scales of the wrong count for the kind: refused with None, missing with the others.
  InputScales wrong(ScaleKind kind) const {
    return kind == ScaleKind::None ? InputScales{sa.as<float>(), sb.as<float>()} : InputScales{};
  }
};

// Our FP8 GEMM of m rows into ref (m x n), the scales as kind says: a
// public op's FP8 call's per-rank product.
inline void fp8_gemm(const void* a, const void* b, void* ref, int64_t m, int64_t n, int64_t k, ScaleKind kind,
                     const InputScales& s, cudaStream_t st) {
  kernels::Fp8 f;
  f.on = true;
  f.scales = kind == ScaleKind::None        ? kernels::Scales::None
             : kind == ScaleKind::PerTensor ? kernels::Scales::PerTensor
                                            : kernels::Scales::RowWise;
  if (kind != ScaleKind::None) f.scale_a = s.a, f.scale_b = s.b;
  const plan::Schedule sch = plan::make_schedule(m, n, {128, 128}, rt::current_device_sms(), plan::Raster::AlongN, 8);
  kernels::GemmParams p = kernels::plain_gemm(kernels::DType::BF16, a, b, sch, int32_t(k), ref, n);
  p.fp8 = f;
  kernels::launch_gemm(p, st);
}

}  // namespace flashoverlap::test
