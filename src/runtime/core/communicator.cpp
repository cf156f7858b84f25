// communicator.cpp — see communicator.h.
#include "runtime/core/communicator.h"

#include <dlfcn.h>

#include <cstring>
#include <string>

#include "runtime/core/checks.h"

namespace flashoverlap::rt {
namespace {

ncclConfig_t make_config(const CommOptions& o) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  if (o.min_ctas > 0) cfg.minCTAs = o.min_ctas;
  if (o.max_ctas > 0) cfg.maxCTAs = o.max_ctas;
  if (o.cga_cluster_size > 0) cfg.cgaClusterSize = o.cga_cluster_size;
  if (o.cta_policy >= 0) cfg.CTAPolicy = o.cta_policy;
  return cfg;
}

}  // namespace

void Communicator::Deleter::operator()(ncclComm* c) const {
  if (c && owned) ncclCommDestroy(c);
}

void Communicator::init_rank_info() {
  FO_NCCL_CHECK_CTX(ncclCommUserRank(comm_.get(), &rank_), "ncclCommUserRank");
  FO_NCCL_CHECK_CTX(ncclCommCount(comm_.get(), &world_), "ncclCommCount");
}

Communicator Communicator::adopt(ncclComm_t comm) {
  if (!comm) throw InvalidArgument("Communicator::adopt: null ncclComm_t");
  Communicator c;
  c.comm_ = std::unique_ptr<ncclComm, Deleter>(comm, Deleter{false});
  c.init_rank_info();
  return c;
}

Communicator Communicator::create(Rendezvous& rv, const CommOptions& opts) {
  ncclUniqueId id{};
  if (rv.rank() == 0)
    FO_NCCL_CHECK_CTX(ncclGetUniqueId(&id), "rank 0 creating the NCCL unique id");
  const auto bytes = rv.broadcast(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&id), sizeof(id)));
  if (bytes.size() != sizeof(id)) throw Error("rendezvous returned a unique id of the wrong size");
  std::memcpy(&id, bytes.data(), sizeof(id));
  return init(id, rv.rank(), rv.world(), opts);
}

Communicator Communicator::init(const ncclUniqueId& id, int rank, int world, const CommOptions& opts) {
  if (world < 1 || rank < 0 || rank >= world)
    throw InvalidArgument("Communicator: rank " + std::to_string(rank) + " is not in [0, world " + std::to_string(world) +
                          ")");
  ncclConfig_t cfg = make_config(opts);
  ncclComm_t comm = nullptr;
  const std::string ctx = "rank " + std::to_string(rank) + " of " + std::to_string(world);
  FO_NCCL_CHECK_CTX(ncclCommInitRankConfig(&comm, world, id, rank, &cfg), ctx);
  Communicator c;
  c.comm_ = std::unique_ptr<ncclComm, Deleter>(comm, Deleter{true});
  c.init_rank_info();
  return c;
}

Communicator Communicator::split(const CommOptions& opts) const {
  ncclConfig_t cfg = make_config(opts);
  ncclComm_t comm = nullptr;
  FO_NCCL_CHECK_CTX(ncclCommSplit(comm_.get(), 0, rank_, &comm, &cfg),
                    "rank " + std::to_string(rank_) + " splitting with maxCTAs " + std::to_string(opts.max_ctas));
  Communicator c;
  c.comm_ = std::unique_ptr<ncclComm, Deleter>(comm, Deleter{true});
  c.init_rank_info();
  return c;
}

namespace {

// ncclCommRevoke of the NCCL this library runs against, looked up at run
// time (NCCL 2.28.9 on): the NCCL built against may be older than the one
// loaded (PyTorch's wheel brings its own), or newer. Null where it has none.
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
RevokeFn loaded_revoke() {
  static const RevokeFn fn = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0 || !info.dli_fname) return RevokeFn{};
    void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);  // (loaded already: no second copy)
    return lib ? reinterpret_cast<RevokeFn>(dlsym(lib, "ncclCommRevoke")) : RevokeFn{};
  }();
  return fn;
}

}  // namespace

bool can_revoke_communicators() { return loaded_revoke() != nullptr; }

void revoke_communicator(ncclComm_t comm) {
  const RevokeFn revoke = loaded_revoke();
  if (!revoke) {
    int version = 0;
    (void)ncclGetVersion(&version);
    throw Error("the NCCL loaded (" + std::to_string(version) +
                ") has no ncclCommRevoke (2.28.9 on): the op's NCCL kernels may keep waiting");
  }
  const ncclResult_t r = revoke(comm, 0);  // (NCCL_REVOKE_DEFAULT)
  if (r != ncclSuccess) throw Error(std::string("ncclCommRevoke: ") + ncclGetErrorString(r));
}

}  // namespace flashoverlap::rt
