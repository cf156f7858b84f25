// latency_model.h — the performance model the search runs on (docs/design.md §2.4):
// a bandwidth curve per collective (latency of one call vs bytes), its scaling
// to other world sizes and to the CTAs left to NCCL, and the GEMM's duration
// per wave.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/collective.h"
#include "plan/schedule.h"
#include "plan/tile_grid.h"

namespace flashoverlap::plan {

struct CurveSample {
  double bytes = 0, ms = 0;
};
// A curve's samples stay within these: 2^48 bytes (256 TiB) and 100 s per call.
inline constexpr double kMaxCurveBytes = 281474976710656.0, kMaxCurveMs = 1e5;

// Latency of one NCCL call vs the bytes it covers (the send buffer), measured
// at log-spaced sizes on `world` ranks. Measured latencies are not monotone at
// small sizes (noise, protocol switches); the model uses the running maximum
// from below (latency(b) >= latency of every smaller sample), so more bytes
// never predict less time and small groups are never predicted optimistically
// — the conservative side for "never slower than sequential". Between samples:
// linear in time against log(bytes); below the first sample: its latency;
// beyond the last: the last segment's bandwidth (linear in bytes).
class BandwidthCurve {
 public:
  static constexpr const char* kFormat = "flashoverlap.bandwidth_curve";
  static constexpr int kSchema = 1;

  // Throws InvalidArgument: fewer than 2 samples, bytes not positive and
  // strictly increasing, latencies not positive and finite, world < 1.
  BandwidthCurve(Collective op, int32_t world, std::vector<CurveSample> samples, std::string gpu = {});

  double latency_ms(double bytes) const;
  double overhead_ms() const { return env_ms_.front(); }  // what even the smallest call costs

  Collective op() const { return op_; }
  int32_t world() const { return world_; }
  const std::string& gpu() const { return gpu_; }
  const std::vector<CurveSample>& samples() const { return samples_; }

  // {"format", "schema", "collective", "world", "gpu"?, "samples": [[bytes, ms], ...]}
  nlohmann::json to_json() const;
  // Throws InvalidArgument "<source>: <problem>" for anything malformed or foreign.
  static BandwidthCurve from_json(const nlohmann::json& j, const std::string& source);
  static BandwidthCurve load(const std::string& path);
  void save(const std::string& path) const;

  // Measured on 2x H200 (NVLink, NCCL 2.28, 2026-11-30), world 2.
  static BandwidthCurve builtin_h200(Collective op);

 private:
  Collective op_;
  int32_t world_;
  std::string gpu_;
  std::vector<CurveSample> samples_;        // as measured (saved as is)
  std::vector<double> log_bytes_, env_ms_;  // log(bytes), monotone envelope
};

// One collective call's latency for the plan's world size and NCCL's CTAs.
struct CommModel {
  BandwidthCurve curve;
  int32_t world = 2;
  // NCCL reaches its full bandwidth with this many CTAs (channels); below
  // it the bandwidth term grows as ~16/channels (fit to the channel sweep
  // of docs/design.md §6.2).
  int32_t saturating_ctas = 16;

  // Throws InvalidArgument when the curve cannot be scaled to `world` (a
  // curve measured on 1 rank says nothing about bandwidth).
  CommModel(BandwidthCurve c, int32_t world, int32_t saturating_ctas = 16);

  // Ring traffic per rank is (W-1)/W of the buffer for ReduceScatter and
  // All-to-All and 2(W-1)/W for AllReduce: relative to the curve's world both
  // scale the bytes by ((W-1)/W) / ((Wc-1)/Wc).
  double bytes_scale() const;
  // `bytes`: the send buffer of the call. comm_ctas: CTAs NCCL may use, 0 for
  // unlimited (nothing else running). The bandwidth term (latency above
  // overhead_ms) grows by saturating_ctas / comm_ctas when fewer.
  double ms(double bytes, int32_t comm_ctas) const;
  // One line: the curve's origin and the scaling applied.
  std::string describe() const;
};

// The GEMM's duration per wave. Default estimate: every CTA of a wave
// computes one tile, 2*bm*bn*K flops at the per-SM share of the peak; a
// partial last wave takes as long as a full one (each active CTA still
// computes a whole tile). Tiles other than 128x256 run at `efficiency`.
struct GemmModel {
  double peak_tflops = 770.0;  // large-shape cuBLAS bf16 on H200 (docs/design.md §6.1)
  int32_t peak_sms = 132;
  double slowdown = 1.10;      // GEMM under concurrent NCCL (docs/design.md §6.2)

  // 1.0 for 128x256, 0.92 for 128x128; throws InvalidArgument for tiles
  // without an estimate (pass measured wave times instead).
  static double efficiency(TileShape t);
  double wave_ms(TileShape t, int64_t k) const;
  std::vector<double> waves_ms(const Schedule& s, int64_t k) const;  // size s.waves()
};

}  // namespace flashoverlap::plan
