// stream_k.h — the last tiles' k-blocks spread evenly over the CTAs (the
// persistent GEMM's "stream-K"; docs/design.md §13, stream-K). Where a grid has
// far fewer tiles than CTAs, the tiles from `whole` on are cut along K into
// pieces so that every CTA computes the same number of k-blocks. One pure walk, used by the host
// (tests, sizes) and by the kernel's producer, consumers and storer.
// No CUDA headers: under nvcc the functions are also __device__.
//
// Tiles [0, whole) go whole, in Schedule order (CTA c: c, c + ctas, ...).
// The split tiles' k-blocks, tile after tile, form one run of
// (tiles - whole) * k_blocks iterations; CTA c takes an even share of it,
// the CTAs in reverse order (CTA ctas-1 the first share), each walking its
// share forwards. A share's pieces: its first may be a tile's later
// k-blocks (it then writes its fp32 sum to the CTA's workspace slot and
// signals), its last may be a tile's first k-blocks without the rest (it
// then waits for the other pieces of that tile, adds them in order and
// stores the tile: the tile's finisher); the pieces between are whole tiles.
// A finisher waits only at the end of its share, for pieces at the start of
// other shares, held by CTAs of lower index (dispatched no later than it):
// nothing waits in a cycle.
#pragma once
#include <cstdint>

#include "plan/schedule.h"

namespace flashoverlap::plan {

// One unit of a CTA's work: tile `idx` (Schedule order), k-blocks [kb0, kb1).
struct Piece {
  int32_t idx = 0;
  int32_t kb0 = 0, kb1 = 0;
  bool finishes = true;  // holds k-block 0: computes the rest's sum (if any) into C
  bool whole = true;     // [0, k_blocks): nobody else's partial to add
};

struct StreamK {
  int32_t tiles = 0;     // all tiles of the schedule
  int32_t whole = 0;     // tiles [0, whole) are not split (== tiles: stream-K off)
  int32_t k_blocks = 1;
  int32_t ctas = 1;

  FO_HD bool on() const { return whole < tiles; }
  FO_HD int64_t iterations() const { return int64_t(tiles - whole) * k_blocks; }
  // The split iterations [begin, end) of CTA c (CTAs in reverse order).
  FO_HD int64_t begin(int32_t c) const { return iterations() * (ctas - 1 - c) / ctas; }
  FO_HD int64_t end(int32_t c) const { return iterations() * (ctas - c) / ctas; }
  FO_HD bool has_share(int32_t c) const { return end(c) > begin(c); }
  // The finisher of split tile `idx`: the CTAs holding its other pieces are
  // among cta - 1, cta - 2, ..., cta - n (n returned: those whose shares
  // begin inside the tile), in the tile's k order; of them, those with an
  // empty share (has_share false: more CTAs than split k-blocks) hold none.
  FO_HD int32_t contributors(int32_t idx, int32_t finisher) const {
    const int64_t tile_end = int64_t(idx - whole + 1) * k_blocks;
    int32_t j = 0;
    while (finisher - j - 1 >= 0 && begin(finisher - j - 1) < tile_end) ++j;
    return j;
  }
};

// Walks CTA `cta`'s pieces in order: its whole tiles, then its share's pieces.
struct PieceWalk {
  StreamK sk;
  int32_t next_whole = 0;  // the next whole tile's index
  int64_t pos = 0, end = 0;

  FO_HD PieceWalk(const StreamK& s, int32_t c) : sk(s), next_whole(c) {
    pos = s.on() ? s.begin(c) : 0;
    end = s.on() ? s.end(c) : 0;
  }
  FO_HD bool next(Piece& w) {
    if (next_whole < sk.whole) {
      w = Piece{next_whole, 0, sk.k_blocks, true, true};
      next_whole += sk.ctas;
      return true;
    }
    if (pos >= end) return false;
    const int32_t t = int32_t(pos / sk.k_blocks);
    const int32_t kb0 = int32_t(pos - int64_t(t) * sk.k_blocks);
    const int64_t rest = end - int64_t(t) * sk.k_blocks;
    const int32_t kb1 = rest < sk.k_blocks ? int32_t(rest) : sk.k_blocks;
    w = Piece{sk.whole + t, kb0, kb1, kb0 == 0, kb0 == 0 && kb1 == sk.k_blocks};
    pos = int64_t(t) * sk.k_blocks + kb1;
    return true;
  }
};

// The stream-K split for a grid (`whole` of it; == tiles: off). On only
// where the whole tiles fill at most half the CTAs (every tile then split):
// there the idle CTAs dominate. A wave that is mostly full loses more than
// it gains when split (its CTAs no longer walk K in step, so they share
// fewer A and B blocks in L2, and the partials go out and back; results
// §4e.2). And only where the
// shares are long enough for the partials' cost (each written once and read
// back once, ~4 k-blocks' loads) to leave a 5% gain.
inline StreamK stream_k_split(int32_t tiles, int32_t ctas, int32_t k_blocks) {
  StreamK s{tiles, tiles, k_blocks, ctas};
  if (tiles <= 0 || ctas <= 1 || k_blocks < 2 || 2 * tiles > ctas) return s;
  // (tiles / ctas + 4 / k_blocks > 0.95, in integers: exact at the boundary)
  if (100 * int64_t(tiles) * k_blocks + 400 * int64_t(ctas) > 95 * int64_t(ctas) * k_blocks) return s;
  s.whole = 0;
  return s;
}

// The last waves split (an experiment, the lab's Split::Tail), for grids
// of more tiles than CTAs whose last wave is partial (688 tiles on 132
// CTAs: five waves and 28 tiles, the sixth round mostly idle): the waves
// but the last whole one go whole, and the last whole wave's tiles with the
// partial wave's are split evenly over all the CTAs, so that every CTA ends
// at about the same time, each split tile in one or two pieces. Off
// (whole == tiles) where the waves come out even or one wave holds them.
inline StreamK stream_k_tail_split(int32_t tiles, int32_t ctas, int32_t k_blocks) {
  StreamK s{tiles, tiles, k_blocks, ctas};
  if (ctas <= 1 || k_blocks < 2 || tiles <= ctas || tiles % ctas == 0) return s;
  s.whole = (tiles / ctas - 1) * ctas;
  return s;
}

// The grid on which a split walks K in step: tiles * S CTAs (S = ctas /
// tiles shares a tile), where the j-th share of every tile starts at the
// same k-block (k_blocks * j / S), so that the CTAs holding the j-th shares
// read the same k-blocks of A (and B) at about the same time, as whole
// tiles do; `ctas` where not even one CTA a tile fits.
inline int32_t stream_k_in_step_ctas(int32_t tiles, int32_t ctas) {
  if (tiles <= 0 || tiles > ctas) return ctas;
  return tiles * (ctas / tiles);
}

}  // namespace flashoverlap::plan
