// baselines.cpp — see baselines.h.
#include "runtime/ops/baselines.h"

#include <algorithm>

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

int64_t reducescatter_rows(int64_t m, ncclComm_t comm) {
  int world = 1;
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world), "ReduceScatter baseline");
  return (m + world - 1) / world;
}

void sequential_cublas_reducescatter(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* c,
                                     void* out, int m, int n, int k, ncclComm_t comm, cudaStream_t stream) {
  cublas.run(dt, a, b, c, m, n, k, n, stream);
  FO_NCCL_CHECK_CTX(ncclReduceScatter(c, out, size_t(reducescatter_rows(m, comm)) * n, nccl_type(dt), ncclSum, comm,
                                      stream),
                    "sequential ReduceScatter");
}

void sequential_ours_reducescatter(kernels::DType dt, const void* a, const void* b, void* c, void* out,
                                   const plan::Schedule& sched, int k, ncclComm_t comm, cudaStream_t stream) {
  kernels::launch_gemm(kernels::plain_gemm(dt, a, b, sched, k, c, sched.n), stream);
  FO_NCCL_CHECK_CTX(ncclReduceScatter(c, out, size_t(reducescatter_rows(sched.m, comm)) * sched.n, nccl_type(dt),
                                      ncclSum, comm, stream),
                    "sequential ReduceScatter (our GEMM)");
}

ChunkStreams::ChunkStreams(int chunks) : chunks_(chunks) {
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  gemm_done_.resize(chunks);
  for (auto& e : gemm_done_) FO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  FO_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
}

ChunkStreams::~ChunkStreams() {
  if (comm_stream_) cudaStreamSynchronize(comm_stream_);
  for (auto e : gemm_done_) cudaEventDestroy(e);
  if (comm_done_) cudaEventDestroy(comm_done_);
  if (comm_stream_) cudaStreamDestroy(comm_stream_);
}

cudaStream_t ChunkStreams::hand_over(int c, cudaStream_t stream) {
  FO_CUDA_CHECK(cudaEventRecord(gemm_done_[c], stream));
  FO_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, gemm_done_[c], 0));
  return comm_stream_;
}

void ChunkStreams::join(cudaStream_t stream) {
  FO_CUDA_CHECK(cudaEventRecord(comm_done_, comm_stream_));
  FO_CUDA_CHECK(cudaStreamWaitEvent(stream, comm_done_, 0));
}

void DecompositionAllReduce::run(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* out,
                                 int m, int n, int k, cudaStream_t stream) {
  for (int c = 0; c < chunks(); ++c) {
    const int r0 = int(int64_t(m) * c / chunks()), r1 = int(int64_t(m) * (c + 1) / chunks());
    if (r1 <= r0) continue;
    const char* ac = static_cast<const char*>(a) + int64_t(r0) * k * 2;
    char* oc = static_cast<char*>(out) + int64_t(r0) * n * 2;
    cublas.run(dt, ac, b, oc, r1 - r0, n, k, n, stream);
    FO_NCCL_CHECK_CTX(ncclAllReduce(oc, oc, size_t(r1 - r0) * n, nccl_type(dt), ncclSum, comm_, hand_over(c, stream)),
                      "decomposition chunk " + std::to_string(c));
  }
  join(stream);
}

DecompositionReduceScatter::DecompositionReduceScatter(int chunks, ncclComm_t comm) : ChunkStreams(chunks), comm_(comm) {
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world_), "ReduceScatter decomposition");
}

void DecompositionReduceScatter::run(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* send,
                                     void* out, int m, int n, int k, cudaStream_t stream) {
  const int64_t R = reducescatter_rows(m, comm_), W = world_;
  // Chunk edges in whole 128-row tiles of the block where it has a tile per chunk.
  const int64_t unit = R >= 128 * int64_t(chunks()) ? 128 : 1, units = (R + unit - 1) / unit;
  auto edge = [&](int c) { return std::min(R, units * c / chunks() * unit); };
  for (int c = 0; c < chunks(); ++c) {
    const int64_t r0 = edge(c), r1 = edge(c + 1), rows = r1 - r0;
    if (rows <= 0) continue;  // (the same on every rank: R is)
    char* part = static_cast<char*>(send) + W * r0 * n * 2;  // [W][rows] x n
    for (int64_t r = 0; r < W; ++r) {
      const int64_t g0 = r * R + r0, g1 = std::min<int64_t>(r * R + r1, m);  // block r's rows of A
      if (g1 > g0)
        cublas.run(dt, static_cast<const char*>(a) + g0 * k * 2, b, part + r * rows * n * 2, int(g1 - g0), n, k, n,
                   stream);
    }
    FO_NCCL_CHECK_CTX(ncclReduceScatter(part, static_cast<char*>(out) + r0 * n * 2, size_t(rows) * n, nccl_type(dt),
                                        ncclSum, comm_, hand_over(c, stream)),
                      "ReduceScatter decomposition chunk " + std::to_string(c));
  }
  join(stream);
}

}  // namespace flashoverlap::rt
