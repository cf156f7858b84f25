// bootstrap.cpp — DistEnv parsing and the TCP rendezvous (see bootstrap.h).
//
// Wire format: every message is a 20-byte header (magic, op, sequence number,
// payload length; little-endian) followed by the payload. Sockets are
// non-blocking and every wait goes through poll() with the step's deadline,
// so nothing blocks past the timeout. Sockets are close-on-exec, so processes
// started later (the launcher, NCCL's helpers) do not inherit them.
#include "process/bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include "flashoverlap/error.h"

namespace flashoverlap::rt {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- DistEnv

namespace {

// The variable's value, or nullopt when unset or empty.
std::optional<std::string> lookup(const std::function<const char*(const char*)>& getenv,
                                  const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parse_int(const char* name, const std::string& value, int lo, int hi,
              const std::string& range_note) {
  int x = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (ec != std::errc() || end != value.data() + value.size())
    throw InvalidArgument(std::string(name) + "='" + value + "' is not an integer");
  if (x < lo || x > hi)
    throw InvalidArgument(std::string(name) + "=" + value + " is out of range: " + range_note);
  return x;
}

}  // namespace

std::optional<DistEnv> DistEnv::from_env() {
  return from_env([](const char* name) { return std::getenv(name); });
}

std::optional<DistEnv> DistEnv::from_env(const std::function<const char*(const char*)>& getenv) {
  struct Names { const char* rank; const char* world; const char* local_rank; };
  static constexpr Names kTorchrun{"RANK", "WORLD_SIZE", "LOCAL_RANK"};
  static constexpr Names kOpenMpi{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK"};
  const Names* names = nullptr;
  for (const Names* n : {&kTorchrun, &kOpenMpi}) {
    if (lookup(getenv, n->rank) || lookup(getenv, n->world)) { names = n; break; }
  }
  if (names == nullptr) return std::nullopt;

  auto rank_s = lookup(getenv, names->rank);
  auto world_s = lookup(getenv, names->world);
  if (!rank_s || !world_s)
    throw InvalidArgument(std::string(rank_s ? names->rank : names->world) + " is set but " +
                          (rank_s ? names->world : names->rank) + " is not");
  DistEnv env;
  env.world = parse_int(names->world, *world_s, 1, 1 << 20, "must be in 1..1048576");
  const std::string below_world = "must be in [0, " + std::string(names->world) + "=" +
                                  std::to_string(env.world) + ")";
  env.rank = parse_int(names->rank, *rank_s, 0, env.world - 1, below_world);
  auto local_s = lookup(getenv, names->local_rank);
  env.local_rank = local_s ? parse_int(names->local_rank, *local_s, 0, env.world - 1, below_world)
                           : env.rank;
  if (auto addr = lookup(getenv, "MASTER_ADDR")) env.master_addr = *addr;
  if (auto port = lookup(getenv, "MASTER_PORT"))
    env.master_port = parse_int("MASTER_PORT", *port, 1, 65535, "must be in 1..65535");
  return env;
}

// ---------------------------------------------------------------- sockets

namespace detail {
UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) { reset(); fd_ = o.release(); }
  return *this;
}
void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}
}  // namespace detail

namespace {

using detail::UniqueFd;

constexpr uint32_t kMagic = 0x31424f46;            // "FOB1"
constexpr size_t kHeaderBytes = 20;
constexpr uint64_t kMaxPayload = uint64_t(1) << 32;  // guards against a corrupt length

std::string errno_text(int err) { return std::strerror(err); }

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << ms.count() / 1000.0 << " s";
  return s.str();
}

UniqueFd tcp_socket() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw Error("cannot create a TCP socket: " + errno_text(errno));
  return fd;
}

void set_nodelay(int fd) {
  int one = 1;  // small request/reply messages: do not wait to coalesce
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

enum class Io { kOk, kTimeout, kClosed, kError };
struct IoResult {
  Io status = Io::kOk;
  int err = 0;
};

// Waits until `fd` is ready for `events` or the deadline passes.
IoResult wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return {Io::kTimeout};
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (n > 0) return {};
    if (n < 0 && errno != EINTR) return {Io::kError, errno};
  }
}

IoResult send_all(int fd, const uint8_t* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);  // a dead peer gives EPIPE, not SIGPIPE
    if (k > 0) { p += k; n -= static_cast<size_t>(k); continue; }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (auto r = wait_ready(fd, POLLOUT, deadline); r.status != Io::kOk) return r;
      continue;
    }
    if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) return {Io::kClosed, errno};
    return {Io::kError, errno};
  }
  return {};
}

IoResult recv_all(int fd, uint8_t* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) { p += k; n -= static_cast<size_t>(k); continue; }
    if (k == 0) return {Io::kClosed};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (auto r = wait_ready(fd, POLLIN, deadline); r.status != Io::kOk) return r;
      continue;
    }
    if (errno == ECONNRESET) return {Io::kClosed, errno};
    return {Io::kError, errno};
  }
  return {};
}

void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

struct Message {
  uint32_t op = 0;
  uint32_t seq = 0;
  std::vector<uint8_t> payload;
};

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::vector<uint8_t> encode(uint32_t op, uint32_t seq, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + payload.size());
  put_le(out, kMagic, 4);
  put_le(out, op, 4);
  put_le(out, seq, 4);
  put_le(out, payload.size(), 8);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// Reads one message. `garbage` is set (status kError, err 0) when the bytes
// are not ours: a stray connection, or another program on the port.
IoResult read_message(int fd, Clock::time_point deadline, Message& m, bool& garbage) {
  garbage = false;
  uint8_t h[kHeaderBytes];
  if (auto r = recv_all(fd, h, sizeof h, deadline); r.status != Io::kOk) return r;
  uint64_t len = get_le(h + 12, 8);
  if (get_le(h, 4) != kMagic || len > kMaxPayload) {
    garbage = true;
    return {Io::kError, 0};
  }
  m.op = static_cast<uint32_t>(get_le(h + 4, 4));
  m.seq = static_cast<uint32_t>(get_le(h + 8, 4));
  m.payload.resize(len);
  return recv_all(fd, m.payload.data(), len, deadline);
}

std::string io_problem(const IoResult& r, std::chrono::milliseconds timeout, bool garbage) {
  if (garbage) return "received bytes that are not a FlashOverlap rendezvous message";
  switch (r.status) {
    case Io::kTimeout: return "timed out after " + seconds_text(timeout);
    case Io::kClosed: return "connection closed by the peer (did it exit or fail?)";
    default: return "socket error: " + errno_text(r.err);
  }
}

// Allgather result on the wire: for each rank, 8-byte length then bytes.
std::vector<uint8_t> pack(const std::vector<std::vector<uint8_t>>& parts) {
  std::vector<uint8_t> out;
  for (const auto& p : parts) {
    put_le(out, p.size(), 8);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}
std::optional<std::vector<std::vector<uint8_t>>> unpack(const std::vector<uint8_t>& in, int world) {
  std::vector<std::vector<uint8_t>> parts(world);
  size_t at = 0;
  for (auto& p : parts) {
    if (in.size() - at < 8) return std::nullopt;
    uint64_t len = get_le(in.data() + at, 8);
    at += 8;
    if (in.size() - at < len) return std::nullopt;
    p.assign(in.begin() + at, in.begin() + at + len);
    at += len;
  }
  if (at != in.size()) return std::nullopt;
  return parts;
}

}  // namespace

namespace {

// A socket bound to `port` (0: the kernel picks one) on all interfaces, with
// SO_REUSEADDR; returns it and the port it got, or the errno of the failure.
std::pair<UniqueFd, int> bind_any(int port, int& err) {
  UniqueFd fd = tcp_socket();
  int one = 1;  // rebind at once after a previous job's sockets linger in TIME_WAIT
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);  // peers on other nodes reach us via MASTER_ADDR
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  err = 0;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    err = errno;
  return {std::move(fd), ntohs(a.sin_port)};
}

UniqueFd reserve(bool listen, int& port) {
  int err = 0;
  auto [fd, got] = bind_any(0, err);
  if (err == 0 && listen && ::listen(fd.get(), SOMAXCONN) != 0) err = errno;
  if (err != 0) throw Error("cannot reserve a free TCP port: " + errno_text(err));
  port = got;
  return std::move(fd);
}

}  // namespace

int find_free_port() {
  int port = 0;
  reserve(false, port);  // released here: see bootstrap.h
  return port;
}

ReservedPort ReservedPort::listening() {
  int port = 0;
  UniqueFd fd = reserve(true, port);
  return ReservedPort(std::move(fd), port);
}

ReservedPort ReservedPort::bound() {
  int port = 0;
  UniqueFd fd = reserve(false, port);
  return ReservedPort(std::move(fd), port);
}

// ---------------------------------------------------------------- Rendezvous

enum class Rendezvous::Op : uint32_t {
  kHello = 1, kWelcome, kAbort, kBroadcast, kAllgather, kBarrier
};

namespace {
const char* op_name(uint32_t op) {
  static constexpr const char* kNames[] = {"?",     "hello",     "welcome",  "abort",
                                           "broadcast", "allgather", "barrier"};
  return op < std::size(kNames) ? kNames[op] : "?";
}
// "allgather #3", or "handshake (welcome)" before the first collective.
std::string step_text(uint32_t op, uint32_t seq) {
  if (seq == 0) return std::string("handshake (") + op_name(op) + ")";
  return std::string(op_name(op)) + " #" + std::to_string(seq);
}
}  // namespace

void Rendezvous::check_env() const {
  if (env_.world < 1 || env_.rank < 0 || env_.rank >= env_.world)
    throw InvalidArgument("rendezvous: rank " + std::to_string(env_.rank) +
                          " is not in [0, world=" + std::to_string(env_.world) + ")");
  if (env_.world > 1 && (env_.master_port < 1 || env_.master_port > 65535))
    throw InvalidArgument("rendezvous: master port " + std::to_string(env_.master_port) +
                          " is not in 1..65535");
}

Rendezvous::Rendezvous(const DistEnv& env, std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout) {
  check_env();
  if (env_.world == 1) return;
  peers_.resize(env_.rank == 0 ? env_.world : 1);
  auto deadline = Clock::now() + timeout_;
  if (env_.rank == 0) accept_peers(listen_on_master_port(), deadline);
  else join_hub(deadline);
}

Rendezvous::Rendezvous(const DistEnv& env, ReservedPort port, std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout) {
  check_env();
  if (env_.rank != 0)
    throw InvalidArgument("rendezvous: rank " + std::to_string(env_.rank) +
                          " cannot listen on a reserved port: only the hub (rank 0) does; "
                          "the others connect to it");
  if (env_.master_port != port.port())
    throw InvalidArgument("rendezvous: master port " + std::to_string(env_.master_port) +
                          " is not the reserved port " + std::to_string(port.port()));
  if (env_.world == 1) return;  // the reservation is released: no socket needed
  peers_.resize(env_.world);
  auto deadline = Clock::now() + timeout_;
  UniqueFd listener = std::move(port.fd_);
  if (::listen(listener.get(), std::min(env_.world, SOMAXCONN)) != 0)  // again, if listening()
    fail("handshake: cannot listen on the reserved port " + std::to_string(env_.master_port) +
         ": " + errno_text(errno));
  accept_peers(std::move(listener), deadline);
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::prefix() const {
  return "rendezvous rank " + std::to_string(env_.rank) + " of " + std::to_string(env_.world) +
         ": ";
}

std::string Rendezvous::peer_name(int peer) const {
  if (peer != 0) return "rank " + std::to_string(peer);
  return "rank 0 (hub " + env_.master_addr + ":" + std::to_string(env_.master_port) + ")";
}

void Rendezvous::fail(const std::string& why, int unsafe_peer) {
  failure_ = prefix() + why;
  if (env_.rank == 0) {
    // Best effort, never blocking: peers waiting on us learn why instead of
    // seeing a bare disconnect.
    auto msg = encode(uint32_t(Op::kAbort), seq_, bytes_of(failure_));
    for (int r = 1; r < static_cast<int>(peers_.size()); ++r)
      if (r != unsafe_peer && peers_[r].get() >= 0)
        (void)!::send(peers_[r].get(), msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  peers_.clear();  // closing the sockets wakes any peer blocked on us
  throw Error(failure_);
}

void Rendezvous::send(int peer, Op op, std::span<const uint8_t> payload, Deadline deadline) {
  int fd = peers_[env_.rank == 0 ? peer : 0].get();
  auto msg = encode(uint32_t(op), seq_, payload);
  if (auto r = send_all(fd, msg.data(), msg.size(), deadline); r.status != Io::kOk)
    fail(step_text(uint32_t(op), seq_) + ": sending to " + peer_name(peer) + ": " +
             io_problem(r, timeout_, false),
         peer);
}

std::vector<uint8_t> Rendezvous::receive(int peer, Op op, Deadline deadline) {
  int fd = peers_[env_.rank == 0 ? peer : 0].get();
  const std::string step =
      step_text(uint32_t(op), seq_) + ": receiving from " + peer_name(peer) + ": ";
  Message m;
  bool garbage = false;
  if (auto r = read_message(fd, deadline, m, garbage); r.status != Io::kOk)
    fail(step + io_problem(r, timeout_, garbage));
  if (m.op == uint32_t(Op::kAbort))
    fail(step + "the group failed: " + std::string(m.payload.begin(), m.payload.end()));
  if (m.op != uint32_t(op) || m.seq != seq_)
    fail(step + "got " + step_text(m.op, m.seq) +
         " instead (ranks call the collectives in different orders)");
  return std::move(m.payload);
}

UniqueFd Rendezvous::listen_on_master_port() {
  int err = 0;
  UniqueFd listener = bind_any(env_.master_port, err).first;
  if (err == 0 && ::listen(listener.get(), std::min(env_.world, SOMAXCONN)) != 0) err = errno;
  if (err != 0)
    fail("handshake: cannot listen on port " + std::to_string(env_.master_port) + ": " +
         errno_text(err) +
         (err == EADDRINUSE ? " (another job uses it, or two processes have rank 0)" : ""));
  return listener;
}

void Rendezvous::accept_peers(UniqueFd listener, Deadline deadline) {
  int joined = 0;
  while (joined < env_.world - 1) {
    if (wait_ready(listener.get(), POLLIN, deadline).status != Io::kOk) {
      std::string missing;
      for (int r = 1; r < env_.world; ++r)
        if (peers_[r].get() < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail("handshake: timed out after " + seconds_text(timeout_) + " waiting on port " +
           std::to_string(env_.master_port) + " for rank(s) " + missing + " to join (" +
           std::to_string(joined) + " of " + std::to_string(env_.world - 1) + " peers joined)");
    }
    UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (conn.get() < 0) continue;  // EINTR, ECONNABORTED, ...: wait for the next one
    set_nodelay(conn.get());
    Message hello;
    bool garbage = false;
    // Our peers say hello as soon as they connect. A connection that does not
    // say it properly is not one of ours (a port scanner, an old job): drop it.
    // (One that says nothing holds us until the deadline; rare, and bounded.)
    if (read_message(conn.get(), deadline, hello, garbage).status != Io::kOk ||
        hello.op != uint32_t(Op::kHello) || hello.payload.size() != 8)
      continue;
    const int rank = static_cast<int>(get_le(hello.payload.data(), 4));
    const int world = static_cast<int>(get_le(hello.payload.data() + 4, 4));
    std::string reject;
    if (world != env_.world)
      reject = "rank " + std::to_string(rank) + " has world size " + std::to_string(world) +
               " but rank 0 has " + std::to_string(env_.world) +
               " (processes from different jobs on one port?)";
    else if (rank < 0 || rank >= env_.world)
      reject = "rank " + std::to_string(rank) + " is out of range for world size " +
               std::to_string(world);
    else if (rank == 0 || peers_[rank].get() >= 0)
      reject = "duplicate rank " + std::to_string(rank) +
               ": two processes claim it (check RANK / OMPI_COMM_WORLD_RANK)";
    if (!reject.empty()) {
      auto msg = encode(uint32_t(Op::kAbort), 0, bytes_of(reject));
      (void)send_all(conn.get(), msg.data(), msg.size(), deadline);
      fail("handshake: " + reject);
    }
    peers_[rank] = std::move(conn);
    ++joined;
  }
  for (int r = 1; r < env_.world; ++r) send(r, Op::kWelcome, {}, deadline);
}

void Rendezvous::join_hub(Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(env_.master_port);
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(env_.master_addr.c_str(), port.c_str(), &hints, &found); rc != 0) {
      last_error = std::string("cannot resolve MASTER_ADDR: ") + gai_strerror(rc);
    } else {
      UniqueFd fd = tcp_socket();
      int rc2 = ::connect(fd.get(), found->ai_addr, found->ai_addrlen);
      ::freeaddrinfo(found);
      int err = rc2 == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        // Bounded per attempt: a SYN to a host not up yet may get no answer.
        auto attempt_end = std::min(deadline, Clock::now() + std::chrono::seconds(5));
        auto r = wait_ready(fd.get(), POLLOUT, attempt_end);
        socklen_t len = sizeof err;
        if (r.status != Io::kOk) err = r.status == Io::kTimeout ? ETIMEDOUT : r.err;
        else ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if (err == 0) {
        // Connecting to one's own port while the hub is not up yet can succeed
        // as a TCP "simultaneous open" to itself; that is not the hub.
        sockaddr_in self{}, peer{};
        socklen_t ls = sizeof self, lp = sizeof peer;
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &ls);
        ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &lp);
        if (self.sin_port != peer.sin_port || self.sin_addr.s_addr != peer.sin_addr.s_addr) {
          set_nodelay(fd.get());
          peers_[0] = std::move(fd);
          break;
        }
        err = ECONNREFUSED;
      }
      last_error = errno_text(err);
    }
    if (Clock::now() + std::chrono::milliseconds(50) >= deadline)
      fail("handshake: cannot connect to " + peer_name(0) + " within " + seconds_text(timeout_) +
           ": " + last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the hub may start later
  }
  std::vector<uint8_t> hello;
  put_le(hello, static_cast<uint32_t>(env_.rank), 4);
  put_le(hello, static_cast<uint32_t>(env_.world), 4);
  send(0, Op::kHello, hello, deadline);
  receive(0, Op::kWelcome, deadline);
}

std::vector<uint8_t> Rendezvous::broadcast(std::span<const uint8_t> from_root) {
  if (!failure_.empty()) throw Error(failure_);
  ++seq_;
  if (env_.rank != 0) return receive(0, Op::kBroadcast, Clock::now() + timeout_);
  auto deadline = Clock::now() + timeout_;
  for (int r = 1; r < env_.world; ++r) send(r, Op::kBroadcast, from_root, deadline);
  return {from_root.begin(), from_root.end()};
}

std::vector<std::vector<uint8_t>> Rendezvous::allgather(std::span<const uint8_t> mine) {
  return gather(Op::kAllgather, mine);
}

void Rendezvous::barrier() { gather(Op::kBarrier, {}); }

std::vector<std::vector<uint8_t>> Rendezvous::gather(Op op, std::span<const uint8_t> mine) {
  if (!failure_.empty()) throw Error(failure_);
  ++seq_;
  auto deadline = Clock::now() + timeout_;
  std::vector<std::vector<uint8_t>> all(env_.world);
  all[env_.rank].assign(mine.begin(), mine.end());
  if (env_.world == 1) return all;
  if (env_.rank != 0) {
    send(0, op, mine, deadline);
    auto parts = unpack(receive(0, op, deadline), env_.world);
    if (!parts)
      fail(step_text(uint32_t(op), seq_) + ": malformed result from " + peer_name(0));
    return std::move(*parts);
  }
  for (int r = 1; r < env_.world; ++r) all[r] = receive(r, op, deadline);
  auto packed = pack(all);
  for (int r = 1; r < env_.world; ++r) send(r, op, packed, deadline);
  return all;
}

}  // namespace flashoverlap::rt
