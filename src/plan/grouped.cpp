#include "plan/grouped.h"

#include <algorithm>
#include <string>

#include "flashoverlap/error.h"
#include "plan/slot_map_alltoall.h"

namespace flashoverlap::plan {

GroupedTileRows make_grouped_tile_rows(const std::vector<RowSegment>& segments, int32_t experts, int64_t n,
                                       int32_t bm) {
  if (bm < 1) throw InvalidArgument("grouped tile rows: bm must be >= 1");
  if (experts < 1 || n < 1 || int64_t(experts) * n > INT32_MAX)
    throw InvalidArgument("grouped tile rows: " + std::to_string(experts) + " experts of " + std::to_string(n) +
                          " rows of B: need 1 or more, and at most 2^31 - 1 rows in all");
  GroupedTileRows g;
  g.bm = bm;
  std::vector<std::pair<int64_t, int64_t>> spans;  // [start, end) of the non-empty segments
  for (size_t i = 0; i < segments.size(); ++i) {
    const RowSegment& s = segments[i];
    const std::string at = "grouped tile rows: segment " + std::to_string(i);
    if (s.rows < 0 || s.a_row0 < 0) throw InvalidArgument(at + ": negative rows or start");
    if (s.expert < 0 || s.expert >= experts)
      throw InvalidArgument(at + ": expert " + std::to_string(s.expert) + " outside [0, " + std::to_string(experts) + ")");
    if (s.a_row0 + s.rows > INT32_MAX) throw InvalidArgument(at + ": rows past 2^31 - 1");
    if (s.rows == 0) continue;
    spans.push_back({s.a_row0, s.a_row0 + s.rows});
    for (int64_t r = 0; r < s.rows; r += bm) {
      g.a_row0.push_back(int32_t(s.a_row0 + r));
      g.b_row0.push_back(int32_t(int64_t(s.expert) * n));
      g.rows.push_back(int32_t(std::min<int64_t>(bm, s.rows - r)));
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      throw InvalidArgument("grouped tile rows: segments overlap at row " + std::to_string(spans[i].first));
  if (int64_t(g.tile_rows()) * bm > INT32_MAX) throw InvalidArgument("grouped tile rows: 2^31 rows or more");
  return g;
}

std::vector<RowSegment> expert_segments(const std::vector<int64_t>& counts) {
  std::vector<RowSegment> out;
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    out.push_back({row, counts[e], int32_t(e)});
    row += counts[e] > 0 ? counts[e] : 0;
  }
  return out;
}

std::vector<int64_t> ragged_counts(int32_t experts, int64_t mean) {
  const int64_t h = std::min<int64_t>(mean / 2, 64);
  std::vector<int64_t> out(size_t(std::max(experts, 0)), mean);
  for (size_t e = 0; e + 1 < out.size(); e += 2) out[e] += h, out[e + 1] -= h;
  return out;
}

Schedule make_grouped_schedule(const GroupedTileRows& g, int64_t n, TileShape tile, int32_t ctas, Raster raster,
                               int32_t swizzle) {
  if (tile.bm != g.bm)
    throw InvalidArgument("grouped schedule: tile rows of " + std::to_string(g.bm) + " rows, tile " + to_string(tile));
  return make_expert_schedule(int64_t(g.tile_rows()) * g.bm, n, tile, ctas, raster, swizzle);
}

}  // namespace flashoverlap::plan
