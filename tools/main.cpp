// flashoverlap — command-line entry point. Subcommands live in cmd_*.cpp.
// Without a subcommand it runs the main job (run_default_job in cmd_run.cpp).
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "flashoverlap/error.h"
#include "runtime/process/launcher.h"
#include "runtime/core/buffer.h"

namespace {

// `flashoverlap`, `flashoverlap bench`, `flashoverlap lab-bench` and
// `flashoverlap tune` default to one process per local GPU: unless the job
// was launched already (RANK set) or --nproc is given, run them again under
// the launcher with --nproc <GPUs>.
std::vector<std::string> default_nproc_args(int argc, char** argv, int gpus) {
  std::vector<std::string> args(argv, argv + argc);
  if (gpus < 2 || std::getenv("RANK")) return {};
  const bool main_job = argc == 1;
  const bool multi = argc > 1 && (std::strcmp(argv[1], "bench") == 0 || std::strcmp(argv[1], "lab-bench") == 0 ||
                                  std::strcmp(argv[1], "tune") == 0);
  if (!main_job && !multi) return {};
  for (const auto& a : args)
    if (a == "--nproc" || a.rfind("--nproc=", 0) == 0 || a == "-h" || a == "--help") return {};
  args.push_back("--nproc=" + std::to_string(gpus));
  return args;
}

constexpr const char* kOversubscribe = "--allow-oversubscribe";

// The process options of every command but `launch` (which has -n/--nproc and
// --allow-oversubscribe of its own): --nproc N starts N processes of the
// command (rt::relaunch_with_nproc), --allow-oversubscribe lets N exceed the
// GPUs. The main job, bench, lab-bench and tune take them (bench, lab-bench
// and tune declare --nproc; the rest is declared here), so that a process
// started by another launcher (RANK set), which keeps them, accepts and
// ignores them. A command
// that runs as one process (plan, bench-gemm: no --nproc declared) refuses
// them instead of printing the same output N times.
void add_process_options(CLI::App& app, int& nproc) {
  app.add_option("--nproc", nproc, "Processes, one per GPU (default: all local GPUs); also on bench, lab-bench and tune");
  app.add_flag(kOversubscribe)
      ->description("With --nproc: start more processes than there are GPUs (also on bench, lab-bench and tune)");
  for (CLI::App* cmd : app.get_subcommands([](CLI::App*) { return true; }))
    if (cmd->get_name() != "launch" && cmd->get_option_no_throw("--nproc") &&
        !cmd->get_option_no_throw(kOversubscribe))
      cmd->add_flag(kOversubscribe)->description("With --nproc: start more processes than there are GPUs");
}

struct ProcessOptions {
  bool relaunch = true;        // false: a word that names no command (CLI11 reports it, once)
  bool oversubscribe = false;  // --allow-oversubscribe given
};

// Checks the process options of `args` (before any "--") against the command
// they are given to. Throws InvalidArgument for process options on a
// one-process command.
ProcessOptions check_process_options(const CLI::App& app, const std::vector<std::string>& args) {
  bool nproc = false, oversubscribe = false;
  const CLI::App* command = nullptr;  // null: the main job
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    const std::string_view a = args[i];
    if (a == "--nproc" || a.starts_with("--nproc=")) {
      if (command && command->get_name() == "launch") continue;  // launch's own
      nproc = true;
      i += a == "--nproc";  // (its value)
    } else if (a == kOversubscribe) {
      oversubscribe = oversubscribe || !command || command->get_name() != "launch";
    } else if (!command && !a.starts_with("-")) {
      const auto named = app.get_subcommands([&](const CLI::App* c) { return c->check_name(std::string(a)); });
      if (named.empty()) return {false};  // not N processes of an error
      command = named.front();
    }
  }
  if (!nproc && !oversubscribe) return {};
  const std::string given = nproc ? "--nproc" : kOversubscribe;
  if (command && command->get_name() == "launch")
    throw flashoverlap::InvalidArgument(given + " before `launch`: give launch's own -n N (and " + kOversubscribe +
                                        ") after it");
  if (command && !command->get_option_no_throw("--nproc"))
    throw flashoverlap::InvalidArgument(
        "`" + command->get_name() + "` runs as one process: " + given + " does not apply" +
        (nproc && command->get_name() == "plan" ? " (--world sets the ranks it plans for)" : "") +
        "; `flashoverlap launch -n N -- flashoverlap " + command->get_name() + " ...` starts N copies");
  return {true, oversubscribe};
}

bool wants_help(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i)
    if (args[i] == "-h" || args[i] == "--help") return true;
  return false;
}

// One line for a failure, and its exit code: 2 for what the caller can fix
// (InvalidArgument: bad arguments, files, shapes), 1 for the rest.
int exit_code_of(const std::exception& e) {
  const bool caller = dynamic_cast<const flashoverlap::InvalidArgument*>(&e) != nullptr;
  std::cerr << "flashoverlap: " << (caller ? "error: " : "failed: ") << e.what() << "\n";
  return caller ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashoverlap;
  CLI::App app{
      "FlashOverlap: a Hopper GEMM overlapped with NCCL AllReduce / ReduceScatter / "
      "All-to-All through tile signals and reordering.\n"
      "Without a subcommand, runs the main job on all local GPUs: `bench`'s defaults,\n"
      "flashoverlap::GemmAllReduce 4096x8192x8192 bf16 against cuBLAS + NCCL\n"
      "(or prints its plan when no GPU is present).",
      "flashoverlap"};
  app.require_subcommand(0, 1);
  int rc = 0, nproc = 0;
  cli::add_plan_command(app, rc);
  cli::add_launch_command(app, rc);
  cli::add_bench_gemm_command(app, rc);
  cli::add_bench_command(app, rc);
  cli::add_lab_bench_command(app, rc);
  cli::add_tune_command(app, rc);
  add_process_options(app, nproc);
  try {
    const std::vector<std::string> given(argv, argv + argc);
    // Help is printed once, by this process, whatever else is given.
    const ProcessOptions process = wants_help(given) ? ProcessOptions{false} : check_process_options(app, given);
    if (process.relaunch) {
      const int gpus = rt::hopper_device_count();
      std::vector<std::string> args = default_nproc_args(argc, argv, gpus);
      if (args.empty()) args = given;
      std::vector<char*> argp;
      for (auto& a : args) argp.push_back(a.data());
      // -1: no check of the processes against the GPUs (the children keep the
      // flag, which they accept and ignore).
      if (auto code = rt::relaunch_with_nproc(int(argp.size()), argp.data(), process.oversubscribe ? -1 : gpus))
        return *code;
    }
  } catch (const std::exception& e) {
    return exit_code_of(e);
  }
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
  } catch (const std::exception& e) {
    return exit_code_of(e);
  }
  return rc;
}
