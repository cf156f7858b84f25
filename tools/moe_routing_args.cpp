#include "moe_routing_args.h"

#include <algorithm>

#include "flashoverlap/error.h"

namespace flashoverlap::cli {

namespace {

// What needs neither the file nor a shape.
void check_flags(const std::string& routing, int topk, int64_t tokens, const std::string& who) {
  if (tokens < 0) throw InvalidArgument("--tokens must be >= 0 (0: the shape's M), not " + std::to_string(tokens));
  if (topk < 0) throw InvalidArgument("--topk must be >= 0 (0: min(2, world)), not " + std::to_string(topk));
  if (is_moe_routing_file(routing) && (tokens != 0 || topk != 0))
    throw InvalidArgument(who + " --routing " + routing +
                          ": the file gives the tokens and top-K (no --tokens, --topk)");
}

plan::MoeRouting read_file(const std::string& routing, int world, const std::string& who) {
  plan::MoeRouting r = plan::read_moe_routing_file(routing.substr(5));
  if (r.world != world)
    throw InvalidArgument(who + " --routing " + routing + ": a routing of " + std::to_string(r.world) +
                          " ranks, the world is " + std::to_string(world));
  return r;
}

}  // namespace

int moe_topk_or_default(int topk, int world) { return topk > 0 ? topk : std::min(2, world); }

int64_t moe_tokens_or_default(int64_t tokens, int64_t m) { return tokens > 0 ? tokens : m; }

bool is_moe_routing_file(const std::string& routing) { return routing.rfind("file:", 0) == 0; }

// (lab-bench's seed before this helper: its routings stay the same.)
uint64_t moe_routing_seed(int64_t tokens, int64_t n, int64_t k) {
  return 0x5eed + uint64_t(tokens) * 31 + uint64_t(n) * 17 + uint64_t(k);
}

void check_moe_routing_args(const std::string& routing, int topk, int64_t tokens, int world,
                            const std::string& who) {
  check_flags(routing, topk, tokens, who);
  if (is_moe_routing_file(routing)) (void)read_file(routing, world, who);
  else (void)plan::make_moe_routing(routing, world, 0, moe_topk_or_default(topk, world));  // (kind, top-K, world)
}

plan::MoeRouting moe_routing_for(const std::string& routing, int topk, int64_t tokens, int world, int64_t m,
                                 int64_t n, int64_t k, const std::string& who, int experts) {
  check_flags(routing, topk, tokens, who);
  if (experts < 1 || experts > 4096) throw InvalidArgument("--experts must be in [1, 4096], not " + std::to_string(experts));
  if (is_moe_routing_file(routing)) {
    plan::MoeRouting r = read_file(routing, world, who);
    if (experts > 1 && r.experts != experts)
      throw InvalidArgument(who + " --routing " + routing + ": a routing of " + std::to_string(r.experts) +
                            " experts per rank, --experts " + std::to_string(experts));
    return r;
  }
  const int64_t T = moe_tokens_or_default(tokens, m);
  const int K = moe_topk_or_default(topk, world * experts);
  // Every rank's routing is made here, on the host: bounded (~0.2 GB at the most).
  constexpr int64_t kMaxRows = int64_t(1) << 24;
  if (T > kMaxRows || T * K * world > kMaxRows)
    throw InvalidArgument(who + ": " + std::to_string(T) + " tokens per rank x top-" + std::to_string(K) + " x " +
                          std::to_string(world) + " ranks: more than " + std::to_string(kMaxRows) +
                          " rows in all (every rank's routing is made on the host)");
  return plan::make_moe_routing(routing, world, T, K, moe_routing_seed(T, n, k), experts);
}

std::vector<AllToAllRouting> public_routings(const plan::MoeRouting& r, std::vector<int64_t>& recv) {
  const size_t W = size_t(r.world);
  recv.assign(W * W, 0);
  std::vector<AllToAllRouting> out(W);
  for (size_t d = 0; d < W; ++d) {
    for (size_t s = 0; s < W; ++s) recv[d * W + s] = r.send_count(int32_t(s), int32_t(d));
    AllToAllRouting& x = out[d];
    x.rows = r.rows(int32_t(d));
    x.dest_rank = r.dest_rank[d].data(), x.dest_token = r.dest_token[d].data(), x.gate = r.gate[d].data();
    x.tokens = r.tokens[d];
    x.send_counts = r.send_counts.data() + d * W, x.recv_counts = recv.data() + d * W;
    if (r.experts > 1) x.expert_counts = r.expert_rows[d].data();
  }
  return out;
}

}  // namespace flashoverlap::cli
