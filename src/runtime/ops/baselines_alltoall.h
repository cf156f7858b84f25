// baselines_alltoall.h — the MoE combine as users run it today, for the
// benchmarks: the expert's GEMM (cuBLAS) into row-major Y, the rows sent back
// with ncclSend / ncclRecv (all_to_all_single's split sizes), then the
// combine. Rows must come in dispatch order (plan::make_moe_routing: by
// destination rank), so each destination's rows are one block of Y; the
// received rows are in (source rank, source row) order. The combine is our
// kernel (kernels::combine_slot_rows on the row-major rows: PyTorch's
// index_add of weighted rows is timed by bench/torch_alltoall.py).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "kernels/gemm.h"
#include "plan/routing.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/baselines.h"

namespace flashoverlap::rt {

class MoeCombineBaseline : public ChunkStreams {
 public:
  // For `rank` of the routing (every rank's, the same on all), n columns.
  // Throws InvalidArgument when a rank's rows are not by destination, or
  // n % 8 != 0 (the combine reads 8 columns at a time).
  MoeCombineBaseline(const plan::MoeRouting& routing, int rank, int64_t n, kernels::DType dtype, ncclComm_t comm,
                     int chunks = 1);
  // y: this rank's m x n rows (row-major) where the GEMM writes them;
  // recv: the received rows (recv_rows() x n). out: tokens x n (combine).
  // chunks == 1: the GEMM, one all-to-all, the combine; more: the rows cut
  // into `chunks` ranges on every rank, each range's GEMM then (on the
  // second stream, beside the next range's GEMM) its rows' all-to-all.
  void run(CublasGemm& cublas, const void* a, const void* b, int k, void* y, void* recv, void* out,
           cudaStream_t stream, bool combine = true);
  // The all-to-all alone (the ideal's component), of y already computed;
  // the combine alone, of the received rows (with all_to_all after a GEMM
  // of one's own: the reference of other GEMMs).
  void all_to_all(const void* y, void* recv, cudaStream_t stream) const;
  void combine(const void* recv, void* out, cudaStream_t stream) const;
  int64_t rows() const { return rows_; }
  int64_t recv_rows() const { return recv_rows_; }
  int32_t tokens() const { return tokens_; }

 private:
  // Rows [r0, r1) of this rank's, each to its destination, and from every
  // source s its rows [c0_s, c1_s) (chunk c of its rows), in one NCCL group.
  void exchange(const void* y, void* recv, int chunk, int chunks, cudaStream_t stream) const;

  const plan::MoeRouting& routing_;
  int rank_ = 0, world_ = 1;
  int64_t n_ = 0, rows_ = 0, recv_rows_ = 0;
  int32_t tokens_ = 0;
  kernels::DType dtype_;
  ncclComm_t comm_ = nullptr;
  std::vector<int64_t> block_of_;     // [W + 1]: this rank's rows to d: [block_of_[d], block_of_[d+1])
  std::vector<int64_t> from_;         // [W + 1]: rows from s at recv rows [from_[s], from_[s+1])
  std::vector<int64_t> src_block_at_;  // [W]: where source s's block for this rank starts among its rows
  DeviceBuffer slot_of_out_, token_begin_, token_rows_, gate_;
};

}  // namespace flashoverlap::rt
