// gemm_monitor.h — the GEMM's trace buffers for one schedule: the tile
// monitor (kernels::GemmParams::monitor_mma: when each tile's operands were
// requested, ns and SM cycles) and the phase monitor (monitor_phases: when
// each CTA's last tile was staged, stored and pushed, its copies done).
// Allocated and zeroed once, attached to launches, read back summarized
// (tile_clocks.h). Trace only: nothing here runs on the timed path.
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/gemm.h"
#include "plan/schedule.h"
#include "runtime/core/buffer.h"
#include "runtime/core/tile_clocks.h"

namespace flashoverlap::rt {

class GemmMonitor {
 public:
  GemmMonitor() = default;
  // Both buffers for `sched`, zeroed on `stream`.
  explicit GemmMonitor(const plan::Schedule& sched, cudaStream_t stream = nullptr);

  // The next launches of p record into the buffers (tile times are
  // overwritten by each launch; phase times keep the latest, atomicMax).
  // Without `phases` only the tile monitor is attached.
  void attach(kernels::GemmParams& p, bool phases = true) const;

  // Copies both back once `stream`'s work is done, and summarizes them.
  struct Reading {
    TileClocks clocks;
    GemmPhases phases;
  };
  Reading read(cudaStream_t stream = nullptr) const;

  bool allocated() const { return mma_.get() != nullptr; }

 private:
  int64_t tiles_ = 0;
  int ctas_ = 0;
  DeviceBuffer mma_;     // [tiles * 2]
  DeviceBuffer phases_;  // [ctas * kPhaseSlots]
};

}  // namespace flashoverlap::rt
