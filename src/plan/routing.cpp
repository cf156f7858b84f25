#include "plan/routing.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "flashoverlap/error.h"
#include "plan/json_file.h"

namespace flashoverlap::plan {

std::vector<int64_t> MoeRouting::input_splits(int32_t rank) const {
  return {send_counts.begin() + size_t(rank) * world, send_counts.begin() + size_t(rank + 1) * world};
}

std::vector<int64_t> MoeRouting::output_splits(int32_t rank) const {
  std::vector<int64_t> in(static_cast<size_t>(world));
  for (int32_t s = 0; s < world; ++s) in[size_t(s)] = send_count(s, rank);
  return in;
}

bool in_dispatch_order(const MoeRouting& r) {
  for (const std::vector<int32_t>& d : r.dest_rank)
    if (!std::is_sorted(d.begin(), d.end())) return false;
  return true;
}

std::vector<int64_t> moe_send_counts(const MoeRouting& r) {
  std::vector<int64_t> counts(size_t(r.world) * r.world, 0);
  for (int32_t src = 0; src < r.world; ++src)
    for (int32_t d : r.dest_rank[size_t(src)]) ++counts[size_t(src) * r.world + d];
  return counts;
}

namespace {

// validate_moe_routing's checks of the experts (after the rest).
void validate_expert_rows(const MoeRouting& r) {
  const int32_t W = r.world, E = r.experts;
  if (E < 1) throw InvalidArgument("MoE routing: " + std::to_string(E) + " experts per rank (must be >= 1)");
  if (E == 1 && r.expert_rows.empty()) return;
  if (r.expert_rows.size() != size_t(W))
    throw InvalidArgument("MoE routing: expert_rows has " + std::to_string(r.expert_rows.size()) +
                          " ranks' counts, expected world " + std::to_string(W) + " (or none with one expert)");
  for (int32_t rank = 0; rank < W; ++rank) {
    const std::vector<int64_t>& c = r.expert_rows[size_t(rank)];
    const std::string at = "MoE routing of rank " + std::to_string(rank);
    if (c.size() != size_t(W) * E)
      throw InvalidArgument(at + ": expert_rows has " + std::to_string(c.size()) + " counts, expected world x experts = " +
                            std::to_string(int64_t{W} * E));
    const std::vector<int32_t>& dest = r.dest_rank[size_t(rank)];
    int64_t row = 0;
    for (int32_t src = 0; src < W; ++src) {
      int64_t block = 0;
      for (int32_t e = 0; e < E; ++e) {
        const int64_t n = c[size_t(src) * E + e];
        if (n < 0)
          throw InvalidArgument(at + ": expert_rows gives " + std::to_string(n) + " rows from rank " +
                                std::to_string(src) + " for expert " + std::to_string(e));
        block += n;
      }
      if (block != r.send_count(rank, src))
        throw InvalidArgument(at + ": expert_rows gives " + std::to_string(block) + " rows from rank " +
                              std::to_string(src) + ", send_counts " + std::to_string(r.send_count(rank, src)));
      for (int64_t i = row; i < row + block; ++i)
        if (dest[size_t(i)] != src)
          throw InvalidArgument(at + " row " + std::to_string(i) + ": in rank " + std::to_string(src) +
                                "'s block of expert_rows (rows " + std::to_string(row) + " to " +
                                std::to_string(row + block - 1) + "), its dest_rank is " + std::to_string(dest[size_t(i)]));
      row += block;
    }
  }
}

}  // namespace

void validate_moe_routing(const MoeRouting& r) {
  const int32_t W = r.world;
  const std::string w = std::to_string(W);
  if (W < 1) throw InvalidArgument("MoE routing: world " + w + " must be >= 1");
  auto sized = [&](size_t n, const char* what) {
    if (n != size_t(W))
      throw InvalidArgument("MoE routing: " + std::string(what) + " has " + std::to_string(n) +
                            " entries, expected world " + w);
  };
  sized(r.tokens.size(), "tokens");
  sized(r.dest_rank.size(), "dest_rank");
  sized(r.dest_token.size(), "dest_token");
  sized(r.gate.size(), "gate");
  if (r.send_counts.size() != size_t(W) * W)
    throw InvalidArgument("MoE routing: send_counts has " + std::to_string(r.send_counts.size()) +
                          " entries, expected world^2 = " + std::to_string(int64_t{W} * W));
  for (int32_t d = 0; d < W; ++d)
    if (r.tokens[size_t(d)] < 0)
      throw InvalidArgument("MoE routing: rank " + std::to_string(d) + " has " + std::to_string(r.tokens[size_t(d)]) +
                            " tokens");
  for (int32_t src = 0; src < W; ++src) {
    const std::string at = "MoE routing of rank " + std::to_string(src);
    const auto& rank = r.dest_rank[size_t(src)];
    const auto& token = r.dest_token[size_t(src)];
    const auto& gate = r.gate[size_t(src)];
    if (token.size() != rank.size() || gate.size() != rank.size())
      throw InvalidArgument(at + ": dest_rank, dest_token and gate have " + std::to_string(rank.size()) + ", " +
                            std::to_string(token.size()) + " and " + std::to_string(gate.size()) +
                            " rows (must be equal)");
    // One pass, every call of the All-to-All: the quick test of each row
    // first, the message only on failure.
    const int32_t* tokens = r.tokens.data();
    bool bad = false;
    for (size_t i = 0; i < rank.size(); ++i) {
      const int32_t d = rank[i];
      bad |= uint32_t(d) >= uint32_t(W) || uint32_t(token[i]) >= uint32_t(tokens[uint32_t(d) < uint32_t(W) ? d : 0]) ||
             !std::isfinite(gate[i]);
    }
    for (size_t i = 0; bad && i < rank.size(); ++i) {
      const auto row = [&] { return at + " row " + std::to_string(i); };
      if (rank[i] < 0 || rank[i] >= W)
        throw InvalidArgument(row() + ": destination rank " + std::to_string(rank[i]) + " outside [0, " + w + ")");
      if (token[i] < 0 || token[i] >= r.tokens[size_t(rank[i])])
        throw InvalidArgument(row() + ": token " + std::to_string(token[i]) + " outside [0, " +
                              std::to_string(r.tokens[size_t(rank[i])]) + ") of rank " + std::to_string(rank[i]));
      if (!std::isfinite(gate[i])) throw InvalidArgument(row() + ": gate weight is not finite");
    }
  }
  const std::vector<int64_t> counted = moe_send_counts(r);
  for (int32_t src = 0; src < W; ++src)
    for (int32_t d = 0; d < W; ++d)
      if (counted[size_t(src) * W + d] != r.send_count(src, d))
        throw InvalidArgument("MoE routing: send_counts says rank " + std::to_string(src) + " sends " +
                              std::to_string(r.send_count(src, d)) + " rows to rank " + std::to_string(d) +
                              ", its dest_rank has " + std::to_string(counted[size_t(src) * W + d]));
  validate_expert_rows(r);
}

std::vector<RowSegment> moe_segments(const MoeRouting& r, int32_t rank) {
  if (rank < 0 || rank >= r.world)
    throw InvalidArgument("MoE routing: rank " + std::to_string(rank) + " out of range (world " +
                          std::to_string(r.world) + ")");
  std::vector<RowSegment> out;
  if (r.experts == 1) {
    if (r.rows(rank) > 0) out.push_back({0, r.rows(rank), 0});
    return out;
  }
  const std::vector<int64_t>& c = r.expert_rows[size_t(rank)];
  int64_t row = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == 0) continue;
    const int32_t e = int32_t(i % size_t(r.experts));
    if (!out.empty() && out.back().expert == e && out.back().a_row0 + out.back().rows == row)
      out.back().rows += c[i];
    else
      out.push_back({row, c[i], e});
    row += c[i];
  }
  return out;
}

// (One pass; validate_moe_routing runs only to say what is wrong.)
MoeRowCounts count_moe_rows(const MoeRouting& r, int32_t bm) {
  if (bm < 1) throw InvalidArgument("MoE routing: tile height " + std::to_string(bm) + " must be >= 1");
  auto invalid = [&r]() -> MoeRowCounts {
    validate_moe_routing(r);
    throw InvalidArgument("MoE routing: invalid");  // (not reached unless the two checks disagree)
  };
  const int32_t W = r.world, E = r.experts;
  if (W < 1 || r.dest_rank.size() != size_t(W) || r.tokens.size() != size_t(W) || r.dest_token.size() != size_t(W) ||
      r.gate.size() != size_t(W) || r.send_counts.size() != size_t(W) * W || E < 1 ||
      (E > 1 && r.expert_rows.size() != size_t(W)))
    return invalid();
  for (int32_t t : r.tokens)
    if (t < 0) return invalid();
  MoeRowCounts result;
  result.bm = bm;
  std::vector<std::vector<int64_t>>& out = result.counts;
  out.resize(static_cast<size_t>(W));
  result.tile_rows.resize(static_cast<size_t>(W));
  std::vector<int64_t> sends(size_t(W) * W, 0);
  for (int32_t src = 0; src < W; ++src) {
    const auto &dest = r.dest_rank[size_t(src)], &token = r.dest_token[size_t(src)];
    const auto& gate = r.gate[size_t(src)];
    const size_t m = dest.size();
    if (token.size() != m || gate.size() != m) return invalid();
    if (E > 1) {  // the segments must cover A's rows before they are cut into tile rows
      const std::vector<int64_t>& c = r.expert_rows[size_t(src)];
      if (c.size() != size_t(W) * E) return invalid();
      int64_t sum = 0;
      for (int64_t x : c) {
        if (x < 0) return invalid();
        sum += x;
      }
      if (sum != int64_t(m)) return invalid();
    }
    // With one expert: one segment of every row, so tile row v is rows v*bm.. as ever.
    const GroupedTileRows& g = result.tile_rows[size_t(src)] = make_grouped_tile_rows(moe_segments(r, src), E, 1, bm);
    auto& counts = out[size_t(src)];
    counts.assign(size_t(g.tile_rows()) * W, 0);
    for (int32_t v = 0; v < g.tile_rows(); ++v) {
      int64_t* c = &counts[size_t(v) * W];
      const size_t row0 = size_t(g.a_row0[size_t(v)]);
      for (size_t i = row0; i < row0 + size_t(g.rows[size_t(v)]); ++i) {
        const int32_t d = dest[i];
        if (uint32_t(d) >= uint32_t(W) || token[i] < 0 || token[i] >= r.tokens[size_t(d)] || !std::isfinite(gate[i]))
          return invalid();
        ++c[d];
      }
    }
    for (size_t i = 0; i < counts.size(); ++i) sends[size_t(src) * W + i % W] += counts[i];
  }
  if (sends != r.send_counts) return invalid();
  validate_expert_rows(r);  // (each source's block its own rows: O(rows), with experts only)
  return result;
}

namespace {

// In [0, 1) with 53 random bits.
double unit(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1p-53; }

}  // namespace

MoeRouting make_moe_routing(std::string_view kind, int32_t world, int64_t tokens_per_rank, int32_t topk,
                            uint64_t seed, int32_t experts) {
  const std::string k(kind);
  if (world < 1) throw InvalidArgument("MoE routing needs world >= 1 (world=" + std::to_string(world) + ")");
  if (experts < 1 || int64_t{experts} * world > (1 << 20))
    throw InvalidArgument("MoE routing: " + std::to_string(experts) + " experts per rank outside [1, 2^20 / world]");
  const int32_t G = world * experts;  // the global experts
  if (tokens_per_rank < 0 || tokens_per_rank > std::numeric_limits<int32_t>::max())
    throw InvalidArgument("MoE routing: tokens per rank " + std::to_string(tokens_per_rank) +
                          " outside [0, 2^31-1]");
  if (topk < 1 || topk > G)
    throw InvalidArgument("MoE routing: top-k " + std::to_string(topk) + " outside [1, " +
                          (experts == 1 ? "world = " + std::to_string(world) + "] (a token picks distinct ranks)"
                                        : "world x experts = " + std::to_string(G) +
                                              "] (a token picks distinct experts)"));
  enum { Uniform, Zipf, One, Empty } type;
  double exponent = 0;
  int32_t special = -1;
  auto parse_rank = [&](std::string_view v) {
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), special);
    if (v.empty() || ec != std::errc() || p != v.data() + v.size() || special < 0 || special >= world)
      throw InvalidArgument("bad MoE routing '" + k + "': the rank must be in [0, " + std::to_string(world) + ")");
  };
  if (kind == "uniform") {
    type = Uniform;
  } else if (kind.substr(0, 5) == "zipf:") {
    type = Zipf;
    const std::string_view v = kind.substr(5);
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), exponent);
    if (v.empty() || ec != std::errc() || p != v.data() + v.size() || !(exponent >= 0) || !std::isfinite(exponent))
      throw InvalidArgument("bad MoE routing '" + k + "': the Zipf exponent must be a finite number >= 0");
  } else if (kind.substr(0, 4) == "one:") {
    type = One;
    parse_rank(kind.substr(4));
  } else if (kind.substr(0, 6) == "empty:") {
    type = Empty;
    parse_rank(kind.substr(6));
    if (topk > G - experts)
      throw InvalidArgument("MoE routing '" + k + "': top-k " + std::to_string(topk) +
                            (experts == 1 ? " distinct ranks without rank " + std::to_string(special) +
                                                " needs world > top-k"
                                          : " distinct experts off rank " + std::to_string(special) +
                                                " needs (world - 1) x experts >= top-k"));
  } else if (kind.substr(0, 5) == "file:") {
    throw InvalidArgument("MoE routing '" + k + "': a recorded routing is read with read_moe_routing_file");
  } else {
    throw InvalidArgument("unknown MoE routing '" + k + "' (expected uniform, zipf:<S>, one:<rank> or empty:<rank>)");
  }

  // Drawn over the G global experts (with one per rank, the ranks), g on rank g / E.
  const int32_t W = world, E = experts, K = topk, T = int32_t(tokens_per_rank);
  std::vector<std::vector<std::vector<MoePick>>> picks(static_cast<size_t>(W),
                                                       std::vector<std::vector<MoePick>>(static_cast<size_t>(T)));
  std::vector<double> weight(size_t(G), 1.0);
  if (type == Zipf)
    for (int32_t i = 0; i < G; ++i)  // kept positive: a huge S must not leave K draws nothing to pick
      weight[size_t(i)] = std::max(1.0 / std::pow(double(i + 1), exponent), std::numeric_limits<double>::min());
  std::mt19937_64 rng(seed);
  std::vector<int32_t> pool, picked(static_cast<size_t>(K));
  std::vector<double> left;
  std::vector<float> u(static_cast<size_t>(K));
  for (int32_t src = 0; src < W; ++src)
    for (int32_t t = 0; t < T; ++t) {
      if (type == Zipf) {  // K weighted draws without replacement
        left = weight;
        for (int32_t j = 0; j < K; ++j) {
          double x = unit(rng) * std::accumulate(left.begin(), left.end(), 0.0);
          int32_t g = 0;
          while (g < G - 1 && (left[size_t(g)] == 0 || x >= left[size_t(g)])) x -= left[size_t(g++)];
          while (left[size_t(g)] == 0) --g;  // rounding ran past the last expert left
          picked[size_t(j)] = g;
          left[size_t(g)] = 0;
        }
      } else {  // partial Fisher-Yates over the allowed experts
        // (one:R's own pick: one of R's experts, drawn only where R has several)
        const int32_t first = type == One ? special * E + (E > 1 ? int32_t(rng() % uint64_t(E)) : 0) : -1;
        pool.clear();
        for (int32_t g = 0; g < G; ++g)
          if (g != first && !(type == Empty && g / E == special)) pool.push_back(g);
        int32_t j = 0;
        if (type == One) picked[size_t(j++)] = first;
        for (int32_t i = 0; j < K; ++i, ++j) {
          std::swap(pool[size_t(i)], pool[size_t(i) + rng() % (pool.size() - size_t(i))]);
          picked[size_t(j)] = pool[size_t(i)];
        }
      }
      float sum = 0;
      for (float& x : u) sum += x = float((rng() >> 40) + 1) * 0x1p-24f;  // (0, 1]
      for (int32_t j = 0; j < K; ++j) {
        const int32_t g = picked[size_t(j)];
        picks[size_t(src)][size_t(t)].push_back({g / E, u[size_t(j)] / sum, g % E});
      }
    }
  return moe_routing_from_picks(W, picks, E);
}

MoeRouting moe_routing_from_picks(int32_t world, const std::vector<std::vector<std::vector<MoePick>>>& picks,
                                  int32_t experts) {
  if (world < 1) throw InvalidArgument("MoE routing needs world >= 1 (world=" + std::to_string(world) + ")");
  if (experts < 1 || int64_t{experts} * world > (1 << 20))
    throw InvalidArgument("MoE routing: " + std::to_string(experts) + " experts per rank outside [1, 2^20 / world]");
  const int32_t E = experts;
  if (picks.size() != size_t(world))
    throw InvalidArgument("MoE routing: picks of " + std::to_string(picks.size()) + " ranks for world " +
                          std::to_string(world));
  MoeRouting r;
  r.world = world, r.experts = E;
  r.dest_rank.resize(size_t(world));
  r.dest_token.resize(size_t(world));
  r.gate.resize(size_t(world));
  std::vector<int32_t> seen(size_t(world) * E, -1);  // per global expert: the last token that picked it
  for (int32_t src = 0; src < world; ++src) {
    const auto& tokens = picks[size_t(src)];
    if (tokens.size() > size_t(std::numeric_limits<int32_t>::max()))
      throw InvalidArgument("MoE routing: rank " + std::to_string(src) + " has more than 2^31-1 tokens");
    r.tokens.push_back(int32_t(tokens.size()));
    std::fill(seen.begin(), seen.end(), -1);
    for (size_t t = 0; t < tokens.size(); ++t)
      for (const MoePick& p : tokens[t]) {
        const auto at = [&] { return "MoE routing: rank " + std::to_string(src) + " token " + std::to_string(t); };
        if (p.rank < 0 || p.rank >= world)
          throw InvalidArgument(at() + " picks rank " + std::to_string(p.rank) + ", outside [0, " +
                                std::to_string(world) + ")");
        if (p.expert < 0 || p.expert >= E)
          throw InvalidArgument(at() + " picks expert " + std::to_string(p.expert) + " of rank " +
                                std::to_string(p.rank) + ", outside [0, " + std::to_string(E) + ")");
        const size_t g = size_t(p.rank) * E + p.expert;
        if (seen[g] == int32_t(t))
          throw InvalidArgument(at() + (E == 1 ? " picks rank " + std::to_string(p.rank) + " twice"
                                               : " picks expert " + std::to_string(p.expert) + " of rank " +
                                                     std::to_string(p.rank) + " twice"));
        if (!std::isfinite(p.gate)) throw InvalidArgument(at() + ": a gate weight that is not finite");
        seen[g] = int32_t(t);
      }
  }
  // The dispatch's order on each rank: by source rank, then local expert, then token, then pick.
  if (E > 1) r.expert_rows.assign(size_t(world), std::vector<int64_t>(size_t(world) * E, 0));
  for (int32_t src = 0; src < world; ++src)
    for (int32_t e = 0; e < E; ++e)
      for (size_t t = 0; t < picks[size_t(src)].size(); ++t)
        for (const MoePick& p : picks[size_t(src)][t]) {
          if (p.expert != e) continue;
          r.dest_rank[size_t(p.rank)].push_back(src);
          r.dest_token[size_t(p.rank)].push_back(int32_t(t));
          r.gate[size_t(p.rank)].push_back(p.gate);
          if (E > 1) ++r.expert_rows[size_t(p.rank)][size_t(src) * E + e];
        }
  r.send_counts = moe_send_counts(r);
  return r;
}

MoeRouting read_moe_routing_file(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "MoE routing");
  auto fail = [&](const std::string& why) -> MoeRouting { throw InvalidArgument(path + ": " + why); };
  if (!j.is_object() || j.value("format", "") != "flashoverlap.moe_routing")
    return fail("not a flashoverlap.moe_routing file");
  if (!j.contains("schema") || !j["schema"].is_number_integer() || j["schema"].get<int64_t>() < 1 ||
      j["schema"].get<int64_t>() > 2)
    return fail("schema must be 1 (one expert per rank) or 2 (\"experts\" per rank)");
  const bool several = j["schema"].get<int64_t>() == 2;
  if (!j.contains("world") || !j["world"].is_number_integer() || j["world"].get<int64_t>() < 1 ||
      j["world"].get<int64_t>() > 1024)
    return fail("\"world\" must be an integer in [1, 1024]");
  const int32_t world = j["world"].get<int32_t>();
  int32_t experts = 1;
  if (several) {
    if (!j.contains("experts") || !j["experts"].is_number_integer() || j["experts"].get<int64_t>() < 1 ||
        j["experts"].get<int64_t>() * world > (1 << 20))
      return fail("\"experts\" must be an integer in [1, 2^20 / world]");
    experts = j["experts"].get<int32_t>();
  }
  const char* form = several ? "[rank, expert, gate]" : "[rank, gate]";
  if (!j.contains("picks") || !j["picks"].is_array() || j["picks"].size() != size_t(world))
    return fail("\"picks\" must be an array of one entry per rank (" + std::to_string(world) + ")");
  std::vector<std::vector<std::vector<MoePick>>> picks(static_cast<size_t>(world));
  for (int32_t src = 0; src < world; ++src) {
    const nlohmann::json& tokens = j["picks"][size_t(src)];
    if (!tokens.is_array()) return fail("picks of rank " + std::to_string(src) + " must be an array of tokens");
    for (size_t t = 0; t < tokens.size(); ++t) {
      const nlohmann::json& token = tokens[t];
      const std::string at = "rank " + std::to_string(src) + " token " + std::to_string(t);
      if (!token.is_array()) return fail(at + ": its picks must be an array of " + form + " picks");
      std::vector<MoePick> mine;
      for (const nlohmann::json& p : token) {
        const size_t n = several ? 3 : 2;
        bool ok = p.is_array() && p.size() == n && p[n - 1].is_number();
        for (size_t i = 0; ok && i + 1 < n; ++i) ok = p[i].is_number_integer();
        if (!ok) return fail(at + ": a pick must be " + form + ", not " + p.dump());
        const int64_t rank = p[0].get<int64_t>(), expert = several ? p[1].get<int64_t>() : 0;
        mine.push_back({int32_t(std::clamp<int64_t>(rank, -1, world)), p[n - 1].get<float>(),
                        int32_t(std::clamp<int64_t>(expert, -1, experts))});
      }
      picks[size_t(src)].push_back(std::move(mine));
    }
  }
  try {
    return moe_routing_from_picks(world, picks, experts);
  } catch (const InvalidArgument& e) {
    return fail(e.what());
  }
}

int32_t moe_topk(const MoeRouting& r) {
  // A token's rows are one per rank it picked: count them per (rank, token),
  // in one pass over the rows (not one per rank: world x rows at 1024 ranks).
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(r.world));
  for (int32_t d = 0; d < r.world; ++d) rows[size_t(d)].assign(size_t(r.tokens[size_t(d)]), 0);
  int32_t most = 0;
  for (int32_t src = 0; src < r.world; ++src) {
    const auto &dest = r.dest_rank[size_t(src)], &token = r.dest_token[size_t(src)];
    for (size_t i = 0; i < dest.size(); ++i) most = std::max(most, ++rows[size_t(dest[i])][size_t(token[i])]);
  }
  return most;
}

}  // namespace flashoverlap::plan
