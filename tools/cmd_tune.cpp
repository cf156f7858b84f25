// flashoverlap tune — measures a bandwidth curve on this machine (all local
// GPUs, one process each) and saves it as JSON: the AllReduce curve
// (optionally with NCCL limited to --ctas CTAs, the budget the overlap leaves
// it; input of `plan --curve FILE`) or the copy-engine AllGather curve of the
// gathered layouts. With --curves DIR it goes where `lab-bench --curves DIR`
// looks for it (curve_files.h).
#include <cuda_runtime_api.h>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.h"
#include "plan/curve_files.h"
#include "flashoverlap/error.h"
#include "flashoverlap/flashoverlap.h"
#include "kernels/gemm.h"
#include "process/bootstrap.h"
#include "runtime/core/buffer.h"
#include "runtime/core/communicator.h"
#include "runtime/tune/tuner.h"

namespace flashoverlap::cli {
namespace {

struct Options {
  std::string op = "allreduce";
  std::string curve, curves;
  std::string dtype = "bf16";
  int ctas = 0;
  double max_mib = 256;
  int iters = 10, nproc = 0;
};

int run(const Options& o) {
  if (o.op != "allreduce" && o.op != "allgather")
    throw InvalidArgument("tune --op " + o.op + ": allreduce or allgather (copy engines) curves are measured so far");
  if (o.curve.empty() == o.curves.empty())
    throw InvalidArgument("tune needs one of --curve FILE or --curves DIR (where to save the curve)");
  if (o.max_mib < 1) throw InvalidArgument("--max-mib must be >= 1");
  if (o.dtype != "bf16" && o.dtype != "fp16") throw InvalidArgument("--dtype must be bf16 or fp16");
  if (o.op == "allgather" && o.ctas > 0) throw InvalidArgument("--ctas: the AllGather curve runs on the copy engines");
  const LocalGpus probe = local_gpus();
  const int gpus = probe.hopper;
  if (gpus < 1) {
    std::cerr << "tune: no Hopper (sm_90) GPU found on this machine (" << probe.reason << "); nothing to measure.\n";
    return 1;
  }
  const rt::DistEnv env = rt::DistEnv::from_env().value_or(rt::DistEnv{});
  FO_CUDA_CHECK(cudaSetDevice(env.local_rank));
  rt::Rendezvous rv(env);
  rt::Communicator base = rt::Communicator::create(rv);
  rt::Communicator limited;
  if (o.op == "allgather") limited = base.split({0, 0, 1, NCCL_CTA_POLICY_ZERO});
  else if (o.ctas > 0) limited = base.split({o.ctas, o.ctas, 1});
  cudaStream_t stream;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const rt::DeviceInfo info = rt::device_info(env.local_rank);
  const auto dt = o.dtype == "fp16" ? kernels::DType::FP16 : kernels::DType::BF16;
  const ncclComm_t comm = limited ? limited.get() : base.get();
  const double max_bytes = o.max_mib * (1 << 20);
  const plan::BandwidthCurve curve =
      o.op == "allgather" ? rt::measure_gather_curve(rv, comm, dt, stream, max_bytes, o.iters, info.name)
                          : rt::measure_allreduce_curve(rv, comm, dt, stream, max_bytes, o.iters, info.name);
  if (rv.rank() == 0) {
    const std::string path = !o.curve.empty()       ? o.curve
                             : o.op == "allgather" ? plan::allgather_curve_file(o.curves, rv.world(), o.dtype)
                                                   : plan::allreduce_curve_file(o.curves, o.ctas, rv.world(), o.dtype);
    if (!o.curves.empty()) std::filesystem::create_directories(o.curves);
    curve.save(path);
    std::cout << (o.op == "allgather" ? "AllGather (copy engines, bytes per rank)" : "AllReduce") << " curve, "
              << rv.world() << " ranks"
              << (o.op == "allgather" ? "" : ", NCCL " + (o.ctas > 0 ? std::to_string(o.ctas) : "default") + " CTAs")
              << " (" << info.summary() << "):\n";
    for (const auto& s : curve.samples())
      std::cout << "  " << std::setw(12) << std::fixed << std::setprecision(0) << s.bytes << " B  " << std::setprecision(4)
                << s.ms << " ms  " << std::setprecision(1) << s.bytes / s.ms / 1e6 << " GB/s\n";
    std::cout << "saved to " << path << "\n";
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tune", "Measure this machine's bandwidth curves (all local GPUs): what the tuner predicts overlap with");
  cmd->add_option("--op", o->op, "allreduce (NCCL on SMs) or allgather (copy engines, the gathered layouts)")
      ->capture_default_str();
  cmd->add_option("--curve", o->curve, "Save the curve to this JSON file (input of `plan --curve`)");
  cmd->add_option("--curves", o->curves,
                  "Save it under its standard name in this directory, where `lab-bench --curves DIR` finds it");
  cmd->add_option("--dtype", o->dtype, "bf16 or fp16")->capture_default_str();
  cmd->add_option("--ctas", o->ctas, "Limit NCCL to this many CTAs (0: NCCL's default)")
      ->capture_default_str()
      ->check(integer_in(0, 1024));
  cmd->add_option("--max-mib", o->max_mib, "Largest message in MiB (at most 65536)")
      ->capture_default_str()
      ->check(number_check([](double x) { return x >= 1 && x <= 65536; }, "in [1, 65536]", "MIB"));
  cmd->add_option("--iters", o->iters, "Timed runs per size (median)")->capture_default_str()->check(integer_at_least(1));
  cmd->add_option("--nproc", o->nproc, "Processes (GPUs); default: all local GPUs");
  cmd->callback([o, &rc] { rc = run(*o); });
}

}  // namespace flashoverlap::cli
