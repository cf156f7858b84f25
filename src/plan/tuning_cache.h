// tuning_cache.h — plans remembered per machine and shape, in one JSON file:
//   {"format": "flashoverlap.tuning_cache", "schema": 1,
//    "entries": {"<key>": {"key": {...}, "plan": {<plan JSON>}}}}
// keyed by GPU name, SM count, world size, collective, dtype, M, N, K.
//
// A damaged cache must never stop a run (it can always be rebuilt), so
// reading does not throw: a file that is not a valid cache (not JSON, foreign,
// another schema) reads as empty, a bad entry (unparsable plan, plan that
// contradicts its key) is dropped, and each is reported in warnings() for the
// caller to log. store() re-reads the file, adds its entry and writes
// atomically (temporary file in the same directory, then rename), all under
// an exclusive lock on "<path>.lock" (flock), so writers queue instead of
// racing: every writer's entry survives, whether the writers are threads of
// one process or the ranks of a job sharing the file (where the file system
// honours flock for all of them: a local disk does; NFS on Linux emulates it).
// A damaged file is first moved aside to "<path>.corrupt". Readers take no
// lock: they see the old or the new file. One TuningCache object per thread.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plan/json_file.h"
#include "plan/planner.h"

namespace flashoverlap::plan {

struct CacheKey {
  std::string gpu;
  int32_t sms = 0, world = 0;
  Collective op = Collective::AllReduce;
  DType dtype = DType::BF16;
  int64_t m = 0, n = 0, k = 0;

  std::string str() const;  // "NVIDIA H200|132|2|allreduce|bf16|4096|8192|8192"
  nlohmann::json to_json() const;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

class TuningCache {
 public:
  static constexpr const char* kFormat = "flashoverlap.tuning_cache";
  static constexpr int kSchema = 1;

  explicit TuningCache(std::string path);  // reads the file when it exists

  std::optional<Plan> lookup(const CacheKey& key) const;
  // Throws InvalidArgument when the plan contradicts the key, Error when the
  // file cannot be locked or written.
  void store(const CacheKey& key, const Plan& plan);

  size_t size() const { return file_.entries().size(); }
  const std::vector<std::string>& warnings() const { return file_.warnings(); }
  const std::string& path() const { return file_.path(); }

 private:
  EntriesFile file_;  // key string -> {"key", "plan"}
};

}  // namespace flashoverlap::plan
