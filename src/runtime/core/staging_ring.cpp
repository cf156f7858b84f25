// staging_ring.cpp — see staging_ring.h.
#include "runtime/core/staging_ring.h"

#include <utility>

#include "kernels/cuda_check.h"

namespace flashoverlap::rt {

StagingRing::StagingRing(size_t slot_bytes, size_t slots)
    : host_(slot_bytes * (slots < 1 ? 1 : slots)), slot_bytes_(slot_bytes) {
  events_.assign(slots < 1 ? 1 : slots, nullptr);
  used_.assign(events_.size(), false);
  for (cudaEvent_t& e : events_) FO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

StagingRing::~StagingRing() { release(); }

void StagingRing::release() {
  for (size_t i = 0; i < events_.size(); ++i) {
    if (used_[i]) cudaEventSynchronize(events_[i]);  // (a queued copy still reads its slot)
    if (events_[i]) cudaEventDestroy(events_[i]);
  }
  events_.clear(), used_.clear();
}

StagingRing::StagingRing(StagingRing&& o) noexcept
    : host_(std::move(o.host_)), slot_bytes_(o.slot_bytes_), events_(std::move(o.events_)),
      used_(std::move(o.used_)), next_(o.next_) {
  o.events_.clear(), o.used_.clear();
}

StagingRing& StagingRing::operator=(StagingRing&& o) noexcept {
  if (this != &o) {
    release();
    host_ = std::move(o.host_), slot_bytes_ = o.slot_bytes_, next_ = o.next_;
    events_ = std::move(o.events_), used_ = std::move(o.used_);
    o.events_.clear(), o.used_.clear();
  }
  return *this;
}

void* StagingRing::take() {
  if (used_[next_]) FO_CUDA_CHECK(cudaEventSynchronize(events_[next_]));  // (`slots` calls ago: mostly long done)
  return host_.as<char>() + next_ * slot_bytes_;
}

void StagingRing::queued(cudaStream_t stream) {
  FO_CUDA_CHECK(cudaEventRecord(events_[next_], stream));
  used_[next_] = true;
  next_ = (next_ + 1) % events_.size();
}

}  // namespace flashoverlap::rt
