// rank_harness.h — what the multi-GPU tests share: one thread per GPU with
// one NCCL communicator each (ncclCommInitAll), schedules, random groups.
#pragma once
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "plan/partition.h"
#include "plan/schedule.h"
#include "runtime/core/checks.h"
#include "runtime/core/communicator.h"
#include "runtime/ops/allreduce.h"
#include "gpu_test_util.h"

namespace flashoverlap::test {


// Runs body(rank, comm) on `world` threads, rank r on GPU r; rethrows the
// first failure once every thread has returned.
inline void on_each_rank(int world, const std::function<void(int, ncclComm_t)>& body) {
  const size_t w = static_cast<size_t>(world);
  std::vector<ncclComm_t> comms(w);
  std::vector<int> devs(w);
  for (int r = 0; r < world; ++r) devs[size_t(r)] = r;
  FO_NCCL_CHECK_CTX(ncclCommInitAll(comms.data(), world, devs.data()), "test comms");
  std::vector<std::exception_ptr> errors(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        FO_CUDA_CHECK(cudaSetDevice(r));
        body(r, comms[size_t(r)]);
      } catch (const std::exception& e) {
        // Said at once: the other ranks may now block in an NCCL call for ever.
        std::fprintf(stderr, "rank %d failed: %s\n", r, e.what());
        errors[size_t(r)] = std::current_exception();
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto c : comms) ncclCommDestroy(c);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

inline plan::Schedule sched_for(int m, int n, int bn, int ctas, int swizzle) {
  plan::Schedule s;
  s.m = m, s.n = n, s.bm = 128, s.bn = bn, s.ctas = ctas, s.raster = plan::Raster::AlongN, s.swizzle = swizzle;
  return s;
}

inline plan::Partition random_partition(int waves, std::mt19937_64& rng) {
  plan::Partition p;
  for (int left = waves; left > 0;) {
    const int s = 1 + int(rng() % uint64_t(std::min(left, 4)));
    p.push_back(s);
    left -= s;
  }
  return p;
}

// Random groups for the layout: runs of waves (Slots) or of row bands; at
// least two where there are two units (one group runs the sequential fallback).
inline std::vector<plan::Group> random_groups(const plan::Schedule& s, rt::ArLayout layout, std::mt19937_64& rng) {
  const int units = rt::is_banded(layout) ? plan::band_count(s) : s.waves();
  plan::Partition p = random_partition(units, rng);
  if (p.size() == 1 && units >= 2) p = {1, units - 1};
  return rt::is_banded(layout) ? plan::band_groups(s, p) : plan::make_groups(s, p);
}

// W ops' NVLink forms side by side on one GPU (OverlapAllToAll's,
// OverlapReduceScatter's): every rank's window is this GPU's memory,
// connected by hand, so that each op's GEMM stores into the others' as it
// would over NVLink, and the ranks, whose calls are enqueued one after
// another on their own streams, meet on the device through their arrival
// counters alone (no transport runs). each(o, r): rank r's options besides
// its rank (a fault to inject).
template <class Op, class Options>
struct NvlinkRanks {
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<cudaStream_t> streams;
  NvlinkRanks(int world, Options o, const std::function<void(Options&, int)>& each = {}) {
    o.comm = nullptr, o.tail_comm = nullptr, o.core = nullptr, o.world = world, o.nvlink = true;
    o.transport = [](const auto&) { throw Error("the NVLink form called a transport"); };
    for (int r = 0; r < world; ++r) {
      Options x = o;
      x.rank = r;
      if (each) each(x, r);
      ops.push_back(std::make_unique<Op>(x));
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      streams.push_back(st);
    }
    std::vector<void*> windows;
    for (auto& op : ops) windows.push_back(op->window());
    for (auto& op : ops) op->connect_peers(windows);
    FO_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~NvlinkRanks() {
    ops.clear();
    for (cudaStream_t st : streams) cudaStreamDestroy(st);
  }
  NvlinkRanks(const NvlinkRanks&) = delete;
  NvlinkRanks& operator=(const NvlinkRanks&) = delete;
};

}  // namespace flashoverlap::test
