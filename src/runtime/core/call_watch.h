// call_watch.h — a bound on each op call's time on the GPU (docs/design.md
// §5.7): a peer that dies inside an NCCL collective leaves the others'
// collective kernels waiting for ever; the library's bounded waits do not
// cover NCCL's. An op brackets each call's work on its stream with two
// events; a process-wide thread polls them, and a call whose work started
// more than the op's timeout ago and has not completed fails its op: the
// op's own communicators are revoked (ncclCommRevoke: their kernels return),
// a message goes to stderr at once, and the op's next call throws it.
// Calls under CUDA graph capture are not watched (a graph's replays are the
// caller's).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace flashoverlap::rt {

using WatchClock = std::chrono::steady_clock;

// What an op's CallWatch shares with its calls in flight.
struct WatchOwner {
  std::mutex m;
  std::string who;
  double timeout_s = 30;
  std::function<void()> on_failure;  // (under m, while alive) the op's communicators revoked
  bool alive = true;                 // false once the op is gone: nothing of it is touched
  std::atomic<bool> failed{false};
  std::string message;
  std::vector<cudaEvent_t> free_events;  // recycled by the poller (under m)
};

// One watched call: its events, and since when its work runs.
struct WatchedCall {
  std::shared_ptr<WatchOwner> owner;
  int device = 0;
  // The stream its work went to, where calls on it complete in the order
  // they were enqueued (nullptr: not known to; the per-thread default
  // stream's handle names a different stream on each thread).
  const void* lane = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  bool running = false;
  WatchClock::time_point since{};
};

// Queued: not started on the GPU; Running: started, not done; Done: both
// events complete; Lost: a query failed (the call is not watched further).
enum class CallState { Queued, Running, Done, Lost };

// The calls in flight, in the order they were enqueued (host logic: the
// poller's decisions; tested on the CPU with a fake probe and clock).
class WatchQueue {
 public:
  void push(WatchedCall c) { calls_.push_back(std::move(c)); }
  size_t size() const { return calls_.size(); }
  // Each call's state (probe): Done and Lost calls leave (release gets
  // them); a Running call past its owner's timeout fails the owner (once:
  // fail_owner) and leaves, and so do the owner's other calls. Calls of an
  // owner already failed or gone leave unprobed. A call behind a call of
  // its lane that is not done has not started: it stays Queued, unprobed
  // (an eager loop queues hundreds of calls between two polls).
  void poll(WatchClock::time_point now, const std::function<CallState(const WatchedCall&)>& probe,
            const std::function<void(WatchedCall&)>& release);

 private:
  std::deque<WatchedCall> calls_;
};

// The owner failed with `message` (first failure only): on_failure runs
// while the owner is alive, the message goes to stderr.
void fail_owner(WatchOwner& owner, const std::string& message);

// An op's watch: begin/end around each call's work on the caller's stream.
class CallWatch {
 public:
  // who: the op, as its messages name it; timeout_s: a call's bound, counted
  // from the moment its work starts on the GPU. enabled false: begin and
  // end do nothing (no call is watched).
  CallWatch(std::string who, double timeout_s, bool enabled = true);
  ~CallWatch();
  CallWatch(const CallWatch&) = delete;
  CallWatch& operator=(const CallWatch&) = delete;

  // What a failure does besides the message (e.g. revoke the op's own
  // communicators; never the caller's, which it does not own).
  void on_failure(std::function<void()> fn);
  void begin(cudaStream_t stream);
  void end(cudaStream_t stream);
  // Throws Error with the failure's message if a call of this op overran.
  void check() const;
  bool failed() const { return owner_->failed.load(std::memory_order_acquire); }

  // begin at construction, end at destruction (also when the call throws).
  class Scope {
   public:
    Scope(CallWatch& w, cudaStream_t s) : w_(w), s_(s) { w_.begin(s_); }
    ~Scope() { w_.end(s_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CallWatch& w_;
    cudaStream_t s_;
  };

 private:
  cudaEvent_t take_event();
  std::shared_ptr<WatchOwner> owner_;
  cudaEvent_t open_ = nullptr;  // begin's event, until end
  int device_ = 0;
  bool enabled_ = true;
};

// The message of a call that overran (fail_owner's).
std::string overran_message(const std::string& who, double timeout_s);

}  // namespace flashoverlap::rt
