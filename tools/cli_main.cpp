// cli_main.cpp — see cli_main.h; also the partition check both executables' commands take.
#include "cli_main.h"

#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "flashoverlap/error.h"
#include "flashoverlap/flashoverlap.h"
#include "plan/partition.h"
#include "process/launcher.h"

namespace flashoverlap::cli {
namespace {

constexpr const char* kOversubscribe = "--allow-oversubscribe";

// The subcommand argv names (the first word before any "--" that is not an
// option), or null for none; `unknown` set where that word names none.
const CLI::App* named_command(const CLI::App& app, const std::vector<std::string>& args, bool& unknown) {
  unknown = false;
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    const std::string_view a = args[i];
    if (a == "--nproc") {
      ++i;  // (its value)
      continue;
    }
    if (a.starts_with("-")) continue;
    const auto named = app.get_subcommands([&](const CLI::App* c) { return c->check_name(std::string(a)); });
    if (named.empty()) {
      unknown = true;
      return nullptr;
    }
    return named.front();
  }
  return nullptr;
}

bool multi_process(const CLI::App* command) {
  return command && command->get_name() != "launch" && command->get_option_no_throw("--nproc") != nullptr;
}

// The main job and the commands that declare --nproc default to one process
// per local GPU: unless the job was launched already (RANK set) or --nproc
// is given, run them again under the launcher with --nproc <GPUs>.
std::vector<std::string> default_nproc_args(const CLI::App& app, const std::vector<std::string>& args, int gpus,
                                            bool has_main_job) {
  if (gpus < 2 || std::getenv("RANK")) return {};
  bool unknown = false;
  const CLI::App* command = named_command(app, args, unknown);
  const bool main_job = has_main_job && args.size() == 1;
  if (!main_job && !multi_process(command)) return {};
  for (const auto& a : args)
    if (a == "--nproc" || a.rfind("--nproc=", 0) == 0 || a == "-h" || a == "--help") return {};
  std::vector<std::string> out = args;
  out.push_back("--nproc=" + std::to_string(gpus));
  return out;
}

// The process options of every command but `launch` (which has -n/--nproc and
// --allow-oversubscribe of its own): --nproc N starts N processes of the
// command (rt::relaunch_with_nproc), --allow-oversubscribe lets N exceed the
// GPUs. The main job and the commands that declare --nproc take them (the
// rest is declared here), so that a process started by another launcher
// (RANK set), which keeps them, accepts and ignores them. A command that
// runs as one process (no --nproc declared) refuses them instead of printing
// the same output N times.
void add_process_options(CLI::App& app, int& nproc) {
  app.add_option("--nproc", nproc, "Processes, one per GPU (default: all local GPUs)");
  app.add_flag(kOversubscribe)->description("With --nproc: start more processes than there are GPUs");
  for (CLI::App* cmd : app.get_subcommands([](CLI::App*) { return true; }))
    if (multi_process(cmd) && !cmd->get_option_no_throw(kOversubscribe))
      cmd->add_flag(kOversubscribe)->description("With --nproc: start more processes than there are GPUs");
}

struct ProcessOptions {
  bool relaunch = true;        // false: a word that names no command (CLI11 reports it, once)
  bool oversubscribe = false;  // --allow-oversubscribe given
};

// Checks the process options of `args` (before any "--") against the command
// they are given to. Throws InvalidArgument for process options on a
// one-process command.
ProcessOptions check_process_options(const CLI::App& app, const std::vector<std::string>& args, bool has_main_job) {
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
  if (!command && !has_main_job) return {false};  // (no command: CLI11 says so, once)
  if (!nproc && !oversubscribe) return {};
  const std::string given = nproc ? "--nproc" : kOversubscribe;
  if (command && command->get_name() == "launch")
    throw InvalidArgument(given + " before `launch`: give launch's own -n N (and " + kOversubscribe + ") after it");
  if (command && !command->get_option_no_throw("--nproc"))
    throw InvalidArgument("`" + command->get_name() + "` runs as one process: " + given + " does not apply" +
                          (nproc && command->get_name() == "plan" ? " (--world sets the ranks it plans for)" : "") +
                          "; `flashoverlap launch -n N -- " + app.get_name() + " " + command->get_name() +
                          " ...` starts N copies");
  return {true, oversubscribe};
}

bool wants_help(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i)
    if (args[i] == "-h" || args[i] == "--help") return true;
  return false;
}

// One line for a failure, and its exit code: 2 for what the caller can fix
// (InvalidArgument: bad arguments, files, shapes), 1 for the rest.
int exit_code_of(const std::string& name, const std::exception& e) {
  const bool caller = dynamic_cast<const InvalidArgument*>(&e) != nullptr;
  std::cerr << name << ": " << (caller ? "error: " : "failed: ") << e.what() << "\n";
  return caller ? 2 : 1;
}

}  // namespace

CLI::Validator partition_check() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v.empty()) return "must not be empty (group sizes, e.g. 1,2,2)";
        try {
          (void)plan::parse_partition(v);
        } catch (const std::exception& e) {
          return e.what();
        }
        return "";
      },
      "LIST");
}

int run_command_line(CLI::App& app, int argc, char** argv, int& rc, const std::function<int()>& main_job) {
  app.require_subcommand(main_job ? 0 : 1, 1);
  int nproc = 0;
  add_process_options(app, nproc);
  const std::string name = app.get_name();
  try {
    const std::vector<std::string> given(argv, argv + argc);
    // Help is printed once, by this process, whatever else is given.
    const ProcessOptions process = wants_help(given) ? ProcessOptions{false} : check_process_options(app, given, bool(main_job));
    if (process.relaunch) {
      const int gpus = local_gpus().hopper;
      std::vector<std::string> args = default_nproc_args(app, given, gpus, bool(main_job));
      if (args.empty()) args = given;
      std::vector<char*> argp;
      for (auto& a : args) argp.push_back(a.data());
      // -1: no check of the processes against the GPUs (the children keep the
      // flag, which they accept and ignore).
      if (auto code = rt::relaunch_with_nproc(int(argp.size()), argp.data(), process.oversubscribe ? -1 : gpus))
        return *code;
    }
  } catch (const std::exception& e) {
    return exit_code_of(name, e);
  }
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty() && main_job) rc = main_job();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, exit code 2, whatever CLI11's own code for this error.
    std::cerr << name << ": error: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const std::exception& e) {
    return exit_code_of(name, e);
  }
  return rc;
}

}  // namespace flashoverlap::cli
