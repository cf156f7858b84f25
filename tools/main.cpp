// flashoverlap — command-line entry point. Subcommands live in cmd_*.cpp.
// Without a subcommand it runs the main job (run_default_job in cmd_run.cpp).
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "flashoverlap/error.h"
#include "runtime/process/launcher.h"
#include "runtime/core/buffer.h"

namespace {

// `flashoverlap`, `flashoverlap bench` and `flashoverlap tune` default to one
// process per local GPU: unless the job was launched already (RANK set) or --nproc is given,
// run them again under the launcher with --nproc <GPUs>.
std::vector<std::string> default_nproc_args(int argc, char** argv, int gpus) {
  std::vector<std::string> args(argv, argv + argc);
  if (gpus < 2 || std::getenv("RANK")) return {};
  const bool main_job = argc == 1;
  const bool multi = argc > 1 && (std::strcmp(argv[1], "bench") == 0 || std::strcmp(argv[1], "tune") == 0);
  if (!main_job && !multi) return {};
  for (const auto& a : args)
    if (a == "--nproc" || a.rfind("--nproc=", 0) == 0 || a == "-h" || a == "--help") return {};
  args.push_back("--nproc=" + std::to_string(gpus));
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashoverlap;
  try {
    const int gpus = rt::hopper_device_count();
    std::vector<std::string> args = default_nproc_args(argc, argv, gpus);
    std::vector<char*> argp;
    for (auto& a : args) argp.push_back(a.data());
    const bool injected = !argp.empty();
    if (auto rc = rt::relaunch_with_nproc(injected ? int(argp.size()) : argc, injected ? argp.data() : argv, gpus))
      return *rc;
  } catch (const InvalidArgument& e) {
    std::cerr << "flashoverlap: error: " << e.what() << "\n";
    return 2;
  }
  CLI::App app{
      "FlashOverlap: a Hopper GEMM overlapped with NCCL AllReduce / ReduceScatter / "
      "All-to-All through tile signals and reordering.\n"
      "Without a subcommand, runs the default GEMM+AllReduce benchmark on all local GPUs\n"
      "(or prints its plan when no GPU is present).",
      "flashoverlap"};
  app.require_subcommand(0, 1);
  int rc = 0;
  cli::add_plan_command(app, rc);
  cli::add_launch_command(app, rc);
  cli::add_bench_gemm_command(app, rc);
  cli::add_bench_command(app, rc);
  cli::add_tune_command(app, rc);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) rc = cli::run_default_job(std::cout);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, exit code 2, whatever CLI11's own code for this error.
    std::cerr << "flashoverlap: error: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const InvalidArgument& e) {
    std::cerr << "flashoverlap: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "flashoverlap: failed: " << e.what() << "\n";
    return 1;
  }
  return rc;
}
