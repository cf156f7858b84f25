// The launcher: validation, the children's environment, failure propagation,
// signals, --nproc relaunch, and the `flashoverlap launch` command.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "flashoverlap/error.h"
#include "process/bootstrap.h"
#include "process/launcher.h"

extern char** environ;

namespace flashoverlap::rt {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ----------------------------------------------------------- child role
// Launched with FO_TEST_CHILD_DIR set, this binary is one rank of a job, not
// a test runner: it joins the rendezvous, checks the collectives, and writes
// DIR/ok_<rank> holding its command-line arguments.

std::string command_line_args() {
  std::ifstream f("/proc/self/cmdline");
  std::string all((std::istreambuf_iterator<char>(f)), {}), out;
  std::istringstream parts(all);
  std::string arg;
  std::getline(parts, arg, '\0');  // skip argv[0]
  while (std::getline(parts, arg, '\0')) out += arg + " ";
  return out;
}

int rendezvous_child(const std::string& dir) {
  try {
    auto env = DistEnv::from_env();
    if (!env) throw Error("no RANK in the environment");
    Rendezvous rv(*env, 60s);  // generous, for a loaded machine: it takes milliseconds
    std::vector<uint8_t> id(128);
    for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + ::getpid());
    auto shared = rv.broadcast(id);
    auto mine = shared;
    mine.push_back(static_cast<uint8_t>(env->rank));
    auto all = rv.allgather(mine);
    for (int r = 0; r < env->world; ++r) {
      auto expect = shared;
      expect.push_back(static_cast<uint8_t>(r));
      if (all[r] != expect) throw Error("allgather mismatch at rank " + std::to_string(r));
    }
    rv.barrier();
    std::ofstream(dir + "/ok_" + std::to_string(env->rank)) << command_line_args();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "child: " << e.what() << "\n";
    return 1;
  }
}

// Launched with FO_TEST_PORT_PROBE_DIR set, rank 0 writes DIR/probe saying
// whether MASTER_PORT is held while the job runs (a bind without SO_REUSEADDR
// is refused) and still open to a hub (one with SO_REUSEADDR binds and listens).
int port_probe_child(const std::string& dir) {
  auto env = DistEnv::from_env();
  if (!env) return 1;
  if (env->rank != 0) return 0;  // one hub
  auto try_bind = [&](bool reuse) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (reuse) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(env->master_port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
    const int err = errno;
    ::close(fd);
    return ok ? std::string("ok") : std::string(std::strerror(err));
  };
  std::ofstream(dir + "/probe")
      << "plain: " << try_bind(false) << "; reuse: " << try_bind(true) << "\n";
  return 0;
}

[[maybe_unused]] const bool kIsChild = [] {
  const char* dir = std::getenv("FO_TEST_CHILD_DIR");
  const char* probe = std::getenv("FO_TEST_PORT_PROBE_DIR");
  if (dir == nullptr && probe == nullptr) return false;
  std::cout.flush();
  std::_Exit(dir ? rendezvous_child(dir) : port_probe_child(probe));
}();

// ----------------------------------------------------------- helpers

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() /
           ("fo_launch_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

LaunchOptions sh(int nproc, const std::string& script, const std::string& arg = "") {
  LaunchOptions o;
  o.nproc = nproc;
  o.command = {"sh", "-c", script, "sh", arg};
  return o;
}

template <class F>
double seconds_of(F&& f) {
  auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ----------------------------------------------------------- launch()

TEST(Launcher, RejectsBadOptions) {
  LaunchOptions o = sh(0, "true");
  EXPECT_THROW(launch(o), InvalidArgument);
  o = sh(2, "true");
  o.command.clear();
  EXPECT_THROW(launch(o), InvalidArgument);
  o = sh(2, "true");
  o.master_port = 70000;
  EXPECT_THROW(launch(o), InvalidArgument);
}

TEST(Launcher, RefusesMoreProcessesThanGpus) {
  LaunchOptions o = sh(3, "true");
  o.visible_gpus = 2;
  try {
    launch(o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "3 processes requested but only 2 GPUs are visible; one process per GPU"),
              std::string::npos)
        << e.what();
  }
  o.allow_oversubscribe = true;
  EXPECT_EQ(launch(o), 0);
  o.allow_oversubscribe = false;
  o.nproc = 2;
  EXPECT_EQ(launch(o), 0);
}

TEST(Launcher, ChildrenGetRankEnvironment) {
  TempDir dir;
  // Stale values of our variables are replaced; everything else passes through.
  ::setenv("RANK", "99", 1);
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  LaunchOptions o = sh(4,
                       "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR "
                       "$MASTER_PORT $NCCL_NVLS_ENABLE\" > \"$1/rank_$RANK\"",
                       dir.path.string());
  const ReservedPort unused = ReservedPort::bound();  // a number no other test is given
  o.master_port = unused.port();
  int rc = launch(o);
  ::unsetenv("RANK");
  ::unsetenv("NCCL_NVLS_ENABLE");
  ASSERT_EQ(rc, 0);
  for (int r = 0; r < 4; ++r) {
    std::string want = std::to_string(r) + " 4 " + std::to_string(r) + " 4 127.0.0.1 " +
                       std::to_string(o.master_port) + " 0\n";
    EXPECT_EQ(read_file(dir.file("rank_" + std::to_string(r))), want);
  }
}

TEST(Launcher, PicksAFreePortSharedByAllRanks) {
  TempDir dir;
  ASSERT_EQ(launch(sh(3, "echo $MASTER_PORT > \"$1/port_$RANK\"", dir.path.string())), 0);
  std::set<std::string> ports;
  for (int r = 0; r < 3; ++r) ports.insert(read_file(dir.file("port_" + std::to_string(r))));
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_GT(std::stoi(*ports.begin()), 0);
}

// While the job runs, the port it picked is held (nothing else can bind it
// plainly, nor be given it), and the children's hub can still bind it.
TEST(Launcher, PickedPortIsHeldForTheJobYetBindableByItsHub) {
  TempDir dir;
  ::setenv("FO_TEST_PORT_PROBE_DIR", dir.path.c_str(), 1);
  LaunchOptions o;
  o.nproc = 2;
  o.command = {"/proc/self/exe"};
  int rc = launch(o);
  ::unsetenv("FO_TEST_PORT_PROBE_DIR");
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(read_file(dir.file("probe")), "plain: Address already in use; reuse: ok\n");
}

// The children that are to be stopped sleep kSleep: a launch that returns in
// well under that stopped them rather than waited for them. kStopped is the
// generous bound (a loaded machine needs far less; it cannot hide a wait).
constexpr const char* kSleep = "exec sleep 600";
constexpr double kStopped = 60;

TEST(Launcher, FailureStopsTheOthersAndReturnsItsCode) {
  double s = seconds_of([] {
    EXPECT_EQ(launch(sh(3, std::string("if [ $RANK = 1 ]; then exit 3; fi; ") + kSleep)), 3);
  });
  EXPECT_LT(s, kStopped);  // generous (see kStopped)
}

TEST(Launcher, KillsWhatIgnoresSigterm) {
  LaunchOptions o =
      sh(3, std::string("trap '' TERM; if [ $RANK = 2 ]; then sleep 0.2; exit 4; fi; ") + kSleep);
  o.kill_grace_s = 0.3;
  double s = seconds_of([&] { EXPECT_EQ(launch(o), 4); });
  EXPECT_GE(s, 0.3);  // safe: SIGKILL comes only after the grace period
  EXPECT_LT(s, kStopped);  // generous (see kStopped)
}

TEST(Launcher, SignalledChildGives128PlusSignal) {
  EXPECT_EQ(launch(sh(2, std::string("if [ $RANK = 0 ]; then kill -KILL $$; fi; ") + kSleep)), 128 + 9);
}

TEST(Launcher, CommandNotFoundIs127) {
  LaunchOptions o;
  o.nproc = 2;
  o.command = {"fo-no-such-command-xyz"};
  EXPECT_EQ(launch(o), 127);
}

TEST(Launcher, NotExecutableIs126) {
  TempDir dir;
  std::ofstream(dir.file("script")) << "#!/bin/sh\nexit 0\n";
  LaunchOptions o;
  o.nproc = 1;
  o.command = {dir.file("script")};
  EXPECT_EQ(launch(o), 126);
}

TEST(Launcher, TimeoutStopsEverything) {
  LaunchOptions o = sh(2, kSleep);
  o.timeout_s = 0.3;
  double s = seconds_of([&] { EXPECT_EQ(launch(o), 124); });
  EXPECT_GE(s, 0.3);  // safe: the timeout cannot fire before it is due
  EXPECT_LT(s, kStopped);  // generous (see kStopped)
}

TEST(Launcher, RendezvousAcrossProcesses) {
  TempDir dir;
  ::setenv("FO_TEST_CHILD_DIR", dir.path.c_str(), 1);
  LaunchOptions o;
  o.nproc = 4;
  o.command = {"/proc/self/exe"};
  int rc = launch(o);
  ::unsetenv("FO_TEST_CHILD_DIR");
  EXPECT_EQ(rc, 0);
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(dir.file("ok_" + std::to_string(r)))) << r;
}

// ----------------------------------------------------------- --nproc

std::optional<int> relaunch(std::vector<std::string> args, int gpus = -1) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return relaunch_with_nproc(static_cast<int>(args.size()), argv.data(), gpus);
}

TEST(Launcher, NprocRelaunchesThisProgramWithoutTheOption) {
  TempDir two, three;
  ::setenv("FO_TEST_CHILD_DIR", two.path.c_str(), 1);
  auto rc2 = relaunch({"prog", "bench", "--nproc", "2", "--m=64"});
  ::setenv("FO_TEST_CHILD_DIR", three.path.c_str(), 1);
  auto rc3 = relaunch({"prog", "--nproc=3", "plan"});
  ::unsetenv("FO_TEST_CHILD_DIR");
  EXPECT_EQ(rc2, std::optional<int>(0));
  EXPECT_EQ(rc3, std::optional<int>(0));
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(read_file(two.file("ok_" + std::to_string(r))), "bench --m=64 ");
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(read_file(three.file("ok_" + std::to_string(r))), "plan ");
}

TEST(Launcher, NprocLeftAloneWhenNotApplicable) {
  EXPECT_EQ(relaunch({"prog", "bench"}), std::nullopt);
  EXPECT_EQ(relaunch({"prog", "launch", "--nproc", "2", "--", "true"}), std::nullopt);
  EXPECT_EQ(relaunch({"prog", "x", "--", "--nproc", "2"}), std::nullopt);
  ::setenv("RANK", "0", 1);  // already a launched child
  auto rc = relaunch({"prog", "--nproc", "2"});
  ::unsetenv("RANK");
  EXPECT_EQ(rc, std::nullopt);
}

TEST(Launcher, NprocBadValues) {
  EXPECT_THROW(relaunch({"prog", "--nproc"}), InvalidArgument);
  EXPECT_THROW(relaunch({"prog", "--nproc", "two"}), InvalidArgument);
  EXPECT_THROW(relaunch({"prog", "--nproc=0"}), InvalidArgument);
  EXPECT_THROW(relaunch({"prog", "--nproc", "4"}, /*gpus=*/2), InvalidArgument);
}

// ----------------------------------------------------------- CLI

struct CliRun {
  int code;
  std::string output;
};

// Runs `env_prefix flashoverlap args` through the shell, stderr included
// (flashoverlap-lab for lab-bench and bench-gemm).
CliRun cli(const std::string& args, const std::string& env_prefix = "") {
  const bool lab = args.rfind("lab-bench", 0) == 0 || args.rfind("bench-gemm", 0) == 0;
  std::string cmd = env_prefix + " '" + (lab ? FO_LAB_PATH : FO_CLI_PATH) + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

TEST(LaunchCli, BadArgumentsExit2) {
  for (const char* args :
       {"launch", "launch -n 2", "launch -n x -- true", "launch -n 0 -- true",
        "launch -n 2 --bogus -- true", "launch -n 2 --master-port 99999 -- true"}) {
    auto r = cli(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("flashoverlap: error: "), std::string::npos)
        << args << "\n" << r.output;
  }
}

TEST(LaunchCli, RunsAndPropagatesExitCodes) {
  EXPECT_EQ(cli("launch -n 2 --allow-oversubscribe -- sh -c 'exit 0'").code, 0);
  auto r = cli("launch -n 2 --allow-oversubscribe -- sh -c 'exit $((RANK + 5))'");
  EXPECT_TRUE(r.code == 5 || r.code == 6) << r.output;
  EXPECT_NE(r.output.find("flashoverlap launch: rank "), std::string::npos) << r.output;
}

TEST(LaunchCli, RefusesMoreProcessesThanVisibleGpus) {
  // No visible GPU whatever the machine has.
  auto r = cli("launch -n 2 -- true", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("2 processes requested but only 0 GPUs are visible; one process per GPU"),
            std::string::npos)
      << r.output;
}

// `--nproc N` on the other commands (README: "on any command starts N
// processes the same way"). CUDA_VISIBLE_DEVICES= everywhere: no GPU is used,
// whatever the machine has, so the children find none.

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

TEST(NprocCli, OneProcessCommandsRefuseIt) {
  for (const char* args : {"plan --nproc 2 --op allreduce --m 4096 --n 8192 --k 8192 --world 2",
                           "--nproc=2 plan", "plan --allow-oversubscribe", "bench-gemm --nproc 2"}) {
    auto r = cli(args, "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_EQ(lines(r.output), 1u) << args << "\n" << r.output;
    const std::string name = std::string(args).rfind("bench-gemm", 0) == 0 ? "flashoverlap-lab" : "flashoverlap";
    EXPECT_EQ(r.output.rfind(name + ": error: `", 0), 0u) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("runs as one process"), std::string::npos) << args << "\n" << r.output;
  }
  // Before `launch` it would start N launchers: launch takes -n itself.
  auto r = cli("--nproc 2 launch -n 2 --allow-oversubscribe -- true", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc before `launch`"), std::string::npos) << r.output;
}

// flashoverlap-lab has no main job: --nproc without a command is one error
// line, not N processes of it.
TEST(NprocCli, TheLabWithoutACommandSaysSoOnce) {
  FILE* p = ::popen("CUDA_VISIBLE_DEVICES= '" FO_LAB_PATH "' --nproc 2 --allow-oversubscribe 2>&1", "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status << "\n" << out;
  EXPECT_EQ(lines(out), 1u) << out;
  EXPECT_EQ(out.rfind("flashoverlap-lab: error: ", 0), 0u) << out;
}

// Too many processes for the GPUs: the hint names --allow-oversubscribe, and
// that option exists: with it the main job, bench and lab-bench start N processes.
TEST(NprocCli, OversubscribeHintNamesAnOptionThatWorks) {
  for (const char* args : {"--nproc 2", "bench --nproc 3", "lab-bench --nproc 3", "tune --nproc 2"}) {
    auto r = cli(args, "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("GPUs are visible; one process per GPU (--allow-oversubscribe"), std::string::npos)
        << args << "\n" << r.output;
  }
  // The main job without a GPU prints its plan: once per process.
  auto main_job = cli("--nproc 2 --allow-oversubscribe", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(main_job.code, 0) << main_job.output;
  EXPECT_EQ(count(main_job.output, "No Hopper (sm_90) GPU on this machine"), 2u) << main_job.output;
  EXPECT_EQ(count(main_job.output, "predicted: "), 2u) << main_job.output;
  // bench's and lab-bench's processes start, find no GPU and say so (exit 1),
  // rather than refusing their arguments.
  for (const std::string command : {"bench", "lab-bench"}) {
    auto bench = cli(command + " --nproc 3 --allow-oversubscribe", "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(bench.code, 1) << bench.output;
    EXPECT_NE(bench.output.find(command + ": no Hopper (sm_90) GPU found"), std::string::npos) << bench.output;
    EXPECT_EQ(bench.output.find(": error: "), std::string::npos) << bench.output;
  }
}

// Under another launcher (RANK set: torchrun, mpirun) the options stay in
// argv; the commands that take them accept and ignore them.
TEST(NprocCli, AcceptedAndIgnoredUnderAnotherLauncher) {
  const std::string env = "CUDA_VISIBLE_DEVICES= RANK=0 WORLD_SIZE=1 LOCAL_RANK=0";
  auto main_job = cli("--nproc 2 --allow-oversubscribe", env);
  EXPECT_EQ(main_job.code, 0) << main_job.output;
  EXPECT_EQ(count(main_job.output, "predicted: "), 1u) << main_job.output;  // this one process
  for (const char* args :
       {"bench --nproc 2 --allow-oversubscribe", "lab-bench --nproc 2 --allow-oversubscribe",
        "tune --nproc 2 --allow-oversubscribe --curves /nonexistent"}) {
    auto r = cli(args, env);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.output;  // no GPU, not a bad argument
    EXPECT_NE(r.output.find("no Hopper (sm_90) GPU found"), std::string::npos) << args << "\n" << r.output;
  }
}

TEST(NprocCli, HelpListsTheOptions) {
  for (const char* args : {"--help", "bench --help", "lab-bench --help", "tune --help"}) {
    auto r = cli(args);
    EXPECT_EQ(r.code, 0) << args;
    EXPECT_NE(r.output.find("--nproc"), std::string::npos) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("--allow-oversubscribe"), std::string::npos) << args << "\n" << r.output;
  }
}

// `flashoverlap launch -n 2` of children that record their pid and sleep, in
// a process group of its own (as a terminal's foreground job), stderr to a file.
struct SleepingJob {
  TempDir dir;
  pid_t launcher = 0;
  std::vector<pid_t> children;
  bool waited = false;

  SleepingJob() {
    std::vector<std::string> args = {FO_CLI_PATH, "launch", "-n", "2", "--allow-oversubscribe",
                                     "--", "sh", "-c", std::string("echo $$ > \"$1/pid_$RANK\"; ") + kSleep,
                                     "sh", dir.path.string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 2, dir.file("stderr").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = ::posix_spawn(&launcher, FO_CLI_PATH, &files, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) return;
    // Generous, for a loaded machine: two shells start in milliseconds.
    for (auto until = Clock::now() + 60s; children.size() < 2 && Clock::now() < until;) {
      std::this_thread::sleep_for(20ms);
      children.clear();
      for (int r = 0; r < 2; ++r) {
        std::string pid = read_file(dir.file("pid_" + std::to_string(r)));
        if (!pid.empty() && pid.back() == '\n') children.push_back(std::stoi(pid));
      }
    }
  }
  // Waits for the launcher; returns its exit code (-1 if it did not exit normally).
  int wait() {
    int status = 0;
    ::waitpid(launcher, &status, 0);
    waited = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // A test that stopped early leaves no launcher or sleeper behind (the
  // children are in the launcher's process group).
  ~SleepingJob() {
    if (launcher <= 0 || waited) return;
    ::kill(-launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
  }
  bool children_gone() const {
    return std::ranges::none_of(children, [](pid_t c) { return ::kill(c, 0) == 0; });
  }
};

TEST(LaunchCli, ForwardsSigtermToChildren) {
  SleepingJob job;
  ASSERT_EQ(job.children.size(), 2u);
  ::kill(job.launcher, SIGTERM);
  int code = -1;
  EXPECT_LT(seconds_of([&] { code = job.wait(); }), kStopped);  // generous (see kStopped)
  EXPECT_EQ(code, 128 + SIGTERM);
  EXPECT_TRUE(job.children_gone());
  EXPECT_NE(read_file(job.dir.file("stderr")).find("received signal 15"), std::string::npos);
}

TEST(LaunchCli, CtrlCIsNotReportedAsAFailure) {
  SleepingJob job;
  ASSERT_EQ(job.children.size(), 2u);
  ::kill(-job.launcher, SIGINT);  // the whole group, as a terminal does
  int code = -1;
  EXPECT_LT(seconds_of([&] { code = job.wait(); }), kStopped);  // generous (see kStopped)
  EXPECT_EQ(code, 128 + SIGINT);
  EXPECT_TRUE(job.children_gone());
  std::string err = read_file(job.dir.file("stderr"));
  EXPECT_NE(err.find("received signal 2"), std::string::npos) << err;
  EXPECT_EQ(err.find("rank "), std::string::npos) << err;
}

}  // namespace
}  // namespace flashoverlap::rt
