// buffer.h — owning device allocations (RAII) for the runtime, the
// benchmarks and the tests.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
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

// Page-locked host memory (cudaMallocHost): the source of asynchronous
// uploads, and where small exchanges land for the host to read.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) FO_CUDA_CHECK_CTX(cudaMallocHost(&ptr_, bytes), std::to_string(bytes) + " pinned bytes");
  }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void* release() {  // (as DeviceBuffer::release)
    bytes_ = 0;
    return std::exchange(ptr_, nullptr);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream, synchronised and destroyed with its scope: declared
// after the buffers its work uses, no kernel outlives them (an exception or
// a test's early return included).
struct ScopedStream {
  cudaStream_t s = nullptr;
  ScopedStream() { FO_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~ScopedStream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;
};

// A host vector into device memory that exists (a window's flags, ...),
// there once this returns. (cudaMemcpy from pageable memory may return
// before its DMA lands, and a kernel on a non-blocking stream is not
// ordered after it: a GEMM read a table half copied, a test compared with
// a reference half there. So the copy's stream is synchronised too.)
template <typename T>
void copy_to_device(void* dst, const std::vector<T>& v) {
  if (v.empty()) return;
  FO_CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  FO_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
// A device copy of a host vector: the kernels' tables and pointer arrays.
template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  copy_to_device(b.get(), v);
  return b;
}
// Epoch counters as `epoch` calls that each add per_call[i] to counter i
// leave them (mod 2^32: they wrap, and their compares are cyclic).
inline std::vector<uint32_t> counts_after(uint32_t epoch, std::vector<uint32_t> per_call) {
  for (uint32_t& c : per_call) c *= epoch;
  return per_call;
}

// What CUDA finds on this machine, and why it finds no Hopper GPU.
struct GpuProbe {
  int hopper = 0;            // usable Hopper (sm_90) devices
  bool cuda_failed = false;  // a driver is installed but CUDA did not start: not "no GPU"
  // Why hopper is 0: "no NVIDIA driver (libcuda.so.1 not found)", "no CUDA
  // device", "no Hopper (sm_90) GPU among 1 device (NVIDIA A100 ...)", or
  // "CUDA failed to start: cudaErrorInsufficientDriver (...)"; "" otherwise.
  std::string reason;
};
GpuProbe probe_gpus();
// probe_gpus().hopper: 0 when there is no driver, no GPU, or CUDA fails.
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
