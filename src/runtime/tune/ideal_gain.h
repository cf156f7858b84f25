// ideal_gain.h — the share of the ideal gain a call captures (host only).
#pragma once
#include <optional>

namespace flashoverlap::rt {

// The least ideal gain, as a share of the sequential time, for which the
// share captured is reported. Below it (one rank, whose AllReduce moves
// nothing; a collective far shorter than the GEMM) the ratio divides timing
// noise by timing noise and can read as any value, however absurd.
inline constexpr double kLeastIdealGain = 0.01;

// (sequential - ms) / (sequential - ideal), ideal = max(GEMM, collective):
// 0 is the sequential time, 1 the ideal; none where sequential - ideal is
// under kLeastIdealGain x sequential (or a time is not positive).
inline std::optional<double> gain_captured(double sequential_ms, double ideal_ms, double ms) {
  const double ideal_gain = sequential_ms - ideal_ms;
  if (!(sequential_ms > 0) || !(ideal_ms > 0) || !(ms > 0) || !(ideal_gain >= kLeastIdealGain * sequential_ms))
    return std::nullopt;
  return (sequential_ms - ms) / ideal_gain;
}

}  // namespace flashoverlap::rt
