// send_recv.h — an All-to-All of spans: one NCCL group of ncclSend /
// ncclRecv, what the All-to-All op's groups and the MoE combine's baseline
// both move.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "plan/slot_map.h"

namespace flashoverlap::rt {

// To each peer p, send_to[p] of `send`; from each, recv_from[p] into `recv`
// (spans in elements of `dtype`; empty ones skipped, as the peer skips
// them), on `stream`. This rank's own part: a device copy where
// self_by_copy (no SMs, no NCCL), else an ncclSend / ncclRecv to itself as
// the others. NCCL errors throw Error naming `ctx`.
void send_recv_spans(const void* send, void* recv, const std::vector<plan::Span>& send_to,
                     const std::vector<plan::Span>& recv_from, kernels::DType dtype, ncclComm_t comm, int rank,
                     bool self_by_copy, cudaStream_t stream, const std::string& ctx);

}  // namespace flashoverlap::rt
