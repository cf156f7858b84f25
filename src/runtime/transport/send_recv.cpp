// send_recv.cpp — see send_recv.h.
#include "runtime/transport/send_recv.h"

#include "runtime/core/checks.h"

namespace flashoverlap::rt {

void send_recv_spans(const void* send, void* recv, const std::vector<plan::Span>& send_to,
                     const std::vector<plan::Span>& recv_from, kernels::DType dtype, ncclComm_t comm, int rank,
                     bool self_by_copy, cudaStream_t stream, const std::string& ctx) {
  const char* from = static_cast<const char*>(send);
  char* to = static_cast<char*>(recv);
  const size_t bytes = 2;  // (bf16, fp16)
  const ncclDataType_t type = nccl_type(dtype);
  const int world = int(send_to.size());
  if (self_by_copy && recv_from[size_t(rank)].count)
    FO_CUDA_CHECK(cudaMemcpyAsync(to + recv_from[size_t(rank)].offset * bytes, from + send_to[size_t(rank)].offset * bytes,
                                  size_t(recv_from[size_t(rank)].count) * bytes, cudaMemcpyDeviceToDevice, stream));
  if (self_by_copy && world == 1) return;
  FO_NCCL_CHECK_CTX(ncclGroupStart(), ctx);
  for (int p = 0; p < world; ++p) {
    if (self_by_copy && p == rank) continue;
    const plan::Span& out = send_to[size_t(p)];
    const plan::Span& in = recv_from[size_t(p)];
    if (out.count) FO_NCCL_CHECK_CTX(ncclSend(from + out.offset * bytes, size_t(out.count), type, p, comm, stream), ctx);
    if (in.count) FO_NCCL_CHECK_CTX(ncclRecv(to + in.offset * bytes, size_t(in.count), type, p, comm, stream), ctx);
  }
  FO_NCCL_CHECK_CTX(ncclGroupEnd(), ctx);
}

}  // namespace flashoverlap::rt
