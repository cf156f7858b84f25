// tile_clocks.h — what the GEMM's tile monitor (kernels::GemmParams::
// monitor_mma) says about the SM clock and the work per tile. Host only.
//
// Why: beside NVLink transfers the GEMM runs longer. Time per tile
// alone cannot tell a lower clock (power) from more cycles per tile
// (interference: memory, L2, issue slots); the SM's cycle counter can.
#pragma once
#include <cstdint>
#include <vector>

namespace flashoverlap::rt {

struct TileClocks {
  int intervals = 0;             // consecutive tile pairs of one CTA measured
  double mhz = 0;                // their cycles over their nanoseconds
  double kcycles_median = 0;     // SM cycles from one tile's end to the next's, thousands
  double kcycles_p90 = 0;
  double us_median = 0;          // the same in microseconds
  std::vector<double> mhz_by_quarter;  // the clock in each quarter of the span (by interval end)
};

// mma: [tiles * 2] = {globaltimer ns, cycles} per tile; a persistent CTA c
// of `ctas` computes tiles c, c + ctas, c + 2 ctas, ... in that order.
// Tiles never recorded (time 0: zero the buffer first) and intervals whose
// time or cycle count does not advance are skipped.
TileClocks summarize_tile_clocks(const std::vector<uint64_t>& mma, int64_t tiles, int ctas);

// Where the GEMM's end goes (kernels::GemmParams::monitor_phases), in µs
// from the first CTA's start: when the CTAs' first and last tiles' MMAs
// were done, when their last tiles were staged (after the epilogue's waits:
// a free buffer, the peer's partial), their stores and pushes done, their
// copies done (owner layout; 0 if none), and the last CTA's end (the latest
// of all). The MMAs' times tell a slower mainloop beside the transfers from
// an epilogue that waits.
struct GemmPhases {
  int ctas = 0;  // CTAs that recorded a last tile
  double mma_first_median_us = 0;                  // the first tile's MMAs done (0: not recorded)
  double mma_last_median_us = 0, mma_last_max_us = 0;  // the last tile's
  double staged_median_us = 0, staged_max_us = 0;
  double stored_max_us = 0;
  double copied_max_us = 0;
  double end_us = 0;
};

// Values per CTA in GemmParams::monitor_phases (= kernels::kPhaseSlots).
inline constexpr int kPhaseSlots = 6;

// phases: [ctas * kPhaseSlots] = {staged, stored, copied (FP8 whole tiles: first data in), start, first
// tile's MMAs done, last tile's MMAs done} ns per CTA (0: not recorded). CTAs without a start are skipped, and those without a staged
// last tile (no tiles) count for the copies only; the times start at the
// earliest start of a CTA with tiles.
GemmPhases summarize_phases(const std::vector<uint64_t>& phases, int ctas);

}  // namespace flashoverlap::rt
