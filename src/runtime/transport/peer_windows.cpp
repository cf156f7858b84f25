// peer_windows.cpp — see peer_windows.h.
#include "runtime/transport/peer_windows.h"

#include <algorithm>
#include <sstream>

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
  // at each rank, [3W, 4W) the sink's, [4W, 5W) and [5W, 6W) this rank's
  // descriptor slot of parity 0 and 1 at each rank, [6W, 7W) its token
  // counter at each rank.
  std::vector<void*> ptrs;
  for (int h = 0; h < 2; ++h)
    for (void* w : windows) ptrs.push_back(static_cast<char*>(w) + kHeader + size_t(h) * half_bytes_);
  for (void* w : windows) ptrs.push_back(static_cast<uint32_t*>(w) + rank_);
  for (int d = 0; d < world_; ++d) ptrs.push_back(sink_.as<uint32_t>() + d);
  for (int h = 0; h < 2; ++h)
    for (void* w : windows) ptrs.push_back(descs_of(w) + h * kernels::kMaxCounters + rank_);
  for (void* w : windows) ptrs.push_back(reinterpret_cast<uint32_t*>(static_cast<char*>(w) + kTokenOffset) + rank_);
  ptrs_ = to_device(ptrs);
}

PeerWindows::Call PeerWindows::next_call(const std::vector<uint32_t>& counts, const std::vector<uint32_t>& rows,
                                         const std::vector<uint32_t>& plans) {
  if (counts.size() != size_t(world_) || rows.size() != size_t(world_) ||
      (!plans.empty() && plans.size() != size_t(world_)))
    throw InvalidArgument("PeerWindows::next_call: " + std::to_string(counts.size()) + " counts, " +
                          std::to_string(rows.size()) + " row counts and " + std::to_string(plans.size()) +
                          " plans for " + std::to_string(world_) + " ranks");
  const std::vector<uint32_t>& plan = plans.empty() ? counts : plans;
  if (broken_)
    throw Error("rank " + std::to_string(rank_) + ": an earlier call of the NVLink form failed after it was counted "
                "on (its rows never went to the other ranks): the windows are out of step; build the op anew");
  Call c;
  c.half = int(calls_++ % 2);
  const uint32_t seq = uint32_t(calls_);  // (from 1; a header of zeros holds no call)
  for (int s = 0; s < world_; ++s) {
    c.targets.target[s] = totals_[size_t(s)] += counts[size_t(s)];  // (wraps: cyclic)
    c.check.m[s] = rows[size_t(s)], c.check.plan[s] = plan[size_t(s)];
  }
  void* const* p = ptrs_.as<void*>();
  c.publish.slots = reinterpret_cast<kernels::CallDesc* const*>(p + size_t(4 + c.half) * size_t(world_));
  c.publish.desc = {seq, rows[size_t(rank_)], plan[size_t(rank_)], 0};
  c.check.slots = descs_of(window_.get());
  c.check.parity = c.half, c.check.seq = seq;
  c.check.tokens = reinterpret_cast<uint32_t* const*>(p + size_t(6) * size_t(world_));
  c.check.token_counters = reinterpret_cast<const uint32_t*>(window_.as<char>() + kTokenOffset);
  return c;
}

std::string describe_call_check(const kernels::WaitError& e, int rank, const std::string& op, const char* rows) {
  const int source = -1 - e.group;
  std::ostringstream os;
  os << "rank " << rank << ": " << op << ": ";
  const auto ahead = [](uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) > 0; };
  if (e.token)
    os << "rank " << source << " did not confirm call #" << e.want_seq << " in time (its check of the call failed, "
       << "or it did not make it; its confirmed calls here: " << e.seen_seq << ")";
  else if (e.seen_seq == e.want_seq)
    os << "rank " << source << "'s call #" << e.want_seq << " has " << rows << " = " << e.seen_m << " and plan "
       << e.seen_plan << ", where this rank expects " << rows << " = " << e.want_m << " and plan " << e.want_plan;
  else if (ahead(e.seen_seq, e.want_seq))
    os << "rank " << source << " is at call #" << e.seen_seq << " where this rank is at #" << e.want_seq
       << " (a rank skipped a call)";
  else
    os << "rank " << source << " did not start call #" << e.want_seq << " in time (its latest here: #" << e.seen_seq
       << ")";
  os << ". Every rank must make the same calls, with the same " << rows << ", in the same order; this call's "
     << "result is not valid and the op's windows are out of step: build the op anew";
  return os.str();
}

}  // namespace flashoverlap::rt
