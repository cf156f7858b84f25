// flashoverlap — the command-line tool on the public API: the main job, bench,
// plan, tune and launch. Subcommands live in cmd_*.cpp; the experiments on
// internal paths are flashoverlap-lab (tools/lab/).
#include <iostream>

#include "cli_main.h"
#include "commands.h"

int main(int argc, char** argv) {
  using namespace flashoverlap;
  CLI::App app{
      "FlashOverlap: a Hopper GEMM overlapped with NCCL AllReduce / ReduceScatter / "
      "All-to-All through tile signals and reordering.\n"
      "Without a subcommand, runs the main job on all local GPUs: `bench`'s defaults,\n"
      "flashoverlap::GemmAllReduce 4096x8192x8192 bf16 against cuBLAS + NCCL\n"
      "(or prints its plan when no GPU is present).",
      "flashoverlap"};
  int rc = 0;
  cli::add_plan_command(app, rc);
  cli::add_launch_command(app, rc);
  cli::add_bench_command(app, rc);
  cli::add_tune_command(app, rc);
  return cli::run_command_line(app, argc, argv, rc, [] { return cli::run_default_job(std::cout); });
}
