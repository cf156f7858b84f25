// communicator.cpp — flashoverlap::Communicator (flashoverlap.h).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "api/communicator_impl.h"
#include "kernels/cuda_check.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "process/bootstrap.h"

namespace flashoverlap {
namespace {

// The ops need a Hopper GPU: say so (and why none is usable) before CUDA or NCCL fail on their own terms.
void require_gpu(const char* what) {
  const rt::GpuProbe p = rt::probe_gpus();
  if (p.hopper < 1) throw Error(std::string(what) + ": no usable Hopper (sm_90) GPU: " + p.reason);
}

// The NCCL the process runs on (one libnccl.so.2 serves it: PyTorch's, if it
// came first) must have what the library uses: 2.28's symmetric windows and
// device API, the zero-CTA policy. Refused here, not by a failure later.
void require_nccl(const char* what) {
  int v = 0;
  FO_NCCL_CHECK_CTX(ncclGetVersion(&v), what);
  if (v < 22800 || v >= 30000)
    throw Error(std::string(what) + ": NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                std::to_string(v % 100) + " runs in this process; FlashOverlap needs 2.28 or a later 2.x");
}

}  // namespace

Communicator Communicator::adopt(ncclComm_t comm) {
  if (!comm) throw InvalidArgument("Communicator::adopt: the ncclComm_t is null");
  require_nccl("Communicator::adopt");
  return Communicator(std::make_shared<Impl>(Impl{rt::Communicator::adopt(comm)}));
}

Communicator Communicator::from_env() {
  require_gpu("Communicator::from_env");
  require_nccl("Communicator::from_env");
  const std::optional<rt::DistEnv> env = rt::DistEnv::from_env();
  if (!env) {  // one process: a communicator of one rank
    FO_CUDA_CHECK(cudaFree(nullptr));  // (the current device's context)
    return from_unique_id(unique_id(), 0, 1);
  }
  int devices = 0;
  FO_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (env->local_rank >= devices)
    throw InvalidArgument("Communicator::from_env: rank " + std::to_string(env->rank) + " has LOCAL_RANK " +
                          std::to_string(env->local_rank) + " but " + std::to_string(devices) + " GPUs are visible");
  FO_CUDA_CHECK(cudaSetDevice(env->local_rank));
  rt::DistEnv hub = *env;
  // Under torchrun its agent's store listens on MASTER_PORT: the hub takes the next port.
  if (std::getenv("TORCHELASTIC_RUN_ID") && hub.master_port < 65535) ++hub.master_port;
  rt::Rendezvous rv(hub);
  return Communicator(std::make_shared<Impl>(Impl{rt::Communicator::create(rv)}));
}

Communicator Communicator::from_unique_id(const ncclUniqueId& id, int rank, int world) {
  require_gpu("Communicator::from_unique_id");
  require_nccl("Communicator::from_unique_id");
  return Communicator(std::make_shared<Impl>(Impl{rt::Communicator::init(id, rank, world)}));
}

ncclUniqueId Communicator::unique_id() {
  ncclUniqueId id{};
  FO_NCCL_CHECK_CTX(ncclGetUniqueId(&id), "Communicator::unique_id");
  return id;
}

ncclComm_t Communicator::get() const { return impl_->comm.get(); }
int Communicator::rank() const { return impl_->comm.rank(); }
int Communicator::world() const { return impl_->comm.world(); }

}  // namespace flashoverlap
