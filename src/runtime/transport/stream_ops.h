// stream_ops.h — the driver's stream memory operations (a wait for, or a
// write of, a 32-bit word executed by the GPU's front end: no SM), resolved
// once through the runtime's driver entry points.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include "kernels/cuda_check.h"

namespace flashoverlap::rt {

inline PFN_cuStreamWaitValue32_v11070 stream_wait_fn() {
  static const auto fn = driver_entry_point<PFN_cuStreamWaitValue32_v11070>("cuStreamWaitValue32", 11070);
  return fn;
}

inline PFN_cuStreamWriteValue32_v11070 stream_write_fn() {
  static const auto fn = driver_entry_point<PFN_cuStreamWriteValue32_v11070>("cuStreamWriteValue32", 11070);
  return fn;
}

}  // namespace flashoverlap::rt
