// peer_windows.h — the receive windows of the ops' NVLink forms (the
// All-to-All's and the ReduceScatter's: docs/design.md §10, §11). On every
// rank one device buffer,
//   [kHeader bytes: an arrival counter per source rank, a token counter per
//    source, then (at kDescOffset) each source's call descriptors, two
//    slots][half 0][half 1],
// that the GEMMs of every rank store rows into (kernels::Scatter) and count
// their tiles in; calls use the halves in turn. Every call is checked
// across the ranks (kernels::CallCheck: the same call, m and plan). Mapped in every rank's
// process over a communicator (CUDA IPC or peer access: PeerMappedBuffer),
// or, where the ranks are side by side in one process without one (the
// one-GPU tests), connected by hand. Counters are never reset: a receiver
// waits for each source's running total.
#pragma once
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/flags.h"
#include "runtime/core/buffer.h"
#include "runtime/transport/peer_map.h"

namespace flashoverlap::rt {

class PeerWindows {
 public:
  static constexpr size_t kHeader = 512;
  static constexpr size_t kTokenOffset = 64;   // [kMaxCounters] uint32_t
  static constexpr size_t kDescOffset = 256;   // [2][kMaxCounters] kernels::CallDesc
  static_assert(kernels::kMaxCounters * 4 <= kTokenOffset && kTokenOffset + kernels::kMaxCounters * 4 <= kDescOffset &&
                    kDescOffset + 2 * kernels::kMaxCounters * sizeof(kernels::CallDesc) <= kHeader,
                "the window header's regions overlap");
  PeerWindows() = default;
  // This rank's window, its counters zeroed (world <= 8). With `comm`:
  // collective, every rank's window mapped here (every rank's half_bytes
  // must be the same: else every rank throws), then a barrier so that no
  // rank counts into one not yet zeroed; without, connect() before use.
  PeerWindows(int rank, int world, size_t half_bytes, ncclComm_t comm, const std::string& who);
  ~PeerWindows();
  PeerWindows(PeerWindows&&) noexcept;
  PeerWindows& operator=(PeerWindows&&) noexcept;

  void* window() const { return window_.get(); }
  // Every rank's window as this process addresses it (its own at `rank`).
  void connect(const std::vector<void*>& windows);
  bool connected() const { return ptrs_.get() != nullptr; }
  // Device [world]: every rank's half h (0, 1) as addressed here.
  void* const* rows(int half) const { return ptrs_.as<void*>() + size_t(half) * size_t(world_); }
  // Device [world]: this rank's counter at every rank; drop (testing): a sink's.
  uint32_t* const* arrivals(bool drop = false) const {
    return reinterpret_cast<uint32_t* const*>(ptrs_.as<void*>() + size_t(drop ? 3 : 2) * size_t(world_));
  }
  const uint32_t* counters() const { return window_.as<uint32_t>(); }  // this rank's, one per source
  const void* half(int h) const { return window_.as<char>() + kHeader + size_t(h) * half_bytes_; }
  size_t half_bytes() const { return half_bytes_; }

  // The next call on these windows (every op that shares them, in call
  // order: the same on every rank): the half it uses; what this rank's
  // counter of each source s reaches once it is done, counts[s] (s's
  // signals in this call) added to s's running total; this rank's
  // descriptor for its GEMM (or signal) to publish, and the check of every
  // source's (rows[s]: s's m; plans[s]: its plan's digest, counts[s] where
  // empty) for the wait. Tokens are counted apart (kernels::CallCheck).
  struct Call {
    int half = 0;
    kernels::CounterTargets targets{};
    kernels::CallPublish publish;
    kernels::CallCheck check;
  };
  // Throws Error once mark_broken was called: a call failed after its
  // next_call (its counts were never sent), so every later one would wait
  // in vain on some rank; the op is built anew.
  Call next_call(const std::vector<uint32_t>& counts, const std::vector<uint32_t>& rows,
                 const std::vector<uint32_t>& plans = {});
  void mark_broken() { broken_ = true; }

 private:
  static kernels::CallDesc* descs_of(void* window) {
    return reinterpret_cast<kernels::CallDesc*>(static_cast<char*>(window) + kDescOffset);
  }
  int rank_ = 0, world_ = 1;
  size_t half_bytes_ = 0;
  DeviceBuffer window_, sink_, ptrs_;
  uint64_t calls_ = 0;
  bool broken_ = false;
  std::vector<uint32_t> totals_;  // each source's signals so far
  std::unique_ptr<PeerMappedBuffer> mapped_;
};

// The call checks' plan digests: FNV-1a over 64-bit values, byte by byte.
struct PlanDigest {
  uint32_t h = 2166136261u;
  void mix(uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ uint32_t((v >> (8 * b)) & 0xff)) * 16777619u;
  }
};

// The message of a failed call check (e.failed == kernels::kCallCheckFailed)
// at `rank`: which source, which call, what differed; `rows` names what m
// counts ("m", "rows").
std::string describe_call_check(const kernels::WaitError& e, int rank, const std::string& op, const char* rows);

}  // namespace flashoverlap::rt
