#include "plan/routing.h"

#include <charconv>
#include <random>
#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

void validate_routing(const Routing& r, int32_t world, int64_t m) {
  if (r.world != world || int64_t(r.dest.size()) != world)
    throw InvalidArgument("routing is for " + std::to_string(r.dest.size()) + " ranks, expected world " +
                          std::to_string(world));
  for (int32_t src = 0; src < world; ++src) {
    if (int64_t(r.dest[src].size()) != m)
      throw InvalidArgument("routing of rank " + std::to_string(src) + " has " +
                            std::to_string(r.dest[src].size()) + " rows, expected M = " + std::to_string(m));
    for (size_t row = 0; row < r.dest[src].size(); ++row)
      if (r.dest[src][row] < 0 || r.dest[src][row] >= world)
        throw InvalidArgument("routing of rank " + std::to_string(src) + " sends row " + std::to_string(row) +
                              " to rank " + std::to_string(r.dest[src][row]) + ", outside [0, " +
                              std::to_string(world) + ")");
  }
}

Routing make_routing(std::string_view kind, int32_t world, int64_t m, uint64_t seed) {
  if (world < 1 || m < 1)
    throw InvalidArgument("routing needs world >= 1 and M >= 1 (world=" + std::to_string(world) +
                          ", M=" + std::to_string(m) + ")");
  int32_t empty = -1;
  if (kind.substr(0, 6) == "empty:") {
    const std::string_view k = kind.substr(6);
    auto [p, ec] = std::from_chars(k.data(), k.data() + k.size(), empty);
    if (k.empty() || ec != std::errc() || p != k.data() + k.size() || empty < 0 || empty >= world)
      throw InvalidArgument("bad routing '" + std::string(kind) + "': the empty rank must be in [0, " +
                            std::to_string(world) + ")");
    if (world < 2) throw InvalidArgument("routing '" + std::string(kind) + "' needs world >= 2");
  } else if (kind != "uniform" && kind != "skewed") {
    throw InvalidArgument("unknown routing '" + std::string(kind) +
                          "' (expected uniform, skewed or empty:<rank>)");
  }
  Routing r{world, m, std::vector<std::vector<int32_t>>(world, std::vector<int32_t>(size_t(m)))};
  std::mt19937_64 rng(seed);
  for (auto& dest : r.dest)
    for (auto& d : dest) {
      if (empty >= 0) {
        d = int32_t(rng() % uint64_t(world - 1));
        d += d >= empty;
      } else if (kind == "skewed" && rng() % 2 == 0) {
        d = 0;
      } else {
        d = int32_t(rng() % uint64_t(world));
      }
    }
  return r;
}

std::vector<int64_t> routing_pair_rows(const Routing& r) {
  std::vector<int64_t> rows(size_t(r.world) * r.world, 0);
  for (int32_t src = 0; src < r.world; ++src)
    for (int32_t d : r.dest[src]) ++rows[size_t(src) * r.world + d];
  return rows;
}

}  // namespace flashoverlap::plan
