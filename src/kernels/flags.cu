// flags.cu — bounded spin-wait on an epoch counter (see flags.h).
#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "kernels/flags.h"
#include "kernels/wait.cuh"

namespace flashoverlap::kernels {
namespace {

__global__ void wait_counter_kernel(const uint32_t* counter, uint32_t target, uint64_t timeout_ns, WaitError* err,
                                    int32_t group) {
  bounded_wait<32, 256>(counter, target, timeout_ns, err, group, 1u);
}

__global__ void wait_counters_kernel(const uint32_t* counters, CounterTargets targets, uint64_t timeout_ns,
                                     WaitError* err) {
  const int i = int(threadIdx.x);
  bounded_wait<32, 256>(counters + i, targets.target[i], timeout_ns, err, -1 - i, 1u);
}

__global__ void signal_counters_kernel(uint32_t* const* counters, uint32_t value) {
  __threadfence_system();  // (this stream's earlier work, e.g. the previous call's reads, is done: kernel order)
  ptx::red_release_sys_add(counters[threadIdx.x], value);
}

}  // namespace

void launch_wait_counters(const uint32_t* counters, int32_t count, const CounterTargets& targets, uint64_t timeout_ns,
                          WaitError* err, cudaStream_t stream) {
  if (count < 1 || count > kMaxCounters) throw InvalidArgument("launch_wait_counters: count must be in [1, 8]");
  wait_counters_kernel<<<1, count, 0, stream>>>(counters, targets, timeout_ns, err);
  FO_CUDA_CHECK(cudaGetLastError());
}

void launch_signal_counters(uint32_t* const* counters, int32_t count, uint32_t value, cudaStream_t stream) {
  if (count < 1 || count > kMaxCounters) throw InvalidArgument("launch_signal_counters: count must be in [1, 8]");
  signal_counters_kernel<<<1, count, 0, stream>>>(counters, value);
  FO_CUDA_CHECK(cudaGetLastError());
}

void launch_wait_counter(const uint32_t* counter, uint32_t target, uint64_t timeout_ns, WaitError* err,
                         int32_t group, cudaStream_t stream) {
  wait_counter_kernel<<<1, 1, 0, stream>>>(counter, target, timeout_ns, err, group);
  FO_CUDA_CHECK(cudaGetLastError());
}

void preload_flag_kernels() {
  cudaFuncAttributes attr{};
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, wait_counter_kernel));
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, wait_counters_kernel));
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, signal_counters_kernel));
}

}  // namespace flashoverlap::kernels
