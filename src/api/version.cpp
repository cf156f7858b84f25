// version.cpp — what the library says of itself and of this machine without
// a communicator: flashoverlap::version(), the project's version, which
// src/api/CMakeLists.txt passes as FO_VERSION (project(... VERSION ...)), and
// flashoverlap::local_gpus().
#include "flashoverlap/flashoverlap.h"
#include "runtime/core/buffer.h"

#ifndef FO_VERSION
#error "FO_VERSION is defined by src/api/CMakeLists.txt"
#endif

const char* flashoverlap::version() { return FO_VERSION; }

flashoverlap::LocalGpus flashoverlap::local_gpus() {
  try {
    const rt::GpuProbe p = rt::probe_gpus();
    return LocalGpus{p.hopper, p.cuda_failed, p.reason};
  } catch (const std::exception& e) {
    return LocalGpus{0, true, std::string("the GPU probe failed: ") + e.what()};
  }
}
