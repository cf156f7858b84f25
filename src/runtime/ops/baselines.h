// baselines.h — what users run today, behind the same harness as the
// overlapped ops: GEMM then one AllReduce or ReduceScatter (cuBLAS or our
// GEMM), and the decomposition baselines (M split into chunks, each chunk's
// collective on a second stream while the next chunk's GEMM runs).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "kernels/gemm.h"
#include "plan/schedule.h"
#include "runtime/core/cublas.h"

namespace flashoverlap::rt {

// out (m x n, row-major) = AllReduce(A B^T): cuBLAS, then ncclAllReduce.
void sequential_cublas_allreduce(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* out,
                                 int m, int n, int k, ncclComm_t comm, cudaStream_t stream);
// The same with our GEMM (plain epilogue, full grid of `sched`).
void sequential_ours_allreduce(kernels::DType dt, const void* a, const void* b, void* out, const plan::Schedule& sched,
                               int k, ncclComm_t comm, cudaStream_t stream);

// Rows each rank ends with in the ReduceScatter baselines: ceil(m / W), W
// the ranks of `comm`.
int64_t reducescatter_rows(int64_t m, ncclComm_t comm);
// out (reducescatter_rows(m) x n, row-major) = this rank's rows [r R, (r+1) R)
// of the sum over ranks of A B^T: cuBLAS into c (W R x n, row-major), then
// one ncclReduceScatter of c. Where m % W != 0, c's rows past m are sent as
// they are (never written here): their sums land in rows past m, which the
// last rank's output holds for nothing.
void sequential_cublas_reducescatter(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* c,
                                     void* out, int m, int n, int k, ncclComm_t comm, cudaStream_t stream);
// The same with our GEMM (plain epilogue, full grid of `sched`: sched.m rows).
void sequential_ours_reducescatter(kernels::DType dt, const void* a, const void* b, void* c, void* out,
                                   const plan::Schedule& sched, int k, ncclComm_t comm, cudaStream_t stream);

// The second stream of a decomposition baseline and its events: chunk c's
// GEMM on the caller's stream, its collective on comm_stream().
class ChunkStreams {
 public:
  explicit ChunkStreams(int chunks);
  ~ChunkStreams();  // waits for the second stream
  ChunkStreams(const ChunkStreams&) = delete;
  ChunkStreams& operator=(const ChunkStreams&) = delete;
  int chunks() const { return chunks_; }

 protected:
  // The second stream, once `stream`'s work so far (chunk c's GEMM) is done.
  cudaStream_t hand_over(int c, cudaStream_t stream);
  // `stream` goes on once the second stream's work so far is done.
  void join(cudaStream_t stream);

 private:
  int chunks_;
  cudaStream_t comm_stream_ = nullptr;
  std::vector<cudaEvent_t> gemm_done_;
  cudaEvent_t comm_done_ = nullptr;
};

class DecompositionAllReduce : public ChunkStreams {
 public:
  DecompositionAllReduce(int chunks, ncclComm_t comm) : ChunkStreams(chunks), comm_(comm) {}
  void run(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* out, int m, int n, int k,
           cudaStream_t stream);

 private:
  ncclComm_t comm_;
};

// ReduceScatter decomposed: every rank block of C (rank r's rows [r R,
// (r+1) R), R = reducescatter_rows(m)) cut alike into `chunks` row ranges
// [r0, r1) (whole 128-row tiles where R has that many, else an even split);
// chunk c is W cuBLAS GEMMs, block r's rows r R + [r0, r1) of A into the
// chunk's part for rank r of `send` (chunk c at W r0 rows: [W][r1 - r0] x n),
// then, on the second stream while the next chunk's GEMMs run, one
// ncclReduceScatter of that part into rows [r0, r1) of out (R x n). `send`
// holds W R x n elements; rows past m: as sequential_cublas_reducescatter.
class DecompositionReduceScatter : public ChunkStreams {
 public:
  DecompositionReduceScatter(int chunks, ncclComm_t comm);
  void run(CublasGemm& cublas, kernels::DType dt, const void* a, const void* b, void* send, void* out, int m, int n,
           int k, cudaStream_t stream);

 private:
  ncclComm_t comm_;
  int world_ = 1;
};

}  // namespace flashoverlap::rt
