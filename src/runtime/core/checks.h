// checks.h — cuBLAS / NCCL status checks that throw flashoverlap::Error
// with the failing call and context (CUDA checks: kernels/cuda_check.h).
#pragma once
#include <cublas_v2.h>
#include <nccl.h>

#include <string>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "kernels/gemm.h"

namespace flashoverlap {

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cuBLAS error ") + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ") in " +
              call + " at " + file + ":" + std::to_string(line));
}
[[noreturn]] inline void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line,
                                          const std::string& context) {
  std::string msg = std::string("NCCL error ") + ncclGetErrorString(r) + " in " + call + " at " + file + ":" +
                    std::to_string(line);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) msg += " (" + std::string(last) + ")";
  if (!context.empty()) msg += " [" + context + "]";
  throw Error(msg);
}

namespace rt {
inline ncclDataType_t nccl_type(kernels::DType t) { return t == kernels::DType::BF16 ? ncclBfloat16 : ncclFloat16; }

}  // namespace rt

}  // namespace flashoverlap

#define FO_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                             \
    cublasStatus_t fo_s_ = (call);                                                                 \
    if (fo_s_ != CUBLAS_STATUS_SUCCESS) ::flashoverlap::throw_cublas_error(fo_s_, #call, __FILE__, __LINE__); \
  } while (0)

#define FO_NCCL_CHECK_CTX(call, ctx)                                                               \
  do {                                                                                             \
    ncclResult_t fo_r_ = (call);                                                                   \
    if (fo_r_ != ncclSuccess) ::flashoverlap::throw_nccl_error(fo_r_, #call, __FILE__, __LINE__, (ctx)); \
  } while (0)

namespace flashoverlap::rt {
// An op's rank and world: its communicator's, or those given where it has
// none (a transport of the caller's); InvalidArgument (after `who`) for
// neither or a rank out of range.
inline void rank_and_world(ncclComm_t comm, bool has_transport, int& rank, int& world, const std::string& who) {
  if (!comm && !has_transport) throw InvalidArgument(who + ": no NCCL communicator and no transport");
  if (comm) {
    FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world), who);
    FO_NCCL_CHECK_CTX(ncclCommUserRank(comm, &rank), who);
  }
  if (world < 1 || rank < 0 || rank >= world)
    throw InvalidArgument(who + ": rank " + std::to_string(rank) + " of " + std::to_string(world));
}
}  // namespace flashoverlap::rt
