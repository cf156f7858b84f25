#include "plan/tile_grid.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

namespace {
bool parse_positive(std::string_view s, int32_t& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && out > 0;
}
}  // namespace

TileShape parse_tile(std::string_view s) {
  const auto x = s.find('x');
  TileShape t;
  if (x == std::string_view::npos || !parse_positive(s.substr(0, x), t.bm) ||
      !parse_positive(s.substr(x + 1), t.bn))
    throw InvalidArgument("bad tile shape '" + std::string(s) +
                          "' (expected ROWSxCOLS with positive integers, e.g. 128x256)");
  return t;
}

std::string to_string(TileShape t) { return std::to_string(t.bm) + "x" + std::to_string(t.bn); }

std::string_view to_string(Raster r) { return r == Raster::AlongM ? "along_m" : "along_n"; }

Raster parse_raster(std::string_view s) {
  if (s == "along_n") return Raster::AlongN;
  if (s == "along_m") return Raster::AlongM;
  throw InvalidArgument("unknown raster '" + std::string(s) + "' (expected along_n or along_m)");
}

void validate_schedule(const Schedule& s) {
  auto fail = [&](const std::string& what) {
    throw InvalidArgument("invalid schedule (m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                          " tile " + std::to_string(s.bm) + "x" + std::to_string(s.bn) +
                          " ctas=" + std::to_string(s.ctas) + " swizzle=" + std::to_string(s.swizzle) +
                          "): " + what);
  };
  if (s.m < 1 || s.n < 1) fail("m and n must be >= 1");
  if (s.bm < 1 || s.bn < 1) fail("tile sides must be >= 1");
  if (s.ctas < 1) fail("ctas must be >= 1");
  if (s.swizzle < 1) fail("swizzle must be >= 1");
  if (s.raster != Raster::AlongN && s.raster != Raster::AlongM) fail("unknown raster");
  if (s.row_shift < 0 || int64_t{s.row_shift} >= (int64_t{s.m} + s.bm - 1) / s.bm)
    fail("row_shift " + std::to_string(s.row_shift) + " outside [0, tile rows)");
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const int64_t tiles_m = (int64_t{s.m} + s.bm - 1) / s.bm, tiles_n = (int64_t{s.n} + s.bn - 1) / s.bn;
  if (tiles_m * tiles_n * s.bm > kMax || int64_t{s.m} * tiles_n > kMax)
    fail("too many slot rows for int32 slot indices");
}

Schedule make_schedule(int64_t m, int64_t n, TileShape tile, int32_t ctas, Raster raster,
                       int32_t swizzle) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (m < 1 || n < 1 || m > kMax || n > kMax)
    throw InvalidArgument("matrix shape " + std::to_string(m) + "x" + std::to_string(n) +
                          " out of range (each side must be in [1, 2^31-1])");
  Schedule s;
  s.m = static_cast<int32_t>(m);
  s.n = static_cast<int32_t>(n);
  s.bm = tile.bm;
  s.bn = tile.bn;
  s.ctas = ctas;
  s.raster = raster;
  s.swizzle = swizzle;
  validate_schedule(s);
  return s;
}

int32_t default_swizzle(int32_t ctas, TileShape tile, int32_t tiles_m) {
  const double ideal = std::sqrt(double(ctas) * tile.bn / tile.bm);
  int32_t s = int32_t(1) << int32_t(std::lround(std::log2(std::max(ideal, 1.0))));
  return std::clamp(s, 1, std::max(tiles_m, 1));
}

}  // namespace flashoverlap::plan
