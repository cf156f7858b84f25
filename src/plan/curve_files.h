// curve_files.h — measured bandwidth curves kept between runs, one JSON file
// per curve in a directory (`tune --curves DIR` writes them, `bench --curves
// DIR` reads them and measures only what is missing):
//   DIR/allreduce-ctas<N|default>-w<world>-<dtype>.json  (NCCL on SMs)
#pragma once
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>

#include "plan/latency_model.h"

namespace flashoverlap::plan {

// ctas <= 0: NCCL's default CTAs.
std::string allreduce_curve_file(const std::string& dir, int ctas, int world, const std::string& dtype);

// The curve in `path` when the file exists and holds a curve of `op`
// measured on a `gpu` with `world` ranks; otherwise nullopt, with the reason
// on `log` if the file exists but does not fit (or cannot be read).
std::optional<BandwidthCurve> load_fitting_curve(const std::string& path, Collective op,
                                                       const std::string& gpu, int world, std::ostream& log);

// How ranks agree: all_ranks(mine) is true when every rank's answer is
// true; from_rank0(text) returns rank 0's text on every rank.
struct RankAgreement {
  std::function<bool(bool)> all_ranks;
  std::function<std::string(const std::string&)> from_rank0;
};

// Rank 0's curve from `path` when the file fits on every rank (the
// measurement is collective, so all ranks must take the same branch, and they
// must plan with the same curve even if their files differ), else measure(),
// saved to `path` when `save` (rank 0's job; a failed save is reported on
// `log`, not thrown). An empty path always measures and saves nothing.
BandwidthCurve cached_curve(const std::string& path, Collective op, const std::string& gpu, int world, bool save,
                            const RankAgreement& ranks, const std::function<BandwidthCurve()>& measure,
                            std::ostream& log);

}  // namespace flashoverlap::plan
