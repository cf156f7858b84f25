// GPU tests of rt::HostGate, the timing harness's hold on a stream until the
// host has queued a run (skipped without a Hopper GPU).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "runtime/core/buffer.h"
#include "runtime/tune/host_gate.h"
#include "runtime/tune/timing.h"
#include "gpu_test_util.h"

using namespace flashoverlap;

namespace {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { FO_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Work queued after hold() does not run before release(), and runs after it.
TEST(HostGate, HoldsUntilReleased) {
  REQUIRE_HOPPER();
  Stream st;
  rt::HostGate gate;
  cudaEvent_t after;
  FO_CUDA_CHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  for (int round = 0; round < 3; ++round) {  // tickets move on
    gate.hold(st.s);
    FO_CUDA_CHECK(cudaEventRecord(after, st.s));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady) << "round " << round;
    gate.release();
    FO_CUDA_CHECK(cudaEventSynchronize(after));
    EXPECT_NO_THROW(gate.check());
  }
  cudaEventDestroy(after);
}

// A hold nobody releases ends after its timeout, the stream moves on, and
// check() says so instead of the process hanging.
TEST(HostGate, UnreleasedHoldTimesOutWithAMessage) {
  REQUIRE_HOPPER();
  Stream st;
  rt::HostGate gate;
  const auto t0 = std::chrono::steady_clock::now();  // (before the hold: it cannot start earlier)
  gate.hold(st.s, 50'000'000);  // 50 ms
  FO_CUDA_CHECK(cudaStreamSynchronize(st.s));
  // (the hold's 50 ms are the GPU's clock from its start; 1 ms for the two clocks' granularity)
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(49));
  try {
    gate.check();
    FAIL() << "check() did not report the timed-out hold";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
}

// With the gate, time_interleaved does not time the host's enqueue: a run
// whose host side sleeps 2 ms before a tiny launch times far below 2 ms,
// and the host time it reports still shows the sleep. (Bounds on either
// side of 1 ms: ungated, the stop event is queued at least 2 ms after the
// start event on an idle stream; gated, the run is a 256-byte memset, microseconds.)
TEST(HostGate, TimedRunsExcludeTheHostsEnqueue) {
  REQUIRE_HOPPER();
  Stream st;
  rt::HostGate gate;
  void* buf = nullptr;
  FO_CUDA_CHECK(cudaMalloc(&buf, 256));
  auto slow_host = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    FO_CUDA_CHECK(cudaMemsetAsync(buf, 0, 256, st.s));
  };
  const auto without = rt::time_interleaved({slow_host}, st.s, 1, 5).front();
  const auto with = rt::time_interleaved({slow_host}, st.s, 1, 5, {}, &gate).front();
  cudaFree(buf);
  EXPECT_GT(without.median_ms, 1.0);
  EXPECT_LT(with.median_ms, 1.0);
  EXPECT_GE(with.host_median_us, 2000);  // (sleep_for sleeps at least that long)
}

}  // namespace
