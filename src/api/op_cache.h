// op_cache.h — the runtime ops a public op keeps, one per m it has run
// (each holds device tables for its m: ~3 MB for a ReduceScatter of 16384 x
// 8192), bounded: past `capacity`, the op least recently used goes, unless
// it was captured into a CUDA graph (the graph reads its tables and
// counters for as long as it lives) or pinned (prepare(m): the caller is
// about to capture it). Host-only: Op needs `bool captured()`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

namespace flashoverlap::api {

// Ops kept per m by the public ops (gemm_allreduce.cpp, gemm_reducescatter.cpp).
inline constexpr size_t kOpsKept = 64;

template <class Op>
class OpCache {
 public:
  explicit OpCache(size_t capacity = kOpsKept) : capacity_(capacity) {}

  // The op of m, now the most recently used; nullptr if there is none.
  Op* find(int64_t m) {
    const auto it = ops_.find(m);
    if (it == ops_.end()) return nullptr;
    it->second.used = ++clock_;
    return it->second.op.get();
  }
  // Keeps `op` for m. First, while `capacity` ops are kept, the least
  // recently used that was never captured nor pinned goes: going(m, op) is called
  // on it before it is destroyed (to report its errors, forget it, ...;
  // if it throws, the op stays and nothing is added).
  Op& add(int64_t m, std::unique_ptr<Op> op, const std::function<void(int64_t, Op&)>& going = {}) {
    while (ops_.size() >= capacity_) {
      auto victim = ops_.end();
      for (auto it = ops_.begin(); it != ops_.end(); ++it)
        if (!it->second.pinned && !it->second.op->captured() &&
            (victim == ops_.end() || it->second.used < victim->second.used))
          victim = it;
      if (victim == ops_.end()) break;  // every one is in a graph or pinned: keep them all
      if (going) going(victim->first, *victim->second.op);
      ops_.erase(victim);
    }
    Entry& e = ops_[m];
    e.op = std::move(op);
    e.used = ++clock_;
    return *e.op;
  }
  // m's op (if kept) never goes.
  void pin(int64_t m) {
    if (const auto it = ops_.find(m); it != ops_.end()) it->second.pinned = true;
  }
  size_t size() const { return ops_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    std::unique_ptr<Op> op;
    uint64_t used = 0;
    bool pinned = false;
  };
  std::map<int64_t, Entry> ops_;
  size_t capacity_;
  uint64_t clock_ = 0;
};

}  // namespace flashoverlap::api
