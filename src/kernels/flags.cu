// flags.cu — bounded spin-wait on an epoch counter (see flags.h).
#include "kernels/cuda_check.h"
#include "kernels/flags.h"
#include "kernels/ptx.cuh"

namespace flashoverlap::kernels {
namespace {

__global__ void wait_counter_kernel(const uint32_t* counter, uint32_t target, uint64_t timeout_ns, WaitError* err,
                                    int32_t group) {
  const uint64_t start = ptx::globaltimer_ns();
  uint32_t backoff = 32;
  while (true) {
    const uint32_t v = ptx::ld_acquire_gpu(counter);
    if (static_cast<int32_t>(v - target) >= 0) return;
    if (ptx::globaltimer_ns() - start > timeout_ns) {
      if (atomicCAS(&err->failed, 0u, 1u) == 0u) {
        err->group = group;
        err->value = v;
        err->expected = target;
        __threadfence_system();
      }
      return;
    }
    __nanosleep(backoff);
    if (backoff < 256) backoff *= 2;  // bounded: a late wake-up delays the group
  }
}

}  // namespace

void launch_wait_counter(const uint32_t* counter, uint32_t target, uint64_t timeout_ns, WaitError* err,
                         int32_t group, cudaStream_t stream) {
  wait_counter_kernel<<<1, 1, 0, stream>>>(counter, target, timeout_ns, err, group);
  FO_CUDA_CHECK(cudaGetLastError());
}

void preload_flag_kernels() {
  cudaFuncAttributes attr{};
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, wait_counter_kernel));
}

}  // namespace flashoverlap::kernels
