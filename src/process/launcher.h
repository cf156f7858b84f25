// launcher.h — start one process per local GPU, the way torchrun does.
// Host-only (fork/exec, signals); no CUDA: the caller counts the GPUs.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace flashoverlap::rt {

struct LaunchOptions {
  int nproc = 1;
  std::vector<std::string> command;      // argv of each process; argv[0] is looked up in PATH
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                   // 0: pick a free port (see launch())
  int visible_gpus = -1;                 // -1: unknown, no check
  bool allow_oversubscribe = false;      // allow nproc > visible_gpus
  double timeout_s = 0;                  // 0: none; else terminate all after it (exit code 124)
  double kill_grace_s = 5;               // SIGTERM, then SIGKILL after this long
};

// Runs `command` as `nproc` processes on this node, each with RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set
// (the rest of the environment is passed unchanged; CUDA_VISIBLE_DEVICES is not
// touched: each process picks GPU LOCAL_RANK). Output is not redirected or
// prefixed. With master_port 0 the port is one that this process holds
// (rt::ReservedPort::bound(): bound, not listening, SO_REUSEADDR) until the
// children exit, so that no other process on the host can be given it before
// rank 0's hub binds it: parallel launches (ctest -j) cannot collide. The hub
// must set SO_REUSEADDR to bind it, as Rendezvous and torch's TCPStore do
// (a server on a fixed port sets it anyway, to restart while connections
// linger in TIME_WAIT); for one that does not, pass a master_port. Waits for
// all of them and returns:
//  - 0 when all exit 0;
//  - the first failing process's exit code (128+signal when it was killed),
//    after terminating the others (SIGTERM, SIGKILL after kill_grace_s);
//  - 127 when the command is not found, 126 when it cannot be executed
//    (no process is left running);
//  - 124 when timeout_s passes;
//  - 128+signal when this process receives SIGINT or SIGTERM, which is
//    forwarded to the children.
// Messages about failures go to stderr, prefixed "flashoverlap launch: ".
// Throws InvalidArgument for nproc < 1, an empty command, a port outside
// 0..65535, or nproc > visible_gpus without allow_oversubscribe.
// Installs its own SIGINT/SIGTERM/SIGCHLD handlers while it runs (restored on
// return); call it from one thread at a time.
int launch(const LaunchOptions& opts);

// `--nproc N` on any command of the CLI. Call first thing in main():
//
//   if (auto rc = rt::relaunch_with_nproc(argc, argv, visible_gpus)) return *rc;
//
// When argv holds `--nproc N` or `--nproc=N` (before any `--`) and RANK is not
// set, runs N copies of this program (/proc/self/exe) with the same arguments
// minus the --nproc option, through launch(), and returns its exit code.
// Otherwise returns nullopt and the caller continues as one process: in a
// launched child RANK is set and --nproc is already gone; under another
// launcher (RANK set) the caller should accept and ignore --nproc. The
// `launch` subcommand (argv[1]) takes -n/--nproc itself and is left alone.
// Throws InvalidArgument when the value is not a positive integer.
std::optional<int> relaunch_with_nproc(int argc, char** argv, int visible_gpus);

}  // namespace flashoverlap::rt
