// peer_map.h — another rank's ordinary device buffer (cudaMalloc, not an
// NCCL window) mapped in this process, so that kernels here store into it:
// the raw address between threads of one process (peer access enabled),
// CUDA IPC between processes. Collective: every rank of `comm` calls it, in
// the same order, each with its own buffer.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "runtime/core/exchange.h"

namespace flashoverlap::rt {

class PeerMappedBuffer {
 public:
  PeerMappedBuffer() = default;
  // Exchanges `mine` (and its elements per row, ld) with every rank of
  // `comm`. Throws InvalidArgument naming the rank if a buffer is not device
  // memory that CUDA IPC can export (cudaMalloc; not VMM or stream-ordered
  // pools) where the ranks are processes of their own.
  // ok = false: this rank's buffer failed its caller's checks; every rank
  // then throws (so that none is left waiting in the exchange). A rank that
  // does not call it at all makes the others throw after `timeout`
  // (exchange.h: the communicator must then be aborted).
  PeerMappedBuffer(ncclComm_t comm, int rank, void* mine, int64_t ld, bool ok = true,
                   std::chrono::milliseconds timeout = kDefaultExchangeTimeout);
  ~PeerMappedBuffer();
  PeerMappedBuffer(PeerMappedBuffer&& o) noexcept;
  PeerMappedBuffer& operator=(PeerMappedBuffer&& o) noexcept;
  PeerMappedBuffer(const PeerMappedBuffer&) = delete;
  PeerMappedBuffer& operator=(const PeerMappedBuffer&) = delete;

  void* mine() const { return mine_; }
  int64_t ld() const { return ld_; }
  // Rank r's buffer as this process addresses it (r = this rank: mine()).
  void* of(int r) const { return at_[size_t(r)]; }
  int64_t ld_of(int r) const { return lds_[size_t(r)]; }

 private:
  void release() noexcept;
  void* mine_ = nullptr;
  int64_t ld_ = 0;
  std::vector<void*> at_;
  std::vector<int64_t> lds_;
  std::vector<void*> opened_;  // IPC mappings held (their bases; shared per process and allocation)
};

}  // namespace flashoverlap::rt
