// timing.h — device timing with CUDA events (docs/design.md §8):
// warm-up first, then each run timed on its own, median reported.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "kernels/cuda_check.h"
#include "runtime/tune/host_gate.h"
#include "runtime/tune/turn_order.h"

namespace flashoverlap::rt {

struct TimingStats {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  std::vector<double> runs_ms;
  double host_median_us = 0;  // the host's enqueue of a run (the call between the events), median
};

inline TimingStats summarize(std::vector<double> runs) {
  TimingStats s;
  s.runs_ms = runs;
  if (runs.empty()) return s;
  std::sort(runs.begin(), runs.end());
  const size_t n = runs.size();
  s.median_ms = n % 2 ? runs[n / 2] : 0.5 * (runs[n / 2 - 1] + runs[n / 2]);
  s.min_ms = runs.front();
  s.max_ms = runs.back();
  return s;
}

// Times several alternatives in turns (run i of each, then run i+1 of each),
// so that slow drifts of the GPU's clocks or temperature hit all of them
// alike; each round in the order turn_order(n, round), so that each follows
// each other equally often (the GPUs are power-capped: a run right after a
// heavier one starts at a lower clock). `before_each` (optional) is enqueued
// before every run, outside the timed region (e.g. a sync between ranks).
// With `gate`, the stream is held before `before_each` until the host has
// queued the run (host_gate.h): the host's enqueue is then not timed.
// Stats in the order given.
inline std::vector<TimingStats> time_interleaved(const std::vector<std::function<void()>>& fns, cudaStream_t stream,
                                                 int warmup, int iters,
                                                 const std::function<void()>& before_each = {},
                                                 HostGate* gate = nullptr) {
  cudaEvent_t start, stop;
  FO_CUDA_CHECK(cudaEventCreate(&start));
  FO_CUDA_CHECK(cudaEventCreate(&stop));
  const size_t n = fns.size();
  for (int i = 0; i < warmup; ++i)
    for (size_t j : turn_order(n, size_t(i))) {
      if (before_each) before_each();
      fns[j]();
    }
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::vector<double>> runs(fns.size()), host_us(fns.size());
  for (int i = 0; i < iters; ++i)
    for (size_t j : turn_order(n, size_t(i))) {
      if (gate) gate->hold(stream);
      if (before_each) before_each();
      FO_CUDA_CHECK(cudaEventRecord(start, stream));
      const auto t0 = std::chrono::steady_clock::now();
      fns[j]();
      host_us[j].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      FO_CUDA_CHECK(cudaEventRecord(stop, stream));
      if (gate) gate->release();
      FO_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      FO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      runs[j].push_back(ms);
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (gate) gate->check();
  std::vector<TimingStats> out;
  for (size_t j = 0; j < n; ++j) {
    out.push_back(summarize(std::move(runs[j])));
    out.back().host_median_us = summarize(std::move(host_us[j])).median_ms;  // (µs here)
  }
  return out;
}

// Times `enqueue` (which enqueues work on `stream`) between two events;
// with `gate` (default), each run queued whole first (host_gate.h).
inline TimingStats time_on_stream(const std::function<void()>& enqueue, cudaStream_t stream, int warmup, int iters,
                                  bool gate = true) {
  return time_interleaved({enqueue}, stream, warmup, iters, {}, gate ? &thread_gate() : nullptr).front();
}

}  // namespace flashoverlap::rt
