// symmetric.cpp — see symmetric.h.
#include "runtime/transport/symmetric.h"

#include <utility>

#include "runtime/core/checks.h"

namespace flashoverlap::rt {

SymmetricBuffer::SymmetricBuffer(ncclComm_t comm, size_t bytes, const std::string& what) : comm_(comm), bytes_(bytes) {
  if (!comm) throw InvalidArgument("SymmetricBuffer (" + what + "): no communicator");
  // Windows are registered in whole pages.
  const size_t align = NCCL_WIN_REQUIRED_ALIGNMENT;
  bytes_ = (bytes + align - 1) / align * align;
  if (bytes_ == 0) bytes_ = align;
  FO_NCCL_CHECK_CTX(ncclMemAlloc(&ptr_, bytes_), "ncclMemAlloc of " + std::to_string(bytes_) + " bytes for " + what);
  const ncclResult_t r = ncclCommWindowRegister(comm_, ptr_, bytes_, &win_, NCCL_WIN_COLL_SYMMETRIC);
  if (r != ncclSuccess) {
    ncclMemFree(ptr_);
    ptr_ = nullptr;
    FO_NCCL_CHECK_CTX(r, "registering the symmetric window for " + what);
  }
}

void SymmetricBuffer::release() noexcept {
  if (win_) ncclCommWindowDeregister(comm_, win_);
  if (ptr_) ncclMemFree(ptr_);
  win_ = nullptr, ptr_ = nullptr, bytes_ = 0;
}

SymmetricBuffer::~SymmetricBuffer() { release(); }

SymmetricBuffer::SymmetricBuffer(SymmetricBuffer&& o) noexcept
    : comm_(o.comm_), win_(std::exchange(o.win_, nullptr)), ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

SymmetricBuffer& SymmetricBuffer::operator=(SymmetricBuffer&& o) noexcept {
  if (this != &o) {
    release();
    comm_ = o.comm_;
    win_ = std::exchange(o.win_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace flashoverlap::rt
