// call_watch.cpp — see call_watch.h.
#include "runtime/core/call_watch.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <sstream>
#include <thread>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"

namespace flashoverlap::rt {

void WatchQueue::poll(WatchClock::time_point now, const std::function<CallState(const WatchedCall&)>& probe,
                      const std::function<void(WatchedCall&)>& release) {
  std::deque<WatchedCall> kept;
  std::vector<std::pair<int, const void*>> blocked;  // lanes with a call not done (a handful)
  for (WatchedCall& c : calls_) {
    if (c.owner->failed.load(std::memory_order_acquire)) {
      release(c);
      continue;
    }
    const std::pair<int, const void*> lane{c.device, c.lane};
    if (c.lane && std::find(blocked.begin(), blocked.end(), lane) != blocked.end()) {
      kept.push_back(std::move(c));
      continue;
    }
    const CallState s = probe(c);
    if (s == CallState::Done || s == CallState::Lost) {
      release(c);
      continue;
    }
    if (c.lane) blocked.push_back(lane);
    if (s == CallState::Running && !c.running) c.running = true, c.since = now;
    const double ran_s = c.running ? std::chrono::duration<double>(now - c.since).count() : 0.0;
    if (ran_s > c.owner->timeout_s) {
      fail_owner(*c.owner, overran_message(c.owner->who, c.owner->timeout_s));
      release(c);
      continue;
    }
    kept.push_back(std::move(c));
  }
  calls_.swap(kept);
}

std::string overran_message(const std::string& who, double timeout_s) {
  std::ostringstream os;
  os << who << ": a call's work did not complete within " << timeout_s
     << " s of starting on the GPU: a peer may have died or stopped calling inside an NCCL collective. The op's own "
        "NCCL communicators were revoked; the caller's communicator, if the call used it, may be stuck too (abort "
        "it). Build the op anew once the ranks agree.";
  return os.str();
}

void fail_owner(WatchOwner& owner, const std::string& message) {
  std::lock_guard<std::mutex> lock(owner.m);
  if (owner.failed.load(std::memory_order_relaxed)) return;
  owner.message = message;
  if (owner.alive && owner.on_failure) {
    try {
      owner.on_failure();
    } catch (const std::exception& e) {
      owner.message += std::string(" (revoking failed: ") + e.what() + ")";
    }
  }
  owner.failed.store(true, std::memory_order_release);
  std::fprintf(stderr, "flashoverlap: %s\n", owner.message.c_str());
  std::fflush(stderr);
}

namespace {

// The process's poller: one thread, asleep while no call is watched. Never
// destroyed (a thread still polling while static destructors run would
// query a CUDA runtime being torn down).
class Poller {
 public:
  static Poller& get() {
    static Poller* p = new Poller();
    return *p;
  }
  void push(WatchedCall c) {
    {
      std::lock_guard<std::mutex> lock(m_);
      incoming_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

 private:
  Poller() { std::thread([this] { loop(); }).detach(); }

  static CallState probe(const WatchedCall& c) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != c.device) (void)cudaSetDevice(c.device);
    const cudaError_t e = cudaEventQuery(c.end);
    if (e == cudaSuccess) return CallState::Done;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return CallState::Lost;
    }
    const cudaError_t s = c.running ? cudaSuccess : cudaEventQuery(c.start);
    if (s == cudaErrorNotReady) return CallState::Queued;
    if (s != cudaSuccess) {
      (void)cudaGetLastError();
      return CallState::Lost;
    }
    return CallState::Running;
  }

  // The call's events back to its op's pool, or destroyed if the op is gone.
  static void release(WatchedCall& c) {
    std::lock_guard<std::mutex> lock(c.owner->m);
    for (cudaEvent_t e : {c.start, c.end}) {
      if (!e) continue;
      if (c.owner->alive) c.owner->free_events.push_back(e);
      else (void)cudaEventDestroy(e);
    }
    c.start = c.end = nullptr;
  }

  // The lock covers only the hand-over of new calls: a caller's push never
  // waits for the event queries.
  void loop() {
    std::vector<WatchedCall> taken;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [this] { return !incoming_.empty() || queue_.size() > 0; });
        taken.swap(incoming_);
      }
      for (WatchedCall& c : taken) queue_.push(std::move(c));
      taken.clear();
      queue_.poll(WatchClock::now(), probe, release);
      if (queue_.size() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::vector<WatchedCall> incoming_;  // (under m_)
  WatchQueue queue_;                   // (the poller thread's alone)
};

}  // namespace

CallWatch::CallWatch(std::string who, double timeout_s, bool enabled)
    : owner_(std::make_shared<WatchOwner>()), enabled_(enabled) {
  owner_->who = std::move(who);
  owner_->timeout_s = timeout_s;
  FO_CUDA_CHECK(cudaGetDevice(&device_));
}

CallWatch::~CallWatch() {
  std::lock_guard<std::mutex> lock(owner_->m);
  owner_->alive = false;  // (calls still polled release their events themselves)
  for (cudaEvent_t e : owner_->free_events) (void)cudaEventDestroy(e);
  owner_->free_events.clear();
  if (open_) (void)cudaEventDestroy(open_);
}

void CallWatch::on_failure(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(owner_->m);
  owner_->on_failure = std::move(fn);
}

cudaEvent_t CallWatch::take_event() {
  {
    std::lock_guard<std::mutex> lock(owner_->m);
    if (!owner_->free_events.empty()) {
      cudaEvent_t e = owner_->free_events.back();
      owner_->free_events.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  FO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CallWatch::begin(cudaStream_t stream) {
  if (!enabled_) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FO_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone || open_) return;
  open_ = take_event();
  FO_CUDA_CHECK(cudaEventRecord(open_, stream));
}

void CallWatch::end(cudaStream_t stream) {
  if (!open_) return;
  WatchedCall c;
  c.owner = owner_, c.device = device_, c.start = open_;
  if (stream != cudaStreamPerThread) c.lane = stream;
  open_ = nullptr;
  c.end = take_event();
  if (cudaEventRecord(c.end, stream) != cudaSuccess) {  // (end runs in destructors: no throw)
    (void)cudaGetLastError();
    std::lock_guard<std::mutex> lock(owner_->m);
    owner_->free_events.push_back(c.start);
    owner_->free_events.push_back(c.end);
    return;
  }
  Poller::get().push(std::move(c));
}

void CallWatch::check() const {
  if (!failed()) return;
  std::lock_guard<std::mutex> lock(owner_->m);
  throw Error(owner_->message);
}

}  // namespace flashoverlap::rt
