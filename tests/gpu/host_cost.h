// host_cost.h — what a call costs the host: the wall time of enqueuing
// `per_round` calls while the stream is held (the host gate, so that the
// GPU never drains the queue meanwhile), per call, the median of `rounds`
// rounds, the alternatives in turns (each first in every other round).
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "runtime/tune/host_gate.h"

namespace flashoverlap::test {

inline std::vector<double> host_us_per_call(const std::vector<std::function<void()>>& calls, cudaStream_t stream,
                                            int rounds = 9, int per_round = 100) {
  rt::HostGate gate;
  for (const auto& f : calls) f();  // (warm: plans, cuBLAS's algorithms)
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::vector<double>> us(calls.size());
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < calls.size(); ++i) {
      const size_t j = round % 2 ? calls.size() - 1 - i : i;
      gate.hold(stream);
      const auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < per_round; ++c) calls[j]();
      us[j].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                      per_round);
      gate.release();
      FO_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  gate.check();
  std::vector<double> median;
  for (auto& v : us) {
    std::sort(v.begin(), v.end());
    median.push_back(v[v.size() / 2]);
  }
  return median;
}

// For each m: the op's call (ours(m)) costs the host at most 3 us more than
// what a C++ user runs instead (theirs(m)); both printed with the op's plan.
inline void expect_host_cost_within_3us(const char* theirs_name, const char* ours_name, std::vector<int64_t> ms,
                                        const std::function<void(int64_t)>& theirs,
                                        const std::function<void(int64_t)>& ours,
                                        const std::function<std::string(int64_t)>& plan, cudaStream_t stream) {
  for (int64_t m : ms) {
    const std::vector<double> us = host_us_per_call({[&] { theirs(m); }, [&] { ours(m); }}, stream);
    std::fprintf(stderr, "host per call, m %lld: %s %.2f us, %s %.2f us (%s)\n", (long long)m, theirs_name, us[0],
                 ours_name, us[1], plan(m).c_str());
    EXPECT_LE(us[1], us[0] + 3.0) << "m " << m << ": " << plan(m);
  }
}

}  // namespace flashoverlap::test
