// gemm_monitor.cpp — see gemm_monitor.h.
#include "runtime/core/gemm_monitor.h"

#include <vector>

#include "flashoverlap/error.h"

namespace flashoverlap::rt {
static_assert(kPhaseSlots == kernels::kPhaseSlots, "the phase monitor's layout, host and kernel");

GemmMonitor::GemmMonitor(const plan::Schedule& sched, cudaStream_t stream)
    : tiles_(sched.tiles()),
      ctas_(sched.ctas),
      mma_(size_t(sched.tiles()) * 2 * sizeof(uint64_t)),
      phases_(size_t(sched.ctas) * kPhaseSlots * sizeof(uint64_t)) {
  FO_CUDA_CHECK(cudaMemsetAsync(mma_.get(), 0, mma_.bytes(), stream));
  FO_CUDA_CHECK(cudaMemsetAsync(phases_.get(), 0, phases_.bytes(), stream));
}

void GemmMonitor::attach(kernels::GemmParams& p, bool phases) const {
  if (!allocated()) throw InvalidArgument("GemmMonitor: attach on a monitor without buffers");
  if (p.sched.tiles() != tiles_ || p.sched.ctas != ctas_)
    throw InvalidArgument("GemmMonitor: sized for " + std::to_string(tiles_) + " tiles on " + std::to_string(ctas_) +
                          " CTAs, attached to a GEMM of " + std::to_string(p.sched.tiles()) + " tiles on " +
                          std::to_string(p.sched.ctas));
  p.monitor_mma = mma_.as<uint64_t>();
  p.monitor_phases = phases ? phases_.as<uint64_t>() : nullptr;
}

GemmMonitor::Reading GemmMonitor::read(cudaStream_t stream) const {
  if (!allocated()) throw InvalidArgument("GemmMonitor: read on a monitor without buffers");
  std::vector<uint64_t> mma(size_t(tiles_) * 2), ph(size_t(ctas_) * kPhaseSlots);
  FO_CUDA_CHECK(cudaMemcpyAsync(mma.data(), mma_.get(), mma_.bytes(), cudaMemcpyDeviceToHost, stream));
  FO_CUDA_CHECK(cudaMemcpyAsync(ph.data(), phases_.get(), phases_.bytes(), cudaMemcpyDeviceToHost, stream));
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {summarize_tile_clocks(mma, tiles_, ctas_), summarize_phases(ph, ctas_)};
}

}  // namespace flashoverlap::rt
