// predictor.h — the paper's latency predictor (docs/design.md §2.4) over an
// abstract cost model: compute time per wave, communication time per group.
//   t_acc_p += t_p(group waves);  t_acc_m = max(t_acc_p, t_acc_m) + t_m(group)
#pragma once
#include <functional>
#include <vector>

#include "plan/partition.h"

namespace flashoverlap::plan {

struct CostModel {
  std::vector<double> wave_ms;  // compute time of each wave (slowdown included)
  // Time of the one call that communicates the tiles of waves [w0, w1).
  std::function<double(int32_t w0, int32_t w1)> comm_ms;
  // No call starts before this (e.g. the GEMM's end when it holds every SM).
  double comm_not_before_ms = 0;

  int32_t waves() const { return int32_t(wave_ms.size()); }
};

struct GroupTiming {
  double compute_start = 0, compute_end = 0, comm_start = 0, comm_end = 0;
};

struct Prediction {
  std::vector<GroupTiming> groups;
  double total_ms = 0;  // end of the last call
};

// Throws InvalidArgument for a partition that does not sum to the waves.
Prediction predict(const CostModel& model, const Partition& p);

}  // namespace flashoverlap::plan
