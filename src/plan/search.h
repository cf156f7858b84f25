// search.h — the best partition of the waves under a cost model.
//
// search_dp is exact in O(T^2) cost evaluations: with P_i the compute time of
// the first i waves and F_i the best finish time of communicating them,
//   F_0 = comm_not_before,  F_i = min_{j<i} max(P_i, F_j) + t_m(j, i).
// It is exact because the finish time after a group is non-decreasing in the
// finish time before it (max and + are monotone), so an optimal partition's
// prefixes are optimal for their own prefix problems. search_exhaustive
// evaluates all 2^(T-1) partitions (T <= 20) and exists to check it.
// Ties (equal within 1e-12 relative): fewer groups first; the DP applies this
// per prefix, so among exact ties the two may return different partitions
// with the same latency.
#pragma once
#include "plan/partition.h"
#include "plan/predictor.h"

namespace flashoverlap::plan {

struct SearchResult {
  Partition partition;
  double total_ms = 0;
};

SearchResult search_dp(const CostModel& model);
SearchResult search_exhaustive(const CostModel& model);  // throws InvalidArgument for T > 20

// search_dp's partition, on runs of ceil(T / max_waves) waves where T
// exceeds max_waves (the DP's O(T^2) bounded): every group but the last a
// multiple of the run, the last what is left. What every planner searches.
Partition search_coarsened(const CostModel& fine, int32_t max_waves);

}  // namespace flashoverlap::plan
