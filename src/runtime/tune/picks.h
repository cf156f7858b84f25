// picks.h — the tuner's measured picks kept between runs, one JSON file per
// machine (`flashoverlap bench --tuning-cache FILE` stores them; the public
// GemmAllReduce and GemmReduceScatter read them): the offline phase whose
// results the online planner looks up before its model. An entry holds for every m of the same
// tile rows (the plan's groups are tile ranges; m only moves the last row):
//   {"format": "flashoverlap.picks", "schema": 1,
//    "entries": {"<key>": {"key": {...}, "plan": {...}}}}
// keyed by GPU name, SMs, world size, dtype, tile rows (of 128), N and K,
// and for the ReduceScatter its layout ("reducescatter:standard", ...).
//
// Reading never throws (a damaged or foreign file reads as empty, a bad
// entry is dropped, each with a warning); store() holds an flock on "<path>.lock" across its
// re-read, merge and atomic rename, so concurrent writers keep every entry.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "plan/json_file.h"
#include "plan/slot_map_reducescatter.h"
#include "runtime/tune/tuner.h"

namespace flashoverlap::rt {

struct PickKey {
  std::string gpu;
  int32_t sms = 0, world = 0;
  kernels::DType dtype = kernels::DType::BF16;
  int64_t tile_rows = 0, n = 0, k = 0;  // tile_rows: ceil(m / 128)
  std::string op;  // empty: the AllReduce; else reducescatter_op(layout)

  std::string str() const;  // "NVIDIA H200|132|2|bf16|32|8192|8192" (+ "|" + op)
  nlohmann::json to_json() const;
  static PickKey from_json(const nlohmann::json& j);  // throws InvalidArgument
  friend bool operator==(const PickKey&, const PickKey&) = default;
};

// The tile rows of m: what an entry is looked up by.
inline int64_t tile_rows_of(int64_t m) { return (m + 127) / 128; }

// A plan as JSON, its groups as the sizes of its units (bands for the
// row-band layouts, waves otherwise); and back, for `key`'s shape (m =
// tile_rows * 128) and `sms`: throws InvalidArgument "<source>: <problem>"
// for anything that does not make a plan of that shape.
nlohmann::json to_json(const AllReducePlan& p);
AllReducePlan allreduce_plan_from_json(const nlohmann::json& j, const PickKey& key, const std::string& source);

// The ReduceScatter's picks (bench --op reducescatter): the measured fastest
// plan of a shape's tile rows, as the public op runs it.
struct ReduceScatterPick {
  enum class Path { Sequential, Slots, NVLink };
  Path path = Path::Sequential;
  int bm = 128, bn = 256;  // the tile (NVLink and Sequential: the whole grid)
  int nccl_sms = 8;        // the SMs NCCL had beside the GEMM when measured (Slots)
  bool cublas = false;     // Sequential with cuBLAS's GEMM
  std::vector<int> waves;  // Slots: waves per group (two groups at least)
  double predicted_ms = 0;
};
std::string reducescatter_op(plan::RsLayout layout);  // the key's op
nlohmann::json to_json(const ReduceScatterPick& p);
// Throws InvalidArgument "<source>: <problem>" where the pick does not make
// a plan of the key's shape (m = tile_rows * 128) on `key.sms` SMs.
ReduceScatterPick reducescatter_pick_from_json(const nlohmann::json& j, const PickKey& key, const std::string& source);

class PickCache {
 public:
  static constexpr const char* kFormat = "flashoverlap.picks";
  static constexpr int kSchema = 1;

  explicit PickCache(std::string path);  // reads the file when it exists

  std::optional<AllReducePlan> lookup(const PickKey& key) const;
  // Every entry of this machine and operand shape (any tile rows), as the
  // file's text: what rank 0 hands the other ranks.
  std::string entries_for(const PickKey& shape) const;
  // Throws InvalidArgument when the plan does not fit the key, Error when
  // the file cannot be written.
  void store(const PickKey& key, const AllReducePlan& plan);
  void store(const PickKey& key, const ReduceScatterPick& pick);  // (key.op: a ReduceScatter's)

  size_t size() const { return file_.entries().size(); }
  const std::vector<std::string>& warnings() const { return file_.warnings(); }

  // The entries of a text from entries_for, by tile rows (bad ones left out).
  static std::map<int64_t, AllReducePlan> parse_entries(const std::string& text, const PickKey& shape);
  static std::map<int64_t, ReduceScatterPick> parse_reducescatter_entries(const std::string& text, const PickKey& shape);

 private:
  plan::EntriesFile file_;  // key string -> {"key", "plan"}
};

}  // namespace flashoverlap::rt
