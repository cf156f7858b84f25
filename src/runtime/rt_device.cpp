// rt_device.cpp — device discovery and version reporting.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <sstream>

#include "runtime/rt_buffer.h"

namespace flashoverlap::rt {

int hopper_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" state
    return 0;
  }
  int hopper = 0;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) == cudaSuccess && p.major == 9) ++hopper;
  }
  return hopper;
}

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
