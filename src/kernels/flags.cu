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
                                     WaitError* err, CallCheck check) {
  const int i = int(threadIdx.x);
  if (check.slots) {
    __shared__ int failed;
    if (i == 0) failed = 0;
    __syncthreads();
    if (!check_call(check, i, timeout_ns, err)) failed = 1;
    __syncthreads();
    if (failed) return;  // (no token: the other ranks fail too)
    ptx::red_release_sys_add(check.tokens[i], 1);
  }
  if (bounded_wait<32, 256>(counters + i, targets.target[i], timeout_ns, err, -1 - i, 1u) && check.slots)
    wait_token(check, i, timeout_ns, err);
}

__global__ void signal_counters_kernel(uint32_t* const* counters, uint32_t value, CallPublish publish) {
  __threadfence_system();  // (this stream's earlier work, e.g. the previous call's reads, is done: kernel order)
  if (publish.slots) publish_call(publish, int(threadIdx.x));
  ptx::red_release_sys_add(counters[threadIdx.x], value);
}

__global__ void uncount_group_kernel(uint32_t* flags, const int32_t* group_of_tile, int32_t tiles, int32_t group) {
  for (int32_t t = int32_t(blockIdx.x * blockDim.x + threadIdx.x); t < tiles; t += int32_t(gridDim.x * blockDim.x))
    if (group_of_tile[t] == group) atomicSub(flags + t, 1u);
}

}  // namespace

void launch_uncount_group(uint32_t* flags, const int32_t* group_of_tile, int32_t tiles, int32_t group,
                          cudaStream_t stream) {
  if (tiles < 1) return;
  uncount_group_kernel<<<(tiles + 255) / 256 < 64 ? (tiles + 255) / 256 : 64, 256, 0, stream>>>(flags, group_of_tile,
                                                                                                tiles, group);
  FO_CUDA_CHECK(cudaGetLastError());
}

void launch_wait_counters(const uint32_t* counters, int32_t count, const CounterTargets& targets, uint64_t timeout_ns,
                          WaitError* err, cudaStream_t stream, const CallCheck& check) {
  if (count < 1 || count > kMaxCounters) throw InvalidArgument("launch_wait_counters: count must be in [1, 8]");
  if (check.slots && (!check.tokens || !check.token_counters || check.parity < 0 || check.parity > 1))
    throw InvalidArgument("launch_wait_counters: the call check needs its token counters and a parity of 0 or 1");
  wait_counters_kernel<<<1, count, 0, stream>>>(counters, targets, timeout_ns, err, check);
  FO_CUDA_CHECK(cudaGetLastError());
}

void launch_signal_counters(uint32_t* const* counters, int32_t count, uint32_t value, cudaStream_t stream,
                            const CallPublish& publish) {
  if (count < 1 || count > kMaxCounters) throw InvalidArgument("launch_signal_counters: count must be in [1, 8]");
  signal_counters_kernel<<<1, count, 0, stream>>>(counters, value, publish);
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
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, uncount_group_kernel));
}

}  // namespace flashoverlap::kernels
