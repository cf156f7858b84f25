// fp8_launch.h — the FP8 GEMM launch that bench-fp8 times and that
// bench/scaled_mm.py times beside torch._scaled_mm in one process
// (kernel_bench_c.cpp): C (bf16, row-major m x n) = A B^T, e4m3 inputs,
// on one of the kernel's FP8 tiles, one CTA per SM, the scales of `f`; stream-K where
// plan::stream_k_split puts it (on the in-step grid: fewer CTAs), or as
// Force asks, if the caller gives a workspace; or split in pairs (Pair).
#pragma once
#include <cstdint>
#include <string>

#include "kernels/gemm.h"
#include "plan/stream_k.h"
#include "plan/tile_grid.h"

namespace flashoverlap::cli {

// A tile as the lab prints it: "112" for 128x112 (the 128-row tiles by
// their width), "64x48" for a 64-row tile.
inline std::string fp8_tile_label(plan::TileShape t) {
  return (t.bm == 64 ? "64x" : "") + std::to_string(t.bn);
}

// The schedule of a tile.
inline plan::Schedule fp8_schedule(int64_t m, int64_t n, plan::TileShape tile, int32_t sms) {
  return plan::make_schedule(m, n, tile, sms, plan::Raster::AlongN,
                             plan::default_swizzle(sms, tile, int32_t((m + tile.bm - 1) / tile.bm)));
}

// How a launch is split along K (stream-K): never; the rule, which takes
// plan::stream_k_split's splits and runs them on plan::stream_k_in_step_ctas'
// grid (the same split over fewer CTAs, whose shares read A and B in step);
// or, as an experiment on it, every grid of fewer tiles than CTAs split, on
// all the CTAs (Force); or, another experiment, each tile's k-blocks split
// between the two CTAs of a cluster (GemmParams::pair_k) where two CTAs a
// tile fit the SMs (Pair; otherwise whole tiles); or, a third, the last
// whole wave and the partial one split over all the CTAs where the tiles
// fill more than one wave (Tail: plan::stream_k_tail_split). The 64-row
// tiles are whole in every mode.
enum class Split { Off, Rule, Force, Pair, Tail };

// The split of this grid (k-blocks of 128) in `mode`, before the rule's
// in-step grid (fp8_gemm).
inline plan::StreamK fp8_split(const plan::Schedule& s, int64_t k, Split mode = Split::Rule) {
  const int32_t kbs = int32_t((k + 127) / 128);
  if (mode == Split::Off || mode == Split::Pair || s.bm != 128) return plan::StreamK{s.tiles(), s.tiles(), kbs, s.ctas};
  if (mode == Split::Force && s.tiles() < s.ctas && kbs >= 2) return plan::StreamK{s.tiles(), 0, kbs, s.ctas};
  if (mode == Split::Tail) return plan::stream_k_tail_split(s.tiles(), s.ctas, kbs);
  return plan::stream_k_split(s.tiles(), s.ctas, kbs);
}

// sk_work: a zeroed workspace of kernels::stream_k_workspace_bytes(sms, 192),
// or null (every tile whole).
inline kernels::GemmParams fp8_gemm(int64_t m, int64_t n, int64_t k, plan::TileShape tile, int32_t sms, const void* a,
                                    const void* b, void* c, const kernels::Fp8& f, void* sk_work,
                                    Split mode = Split::Rule) {
  plan::Schedule s = fp8_schedule(m, n, tile, sms);
  const bool pair = mode == Split::Pair && s.bm == 128 && 2 * int64_t(s.tiles()) <= sms && (k + 127) / 128 >= 2;
  if (pair) s = fp8_schedule(m, n, tile, 2 * s.tiles());  // (two CTAs a tile)
  plan::StreamK split = fp8_split(s, k, mode);
  if (sk_work && mode == Split::Rule && split.on()) {  // (the same split, fewer CTAs)
    s = fp8_schedule(m, n, tile, plan::stream_k_in_step_ctas(s.tiles(), sms));
    split.ctas = s.ctas;
  }
  kernels::GemmParams p = kernels::plain_gemm(kernels::DType::BF16, a, b, s, int32_t(k), c, n);
  p.fp8 = f;
  p.pair_k = pair;
  if (sk_work && split.on()) p.stream_k = split, p.stream_k_work = sk_work;
  return p;
}

}  // namespace flashoverlap::cli
