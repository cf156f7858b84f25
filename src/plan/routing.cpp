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
}

// (One pass; validate_moe_routing runs only to say what is wrong.)
MoeRowCounts count_moe_rows(const MoeRouting& r, int32_t bm) {
  if (bm < 1) throw InvalidArgument("MoE routing: tile height " + std::to_string(bm) + " must be >= 1");
  auto invalid = [&r]() -> MoeRowCounts {
    validate_moe_routing(r);
    throw InvalidArgument("MoE routing: invalid");  // (not reached unless the two checks disagree)
  };
  const int32_t W = r.world;
  if (W < 1 || r.dest_rank.size() != size_t(W) || r.tokens.size() != size_t(W) || r.dest_token.size() != size_t(W) ||
      r.gate.size() != size_t(W) || r.send_counts.size() != size_t(W) * W)
    return invalid();
  for (int32_t t : r.tokens)
    if (t < 0) return invalid();
  MoeRowCounts result;
  result.bm = bm;
  std::vector<std::vector<int64_t>>& out = result.counts;
  out.resize(static_cast<size_t>(W));
  std::vector<int64_t> sends(size_t(W) * W, 0);
  for (int32_t src = 0; src < W; ++src) {
    const auto &dest = r.dest_rank[size_t(src)], &token = r.dest_token[size_t(src)];
    const auto& gate = r.gate[size_t(src)];
    const size_t m = dest.size();
    if (token.size() != m || gate.size() != m) return invalid();
    auto& counts = out[size_t(src)];
    counts.assign((m + bm - 1) / bm * W, 0);
    for (size_t row0 = 0, tm = 0; row0 < m; row0 += size_t(bm), ++tm) {
      int64_t* c = &counts[tm * W];
      for (size_t i = row0; i < std::min(m, row0 + size_t(bm)); ++i) {
        const int32_t d = dest[i];
        if (uint32_t(d) >= uint32_t(W) || token[i] < 0 || token[i] >= r.tokens[size_t(d)] || !std::isfinite(gate[i]))
          return invalid();
        ++c[d];
      }
    }
    for (size_t i = 0; i < counts.size(); ++i) sends[size_t(src) * W + i % W] += counts[i];
  }
  if (sends != r.send_counts) return invalid();
  return result;
}


namespace {

// In [0, 1) with 53 random bits.
double unit(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1p-53; }

}  // namespace

MoeRouting make_moe_routing(std::string_view kind, int32_t world, int64_t tokens_per_rank, int32_t topk,
                            uint64_t seed) {
  const std::string k(kind);
  if (world < 1) throw InvalidArgument("MoE routing needs world >= 1 (world=" + std::to_string(world) + ")");
  if (tokens_per_rank < 0 || tokens_per_rank > std::numeric_limits<int32_t>::max())
    throw InvalidArgument("MoE routing: tokens per rank " + std::to_string(tokens_per_rank) +
                          " outside [0, 2^31-1]");
  if (topk < 1 || topk > world)
    throw InvalidArgument("MoE routing: top-k " + std::to_string(topk) + " outside [1, world = " +
                          std::to_string(world) + "] (a token picks distinct ranks)");
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
    if (topk > world - 1)
      throw InvalidArgument("MoE routing '" + k + "': top-k " + std::to_string(topk) +
                            " distinct ranks without rank " + std::to_string(special) + " needs world > top-k");
  } else if (kind.substr(0, 5) == "file:") {
    throw InvalidArgument("MoE routing '" + k + "': a recorded routing is read with read_moe_routing_file");
  } else {
    throw InvalidArgument("unknown MoE routing '" + k + "' (expected uniform, zipf:<S>, one:<rank> or empty:<rank>)");
  }

  const int32_t W = world, K = topk, T = int32_t(tokens_per_rank);
  std::vector<std::vector<std::vector<MoePick>>> picks(static_cast<size_t>(W),
                                                       std::vector<std::vector<MoePick>>(static_cast<size_t>(T)));
  std::vector<double> weight(size_t(W), 1.0);
  if (type == Zipf)
    for (int32_t i = 0; i < W; ++i)  // kept positive: a huge S must not leave K draws nothing to pick
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
          int32_t e = 0;
          while (e < W - 1 && (left[size_t(e)] == 0 || x >= left[size_t(e)])) x -= left[size_t(e++)];
          while (left[size_t(e)] == 0) --e;  // rounding ran past the last rank left
          picked[size_t(j)] = e;
          left[size_t(e)] = 0;
        }
      } else {  // partial Fisher-Yates over the allowed ranks
        pool.clear();
        for (int32_t e = 0; e < W; ++e)
          if (e != special) pool.push_back(e);
        int32_t j = 0;
        if (type == One) picked[size_t(j++)] = special;
        for (int32_t i = 0; j < K; ++i, ++j) {
          std::swap(pool[size_t(i)], pool[size_t(i) + rng() % (pool.size() - size_t(i))]);
          picked[size_t(j)] = pool[size_t(i)];
        }
      }
      float sum = 0;
      for (float& x : u) sum += x = float((rng() >> 40) + 1) * 0x1p-24f;  // (0, 1]
      for (int32_t j = 0; j < K; ++j) picks[size_t(src)][size_t(t)].push_back({picked[size_t(j)], u[size_t(j)] / sum});
    }
  return moe_routing_from_picks(W, picks);
}

MoeRouting moe_routing_from_picks(int32_t world, const std::vector<std::vector<std::vector<MoePick>>>& picks) {
  if (world < 1) throw InvalidArgument("MoE routing needs world >= 1 (world=" + std::to_string(world) + ")");
  if (picks.size() != size_t(world))
    throw InvalidArgument("MoE routing: picks of " + std::to_string(picks.size()) + " ranks for world " +
                          std::to_string(world));
  MoeRouting r;
  r.world = world;
  r.dest_rank.resize(size_t(world));
  r.dest_token.resize(size_t(world));
  r.gate.resize(size_t(world));
  std::vector<int32_t> seen(size_t(world), -1);
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
        if (seen[size_t(p.rank)] == int32_t(t))
          throw InvalidArgument(at() + " picks rank " + std::to_string(p.rank) + " twice");
        if (!std::isfinite(p.gate)) throw InvalidArgument(at() + ": a gate weight that is not finite");
        seen[size_t(p.rank)] = int32_t(t);
      }
  }
  // The dispatch's order on each expert: by source rank, then token, then pick.
  for (int32_t src = 0; src < world; ++src)
    for (size_t t = 0; t < picks[size_t(src)].size(); ++t)
      for (const MoePick& p : picks[size_t(src)][t]) {
        r.dest_rank[size_t(p.rank)].push_back(src);
        r.dest_token[size_t(p.rank)].push_back(int32_t(t));
        r.gate[size_t(p.rank)].push_back(p.gate);
      }
  r.send_counts = moe_send_counts(r);
  return r;
}

MoeRouting read_moe_routing_file(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "MoE routing");
  auto fail = [&](const std::string& why) -> MoeRouting { throw InvalidArgument(path + ": " + why); };
  if (!j.is_object() || j.value("format", "") != "flashoverlap.moe_routing")
    return fail("not a flashoverlap.moe_routing file");
  if (!j.contains("schema") || !j["schema"].is_number_integer() || j["schema"].get<int64_t>() != 1)
    return fail("schema must be 1");
  if (!j.contains("world") || !j["world"].is_number_integer() || j["world"].get<int64_t>() < 1 ||
      j["world"].get<int64_t>() > 1024)
    return fail("\"world\" must be an integer in [1, 1024]");
  const int32_t world = j["world"].get<int32_t>();
  if (!j.contains("picks") || !j["picks"].is_array() || j["picks"].size() != size_t(world))
    return fail("\"picks\" must be an array of one entry per rank (" + std::to_string(world) + ")");
  std::vector<std::vector<std::vector<MoePick>>> picks(static_cast<size_t>(world));
  for (int32_t src = 0; src < world; ++src) {
    const nlohmann::json& tokens = j["picks"][size_t(src)];
    if (!tokens.is_array()) return fail("picks of rank " + std::to_string(src) + " must be an array of tokens");
    for (size_t t = 0; t < tokens.size(); ++t) {
      const nlohmann::json& token = tokens[t];
      const std::string at = "rank " + std::to_string(src) + " token " + std::to_string(t);
      if (!token.is_array()) return fail(at + ": its picks must be an array of [rank, gate] pairs");
      std::vector<MoePick> mine;
      for (const nlohmann::json& p : token) {
        if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number())
          return fail(at + ": a pick must be [rank, gate], not " + p.dump());
        const int64_t rank = p[0].get<int64_t>();
        mine.push_back({int32_t(std::clamp<int64_t>(rank, -1, world)), p[1].get<float>()});
      }
      picks[size_t(src)].push_back(std::move(mine));
    }
  }
  try {
    return moe_routing_from_picks(world, picks);
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
