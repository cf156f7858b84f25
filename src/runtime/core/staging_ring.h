// staging_ring.h — pinned host slots for a call's upload, reused in turns
// once their copy has run, so that the host can queue calls far ahead of
// the GPU.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "runtime/core/buffer.h"

namespace flashoverlap::rt {

// `slots` equal slots in one pinned allocation (made up front: a page-locked
// allocation while work is queued would serialise the streams), each with the
// event of its last copy. take() waits only where the slot's copy of `slots`
// calls before has not run yet. Not thread-safe (one per op, as its calls are).
class StagingRing {
 public:
  StagingRing() = default;
  StagingRing(size_t slot_bytes, size_t slots);
  ~StagingRing();
  StagingRing(StagingRing&&) noexcept;
  StagingRing& operator=(StagingRing&&) noexcept;
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // The slots of slot_bytes that `bytes` of pinned memory holds, within
  // [2, most]: at least one to fill while the last one's copy waits.
  static size_t slots_within(size_t bytes, size_t slot_bytes, size_t most);

  // The next slot to fill and copy from on `stream`; queued(stream) once its copy is enqueued.
  void* take();
  void queued(cudaStream_t stream);
  size_t slots() const { return events_.size(); }

 private:
  void release();
  PinnedBuffer host_;
  size_t slot_bytes_ = 0;
  std::vector<cudaEvent_t> events_;  // each slot's last copy (recorded by queued; never recorded: done)
  size_t next_ = 0;
};

}  // namespace flashoverlap::rt
