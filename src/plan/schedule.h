// schedule.h — the persistent GEMM schedule: tile index -> (tile row, tile
// column), CTA and round. One pure function used by the host planner and by the
// kernel (docs/design.md §5.1, "one schedule, two users"). No CUDA headers:
// under nvcc the functions are also __device__.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FO_HD __host__ __device__ __forceinline__
#else
#define FO_HD inline
#endif

namespace flashoverlap::plan {

// Which way consecutive tile indices walk. Tiles are visited in bands of
// `swizzle` tile rows (AlongN) or tile columns (AlongM) so that tiles running
// at the same time share operands in L2.
enum class Raster : int32_t {
  AlongN = 0,  // bands of `swizzle` tile rows; inside a band tm varies fastest
  AlongM = 1,  // bands of `swizzle` tile columns; inside a band tn varies fastest
};

struct TileCoord {
  int32_t tm;  // tile row    (rows    [tm*bm, tm*bm+bm) of C)
  int32_t tn;  // tile column (columns [tn*bn, tn*bn+bn) of C)
};

// Everything the tile order depends on. Identical on every rank.
struct Schedule {
  int32_t m = 0, n = 0;    // C is m x n
  int32_t bm = 128, bn = 256;  // tile shape
  int32_t ctas = 1;        // persistent CTAs (the grid); waves are rounds
  Raster raster = Raster::AlongN;
  int32_t swizzle = 1;     // band width in tiles, >= 1
  // The walk starts at tile row row_shift and wraps (tile row tm of the
  // unshifted order becomes (tm + row_shift) % tiles_m): the MoE combine
  // starts each rank's GEMM at a different destination's rows, so that the
  // ranks' groups go to different ranks at the same time. 0 elsewhere.
  int32_t row_shift = 0;

  FO_HD int32_t tiles_m() const { return (m + bm - 1) / bm; }
  FO_HD int32_t tiles_n() const { return (n + bn - 1) / bn; }
  FO_HD int32_t tiles() const { return tiles_m() * tiles_n(); }
  FO_HD int32_t waves() const { return (tiles() + ctas - 1) / ctas; }

  // Tile index `idx` is the idx-th tile in schedule order; CTA `cta_of(idx)`
  // computes it in round `round_of(idx)`. Rounds are the waves.
  FO_HD int32_t cta_of(int32_t idx) const { return idx % ctas; }
  FO_HD int32_t round_of(int32_t idx) const { return idx / ctas; }
  FO_HD int32_t index_of(int32_t cta, int32_t round) const { return round * ctas + cta; }

  // Rows/columns of C actually covered by a tile (edge tiles are ragged).
  FO_HD int32_t rows_of(TileCoord t) const {
    int32_t r = m - t.tm * bm;
    return r < bm ? r : bm;
  }
  FO_HD int32_t cols_of(TileCoord t) const {
    int32_t c = n - t.tn * bn;
    return c < bn ? c : bn;
  }

  // The tile order. A band holds `swizzle` lines of tiles (the last band may
  // be narrower); inside a band the index walks across the band first.
  FO_HD TileCoord tile_of(int32_t idx) const {
    const bool along_n = raster == Raster::AlongN;
    const int32_t lines = along_n ? tiles_m() : tiles_n();  // banded dimension
    const int32_t length = along_n ? tiles_n() : tiles_m();  // walked dimension
    const int32_t band_tiles = swizzle * length;
    const int32_t band = idx / band_tiles;
    const int32_t in_band = idx - band * band_tiles;
    const int32_t first_line = band * swizzle;
    const int32_t rest = lines - first_line;
    const int32_t width = rest < swizzle ? rest : swizzle;
    const int32_t line = first_line + in_band % width;
    const int32_t step = in_band / width;
    TileCoord t = along_n ? TileCoord{line, step} : TileCoord{step, line};
    if (row_shift) t.tm = (t.tm + row_shift) % tiles_m();
    return t;
  }

  // Inverse of tile_of: the schedule index of tile (tm, tn).
  FO_HD int32_t index_of_tile(TileCoord t) const {
    if (row_shift) t.tm = (t.tm - row_shift + tiles_m()) % tiles_m();
    const bool along_n = raster == Raster::AlongN;
    const int32_t lines = along_n ? tiles_m() : tiles_n();
    const int32_t length = along_n ? tiles_n() : tiles_m();
    const int32_t line = along_n ? t.tm : t.tn;
    const int32_t step = along_n ? t.tn : t.tm;
    const int32_t band = line / swizzle;
    const int32_t first_line = band * swizzle;
    const int32_t rest = lines - first_line;
    const int32_t width = rest < swizzle ? rest : swizzle;
    return band * swizzle * length + step * width + (line - first_line);
  }
};

}  // namespace flashoverlap::plan
