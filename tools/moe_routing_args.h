// moe_routing_args.h — the routing of `--op alltoall` from the command line,
// one rule for `plan` and `lab-bench`: a shape M x N x K means T tokens per rank
// (--tokens, or M when 0), each picking --topk distinct ranks (0: min(2,
// world)) by --routing (uniform | zipf:S | one:R | empty:R, plan::
// make_moe_routing), drawn from a seed of the shape, so that every rank of a
// lab-bench job, and plan, draw the same routing; or file:PATH, a recorded one
// (plan::read_moe_routing_file) that gives the tokens and top-K itself.
// Plain arguments (no Options struct), so that either command passes its own.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "flashoverlap/flashoverlap.h"
#include "plan/routing.h"

namespace flashoverlap::cli {

// --topk as given, or min(2, world) for 0.
int moe_topk_or_default(int topk, int world);
// A shape's tokens per rank: --tokens as given, or the shape's M for 0.
int64_t moe_tokens_or_default(int64_t tokens, int64_t m);
// --routing file:PATH (a recorded routing, not drawn).
bool is_moe_routing_file(const std::string& routing);
// The seed of a shape's drawn routing (T: its tokens per rank).
uint64_t moe_routing_seed(int64_t tokens, int64_t n, int64_t k);

// The flags alone, before any shape: --tokens and --topk >= 0, no --tokens or
// --topk beside a file, the kind, its rank and the top-K against the world
// (make_moe_routing's messages); a file is read and its world compared.
// `who` starts the messages of this helper's own ("plan --op alltoall").
// Throws InvalidArgument.
void check_moe_routing_args(const std::string& routing, int topk, int64_t tokens, int world,
                            const std::string& who);

// The routing of shape M x N x K on `world` ranks: drawn (with `experts`
// per rank, topk of world x experts; --topk 0: min(2, world x experts)), or
// the file's (of `world` ranks; its own experts, which `experts` must be,
// or 1 for the file's say). Throws InvalidArgument as check_moe_routing_args.
plan::MoeRouting moe_routing_for(const std::string& routing, int topk, int64_t tokens, int world, int64_t m,
                                 int64_t n, int64_t k, const std::string& who, int experts = 1);

// Each rank's routing as the public calls take it (plan_gemm_alltoall):
// views of r's arrays (expert_counts too, with several experts), the
// recv_counts in `recv` (world x world, kept alive by the caller with r).
std::vector<AllToAllRouting> public_routings(const plan::MoeRouting& r, std::vector<int64_t>& recv);

}  // namespace flashoverlap::cli
