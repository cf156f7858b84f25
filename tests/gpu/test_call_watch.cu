// The call watch on a GPU (runtime/core/call_watch.h): a call whose work
// runs past the timeout (here a kernel spinning on a host flag, standing for
// a collective whose peer died) fails its op within the timeout and a poll,
// with a message, and runs the op's failure action (the ops revoke their
// own communicators: here a communicator of one rank); calls that complete
// do not fail; under CUDA graph capture nothing is recorded; a watch turned
// off watches nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "flashoverlap/error.h"
#include "gpu_test_util.h"
#include "kernels/cuda_check.h"
#include "runtime/core/call_watch.h"
#include "runtime/core/communicator.h"

namespace fo = flashoverlap;

namespace {

__global__ void spin_until_set(const volatile uint32_t* flag) {
  while (*flag == 0) {
  }
}

__global__ void nothing() {}

}  // namespace

TEST(CallWatchGpu, ACallPastItsTimeoutFailsWithAMessageAndRevokesTheOpsCommunicator) {
  REQUIRE_HOPPER();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  fo::rt::Communicator comm = fo::rt::Communicator::init(id, 0, 1);
  uint32_t* flag = nullptr;
  FO_CUDA_CHECK(cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped));
  *flag = 0;
  uint32_t* dflag = nullptr;
  FO_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dflag), flag, 0));
  cudaStream_t s;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    fo::rt::CallWatch w("a test op (rank 0 of 1)", 0.3);
    std::atomic<int> revoked{0};
    const ncclComm_t c = comm.get();
    w.on_failure([&revoked, c] {
      ++revoked;
      if (fo::rt::can_revoke_communicators())
        EXPECT_NO_THROW(fo::rt::revoke_communicator(c));
      else
        EXPECT_THROW(fo::rt::revoke_communicator(c), fo::Error);  // (this NCCL cannot: said so)
    });
    // Calls that complete: nothing fails, however many.
    for (int i = 0; i < 100; ++i) {
      const fo::rt::CallWatch::Scope call(w, s);
      nothing<<<1, 1, 0, s>>>();
    }
    FO_CUDA_CHECK(cudaStreamSynchronize(s));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_NO_THROW(w.check());
    EXPECT_EQ(revoked.load(), 0);
    // A call that does not complete: failed within the timeout and a few polls.
    const auto t0 = std::chrono::steady_clock::now();
    {
      const fo::rt::CallWatch::Scope call(w, s);
      spin_until_set<<<1, 1, 0, s>>>(dflag);
    }
    while (!w.failed() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(w.failed());
    EXPECT_GE(waited, 0.3);
    EXPECT_LT(waited, 2.0);
    EXPECT_EQ(revoked.load(), 1);
    try {
      w.check();
      ADD_FAILURE() << "check() did not throw";
    } catch (const fo::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("a test op (rank 0 of 1)"), std::string::npos) << what;
      EXPECT_NE(what.find("within 0.3 s"), std::string::npos) << what;
    }
    *flag = 1;  // (the stand-in collective returns)
    FO_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  // Under capture: begin and end record nothing (the graph holds the kernel only).
  {
    fo::rt::CallWatch w("captured", 0.3);
    cudaGraph_t g = nullptr;
    FO_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    {
      const fo::rt::CallWatch::Scope call(w, s);
      nothing<<<1, 1, 0, s>>>();
    }
    FO_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    FO_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    EXPECT_EQ(nodes, 1u);
    FO_CUDA_CHECK(cudaGraphDestroy(g));
  }
  // Off (FLASHOVERLAP_CALL_WATCH=0 makes the ops' so): a call that does not complete is not failed.
  {
    fo::rt::CallWatch w("off", 0.2, false);
    *flag = 0;
    {
      const fo::rt::CallWatch::Scope call(w, s);
      spin_until_set<<<1, 1, 0, s>>>(dflag);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    EXPECT_FALSE(w.failed());
    EXPECT_NO_THROW(w.check());
    *flag = 1;
    FO_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  FO_CUDA_CHECK(cudaStreamDestroy(s));
  FO_CUDA_CHECK(cudaFreeHost(flag));
}
