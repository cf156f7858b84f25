// device.cpp — device discovery and version reporting.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <dlfcn.h>

#include <cstdlib>
#include <sstream>

#include "runtime/core/buffer.h"

namespace flashoverlap::rt {

GpuProbe probe_gpus() {
  GpuProbe g;
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    cudaGetLastError();  // (clears the error state)
    // Without the driver's library CUDA says "insufficient driver": that is
    // a machine without a GPU, not a GPU machine whose CUDA is broken.
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (e == cudaErrorNoDevice) {
      g.reason = "no CUDA device";
      if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) g.reason += std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")";
    } else if (!driver) {
      g.reason = "no NVIDIA driver (libcuda.so.1 not found)";
    } else {
      g.cuda_failed = true;
      g.reason = std::string("CUDA failed to start: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    }
    if (driver) dlclose(driver);
    return g;
  }
  std::string others;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    if (const cudaError_t e = cudaGetDeviceProperties(&p, d); e != cudaSuccess) {
      cudaGetLastError();
      g.cuda_failed = true;
      g.reason = "CUDA failed to query device " + std::to_string(d) + ": " + cudaGetErrorName(e) + " (" +
                 cudaGetErrorString(e) + ")";
      return GpuProbe{0, true, g.reason};
    }
    if (p.major == 9) ++g.hopper;
    else others += (others.empty() ? "" : ", ") + std::string(p.name);
  }
  if (g.hopper == 0)
    g.reason = "no Hopper (sm_90) GPU among " + std::to_string(n) + (n == 1 ? " device (" : " devices (") + others + ")";
  return g;
}

int hopper_device_count() { return probe_gpus().hopper; }

DeviceInfo device_info(int device) {
  DeviceInfo i;
  cudaDeviceProp p{};
  FO_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  i.name = p.name;
  i.sms = p.multiProcessorCount;
  cudaDriverGetVersion(&i.driver);
  cudaRuntimeGetVersion(&i.runtime);
  int cv = 0;
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) == CUBLAS_STATUS_SUCCESS) {
    cublasGetVersion(h, &cv);
    cublasDestroy(h);
  }
  i.cublas = cv;
  ncclGetVersion(&i.nccl);
  return i;
}

int current_device_sms() {
  int dev = 0, sms = 0;
  FO_CUDA_CHECK(cudaGetDevice(&dev));
  FO_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

std::string DeviceInfo::summary() const {
  std::ostringstream os;
  os << name << ", " << sms << " SMs, driver " << driver / 1000 << "." << (driver % 1000) / 10 << ", CUDA runtime "
     << runtime / 1000 << "." << (runtime % 1000) / 10 << ", cuBLAS " << cublas << ", NCCL " << nccl;
  return os.str();
}

}  // namespace flashoverlap::rt
