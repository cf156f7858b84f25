// routing.h — MoE token routing for All-to-All: the destination rank of every
// row of C on every source rank. The planner needs all ranks' routings (they
// are exchanged before the GEMM): the groups' per-peer counts depend on them.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace flashoverlap::plan {

struct Routing {
  int32_t world = 1;
  int64_t m = 0;                           // rows of C on every rank
  std::vector<std::vector<int32_t>> dest;  // dest[src][row] in [0, world)
};

// Throws InvalidArgument unless there are `world` ranks of `m` rows each with
// destinations in [0, world).
void validate_routing(const Routing& r, int32_t world, int64_t m);

// Synthetic routings (CLI, tests), deterministic for a seed:
//   "uniform"      each row to a uniformly random rank;
//   "skewed"       half of the rows to rank 0, the rest uniform;
//   "empty:<k>"    uniform over every rank but k (k receives nothing; world >= 2).
Routing make_routing(std::string_view kind, int32_t world, int64_t m, uint64_t seed = 1);

// rows[src * world + dst]: how many rows src sends to dst.
std::vector<int64_t> routing_pair_rows(const Routing& r);

}  // namespace flashoverlap::plan
