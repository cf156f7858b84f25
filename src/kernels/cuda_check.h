// cuda_check.h — CUDA runtime error checking that throws flashoverlap::Error
// with the failing call, the error string and the caller's context.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "flashoverlap/error.h"

namespace flashoverlap {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line,
                                          const std::string& context = {}) {
  // The error is reported here, by the exception: cleared from the runtime's
  // state, so that the next call's launch check does not report it again.
  (void)cudaGetLastError();
  std::string msg = std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " +
                    call + " at " + file + ":" + std::to_string(line);
  if (!context.empty()) msg += " [" + context + "]";
  throw Error(msg);
}

// A CUDA driver function, resolved through the runtime (binaries do not link
// libcuda, so they start on machines without a driver). Throws if missing.
template <typename Fn>
Fn driver_entry_point(const char* name, int version);

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

namespace flashoverlap {
// Whether stream is being captured into a CUDA graph (a capture forbids
// allocation and host waits, and freezes launch arguments).
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FO_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

template <typename Fn>
Fn driver_entry_point(const char* name, int version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  FO_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !f) throw Error(std::string(name) + " is not available from the driver");
  return reinterpret_cast<Fn>(f);
}
}  // namespace flashoverlap
