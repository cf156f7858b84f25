// DistEnv parsing, the TCP rendezvous over loopback (one thread per rank), and
// the reserved ports that keep groups apart.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "flashoverlap/error.h"
#include "process/bootstrap.h"
#include "test_seed.h"

namespace flashoverlap::rt {
namespace {

using namespace std::chrono_literals;
using Vars = std::map<std::string, std::string>;

std::optional<DistEnv> parse(const Vars& vars) {
  return DistEnv::from_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The InvalidArgument message of parsing `vars` ("" when it does not throw).
std::string parse_error(const Vars& vars) {
  try {
    parse(vars);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Env, NothingSetMeansOneProcess) {
  EXPECT_FALSE(parse({}).has_value());
  EXPECT_FALSE(parse({{"MASTER_ADDR", "10.0.0.1"}, {"RANK", ""}}).has_value());
}

TEST(Env, Torchrun) {
  auto env = parse({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                    {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "node7");
  EXPECT_EQ(env->master_port, 1234);
}

TEST(Env, DefaultsForMissingOptionalVariables) {
  auto env = parse({{"RANK", "2"}, {"WORLD_SIZE", "4"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->local_rank, 2);
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->master_port, kDefaultMasterPort);
}

TEST(Env, OpenMpi) {
  auto env = parse({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world, 4);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->master_port, kDefaultMasterPort);

  env = parse({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
               {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "4000"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->master_addr, "10.1.2.3");
  EXPECT_EQ(env->master_port, 4000);
}

TEST(Env, TorchrunVariablesWinOverMpi) {
  auto env = parse({{"RANK", "1"}, {"WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world, 2);
}

TEST(Env, BadValuesNameTheVariable) {
  const Vars ok{{"RANK", "1"}, {"WORLD_SIZE", "4"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Vars vars = ok;
    vars[k] = v;
    return parse_error(vars);
  };
  EXPECT_NE(with("RANK", "abc").find("RANK='abc' is not an integer"), std::string::npos);
  EXPECT_NE(with("RANK", "1x").find("RANK"), std::string::npos);
  EXPECT_NE(with("RANK", "4").find("RANK=4 is out of range: must be in [0, WORLD_SIZE=4)"),
            std::string::npos);
  EXPECT_NE(with("RANK", "-1").find("RANK=-1"), std::string::npos);
  EXPECT_NE(with("WORLD_SIZE", "0").find("WORLD_SIZE=0"), std::string::npos);
  EXPECT_NE(with("LOCAL_RANK", "9").find("LOCAL_RANK=9"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "70000").find("MASTER_PORT=70000"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "0").find("MASTER_PORT=0"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "http").find("MASTER_PORT='http'"), std::string::npos);
  EXPECT_NE(parse_error({{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not"),
            std::string::npos);
  EXPECT_NE(parse_error({{"OMPI_COMM_WORLD_SIZE", "2"}})
                .find("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"),
            std::string::npos);
  EXPECT_NE(parse_error({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}})
                .find("OMPI_COMM_WORLD_RANK=2"),
            std::string::npos);
}

TEST(Env, ReadsTheProcessEnvironment) {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  auto env = DistEnv::from_env();
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world, 3);
}

// ------------------------------------------------------------ rendezvous
// Every group's port is reserved (ReservedPort) for the whole test, so tests
// running in parallel (ctest -j) cannot take each other's ports.

// The bound of the steps that are meant to succeed: far above what they take
// (milliseconds), so that a loaded machine does not turn it into a failure,
// and below ctest's timeout, so that a hang still fails with a message.
constexpr auto kStepTimeout = 60s;

DistEnv env_for(int rank, int world, int port) {
  DistEnv e;
  e.rank = rank;
  e.world = world;
  e.local_rank = rank;
  e.master_port = port;
  return e;
}

// Rank `rank` of a group whose hub (rank 0) adopts `hub_port` (reserved
// before the threads start; the others connect to its number).
Rendezvous join(int rank, int world, ReservedPort& hub_port, int port,
                std::chrono::milliseconds timeout = kStepTimeout) {
  const DistEnv env = env_for(rank, world, port);
  return rank == 0 ? Rendezvous(env, std::move(hub_port), timeout) : Rendezvous(env, timeout);
}

// Runs body(i) on n threads; returns each one's exception message ("" if none).
std::vector<std::string> on_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        body(i);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Each rank's allgather contribution in a world, the same on every thread
// for one test seed: random sizes, one empty, one large enough (1 MiB) that
// the sends block and resume.
std::vector<uint8_t> contribution(uint64_t seed, int world, int rank) {
  const uint64_t mine = seed + uint64_t(world) * 1000 + uint64_t(rank);
  const size_t size = rank == 1 ? 0 : (rank == 2 ? (1 << 20) : std::mt19937_64(mine)() % 5000);
  return random_bytes(size, mine);
}

TEST(Rendezvous, CollectivesForWorldSizes1To8) {
  const uint64_t seed = fo_test::test_seed();
  FO_SEED_TRACE(seed);
  for (int world = 1; world <= 8; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    ReservedPort hub = ReservedPort::listening();
    const int port = hub.port();
    const auto id = random_bytes(128, seed ^ uint64_t(world));  // an ncclUniqueId
    auto errors = on_threads(world, [&](int rank) {
      FO_SEED_TRACE(seed);  // (traces are per thread)
      Rendezvous rv = join(rank, world, hub, port);
      EXPECT_EQ(rv.rank(), rank);
      EXPECT_EQ(rv.world(), world);
      const std::vector<uint8_t> ignored(7, 0xee);
      EXPECT_EQ(rv.broadcast(rank == 0 ? id : ignored), id);
      for (int round = 0; round < 2; ++round) {  // sequence numbers advance
        auto all = rv.allgather(contribution(seed, world, rank));
        ASSERT_EQ(all.size(), static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) EXPECT_EQ(all[r], contribution(seed, world, r)) << "rank " << r;
        rv.barrier();
      }
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

TEST(Rendezvous, HubMayStartLast) {
  // Bound, not listening: the peers' first attempts are refused, and they
  // retry until the hub listens (after its sleep, if the peers came first).
  ReservedPort hub = ReservedPort::bound();
  const int port = hub.port();
  auto errors = on_threads(3, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(400ms);
    Rendezvous rv = join(rank, 3, hub, port);
    std::vector<uint8_t> mine{static_cast<uint8_t>(rank)};
    auto all = rv.allgather(mine);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(all[r], std::vector<uint8_t>{static_cast<uint8_t>(r)});
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Rendezvous, MissingPeerTimesOutWithMessage) {
  ReservedPort hub = ReservedPort::listening();  // rank 1 connects at once, however late the hub runs
  const int port = hub.port();
  const auto start = std::chrono::steady_clock::now();
  auto errors = on_threads(2, [&](int rank) { Rendezvous rv = join(rank, 3, hub, port, 500ms); });
  const auto took = std::chrono::steady_clock::now() - start;
  // Safe: the hub's deadline is 0.5 s after it started, which is after `start`.
  EXPECT_GE(took, 500ms);
  // Generous, for a loaded machine: only a wait that ignores the 0.5 s timeout
  // (say, one on the 300 s default) lasts this long.
  EXPECT_LT(took, 30s);
  EXPECT_NE(errors[0].find("rendezvous rank 0 of 3"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("timed out after 0.5 s"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank(s) 2 to join (1 of 2 peers joined)"), std::string::npos)
      << errors[0];
  // Rank 1 either timed out itself or was told by the hub: both say so.
  EXPECT_NE(errors[1].find("rendezvous rank 1 of 3"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("timed out after 0.5 s"), std::string::npos) << errors[1];
}

TEST(Rendezvous, NoHubTimesOutWithAddress) {
  const ReservedPort nobody = ReservedPort::bound();  // held, never listened on: refused
  const int port = nobody.port();
  const auto start = std::chrono::steady_clock::now();
  try {
    Rendezvous rv(env_for(1, 2, port), 300ms);
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cannot connect to rank 0 (hub 127.0.0.1:" + std::to_string(port) + ")"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("Connection refused"), std::string::npos) << msg;
  }
  const auto took = std::chrono::steady_clock::now() - start;
  // Safe: it gives up only once less than its 50 ms pause is left of the 0.3 s.
  EXPECT_GE(took, 250ms);
  // Generous, for a loaded machine: only a wait past the timeout lasts this long.
  EXPECT_LT(took, 30s);
}

TEST(Rendezvous, DuplicateRankFailsEveryone) {
  ReservedPort hub = ReservedPort::listening();
  const int port = hub.port();
  // Threads 1 and 2 both claim rank 1.
  auto errors = on_threads(3, [&](int i) { Rendezvous rv = join(i == 0 ? 0 : 1, 3, hub, port); });
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(errors[i].find("duplicate rank 1: two processes claim it"), std::string::npos)
        << i << ": " << errors[i];
}

TEST(Rendezvous, WorldSizeMismatchFailsBothSides) {
  ReservedPort hub = ReservedPort::listening();
  const int port = hub.port();
  auto errors = on_threads(2, [&](int rank) {
    Rendezvous rv = join(rank, /*world=*/rank == 0 ? 2 : 3, hub, port);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("rank 1 has world size 3 but rank 0 has 2"), std::string::npos)
        << r << ": " << errors[r];
}

TEST(Rendezvous, PeerExitFailsTheOthers) {
  ReservedPort hub = ReservedPort::listening();
  const int port = hub.port();
  std::string after;
  auto errors = on_threads(3, [&](int rank) {
    Rendezvous rv = join(rank, 3, hub, port);
    if (rank == 2) return;  // "exits": its socket closes
    std::vector<uint8_t> mine(16, static_cast<uint8_t>(rank));
    try {
      rv.allgather(mine);
    } catch (const Error&) {
      if (rank == 0) {
        try { rv.barrier(); } catch (const Error& e) { after = e.what(); }  // stays failed
      }
      throw;
    }
  });
  EXPECT_NE(errors[0].find("allgather #1: receiving from rank 2: connection closed"),
            std::string::npos)
      << errors[0];
  EXPECT_EQ(after, errors[0]);
  // Rank 1 hears the reason from the hub (or, at worst, sees the hub go away).
  EXPECT_NE(errors[1].find("rendezvous rank 1 of 3: allgather #1: receiving from rank 0"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("rank 2"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[2], "");
}

TEST(Rendezvous, CollectivesOutOfOrderAreDetected) {
  ReservedPort hub = ReservedPort::listening();
  const int port = hub.port();
  auto errors = on_threads(2, [&](int rank) {
    Rendezvous rv = join(rank, 2, hub, port);
    std::vector<uint8_t> data(4, 1);
    if (rank == 0) {
      rv.broadcast(data);
      rv.barrier();  // rank 1 has given up by now
    } else {
      rv.allgather(data);
    }
  });
  EXPECT_NE(errors[1].find("allgather #1: receiving from rank 0 (hub 127.0.0.1:" +
                           std::to_string(port) + "): got broadcast #1 instead"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0], "");
}

TEST(Rendezvous, WorldOfOneNeedsNoSocket) {
  DistEnv env;  // port 29500 may be taken; world 1 never touches it
  Rendezvous rv(env, 100ms);
  std::vector<uint8_t> data{1, 2, 3};
  EXPECT_EQ(rv.broadcast(data), data);
  auto all = rv.allgather(data);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], data);
  rv.barrier();
}

TEST(Rendezvous, RejectsBadRank) {
  EXPECT_THROW(Rendezvous(env_for(2, 2, 1234), 100ms), InvalidArgument);
  ReservedPort hub = ReservedPort::listening();
  const int port = hub.port();
  EXPECT_THROW(Rendezvous(env_for(1, 2, port), std::move(hub), 100ms), InvalidArgument);  // not the hub
  ReservedPort other = ReservedPort::listening();
  EXPECT_THROW(Rendezvous(env_for(0, 2, other.port() % 65535 + 1), std::move(other), 100ms),
               InvalidArgument);  // not the reserved port
}

// ------------------------------------------------------------ ports

// The listening reservation keeps every other socket off the port; the bound
// one lets a hub bind it again (as a launched child's does), but neither is
// ever handed out by the kernel to bind(port 0) or find_free_port().
TEST(ReservedPort, HeldPortsAreNotHandedOutAgain) {
  std::vector<ReservedPort> held;
  std::set<int> ports;
  for (int i = 0; i < 64; ++i) {
    held.push_back(i % 2 ? ReservedPort::listening() : ReservedPort::bound());
    ports.insert(held.back().port());
  }
  EXPECT_EQ(ports.size(), held.size());
  for (int i = 0; i < 500; ++i) {
    const int p = find_free_port();
    ASSERT_EQ(ports.count(p), 0u) << "port " << p << " is held, yet handed out";
  }
}

TEST(ReservedPort, ListeningKeepsOtherHubsOffBoundLetsOneBind) {
  ReservedPort listening = ReservedPort::listening();
  try {
    Rendezvous rv(env_for(0, 2, listening.port()), 100ms);  // binds the port itself
    FAIL() << "bound a port that another socket listens on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on port " + std::to_string(listening.port()) +
                                         ": Address already in use"),
              std::string::npos)
        << e.what();
  }
  // A hub that binds a port held by a bound reservation (here in this
  // process; the launcher's children do it from theirs).
  const ReservedPort bound = ReservedPort::bound();
  const int port = bound.port();
  auto errors = on_threads(2, [&](int rank) {
    Rendezvous rv(env_for(rank, 2, port), kStepTimeout);
    rv.barrier();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace flashoverlap::rt
