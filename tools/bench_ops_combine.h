// bench_ops_combine.h — the MoE combine of `flashoverlap bench --op alltoall`'s
// baseline (cuBLAS GEMM + ncclSend/ncclRecv + this): a kernel of the tool's
// own (bench_ops_combine.cu), written the plain way a user would, so that the
// baseline does what the public GemmAllToAll does, with nothing of the
// library in it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashoverlap::cli {

// out (tokens x n, row-major) row t = sum over i in [offsets[t], offsets[t+1])
// of gates[i] * rows[index[i]] (rows: received rows x n, row-major), summed
// in fp32 in that order and rounded once to the element type (bf16, or fp16
// when !bf16). A token with no rows gets zeros. All pointers on the device.
void launch_moe_combine(bool bf16, const void* rows, int64_t n, const int64_t* offsets, const int64_t* index,
                        const float* gates, int64_t tokens, void* out, cudaStream_t stream);

}  // namespace flashoverlap::cli
