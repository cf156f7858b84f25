// bootstrap.h — how the processes of one job find each other, before NCCL exists.
//
// DistEnv reads the job layout from the environment (torchrun, `flashoverlap
// launch`, or OpenMPI's mpirun). Rendezvous is a tiny TCP store with rank 0 as
// the hub: it shares the 128-byte ncclUniqueId (broadcast), gathers per-rank
// data such as MoE routing counts or timings (allgather), and synchronises
// (barrier). Host-only: POSIX sockets, no CUDA, no NCCL.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace flashoverlap::rt {

// torchrun's default, used when the rank variables are set but MASTER_PORT is not
// (e.g. a plain `mpirun -n 2 flashoverlap ...` on one node).
inline constexpr int kDefaultMasterPort = 29500;
inline constexpr const char* kDefaultMasterAddr = "127.0.0.1";

// Bound of every blocking rendezvous step: generous, because a step waits for
// the slowest rank to reach it (e.g. rank 0 creating the NCCL unique id).
inline constexpr std::chrono::milliseconds kDefaultBootstrapTimeout{std::chrono::seconds(300)};

struct DistEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;  // the GPU this process drives on its node
  std::string master_addr = kDefaultMasterAddr;
  int master_port = kDefaultMasterPort;

  // The job layout, from (first match wins):
  //  - RANK, WORLD_SIZE, LOCAL_RANK (torchrun, `flashoverlap launch`);
  //  - OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK.
  // Either way MASTER_ADDR / MASTER_PORT name the hub (rank 0's host and a
  // port it may listen on), defaulting to 127.0.0.1:kDefaultMasterPort, which
  // only works on one node. A missing local rank defaults to the rank (one node).
  // An empty variable counts as unset. Returns nullopt when neither rank
  // variable is set (a single process, no rendezvous). Throws InvalidArgument
  // naming the variable for a non-integer, a rank outside [0, world), a rank
  // without a world size (or the reverse), or a port outside 1..65535.
  static std::optional<DistEnv> from_env();
  // The same, with `getenv` as the variable lookup (for tests).
  static std::optional<DistEnv> from_env(const std::function<const char*(const char*)>& getenv);
};

// A free TCP port on this host (bound to port 0, then released). Another
// socket may be given it before it is used (under parallel tests, another
// test's hub or a connection's source port): prefer ReservedPort.
int find_free_port();

namespace detail {
// Owns a file descriptor; closes it once.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() { int fd = fd_; fd_ = -1; return fd; }
  void reset();
 private:
  int fd_ = -1;
};
}  // namespace detail

// A free TCP port of this host (the kernel picks it), held by a socket bound
// on all interfaces with SO_REUSEADDR for as long as the object lives. While
// it is held the kernel gives the port to no other bind(port 0) or connect()
// source port, so tests running in parallel and the launcher's children
// cannot collide on it, unlike find_free_port()'s bare number.
//  - listening(): the socket listens: peers can connect at once (they queue
//    until the hub accepts) and no other socket can bind the port at all.
//    Hand it to the hub of this process: Rendezvous(env, std::move(port)).
//  - bound(): the socket only binds. Connections are refused until someone
//    listens, and a hub in another process (a launched child) can still bind
//    the port and listen on it if it sets SO_REUSEADDR, as Rendezvous (and
//    torch's TCPStore) do: Linux lets SO_REUSEADDR sockets share a port as
//    long as none of them listens. A Rendezvous of this process may adopt it too.
// Close-on-exec: a child started later does not inherit it. Throws Error.
class ReservedPort {
 public:
  static ReservedPort listening();
  static ReservedPort bound();
  ReservedPort(ReservedPort&&) = default;
  ReservedPort& operator=(ReservedPort&&) = default;

  int port() const { return port_; }

 private:
  friend class Rendezvous;
  ReservedPort(detail::UniqueFd fd, int port) : fd_(std::move(fd)), port_(port) {}
  detail::UniqueFd fd_;
  int port_ = 0;
};

// A process group's TCP rendezvous: rank 0 is the hub, every other rank keeps
// one connection to it for the life of the object. All ranks must call the
// same collectives in the same order (each carries a sequence number; a
// mismatch fails). Every blocking step is bounded by `timeout` and fails with
// rank, peer and what was awaited; a peer that exits fails the others (the hub
// relays the reason). After a failure the object only throws.
// Not thread-safe: one thread per Rendezvous.
class Rendezvous {
 public:
  // Rank 0 listens on env.master_port (all interfaces, SO_REUSEADDR) and
  // waits for world-1 peers; the others connect to master_addr:master_port,
  // retrying until the timeout (the hub may start later). The handshake
  // rejects a duplicate rank or a different world size, on both sides.
  // world == 1 opens no socket.
  explicit Rendezvous(const DistEnv& env,
                      std::chrono::milliseconds timeout = kDefaultBootstrapTimeout);
  // The hub (env.rank == 0) on a port reserved beforehand: it listens on
  // `port`'s socket instead of binding env.master_port itself, so that nothing
  // else can take the port between choosing it and the peers joining. The
  // peers use the constructor above with env.master_port == port.port().
  // Throws InvalidArgument for another rank or another master_port.
  Rendezvous(const DistEnv& env, ReservedPort port,
             std::chrono::milliseconds timeout = kDefaultBootstrapTimeout);
  Rendezvous(Rendezvous&&) = default;
  Rendezvous& operator=(Rendezvous&&) = default;
  ~Rendezvous();

  int rank() const { return env_.rank; }
  int world() const { return env_.world; }

  // Rank 0's bytes, on every rank (other ranks' argument is ignored).
  std::vector<uint8_t> broadcast(std::span<const uint8_t> from_root);
  // Every rank's bytes (sizes may differ), indexed by rank.
  std::vector<std::vector<uint8_t>> allgather(std::span<const uint8_t> mine);
  // Returns once every rank has called it.
  void barrier();

 private:
  enum class Op : uint32_t;
  using Deadline = std::chrono::steady_clock::time_point;
  void check_env() const;
  detail::UniqueFd listen_on_master_port();
  void accept_peers(detail::UniqueFd listener, Deadline deadline);
  void join_hub(Deadline deadline);
  std::vector<std::vector<uint8_t>> gather(Op op, std::span<const uint8_t> mine);
  void send(int peer, Op op, std::span<const uint8_t> payload, Deadline deadline);
  std::vector<uint8_t> receive(int peer, Op op, Deadline deadline);
  // Marks the group broken and throws Error(prefix + why). On the hub it first
  // tells every peer (except `unsafe_peer`, whose stream may be mid-message).
  [[noreturn]] void fail(const std::string& why, int unsafe_peer = -1);
  std::string prefix() const;
  std::string peer_name(int peer) const;

  DistEnv env_;
  std::chrono::milliseconds timeout_;
  uint32_t seq_ = 0;             // collectives completed so far (same on every rank)
  std::string failure_;          // set once broken
  // Rank 0: peers_[r] is the connection to rank r (peers_[0] unused).
  // Other ranks: peers_[0] is the connection to the hub.
  std::vector<detail::UniqueFd> peers_;
};

}  // namespace flashoverlap::rt
