// The call watch's decisions (runtime/core/call_watch.h; host logic, no
// GPU): which calls leave the queue, when an owner fails, what a failure
// does. A fake probe stands for the events, a fake clock for time.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "flashoverlap/error.h"
#include "runtime/core/call_watch.h"
#include "runtime/core/communicator.h"
#include "test_seed.h"

namespace fo = flashoverlap;
using fo::rt::CallState;
using fo::rt::WatchClock;

namespace {

std::shared_ptr<fo::rt::WatchOwner> owner(const std::string& who, double timeout_s, int* failures) {
  auto o = std::make_shared<fo::rt::WatchOwner>();
  o->who = who, o->timeout_s = timeout_s;
  o->on_failure = [failures] { ++*failures; };
  return o;
}

// A call whose state the test sets: its id in the start event's place.
fo::rt::WatchedCall call(const std::shared_ptr<fo::rt::WatchOwner>& o, uintptr_t id) {
  fo::rt::WatchedCall c;
  c.owner = o;
  c.start = reinterpret_cast<cudaEvent_t>(id);
  return c;
}
uintptr_t id_of(const fo::rt::WatchedCall& c) { return reinterpret_cast<uintptr_t>(c.start); }

struct Fake {
  std::map<uintptr_t, CallState> state;
  std::map<uintptr_t, int> probed, released;
  std::function<CallState(const fo::rt::WatchedCall&)> probe() {
    return [this](const fo::rt::WatchedCall& c) {
      ++probed[id_of(c)];
      return state.at(id_of(c));
    };
  }
  std::function<void(fo::rt::WatchedCall&)> release() {
    return [this](fo::rt::WatchedCall& c) { ++released[id_of(c)]; };
  }
};

WatchClock::time_point at(double s) {
  return WatchClock::time_point() + std::chrono::duration_cast<WatchClock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

// The time counts from the first poll that sees a call's work running, not
// from its enqueue: a call queued behind other work never fails.
TEST(CallWatch, ARunningCallFailsItsOwnerOnlyPastTheTimeoutFromItsStart) {
  int failures = 0;
  const auto o = owner("op A (rank 1 of 2)", 2.0, &failures);
  fo::rt::WatchQueue q;
  Fake f;
  q.push(call(o, 1));
  f.state[1] = CallState::Queued;
  q.poll(at(0), f.probe(), f.release());
  q.poll(at(100), f.probe(), f.release());  // (queued for 100 s: behind other work, not failed)
  EXPECT_EQ(q.size(), 1u);
  EXPECT_FALSE(o->failed);
  f.state[1] = CallState::Running;
  q.poll(at(101), f.probe(), f.release());
  q.poll(at(102.9), f.probe(), f.release());  // (1.9 s running)
  EXPECT_FALSE(o->failed);
  EXPECT_EQ(q.size(), 1u);
  q.poll(at(103.1), f.probe(), f.release());  // (2.1 s)
  EXPECT_TRUE(o->failed);
  EXPECT_EQ(failures, 1);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(f.released[1], 1);
  EXPECT_NE(o->message.find("op A (rank 1 of 2)"), std::string::npos) << o->message;
  EXPECT_NE(o->message.find("within 2 s"), std::string::npos) << o->message;
}

TEST(CallWatch, CompletedAndLostCallsLeaveWithoutAFailure) {
  int failures = 0;
  const auto o = owner("op", 1.0, &failures);
  fo::rt::WatchQueue q;
  Fake f;
  for (uintptr_t i = 1; i <= 3; ++i) q.push(call(o, i));
  f.state = {{1, CallState::Done}, {2, CallState::Lost}, {3, CallState::Running}};
  q.poll(at(0), f.probe(), f.release());
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(f.released[1], 1);
  EXPECT_EQ(f.released[2], 1);
  f.state[3] = CallState::Done;
  q.poll(at(0.99), f.probe(), f.release());
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(f.released[3], 1);
  EXPECT_FALSE(o->failed);
  EXPECT_EQ(failures, 0);
}

// Calls on one lane complete in order: behind the first call not done,
// the lane's calls are not probed (they have not started); other lanes and
// calls of no lane are; once the first is done, the next is probed in the
// same poll.
TEST(CallWatch, CallsBehindANotDoneCallOfTheirLaneAreNotProbed) {
  int failures = 0;
  const auto o = owner("op", 1.0, &failures);
  int s1 = 0, s2 = 0;
  fo::rt::WatchQueue q;
  Fake f;
  const auto on = [&](uintptr_t id, const void* lane) {
    auto c = call(o, id);
    c.lane = lane;
    q.push(std::move(c));
    f.state[id] = CallState::Queued;
  };
  on(1, &s1), on(2, &s2), on(3, &s1), on(4, nullptr), on(5, &s1), on(6, &s2);
  f.state[1] = CallState::Running;
  q.poll(at(0), f.probe(), f.release());
  EXPECT_EQ(f.probed[1], 1);
  EXPECT_EQ(f.probed[2], 1);
  EXPECT_EQ(f.probed[3], 0);
  EXPECT_EQ(f.probed[4], 1);
  EXPECT_EQ(f.probed[5], 0);
  EXPECT_EQ(f.probed[6], 0);
  f.state[1] = CallState::Done, f.state[3] = CallState::Done, f.state[5] = CallState::Running;
  q.poll(at(0.5), f.probe(), f.release());
  EXPECT_EQ(f.released[1], 1);
  EXPECT_EQ(f.released[3], 1);
  EXPECT_EQ(f.probed[5], 1);
  EXPECT_EQ(q.size(), 4u);  // (2, 4, 5, 6)
  // The same lane number on another device is another lane.
  auto c = call(o, 7);
  c.lane = &s1, c.device = 1;
  q.push(std::move(c));
  f.state[7] = CallState::Queued;
  q.poll(at(0.6), f.probe(), f.release());
  EXPECT_EQ(f.probed[7], 1);
  // 5's time counts from the poll that saw it running.
  q.poll(at(1.4), f.probe(), f.release());
  EXPECT_FALSE(o->failed);
  q.poll(at(1.6), f.probe(), f.release());
  EXPECT_TRUE(o->failed);
  EXPECT_EQ(failures, 1);
}

// One owner's failure: its other calls leave unprobed (their events
// released), another owner's calls go on; a failure acts once; an owner
// that is gone is marked failed without its action.
TEST(CallWatch, AFailureActsOnceAndOnItsOwnerOnly) {
  int fa = 0, fb = 0, fc = 0;
  const auto a = owner("A", 1.0, &fa), b = owner("B", 1.0, &fb), c = owner("C", 1.0, &fc);
  c->alive = false;  // (its op destroyed while a call ran)
  fo::rt::WatchQueue q;
  Fake f;
  q.push(call(a, 1));
  q.push(call(b, 2));
  q.push(call(a, 3));
  q.push(call(c, 4));
  f.state = {{1, CallState::Running}, {2, CallState::Running}, {3, CallState::Queued}, {4, CallState::Running}};
  q.poll(at(0), f.probe(), f.release());
  f.state[2] = CallState::Done;
  q.poll(at(1.5), f.probe(), f.release());
  EXPECT_TRUE(a->failed);
  EXPECT_FALSE(b->failed);
  EXPECT_TRUE(c->failed);
  EXPECT_EQ(fa, 1);
  EXPECT_EQ(fb, 0);
  EXPECT_EQ(fc, 0);  // (gone: nothing of its op is touched)
  EXPECT_EQ(q.size(), 0u);
  for (uintptr_t i = 1; i <= 4; ++i) EXPECT_EQ(f.released[i], 1) << i;
  // A later call of the failed owner leaves at once, unprobed.
  q.push(call(a, 5));
  f.state[5] = CallState::Running;
  q.poll(at(2), f.probe(), f.release());
  EXPECT_EQ(f.probed[5], 0);
  EXPECT_EQ(f.released[5], 1);
  EXPECT_EQ(fa, 1);
}

// Fresh random timelines: each call's work starts at some time (or never)
// and ends some time later (or never); polled at random times. An owner
// fails exactly when one of its calls was seen running for longer than the
// timeout before it was seen done; each call is released once.
TEST(CallWatch, RandomTimelinesFailExactlyTheOwnersWithAnOverrun) {
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 200; ++trial) {
    const int owners = 1 + int(rng() % 3), calls = 1 + int(rng() % 8);
    const double timeout = 0.55 + double(rng() % 20) / 10;  // (off the 0.1 s grid of the times: no ties)
    std::vector<int> failures(size_t(owners), 0);
    std::vector<std::shared_ptr<fo::rt::WatchOwner>> os;
    for (int i = 0; i < owners; ++i) os.push_back(owner("op " + std::to_string(i), timeout, &failures[size_t(i)]));
    struct Timeline {
      int owner;
      double start, end;  // (1e9: never)
    };
    std::vector<Timeline> t;
    fo::rt::WatchQueue q;
    Fake f;
    for (int i = 0; i < calls; ++i) {
      const double start = rng() % 4 == 0 ? 1e9 : double(rng() % 100) / 10;
      const double end = rng() % 4 == 0 ? 1e9 : start + double(rng() % 40) / 10;
      t.push_back({int(rng() % uint64_t(owners)), start, end});
      q.push(call(os[size_t(t.back().owner)], uintptr_t(i + 1)));
      f.state[uintptr_t(i + 1)] = CallState::Queued;
    }
    // The oracle: each call as the poller sees it at the same poll times.
    std::vector<double> seen_running(size_t(calls), -1);
    std::vector<bool> expect_failed(size_t(owners), false), left(size_t(calls), false);
    double now = 0;
    for (int step = 0; step < 60; ++step) {
      now += double(1 + rng() % 5) / 10;
      for (int i = 0; i < calls; ++i) {
        const Timeline& x = t[size_t(i)];
        f.state[uintptr_t(i + 1)] = now >= x.end ? CallState::Done : now >= x.start ? CallState::Running : CallState::Queued;
      }
      const std::vector<bool> failed_before = [&] {
        std::vector<bool> v;
        for (const auto& o : os) v.push_back(o->failed);
        return v;
      }();
      for (int i = 0; i < calls; ++i) {
        if (left[size_t(i)]) continue;
        const Timeline& x = t[size_t(i)];
        if (expect_failed[size_t(x.owner)] && failed_before[size_t(x.owner)]) {
          left[size_t(i)] = true;
          continue;
        }
        if (now >= x.end) {
          left[size_t(i)] = true;
          continue;
        }
        if (now >= x.start && seen_running[size_t(i)] < 0) seen_running[size_t(i)] = now;
        if (seen_running[size_t(i)] >= 0 && now - seen_running[size_t(i)] > timeout) {
          expect_failed[size_t(x.owner)] = true;
          left[size_t(i)] = true;
        }
      }
      q.poll(at(now), f.probe(), f.release());
      for (int o = 0; o < owners; ++o) {
        if (expect_failed[size_t(o)]) {
          // (the owner's other calls leave at the next poll)
          for (int i = 0; i < calls; ++i)
            if (t[size_t(i)].owner == o) left[size_t(i)] = left[size_t(i)] || failed_before[size_t(o)];
        }
        ASSERT_EQ(bool(os[size_t(o)]->failed), bool(expect_failed[size_t(o)])) << "trial " << trial << ", owner " << o
                                                                               << ", at " << now;
        ASSERT_LE(failures[size_t(o)], 1);
      }
    }
    for (int i = 0; i < calls; ++i) EXPECT_LE(f.released[uintptr_t(i + 1)], 1) << "trial " << trial;
  }
}

// The ops' failure action revokes through the NCCL loaded, looked up at run
// time (no GPU needed to look): found where that NCCL is 2.28.9 or later
// (2.28.3 has none); where it is not found, a revocation throws and names
// the version.
TEST(CallWatch, RevokeIsLookedUpInTheNcclLoaded) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  if (version >= 22809) EXPECT_TRUE(flashoverlap::rt::can_revoke_communicators()) << "NCCL " << version;
  if (version < 22804) EXPECT_FALSE(flashoverlap::rt::can_revoke_communicators()) << "NCCL " << version;
  if (!flashoverlap::rt::can_revoke_communicators()) {
    try {
      flashoverlap::rt::revoke_communicator(nullptr);
      ADD_FAILURE() << "no throw";
    } catch (const flashoverlap::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(version)), std::string::npos) << e.what();
    }
  }
}
