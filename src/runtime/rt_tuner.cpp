// rt_tuner.cpp — see rt_tuner.h.
#include "runtime/rt_tuner.h"

#include <cstring>

#include "runtime/rt_buffer.h"
#include "runtime/rt_checks.h"

namespace flashoverlap::rt {

std::vector<double> max_over_ranks(Rendezvous& rv, const std::vector<double>& mine) {
  const auto all = rv.allgather(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(mine.data()),
                                                         mine.size() * sizeof(double)));
  std::vector<double> out = mine;
  for (const auto& bytes : all) {
    if (bytes.size() != mine.size() * sizeof(double)) throw Error("max_over_ranks: ranks sent different sizes");
    for (size_t i = 0; i < mine.size(); ++i) {
      double v;
      std::memcpy(&v, bytes.data() + i * sizeof(double), sizeof(double));
      out[i] = std::max(out[i], v);
    }
  }
  return out;
}

TimingStats time_collective(const std::function<void()>& enqueue, cudaStream_t stream, ncclComm_t sync_comm,
                            int warmup, int iters) {
  static thread_local DeviceBuffer token(256);
  auto sync = [&] {
    FO_NCCL_CHECK_CTX(ncclAllReduce(token.get(), token.get(), 1, ncclFloat, ncclSum, sync_comm, stream),
                      "timing sync");
  };
  cudaEvent_t start, stop;
  FO_CUDA_CHECK(cudaEventCreate(&start));
  FO_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) {
    sync();
    enqueue();
  }
  FO_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> runs;
  for (int i = 0; i < iters; ++i) {
    sync();
    FO_CUDA_CHECK(cudaEventRecord(start, stream));
    enqueue();
    FO_CUDA_CHECK(cudaEventRecord(stop, stream));
    FO_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    runs.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return summarize(std::move(runs));
}

plan::BandwidthCurve measure_allreduce_curve(Rendezvous& rv, ncclComm_t comm, kernels::DType dt, cudaStream_t stream,
                                             double max_bytes, int iters, const std::string& gpu) {
  DeviceBuffer buf{static_cast<size_t>(max_bytes)};
  FO_CUDA_CHECK(cudaMemset(buf.get(), 0, buf.bytes()));
  const ncclDataType_t t = dt == kernels::DType::BF16 ? ncclBfloat16 : ncclFloat16;
  std::vector<double> sizes, ms;
  for (double b = 65536; b <= max_bytes; b *= 2) {
    const auto st = time_collective(
        [&] {
          FO_NCCL_CHECK_CTX(ncclAllReduce(buf.get(), buf.get(), size_t(b / 2), t, ncclSum, comm, stream),
                            "curve sample");
        },
        stream, comm, 2, iters);
    sizes.push_back(b);
    ms.push_back(st.median_ms);
  }
  ms = max_over_ranks(rv, ms);
  std::vector<plan::CurveSample> samples;
  for (size_t i = 0; i < sizes.size(); ++i) samples.push_back({sizes[i], ms[i]});
  return plan::BandwidthCurve(plan::Collective::AllReduce, rv.world(), samples, gpu);
}

double measure_gemm_ms(const plan::Schedule& sched, int k, kernels::DType dt, const void* a, const void* b, void* c,
                       cudaStream_t stream, int iters) {
  kernels::GemmParams p;
  p.dtype = dt, p.a = a, p.b = b, p.m = sched.m, p.n = sched.n, p.k = k, p.sched = sched;
  p.store = kernels::Store::Plain, p.c = c, p.ldc = sched.n;
  return time_on_stream([&] { kernels::launch_gemm(p, stream); }, stream, 2, iters).median_ms;
}

}  // namespace flashoverlap::rt
