// lab.h — flashoverlap-lab's subcommands (tools/lab/main.cpp).
#pragma once
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "runtime/core/buffer.h"

namespace flashoverlap::cli {

// The kernel benchmarks' GPU: device `device` made current, every kernel
// loaded and its summary printed as a "#" line; nullopt (said on stderr,
// for `command`) where there is no Hopper GPU.
std::optional<rt::DeviceInfo> open_kernel_bench_gpu(const char* command, int device);

// The kernel benchmarks' common options: --warmup, --iters (median
// reported), --device, --csv (bench-gemm, bench-fp8).
void add_kernel_timing_options(CLI::App* cmd, int& warmup, int& iters, int& device, std::string& csv);

// `lab-bench`: the internal variants and the measured tuner (cmd_lab_bench.cpp,
// cmd_lab_bench_rs.cpp, cmd_lab_bench_a2a.cpp): experiments, not the public ops.
void add_lab_bench_command(CLI::App& app, int& rc);
// `bench-gemm`: the GEMM kernels alone against cuBLAS (cmd_bench_gemm.cpp).
void add_bench_gemm_command(CLI::App& app, int& rc);
// `bench-fp8`: the GEMM with e4m3 inputs against cuBLASLt's FP8 matmul (cmd_bench_fp8.cpp).
void add_bench_fp8_command(CLI::App& app, int& rc);

}  // namespace flashoverlap::cli
