// lab.h — flashoverlap-lab's subcommands (tools/lab/main.cpp).
#pragma once
#include <CLI/CLI.hpp>

namespace flashoverlap::cli {

// `lab-bench`: the internal variants and the measured tuner (cmd_lab_bench.cpp,
// cmd_lab_bench_rs.cpp, cmd_lab_bench_a2a.cpp): experiments, not the public ops.
void add_lab_bench_command(CLI::App& app, int& rc);
// `bench-gemm`: the GEMM kernels alone against cuBLAS (cmd_bench_gemm.cpp).
void add_bench_gemm_command(CLI::App& app, int& rc);
// `bench-fp8`: the GEMM with e4m3 inputs against cuBLASLt's FP8 matmul (cmd_bench_fp8.cpp).
void add_bench_fp8_command(CLI::App& app, int& rc);

}  // namespace flashoverlap::cli
