// exchange.h — every rank's few bytes over NCCL: how the runtime's ranks
// agree on host values (output addresses, whether each could map them)
// with no channel but the communicator. Collective: every rank of `comm`
// calls it, in the same order.
//
// Bounded: a rank that never joins (it failed before the exchange, or its
// program took another path) makes the others throw after `timeout` with
// this rank, `what` and the wait in the message, instead of waiting for
// ever. Such an exchange stays enqueued on the communicator (its device
// buffer is kept for it): it completes if the late ranks join it, and
// otherwise the communicator must be aborted (ncclCommAbort), not destroyed.
// Not bounded here: NCCL itself may block inside the call while it connects
// the ranks, at a communicator's first collective of a kind (its lazy
// connection set-up), unless the communicator is non-blocking.
#pragma once
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#include "runtime/core/buffer.h"

namespace flashoverlap::rt {

// How long the runtime's exchanges wait for the other ranks by default.
inline constexpr std::chrono::milliseconds kDefaultExchangeTimeout{120'000};

// Every rank's `bytes` bytes at `mine`, by rank (world x bytes).
std::vector<uint8_t> gather_bytes(ncclComm_t comm, int rank, const void* mine, size_t bytes, const std::string& what,
                                  std::chrono::milliseconds timeout = kDefaultExchangeTimeout);

template <typename T>
std::vector<T> gather_from_all(ncclComm_t comm, int rank, const T& mine, const std::string& what,
                               std::chrono::milliseconds timeout = kDefaultExchangeTimeout) {
  static_assert(std::is_trivially_copyable_v<T>, "exchanged as bytes");
  const std::vector<uint8_t> raw = gather_bytes(comm, rank, &mine, sizeof(T), what, timeout);
  std::vector<T> all(raw.size() / sizeof(T));
  std::memcpy(static_cast<void*>(all.data()), raw.data(), raw.size());
  return all;
}

// The same exchange made again and again (every call of an op), without an
// allocation per call: `bytes` of this rank's at mine(), gathered by rank
// into a host buffer. Runs on a stream of its own, ordered after nothing
// of the caller's: the host waits for the exchange alone. After a failure
// (timeout, NCCL error) every later gather throws.
class HostExchange {
 public:
  HostExchange(ncclComm_t comm, size_t bytes);
  ~HostExchange();
  HostExchange(const HostExchange&) = delete;
  HostExchange& operator=(const HostExchange&) = delete;
  void* mine() const { return mine_.get(); }  // (pinned: write it, then gather)
  // Every rank's bytes, by rank (world x bytes), valid until the next gather.
  const uint8_t* gather(const std::string& what, std::chrono::milliseconds timeout = kDefaultExchangeTimeout);
  size_t bytes() const { return bytes_; }

 private:
  ncclComm_t comm_ = nullptr;
  size_t bytes_ = 0;
  int world_ = 1, rank_ = 0;
  PinnedBuffer mine_, all_;
  DeviceBuffer device_;
  cudaStream_t stream_ = nullptr;
  bool stuck_ = false;
};

}  // namespace flashoverlap::rt
