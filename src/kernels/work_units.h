// work_units.h — the persistent GEMM's units of work with the last wave
// split along K (gemm.h: TailSplit). Pure functions shared by the kernel and
// the host (checks, tests); no CUDA headers.
//
// Walk positions [0, from) are one unit each; each position from `from` on
// is `parts` consecutive units, part q computing k-blocks
// [q * kb / parts, (q + 1) * kb / parts) of that tile. Units go to the CTAs
// as tiles did (unit u to CTA u % ctas), so a split tile's parts run side by
// side on neighbouring CTAs. Its last part (parts - 1) adds the others' fp32
// partial sums and runs the tile's epilogue: which of the tile's units that
// is rotates with the round, so that each CTA takes that extra work in turn
// (the last part on the same CTAs every round ran 1-2 epilogues behind the
// others at the end). A tile whose units straddle two rounds keeps its last
// part on its highest unit: the last part waits for the others, which must
// not be in a later round of their CTAs than it.
#pragma once
#include <cstdint>

#include "plan/schedule.h"  // (FO_HD)

namespace flashoverlap::kernels {

struct WorkUnit {
  int32_t pos;    // walk position: the tile it computes (part of)
  int32_t part;   // which K range, 0 .. parts - 1
  int32_t parts;  // 1: the whole tile
};

FO_HD int32_t unit_count(int32_t tiles, int32_t from, int32_t parts) {
  return parts > 1 ? from + parts * (tiles - from) : tiles;
}

FO_HD WorkUnit unit_at(int32_t u, int32_t from, int32_t parts, int32_t ctas) {
  if (parts <= 1 || u < from) return {u, 0, 1};
  const int32_t j = u - from, q = j % parts, first = u - q;
  const int32_t round = first / ctas;
  const int32_t rot = round == (first + parts - 1) / ctas ? round % parts : 0;
  return {from + j / parts, (q + rot) % parts, parts};
}

// The unit that finishes its tile (the last part, or the only one).
FO_HD bool unit_is_final(WorkUnit w) { return w.part == w.parts - 1; }

// Its k-blocks [k_begin, k_end) of the tile's k_blocks.
FO_HD int32_t unit_k_begin(WorkUnit w, int32_t k_blocks) { return int32_t(int64_t(w.part) * k_blocks / w.parts); }
FO_HD int32_t unit_k_end(WorkUnit w, int32_t k_blocks) { return int32_t(int64_t(w.part + 1) * k_blocks / w.parts); }

// The first walk position split by default: the last wave's (every tile of a
// one-wave grid), so that the tiles finishing at the GEMM's end are
// 1/parts as many, each after 1/parts of the MMAs.
FO_HD int32_t tail_split_from(const plan::Schedule& s) {
  const int32_t tiles = s.tiles();
  return tiles <= s.ctas ? 0 : s.ctas * ((tiles - 1) / s.ctas);
}

// The fp32 partial sums of the non-final parts: per split tile and part,
// 2 consumer warpgroups x 128 threads x 128 accumulators (128x256 tiles).
constexpr int64_t kTailPartFloats = 2 * 128 * 128;
FO_HD int64_t tail_split_ws_bytes(int32_t tiles, int32_t from, int32_t parts) {
  return parts > 1 ? int64_t(tiles - from) * (parts - 1) * kTailPartFloats * 4 : 0;
}
// One flag per split tile and consumer warpgroup.
FO_HD int64_t tail_split_flag_count(int32_t tiles, int32_t from, int32_t parts) {
  return parts > 1 ? int64_t(tiles - from) * 2 : 0;
}

}  // namespace flashoverlap::kernels
