// tile_grid.h — checked construction of the persistent schedule (schedule.h)
// and the host-side helpers around it: tile shapes, default tile order.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "plan/schedule.h"

namespace flashoverlap::plan {

struct TileShape {
  int32_t bm = 128, bn = 256;
  friend bool operator==(const TileShape&, const TileShape&) = default;
};

// "128x256" -> {128, 256}; throws InvalidArgument on anything else.
TileShape parse_tile(std::string_view s);
std::string to_string(TileShape t);
std::string_view to_string(Raster r);  // "along_n" | "along_m"
Raster parse_raster(std::string_view s);

// Throws InvalidArgument unless m, n, bm, bn, ctas, swizzle >= 1 and the slot
// buffers of every collective (at most tiles * bm rows, or m * tiles_n rows for
// All-to-All) are addressable with int32 slot rows.
void validate_schedule(const Schedule& s);

// A validated schedule; m and n are range-checked before narrowing to int32.
Schedule make_schedule(int64_t m, int64_t n, TileShape tile, int32_t ctas,
                       Raster raster, int32_t swizzle);

// Default band width for Raster::AlongN: a wave of `ctas` tiles then spans about
// s tile rows x ctas/s tile columns, and the operand rows it reads,
// (s*bm + ctas/s*bn) * K, are smallest at s = sqrt(ctas*bn/bm). Rounded to a
// power of two and clamped to [1, tiles_m] (a wider band changes nothing).
int32_t default_swizzle(int32_t ctas, TileShape tile, int32_t tiles_m);

}  // namespace flashoverlap::plan
