// baselines.cpp — see baselines.h.
#include "runtime/ops/baselines.h"

#include "runtime/core/checks.h"

namespace flashoverlap::rt {
void sequential_cublas_allreduce(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* out,
                                 int m, int n, int k, ncclComm_t comm, cudaStream_t stream) {
  cublas.run(dt, a, b, out, m, n, k, n, stream);
  FO_NCCL_CHECK_CTX(ncclAllReduce(out, out, size_t(m) * n, nccl_type(dt), ncclSum, comm, stream), "sequential");
}

void sequential_ours_allreduce(kernels::DType dt, const void* a, const void* b, void* out, const plan::Schedule& sched,
                               int k, ncclComm_t comm, cudaStream_t stream) {
  kernels::launch_gemm(kernels::plain_gemm(dt, a, b, sched, k, out, sched.n), stream);
  FO_NCCL_CHECK_CTX(ncclAllReduce(out, out, size_t(sched.m) * sched.n, nccl_type(dt), ncclSum, comm, stream),
                    "sequential (our GEMM)");
}

DecompositionAllReduce::DecompositionAllReduce(int chunks, ncclComm_t comm) : chunks_(chunks), comm_(comm) {
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  gemm_done_.resize(chunks);
  for (auto& e : gemm_done_) FO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  FO_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
}

DecompositionAllReduce::~DecompositionAllReduce() {
  if (comm_stream_) cudaStreamSynchronize(comm_stream_);
  for (auto e : gemm_done_) cudaEventDestroy(e);
  if (comm_done_) cudaEventDestroy(comm_done_);
  if (comm_stream_) cudaStreamDestroy(comm_stream_);
}

void DecompositionAllReduce::run(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* out,
                                 int m, int n, int k, cudaStream_t stream) {
  for (int c = 0; c < chunks_; ++c) {
    const int r0 = int(int64_t(m) * c / chunks_), r1 = int(int64_t(m) * (c + 1) / chunks_);
    if (r1 <= r0) continue;
    const char* ac = static_cast<const char*>(a) + int64_t(r0) * k * 2;
    char* oc = static_cast<char*>(out) + int64_t(r0) * n * 2;
    cublas.run(dt, ac, b, oc, r1 - r0, n, k, n, stream);
    FO_CUDA_CHECK(cudaEventRecord(gemm_done_[c], stream));
    FO_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, gemm_done_[c], 0));
    FO_NCCL_CHECK_CTX(ncclAllReduce(oc, oc, size_t(r1 - r0) * n, nccl_type(dt), ncclSum, comm_, comm_stream_),
                      "decomposition chunk " + std::to_string(c));
  }
  FO_CUDA_CHECK(cudaEventRecord(comm_done_, comm_stream_));
  FO_CUDA_CHECK(cudaStreamWaitEvent(stream, comm_done_, 0));
}

}  // namespace flashoverlap::rt
