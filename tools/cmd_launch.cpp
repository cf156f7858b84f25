// cmd_launch.cpp — `flashoverlap launch`: one process per local GPU, torchrun style.
#include <cuda_runtime_api.h>

#include <memory>

#include "commands.h"
#include "process/launcher.h"

namespace flashoverlap::cli {

namespace {
// Any CUDA error (no driver, no device) means no usable GPU here.
int visible_gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
}  // namespace

void add_launch_command(CLI::App& app, int& rc) {
  auto opts = std::make_shared<rt::LaunchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Start N processes of a command on this node, one per GPU, the way torchrun does.\n"
      "Each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and\n"
      "MASTER_PORT; the rest of the environment is passed through. If one process\n"
      "fails, the others are stopped and its exit code is returned.");
  cmd->add_option("-n,--nproc", opts->nproc, "Number of processes (at most the visible GPUs)")
      ->required();
  cmd->add_option("--master-addr", opts->master_addr,
                  "Address of rank 0 for the rendezvous")
      ->capture_default_str();
  cmd->add_option("--master-port", opts->master_port, "Rendezvous port (0: pick a free one)")
      ->capture_default_str();
  cmd->add_flag("--allow-oversubscribe", opts->allow_oversubscribe,
                "Allow more processes than visible GPUs (e.g. CPU-only tests)");
  cmd->add_option("--timeout", opts->timeout_s,
                  "Stop all processes after this many seconds and exit 124 (0: no limit)")
      ->capture_default_str();
  cmd->add_option("command", opts->command, "The command to run and its arguments, after --")
      ->required();
  cmd->footer("Example: flashoverlap launch -n 2 -- flashoverlap bench --op allreduce");
  cmd->callback([opts, &rc] {
    opts->visible_gpus = visible_gpu_count();
    rc = rt::launch(*opts);
  });
}

}  // namespace flashoverlap::cli
