// flashoverlap tune — measures NCCL's AllReduce bandwidth curve on this
// machine (all local GPUs, one process each), optionally with NCCL limited to
// --ctas CTAs (the budget the overlap leaves it), and saves it as JSON: the
// input of `plan --curve FILE`, or, with --curves DIR, where
// GemmAllReduceOptions::curves = DIR finds it. On the public API
// (flashoverlap::measure_allreduce_curve).
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "flashoverlap/error.h"
#include "flashoverlap/flashoverlap.h"

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
  if (o.op != "allreduce")
    throw InvalidArgument("tune --op " + o.op + ": the AllReduce's curve is what the ops read (allreduce)");
  if (o.curve.empty() == o.curves.empty())
    throw InvalidArgument("tune needs one of --curve FILE or --curves DIR (where to save the curve)");
  if (o.dtype != "bf16" && o.dtype != "fp16") throw InvalidArgument("--dtype must be bf16 or fp16");
  const LocalGpus gpus = local_gpus();
  if (gpus.hopper < 1) {
    std::cerr << "tune: no Hopper (sm_90) GPU found on this machine (" << gpus.reason << "); nothing to measure.\n";
    return 1;
  }
  const Communicator comm = Communicator::from_env();
  const DType dt = o.dtype == "fp16" ? DType::FP16 : DType::BF16;
  const std::string path =
      !o.curve.empty() ? o.curve : allreduce_curve_path(o.curves, o.ctas, comm.world(), dt);
  if (!o.curves.empty() && comm.rank() == 0) std::filesystem::create_directories(o.curves);
  const nlohmann::json curve = nlohmann::json::parse(measure_allreduce_curve(comm, dt, o.ctas, o.max_mib, o.iters, path));
  if (comm.rank() == 0) {
    std::cout << "AllReduce curve, " << comm.world() << " ranks, NCCL "
              << (o.ctas > 0 ? std::to_string(o.ctas) : "default") << " CTAs, " << o.dtype << " ("
              << curve.value("gpu", std::string("this GPU")) << "):\n";
    for (const auto& s : curve.at("samples")) {
      const double bytes = s.at(0).get<double>(), ms = s.at(1).get<double>();
      std::cout << "  " << std::setw(12) << std::fixed << std::setprecision(0) << bytes << " B  " << std::setprecision(4)
                << ms << " ms  " << std::setprecision(1) << bytes / ms / 1e6 << " GB/s\n";
    }
    std::cout << "saved to " << path << "\n";
  }
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tune", "Measure this machine's bandwidth curves (all local GPUs): what the tuner predicts overlap with");
  cmd->add_option("--op", o->op, "allreduce (NCCL's AllReduce on SMs: the curve the ops plan with)")
      ->capture_default_str();
  cmd->add_option("--curve", o->curve, "Save the curve to this JSON file (input of `plan --curve`)");
  cmd->add_option("--curves", o->curves,
                  "Save it under its standard name in this directory, where the ops' curves option (and "
                  "`flashoverlap-lab lab-bench --curves DIR`) finds it");
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
