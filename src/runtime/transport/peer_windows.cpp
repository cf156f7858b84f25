// peer_windows.cpp — see peer_windows.h.
#include "runtime/transport/peer_windows.h"

#include <algorithm>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "runtime/transport/peers.h"

namespace flashoverlap::rt {

PeerWindows::PeerWindows(int rank, int world, size_t half_bytes, ncclComm_t comm, const std::string& who)
    : rank_(rank), world_(world), half_bytes_((half_bytes + 255) / 256 * 256) {
  if (world < 1 || world > kernels::kMaxCounters || rank < 0 || rank >= world)
    throw InvalidArgument(who + ": the NVLink form takes 1 to " + std::to_string(kernels::kMaxCounters) +
                          " ranks (rank " + std::to_string(rank) + " of " + std::to_string(world) + ")");
  totals_.assign(size_t(world), 0);
  window_ = DeviceBuffer(kHeader + 2 * half_bytes_);
  sink_ = DeviceBuffer(size_t(world) * 4);
  FO_CUDA_CHECK(cudaMemset(window_.get(), 0, kHeader));
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  if (!comm) return;
  mapped_ = std::make_unique<PeerMappedBuffer>(comm, rank, window_.get(), int64_t(half_bytes_));
  std::vector<void*> all;
  for (int r = 0; r < world; ++r) {
    if (mapped_->ld_of(r) != int64_t(half_bytes_))  // (every rank sees the same list: all throw)
      throw InvalidArgument(who + ": rank " + std::to_string(r) + "'s receive window halves are " +
                            std::to_string(mapped_->ld_of(r)) + " bytes, rank " + std::to_string(rank) + "'s " +
                            std::to_string(half_bytes_) + " (the ranks' sizes must agree)");
    all.push_back(mapped_->of(r));
  }
  connect(all);
  setup_barrier(comm, rank, who + ": the receive windows");
}

PeerWindows::~PeerWindows() = default;
PeerWindows::PeerWindows(PeerWindows&&) noexcept = default;
PeerWindows& PeerWindows::operator=(PeerWindows&&) noexcept = default;

void PeerWindows::connect(const std::vector<void*>& windows) {
  const std::string who = "PeerWindows::connect (rank " + std::to_string(rank_) + ")";
  if (!window_.get()) throw InvalidArgument(who + ": no window (built without the NVLink form)");
  if (windows.size() != size_t(world_) || std::find(windows.begin(), windows.end(), nullptr) != windows.end())
    throw InvalidArgument(who + ": needs " + std::to_string(world_) + " windows, none null");
  // [0, W) half 0's rows, [W, 2W) half 1's, [2W, 3W) this rank's counter
  // at each rank, [3W, 4W) the sink's.
  std::vector<void*> ptrs;
  for (int h = 0; h < 2; ++h)
    for (void* w : windows) ptrs.push_back(static_cast<char*>(w) + kHeader + size_t(h) * half_bytes_);
  for (void* w : windows) ptrs.push_back(static_cast<uint32_t*>(w) + rank_);
  for (int d = 0; d < world_; ++d) ptrs.push_back(sink_.as<uint32_t>() + d);
  ptrs_ = to_device(ptrs);
}

PeerWindows::Call PeerWindows::next_call(const std::vector<uint32_t>& counts) {
  if (counts.size() != size_t(world_))
    throw InvalidArgument("PeerWindows::next_call: " + std::to_string(counts.size()) + " counts for " +
                          std::to_string(world_) + " ranks");
  if (broken_)
    throw Error("rank " + std::to_string(rank_) + ": an earlier call of the NVLink form failed after it was counted "
                "on (its rows never went to the other ranks): the windows are out of step; build the op anew");
  Call c;
  c.half = int(calls_++ % 2);
  for (int s = 0; s < world_; ++s) c.targets.target[s] = totals_[size_t(s)] += counts[size_t(s)];  // (wraps: cyclic)
  return c;
}

}  // namespace flashoverlap::rt
