// symmetric.h — a device buffer every rank of a communicator can address:
// allocated with ncclMemAlloc (CUDA VMM) and registered as a symmetric window
// on one communicator (same size and offsets on every rank), so that the
// peers' copies are mapped here (window_peer_pointers) for the NVLink paths.
#pragma once
#include <nccl.h>

#include <cstddef>
#include <string>

namespace flashoverlap::rt {

class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  // Collective over `comm`: every rank calls it with the same size.
  SymmetricBuffer(ncclComm_t comm, size_t bytes, const std::string& what);
  ~SymmetricBuffer();
  SymmetricBuffer(SymmetricBuffer&& o) noexcept;
  SymmetricBuffer& operator=(SymmetricBuffer&& o) noexcept;
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  void* get() const { return ptr_; }
  ncclWindow_t window() const { return win_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  ncclComm_t comm_ = nullptr;
  ncclWindow_t win_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace flashoverlap::rt
