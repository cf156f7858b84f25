// cli_main.h — what the two executables' main() share (flashoverlap, the
// product's CLI, and flashoverlap-lab, the experiments on internal paths):
// the process options, the relaunch as one process per GPU, and one line
// per failure with its exit code.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace flashoverlap::cli {

// Parses and runs argv on `app` (its subcommands added; its name heads the
// error lines). --nproc N starts N processes of a command that declares
// --nproc (the rest refuse it), by default one per local Hopper GPU;
// main_job runs where no subcommand is given and starts one process per GPU
// as well (empty: a subcommand is required). Returns the exit code: rc as
// the command left it, 2 for what the caller can fix (bad arguments,
// files, shapes), 1 for other failures.
int run_command_line(CLI::App& app, int argc, char** argv, int& rc, const std::function<int()>& main_job);

}  // namespace flashoverlap::cli
