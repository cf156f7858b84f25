// peer_map.cpp — see peer_map.h.
#include "runtime/transport/peer_map.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/exchange.h"

namespace flashoverlap::rt {
namespace {

// What each rank says of its buffer.
struct Entry {
  int32_t ok = 1;        // this rank's buffer passed its checks (PeerMappedBuffer's `ok`)
  int64_t pid = 0;
  uint64_t nonce = 0;    // with pid: this process (pids repeat across PID namespaces)
  int32_t device = 0;
  int32_t exported = 0;  // the IPC handle is valid
  uint64_t raw = 0;      // the address in its own process
  uint64_t offset = 0;   // from the base of its allocation
  int64_t ld = 0;
  cudaIpcMemHandle_t handle{};
};

// IPC mappings, shared: CUDA opens a handle once per process, and buffers
// of one allocation (a caching allocator's block) share its handle.
struct Opened {
  void* base = nullptr;
  int refs = 0;
};
std::mutex& opened_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Opened>& opened_handles() {
  static std::map<std::string, Opened> m;
  return m;
}
std::string key_of(const cudaIpcMemHandle_t& h) { return std::string(h.reserved, sizeof(h.reserved)); }

void* open_handle(const cudaIpcMemHandle_t& h) {
  std::lock_guard<std::mutex> lock(opened_mutex());
  Opened& o = opened_handles()[key_of(h)];
  if (o.refs == 0) {
    const cudaError_t e = cudaIpcOpenMemHandle(&o.base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      opened_handles().erase(key_of(h));
      FO_CUDA_CHECK(e);
    }
  }
  ++o.refs;
  return o.base;
}

void close_handle(void* base) noexcept {
  std::lock_guard<std::mutex> lock(opened_mutex());
  for (auto it = opened_handles().begin(); it != opened_handles().end(); ++it)
    if (it->second.base == base) {
      if (--it->second.refs == 0) {
        cudaIpcCloseMemHandle(base);
        opened_handles().erase(it);
      }
      return;
    }
}

uint64_t process_nonce() {
  static const uint64_t n = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  return n;
}

// Whether every rank of `comm` says ok.
bool all_ok(ncclComm_t comm, int rank, bool ok, std::chrono::milliseconds timeout) {
  const std::vector<int32_t> all =
      gather_from_all<int32_t>(comm, rank, ok ? 1 : 0, "agreeing on an output mapping", timeout);
  return std::all_of(all.begin(), all.end(), [](int32_t v) { return v == 1; });
}

}  // namespace

PeerMappedBuffer::PeerMappedBuffer(ncclComm_t comm, int rank, void* mine, int64_t ld, bool ok,
                                   std::chrono::milliseconds timeout)
    : mine_(mine), ld_(ld) {
  Entry me;
  me.ok = ok ? 1 : 0;
  me.pid = int64_t(getpid());
  me.nonce = process_nonce();
  FO_CUDA_CHECK(cudaGetDevice(&me.device));
  me.raw = reinterpret_cast<uint64_t>(mine);
  me.ld = ld;
  // The base of the allocation: IPC exports whole allocations.
  static const auto range = driver_entry_point<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange", 3020);
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range(&base, &size, reinterpret_cast<CUdeviceptr>(mine)) == CUDA_SUCCESS &&
      cudaIpcGetMemHandle(&me.handle, reinterpret_cast<void*>(base)) == cudaSuccess) {
    me.exported = 1;
    me.offset = me.raw - uint64_t(base);
  } else {
    (void)cudaGetLastError();  // (only a problem if another process needs it: below)
  }
  const std::vector<Entry> all = gather_from_all(comm, rank, me, "exchanging output addresses", timeout);
  // Every rank decides from the same entries, so all throw or none does.
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].ok)
      throw InvalidArgument("rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                            " could not register its output (its own error says why)");
  auto same_process = [&](const Entry& e) { return e.pid == me.pid && e.nonce == me.nonce; };
  bool processes = false;
  for (const Entry& e : all) processes = processes || e.pid != all[0].pid || e.nonce != all[0].nonce;
  for (size_t r = 0; processes && r < all.size(); ++r)
    if (!all[r].exported)
      throw InvalidArgument("rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                            "'s output is not device memory CUDA IPC can share with the other processes (allocate "
                            "it with cudaMalloc)");
  at_.assign(all.size(), nullptr);
  lds_.assign(all.size(), 0);
  std::string failure;  // mapping a peer's buffer failed here: every rank throws (all_ok below)
  try {
    for (size_t r = 0; r < all.size(); ++r) {
      const Entry& e = all[r];
      lds_[r] = e.ld;
      if (int(r) == rank) {
        at_[r] = mine;
      } else if (same_process(e)) {  // a thread of this process: the same address, once peer access is on
        const cudaError_t pe = cudaDeviceEnablePeerAccess(e.device, 0);
        if (pe == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
        else FO_CUDA_CHECK(pe);
        at_[r] = reinterpret_cast<void*>(e.raw);
      } else {
        void* p = open_handle(e.handle);
        opened_.push_back(p);
        at_[r] = static_cast<char*>(p) + e.offset;
      }
    }
  } catch (const std::exception& ex) {
    failure = ex.what();
  }
  bool everyone_mapped = false;
  try {
    everyone_mapped = all_ok(comm, rank, failure.empty(), timeout);
  } catch (...) {  // (a timed-out agreement: the mappings opened above are closed before the throw)
    release();
    throw;
  }
  if (!everyone_mapped) {
    release();
    throw Error(failure.empty() ? "rank " + std::to_string(rank) + ": another rank could not map this rank's output"
                                : failure);
  }
}

void PeerMappedBuffer::release() noexcept {
  for (void* p : opened_) close_handle(p);
  opened_.clear();
}

PeerMappedBuffer::~PeerMappedBuffer() { release(); }

PeerMappedBuffer::PeerMappedBuffer(PeerMappedBuffer&& o) noexcept
    : mine_(o.mine_), ld_(o.ld_), at_(std::move(o.at_)), lds_(std::move(o.lds_)), opened_(std::move(o.opened_)) {
  o.opened_.clear();
}

PeerMappedBuffer& PeerMappedBuffer::operator=(PeerMappedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    mine_ = o.mine_, ld_ = o.ld_, at_ = std::move(o.at_), lds_ = std::move(o.lds_), opened_ = std::move(o.opened_);
    o.opened_.clear();
  }
  return *this;
}

}  // namespace flashoverlap::rt
