#include "plan/predictor.h"

#include <algorithm>

namespace flashoverlap::plan {

Prediction predict(const CostModel& model, const Partition& p) {
  validate_partition(p, model.waves());
  Prediction out;
  double t_p = 0, t_m = model.comm_not_before_ms;
  int32_t w = 0;
  for (int32_t size : p) {
    GroupTiming g;
    g.compute_start = t_p;
    for (int32_t i = w; i < w + size; ++i) t_p += model.wave_ms[size_t(i)];
    g.compute_end = t_p;
    g.comm_start = std::max(t_p, t_m);
    t_m = g.comm_end = g.comm_start + model.comm_ms(w, w + size);
    out.groups.push_back(g);
    w += size;
  }
  out.total_ms = t_m;
  return out;
}

}  // namespace flashoverlap::plan
