// rt_buffer.h — owning device allocations (RAII) for the runtime, the
// benchmarks and the tests.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cuda_check.h"

namespace flashoverlap::rt {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) FO_CUDA_CHECK_CTX(cudaMalloc(&ptr_, bytes), std::to_string(bytes) + " bytes");
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // Gives up ownership without freeing (memory that enqueued work may still
  // write, e.g. a collective left waiting for a rank that never joined).
  void* release() {
    bytes_ = 0;
    return std::exchange(ptr_, nullptr);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host vector: the kernels' tables and pointer arrays.
template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) FO_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice));
  return b;
}

// Number of usable Hopper (sm_90) devices; 0 when there is no driver or GPU.
int hopper_device_count();

}  // namespace flashoverlap::rt

#include <string>
namespace flashoverlap::rt {
// What a results file records about the machine it was measured on.
struct DeviceInfo {
  std::string name;
  int sms = 0;
  int driver = 0, runtime = 0, cublas = 0, nccl = 0;  // versions as integers
  std::string summary() const;  // "NVIDIA H200, 132 SMs, driver 13.0, CUDA 13.0, cuBLAS 130100, NCCL 22803"
};
DeviceInfo device_info(int device);
// SMs of the current device (a persistent grid's bound).
int current_device_sms();
}  // namespace flashoverlap::rt
