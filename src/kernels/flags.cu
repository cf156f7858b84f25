// flags.cu — bounded spin-wait on an epoch counter (see flags.h).
#include "kernels/cuda_check.h"
#include "kernels/flags.h"
#include "kernels/wait.cuh"

namespace flashoverlap::kernels {
namespace {

__global__ void wait_counter_kernel(const uint32_t* counter, uint32_t target, uint64_t timeout_ns, WaitError* err,
                                    int32_t group) {
  bounded_wait<32, 256>(counter, target, timeout_ns, err, group, 1u);
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
