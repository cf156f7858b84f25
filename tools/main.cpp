// flashoverlap — command-line entry point. Subcommands live in cmd_*.cpp.
// Without a subcommand it runs the main job (run_default_job in cmd_run.cpp).
#include <cstdlib>
#include <iostream>
#include <string>

#include "commands.h"
#include "flashoverlap/error.h"

namespace flashoverlap::cli {
int run_default_job(std::ostream& out);
}

int main(int argc, char** argv) {
  using namespace flashoverlap;
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
