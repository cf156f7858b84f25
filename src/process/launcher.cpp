// launcher.cpp — fork/exec of the local processes and their supervision
// (see launcher.h).
//
// Signal handlers record SIGINT/SIGTERM and write a byte to a pipe (the
// self-pipe trick), so the supervision loop is a plain poll(): it wakes on a
// child's exit (SIGCHLD), on SIGINT/SIGTERM to forward, or every 100 ms to
// check the deadlines. Handlers, unlike a blocked-signal mask, are
// process-wide, so a signal taken by another thread (the CUDA driver starts
// some) still wakes us.
#include "process/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string_view>

#include "flashoverlap/error.h"
#include "process/bootstrap.h"

extern char** environ;

namespace flashoverlap::rt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTimedOutCode = 124;    // as timeout(1)
constexpr int kCannotExecCode = 126;  // as the shell: found but not executable
constexpr int kNotFoundCode = 127;    // as the shell: command not found

void say(const std::string& msg) { std::cerr << "flashoverlap launch: " << msg << std::endl; }

std::string signal_text(int sig) {
  const char* name = ::strsignal(sig);
  return "signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s << " s";
  return out.str();
}

// --------------------------------------------------------------- signals

std::atomic<int> g_wake_fd{-1};      // write end of the self-pipe while launch() runs
std::atomic<int> g_stop_signal{0};   // the last SIGINT/SIGTERM not yet handled
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");

extern "C" void on_signal(int sig) {
  int saved = errno;
  if (sig != SIGCHLD) g_stop_signal.store(sig);
  unsigned char b = 0;
  (void)!::write(g_wake_fd.load(), &b, 1);
  errno = saved;
}

// Installs the handlers for its lifetime; remembers the caller's dispositions
// so that children start with them (exec keeps ignored signals ignored).
class SignalTrap {
 public:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGCHLD};

  SignalTrap() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("launch: cannot create a pipe: ") + std::strerror(errno));
    read_fd_ = fds[0];
    int expected = -1;
    if (!g_wake_fd.compare_exchange_strong(expected, fds[1])) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw Error("launch: already running in this process");
    }
    g_stop_signal.store(0);  // one that came after the previous launch is not ours
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &saved_[i]);
  }
  ~SignalTrap() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
    ::close(g_wake_fd.exchange(-1));
    ::close(read_fd_);
  }
  SignalTrap(const SignalTrap&) = delete;
  SignalTrap& operator=(const SignalTrap&) = delete;

  // In a forked child before exec (async-signal-safe).
  void restore_in_child() const noexcept {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
  }

  // Waits up to `ms` for any of the signals.
  void wait(int ms) {
    pollfd p{read_fd_, POLLIN, 0};
    ::poll(&p, 1, ms);
    unsigned char buf[64];
    while (::read(read_fd_, buf, sizeof buf) > 0) {}
  }
  // SIGINT or SIGTERM if one came since the last call, else 0.
  static int take_stop_signal() { return g_stop_signal.exchange(0); }

 private:
  int read_fd_ = -1;
  std::array<struct sigaction, kSignals.size()> saved_{};
};

// --------------------------------------------------------------- children

struct Child {
  pid_t pid;
  int rank;
  bool running = true;
};

// The environment of rank `rank`: ours, minus the variables we set.
std::vector<std::string> child_env(const LaunchOptions& o, int rank, int port) {
  const std::array<std::pair<std::string_view, std::string>, 6> ours{{
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(o.nproc)},
      {"LOCAL_RANK", std::to_string(rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
  }};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv = *e;
    std::string_view name = kv.substr(0, kv.find('='));
    if (std::ranges::none_of(ours, [&](const auto& v) { return v.first == name; }))
      env.emplace_back(kv);
  }
  for (const auto& [name, value] : ours) env.push_back(std::string(name) + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Forks and execs; returns the pid, or 0 with `exec_errno` set when exec
// failed (that child is already reaped). The close-on-exec pipe reports the
// outcome: it closes without data when exec succeeds.
pid_t spawn(std::vector<std::string> argv_s, std::vector<std::string> env_s,
            const SignalTrap& trap, int& exec_errno) {
  // Everything allocated before fork: only async-signal-safe calls after it.
  auto argv = c_strings(argv_s);
  auto envp = c_strings(env_s);
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0)
    throw Error(std::string("launch: cannot create a pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(status_pipe[0]);
    ::close(status_pipe[1]);
    throw Error(std::string("launch: fork failed: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::close(status_pipe[0]);
    trap.restore_in_child();
    // If the launcher is killed outright, take its children with it rather
    // than leave them holding GPUs.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    ::execvpe(argv[0], argv.data(), envp.data());
    int err = errno;
    (void)!::write(status_pipe[1], &err, sizeof err);
    ::_exit(err == ENOENT ? kNotFoundCode : kCannotExecCode);
  }
  ::close(status_pipe[1]);
  exec_errno = 0;
  ssize_t n;
  while ((n = ::read(status_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {}
  ::close(status_pipe[0]);
  if (n != static_cast<ssize_t>(sizeof exec_errno)) return pid;  // exec succeeded
  ::waitpid(pid, nullptr, 0);
  return 0;
}

int exit_code(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::string exit_text(int status) {
  if (WIFSIGNALED(status)) return "was killed by " + signal_text(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

// Waits for every child. `result` != 0 means the launch already failed and
// the children are to be stopped. Returns the launch's exit code.
int supervise(std::vector<Child>& children, const LaunchOptions& o, SignalTrap& trap, int result) {
  const auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(o.kill_grace_s));
  std::optional<Clock::time_point> deadline;
  if (o.timeout_s > 0)
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(o.timeout_s));
  std::optional<Clock::time_point> kill_at;  // set once we start stopping them
  bool killed = false;
  auto signal_all = [&](int sig) {
    for (const Child& c : children)
      if (c.running) ::kill(c.pid, sig);
    if (!kill_at) kill_at = Clock::now() + grace;
  };
  auto running = [&] { return std::ranges::count_if(children, &Child::running); };
  if (result != 0) signal_all(SIGTERM);

  // A signal to us is forwarded; a second one, or one while already
  // stopping, kills at once.
  auto on_stop_signal = [&] {
    int sig = SignalTrap::take_stop_signal();
    if (sig == 0) return;
    if (result == 0) {
      say("received " + signal_text(sig) + "; forwarding it to " + std::to_string(running()) +
          " process(es)");
      result = 128 + sig;
      signal_all(sig);
    } else {
      signal_all(SIGKILL);
      killed = true;
    }
  };

  for (;;) {
    trap.wait(100);
    on_stop_signal();
    for (Child& c : children) {
      int status = 0;
      if (!c.running) continue;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == 0) continue;
      c.running = false;
      if (r < 0 || exit_code(status) == 0) continue;
      // On Ctrl-C the terminal signals the children along with us; our
      // handler has run by now (the signal was pending before they died), so
      // this is not a failure to report.
      on_stop_signal();
      if (result != 0) continue;
      result = exit_code(status);
      say("rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") " +
          exit_text(status) + "; stopping the other " + std::to_string(running()) +
          " process(es)");
      signal_all(SIGTERM);
    }
    if (running() == 0) return result;

    const auto now = Clock::now();
    if (result == 0 && deadline && now >= *deadline) {
      say("timed out after " + seconds_text(o.timeout_s) + "; stopping " +
          std::to_string(running()) + " process(es)");
      result = kTimedOutCode;
      signal_all(SIGTERM);
    }
    if (kill_at && !killed && now >= *kill_at) {
      say(std::to_string(running()) + " process(es) still running " +
          seconds_text(o.kill_grace_s) + " after being told to stop; sending SIGKILL");
      signal_all(SIGKILL);
      killed = true;
    }
  }
}

std::string self_exe(const char* fallback) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string(fallback);
}

}  // namespace

int launch(const LaunchOptions& o) {
  if (o.nproc < 1)
    throw InvalidArgument("launch: the number of processes must be >= 1, got " +
                          std::to_string(o.nproc));
  if (o.command.empty()) throw InvalidArgument("launch: no command to run");
  if (o.master_port < 0 || o.master_port > 65535)
    throw InvalidArgument("launch: master port " + std::to_string(o.master_port) +
                          " is not in 0..65535");
  if (o.timeout_s < 0 || o.kill_grace_s < 0)
    throw InvalidArgument("launch: the timeout and grace period must be >= 0");
  if (o.visible_gpus >= 0 && o.nproc > o.visible_gpus && !o.allow_oversubscribe)
    throw InvalidArgument(std::to_string(o.nproc) + " processes requested but only " +
                          std::to_string(o.visible_gpus) +
                          " GPUs are visible; one process per GPU (--allow-oversubscribe "
                          "to start them anyway)");

  // A port we pick stays reserved until the children have exited: nothing
  // else on this host is given it meanwhile, and rank 0's hub can still bind
  // it (see launcher.h). Close-on-exec: the children do not inherit it.
  std::optional<ReservedPort> reserved;
  if (o.master_port == 0) reserved = ReservedPort::bound();
  const int port = reserved ? reserved->port() : o.master_port;
  SignalTrap trap;
  std::cout.flush();  // so that buffered output is not interleaved with the children's
  std::cerr.flush();
  std::fflush(nullptr);

  std::vector<Child> children;
  int result = 0;
  for (int rank = 0; rank < o.nproc; ++rank) {
    int exec_errno = 0;
    pid_t pid = spawn(o.command, child_env(o, rank, port), trap, exec_errno);
    if (pid == 0) {
      say("cannot execute '" + o.command[0] + "': " + std::strerror(exec_errno));
      result = exec_errno == ENOENT ? kNotFoundCode : kCannotExecCode;
      break;
    }
    children.push_back({pid, rank});
  }
  return supervise(children, o, trap, result);
}

std::optional<int> relaunch_with_nproc(int argc, char** argv, int visible_gpus) {
  if (argc > 1 && std::string_view(argv[1]) == "launch") return std::nullopt;
  if (const char* rank = std::getenv("RANK"); rank != nullptr && *rank != '\0') return std::nullopt;

  LaunchOptions o;
  o.visible_gpus = visible_gpus;
  o.command.push_back(self_exe(argv[0]));
  bool found = false, options_ended = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    options_ended = options_ended || a == "--";
    if (options_ended || (a != "--nproc" && !a.starts_with("--nproc="))) {
      o.command.emplace_back(a);
      continue;
    }
    std::string_view value;
    if (a == "--nproc") {
      if (i + 1 >= argc) throw InvalidArgument("--nproc expects a number of processes");
      value = argv[++i];
    } else {
      value = a.substr(std::string_view("--nproc=").size());
    }
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), o.nproc);
    if (ec != std::errc() || end != value.data() + value.size() || o.nproc < 1)
      throw InvalidArgument("--nproc expects a positive integer, got '" + std::string(value) + "'");
    found = true;
  }
  if (!found) return std::nullopt;
  return launch(o);
}

}  // namespace flashoverlap::rt
