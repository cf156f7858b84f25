// flashoverlap-lab — experiments on the library's internal paths, not
// installed: lab-bench (every overlap variant and the measured tuner, per
// collective) and bench-gemm (the GEMM kernels alone). The product's CLI is
// flashoverlap (tools/main.cpp).
#include "cli_main.h"
#include "lab/lab.h"

int main(int argc, char** argv) {
  using namespace flashoverlap;
  CLI::App app{
      "FlashOverlap's lab: the library's internal overlap paths and GEMM kernels, measured\n"
      "(not the public ops: `flashoverlap bench` times those).",
      "flashoverlap-lab"};
  int rc = 0;
  cli::add_lab_bench_command(app, rc);
  cli::add_bench_gemm_command(app, rc);
  cli::add_bench_fp8_command(app, rc);
  return cli::run_command_line(app, argc, argv, rc, nullptr);
}
