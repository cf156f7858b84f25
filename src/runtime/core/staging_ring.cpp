// staging_ring.cpp — see staging_ring.h.
#include "runtime/core/staging_ring.h"

#include <algorithm>
#include <utility>

#include "kernels/cuda_check.h"

namespace flashoverlap::rt {

StagingRing::StagingRing(size_t slot_bytes, size_t slots)
    : host_(slot_bytes * (slots < 1 ? 1 : slots)), slot_bytes_(slot_bytes) {
  events_.assign(slots < 1 ? 1 : slots, nullptr);
  for (cudaEvent_t& e : events_) FO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

StagingRing::~StagingRing() { release(); }

size_t StagingRing::slots_within(size_t bytes, size_t slot_bytes, size_t most) {
  return std::clamp<size_t>(bytes / std::max<size_t>(slot_bytes, 1), 2, std::max<size_t>(most, 2));
}

void StagingRing::release() {
  for (cudaEvent_t e : events_) {
    if (!e) continue;
    cudaEventSynchronize(e);  // (a queued copy still reads its slot)
    cudaEventDestroy(e);
  }
  events_.clear();
}

StagingRing::StagingRing(StagingRing&& o) noexcept
    : host_(std::move(o.host_)), slot_bytes_(o.slot_bytes_), events_(std::move(o.events_)), next_(o.next_) {
  o.events_.clear();
}

StagingRing& StagingRing::operator=(StagingRing&& o) noexcept {
  if (this != &o) {
    release();
    host_ = std::move(o.host_), slot_bytes_ = o.slot_bytes_, next_ = o.next_;
    events_ = std::move(o.events_);
    o.events_.clear();
  }
  return *this;
}

void* StagingRing::take() {
  FO_CUDA_CHECK(cudaEventSynchronize(events_[next_]));  // (its copy of `slots` calls ago, if any: mostly long done)
  return host_.as<char>() + next_ * slot_bytes_;
}

void StagingRing::queued(cudaStream_t stream) {
  FO_CUDA_CHECK(cudaEventRecord(events_[next_], stream));
  next_ = (next_ + 1) % events_.size();
}

}  // namespace flashoverlap::rt
