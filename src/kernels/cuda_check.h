// cuda_check.h — CUDA runtime error checking that throws flashoverlap::Error
// with the failing call, the error string and the caller's context.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line,
                                          const std::string& context = {}) {
  std::string msg = std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " +
                    call + " at " + file + ":" + std::to_string(line);
  if (!context.empty()) msg += " [" + context + "]";
  throw Error(msg);
}

}  // namespace flashoverlap

#define FO_CUDA_CHECK(call)                                                         \
  do {                                                                              \
    cudaError_t fo_err_ = (call);                                                   \
    if (fo_err_ != cudaSuccess) ::flashoverlap::throw_cuda_error(fo_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define FO_CUDA_CHECK_CTX(call, ctx)                                                \
  do {                                                                              \
    cudaError_t fo_err_ = (call);                                                   \
    if (fo_err_ != cudaSuccess) ::flashoverlap::throw_cuda_error(fo_err_, #call, __FILE__, __LINE__, (ctx)); \
  } while (0)
