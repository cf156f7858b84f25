// curves.cpp — the AllReduce's bandwidth curve measured on this machine
// (flashoverlap::measure_allreduce_curve) and where GemmAllReduceOptions::curves
// looks for it (allreduce_curve_path).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "api/op_setup.h"
#include "flashoverlap/flashoverlap.h"
#include "kernels/cuda_check.h"
#include "plan/curve_files.h"
#include "plan/latency_model.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/communicator.h"
#include "runtime/core/exchange.h"
#include "runtime/tune/tuner.h"

namespace flashoverlap {
namespace {

const char* dtype_name(DType d) { return d == DType::BF16 ? "bf16" : "fp16"; }

}  // namespace

std::string measure_allreduce_curve(const Communicator& comm, DType dtype, int nccl_ctas, double max_mib, int iters,
                                    const std::string& path) {
  const std::string who = "measure_allreduce_curve (rank " + std::to_string(comm.rank()) + ")";
  if (nccl_ctas < 0 || nccl_ctas > 1024)
    throw InvalidArgument(who + ": nccl_ctas = " + std::to_string(nccl_ctas) + ": 0 (NCCL's default) to 1024");
  if (!(max_mib >= 1 && max_mib <= 65536))
    throw InvalidArgument(who + ": max_mib = " + std::to_string(max_mib) + ": 1 to 65536");
  if (iters < 1) throw InvalidArgument(who + ": iters = " + std::to_string(iters) + ": at least 1");
  const rt::Communicator adopted = rt::Communicator::adopt(comm.get());
  // (NCCL on nccl_ctas CTAs in clusters of 1: as the op's bounded communicator runs beside the GEMM)
  const rt::Communicator limited = nccl_ctas > 0 ? adopted.split({nccl_ctas, nccl_ctas, 1}) : rt::Communicator{};
  const ncclComm_t c = limited ? limited.get() : adopted.get();
  const rt::ScopedStream stream;
  const double max_bytes = max_mib * (1 << 20);
  rt::DeviceBuffer buf{static_cast<size_t>(max_bytes)};
  FO_CUDA_CHECK(cudaMemset(buf.get(), 0, buf.bytes()));
  const ncclDataType_t type = dtype == DType::BF16 ? ncclBfloat16 : ncclFloat16;
  std::vector<double> sizes, ms;
  for (double b = 65536; b <= max_bytes; b *= 2) {
    sizes.push_back(b);
    ms.push_back(rt::time_collective(
                     [&] {
                       FO_NCCL_CHECK_CTX(ncclAllReduce(buf.get(), buf.get(), size_t(b / 2), type, ncclSum, c, stream.s),
                                         who + ": a curve sample");
                     },
                     stream.s, c, 2, iters)
                     .median_ms);
  }
  // The slowest rank's time per size: what a call of every rank waits for.
  const std::vector<uint8_t> all = rt::gather_bytes(adopted.get(), comm.rank(), ms.data(), ms.size() * sizeof(double),
                                                    who + ": the ranks' curve samples");
  for (int r = 0; r < comm.world(); ++r)
    for (size_t i = 0; i < ms.size(); ++i) {
      double t;
      std::memcpy(&t, all.data() + (size_t(r) * ms.size() + i) * sizeof(double), sizeof t);
      ms[i] = std::max(ms[i], t);
    }
  std::vector<plan::CurveSample> samples;
  for (size_t i = 0; i < sizes.size(); ++i) samples.push_back({sizes[i], ms[i]});
  const plan::BandwidthCurve curve(plan::Collective::AllReduce, comm.world(), samples, api::current_gpu_name());
  if (!path.empty() && comm.rank() == 0) curve.save(path);
  return curve.to_json().dump(2);
}

std::string allreduce_curve_path(const std::string& dir, int nccl_ctas, int world, DType dtype) {
  if (nccl_ctas < 0 || world < 1)
    throw InvalidArgument("allreduce_curve_path: nccl_ctas = " + std::to_string(nccl_ctas) + ", world = " +
                          std::to_string(world) + ": needs nccl_ctas >= 0 and world >= 1");
  return plan::allreduce_curve_file(dir, nccl_ctas, world, dtype_name(dtype));
}

}  // namespace flashoverlap
