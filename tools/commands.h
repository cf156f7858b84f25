// commands.h — the CLI's subcommands. Each add_* registers one subcommand on
// `app`; its callback runs the command and stores the process exit code in
// `rc` (0 ok, 1 runtime failure, 2 bad arguments).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace flashoverlap::cli {

// Number checks with plain messages (CLI11's PositiveNumber names its range
// as "0.000000 to 1797693...": unreadable in an error line). CLI11 puts the
// option's name in front: "--iters: must be a number >= 1, not 0".
inline CLI::Validator number_check(bool (*ok)(double), const std::string& rule, const std::string& help) {
  return CLI::Validator(
      [ok, rule](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && ok(x)) return "";
        } catch (...) {
        }
        return "must be a number " + rule + ", not " + v;
      },
      help);
}
// Integers: decimal digits only (no 0x10, 1e3 or 2.5, which CLI11 would read
// or refuse in other words), within [lo, hi].
inline CLI::Validator integer_check(int64_t lo, int64_t hi, const std::string& rule, const std::string& help) {
  return CLI::Validator(
      [lo, hi, rule](std::string& v) -> std::string {
        const size_t start = !v.empty() && v[0] == '-' ? 1 : 0;
        bool digits = v.size() > start && v.size() - start <= 18;
        for (size_t i = start; digits && i < v.size(); ++i) digits = v[i] >= '0' && v[i] <= '9';
        if (digits) {
          const int64_t x = std::stoll(v);
          if (x >= lo && x <= hi) return "";
        }
        return "must be an integer " + rule + ", not " + v;
      },
      help);
}
inline CLI::Validator integer_at_least(int64_t lo) {
  return integer_check(lo, INT64_MAX / 2, ">= " + std::to_string(lo), lo > 0 ? "POSITIVE" : "NONNEGATIVE");
}
inline CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return integer_check(lo, hi, "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", "INT");
}
// Even and >= 2: turns that put each side first equally often.
inline CLI::Validator even_turns() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        std::string copy = v;
        if (integer_at_least(2)(copy).empty() && std::stoll(v) % 2 == 0) return "";
        return "must be an even integer >= 2, not " + v;
      },
      "EVEN");
}
// A partition of waves or bands, e.g. 1,2,2 (parsed as the planner does; not empty).
CLI::Validator partition_check();

inline CLI::Validator above_zero() { return number_check([](double x) { return x > 0; }, "> 0", "POSITIVE"); }
inline CLI::Validator not_negative() {
  return number_check([](double x) { return x >= 0; }, ">= 0", "NONNEGATIVE");
}

// Options of `flashoverlap plan`, shared with the default main job, which
// prints the same plan when no GPU is present.
struct PlanOptions {
  std::string op = "allreduce";  // allreduce | reducescatter | alltoall
  int64_t m = 4096, n = 8192, k = 8192;
  int world = 2;
  std::string dtype = "bf16";    // bf16 | fp16
  std::string tile = "auto";     // auto | 128x256 | 128x128
  int sms = 132;
  int reserve_sms = -1;          // -1: let the search pick
  std::string curve;             // bandwidth curve JSON; empty: built-in H200 curve
  std::string partition;         // "1,2,2": evaluate this partition instead of searching
  std::string routing = "uniform";  // alltoall: uniform | zipf:S | one:R | empty:R | file:PATH (moe_routing_args.h)
  bool json = false;
};
void add_plan_options(CLI::App* cmd, PlanOptions& opts);
// Prints the plan (text or JSON); returns the exit code. Throws
// flashoverlap::InvalidArgument for bad input.
int print_plan(const PlanOptions& opts, std::ostream& out);

void add_plan_command(CLI::App& app, int& rc);
void add_launch_command(CLI::App& app, int& rc);
// `bench`: the public ops (flashoverlap.h) against cuBLAS + NCCL (cmd_bench_ops.cpp).
void add_bench_command(CLI::App& app, int& rc);
void add_tune_command(CLI::App& app, int& rc);

// The main job: `bench` with its defaults (flashoverlap::GemmAllReduce,
// 4096x8192x8192 bf16, against cuBLAS + NCCL).
int run_default_ops_bench();
// Without a GPU: says so and prints the default plan.
int run_default_job(std::ostream& out);

}  // namespace flashoverlap::cli
