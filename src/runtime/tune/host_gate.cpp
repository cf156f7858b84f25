// host_gate.cpp — see host_gate.h.
#include "runtime/tune/host_gate.h"

#include <string>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"

namespace flashoverlap::rt {

HostGate::HostGate() {
  FO_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(uint32_t), cudaHostAllocMapped));
  FO_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&err_), sizeof(kernels::WaitError), cudaHostAllocMapped));
  __atomic_store_n(flag_, 0u, __ATOMIC_SEQ_CST);
  *err_ = kernels::WaitError{};
}

HostGate::~HostGate() {
  if (flag_) {
    __atomic_store_n(flag_, ticket_, __ATOMIC_SEQ_CST);  // never leave a stream held
    cudaFreeHost(flag_);
  }
  if (err_) cudaFreeHost(err_);
}

void HostGate::hold(cudaStream_t stream, uint64_t timeout_ns) {
  ++ticket_;
  // (UVA: the mapped host pointers are valid on the device as they are.)
  kernels::launch_wait_counter(flag_, ticket_, timeout_ns, err_, -1, stream);
}

void HostGate::release() { __atomic_store_n(flag_, ticket_, __ATOMIC_SEQ_CST); }

void HostGate::check() const {
  if (__atomic_load_n(&err_->failed, __ATOMIC_SEQ_CST))
    throw Error("HostGate: a held stream timed out waiting for the host (ticket " + std::to_string(err_->expected) +
                ", flag " + std::to_string(err_->value) + ")");
}

HostGate& thread_gate() {
  static thread_local HostGate gate;
  return gate;
}

}  // namespace flashoverlap::rt
