#include "plan/tuning_cache.h"

#include <cstdio>
#include <filesystem>

#include "flashoverlap/error.h"
#include "plan/json_file.h"

namespace flashoverlap::plan {

namespace {

// Why a plan cannot be the answer for `key`, or "" when it can.
std::string contradiction(const CacheKey& key, const Plan& p) {
  if (p.op != key.op || p.dtype != key.dtype || p.world != key.world || p.sms != key.sms ||
      p.schedule.m != key.m || p.schedule.n != key.n || p.k != key.k)
    return "plan (" + std::string(to_string(p.op)) + " " + std::to_string(p.schedule.m) + "x" +
           std::to_string(p.schedule.n) + "x" + std::to_string(p.k) + ", world " + std::to_string(p.world) +
           ", " + std::to_string(p.sms) + " SMs) does not match key " + key.str();
  return "";
}

}  // namespace

std::string CacheKey::str() const {
  return gpu + "|" + std::to_string(sms) + "|" + std::to_string(world) + "|" + std::string(to_string(op)) + "|" +
         std::string(to_string(dtype)) + "|" + std::to_string(m) + "|" + std::to_string(n) + "|" + std::to_string(k);
}

nlohmann::json CacheKey::to_json() const {
  return {{"gpu", gpu}, {"sms", sms}, {"world", world}, {"op", to_string(op)}, {"dtype", to_string(dtype)},
          {"m", m},     {"n", n},     {"k", k}};
}

TuningCache::TuningCache(std::string path) : path_(std::move(path)) { read(); }

bool TuningCache::read() {
  entries_.clear();
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return true;  // absent (or unreachable: the read would say why)
  auto reject = [&](const std::string& why) {
    warnings_.push_back("tuning cache " + path_ + ": " + why + "; ignoring it");
    return false;
  };
  nlohmann::json j;
  try {
    j = read_json_file(path_, "tuning cache");
  } catch (const InvalidArgument& e) {
    warnings_.push_back(std::string(e.what()) + "; ignoring it");
    return false;
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) return reject("not a tuning cache");
  if (!j.contains("schema") || j["schema"] != kSchema)
    return reject("schema " + (j.contains("schema") ? j["schema"].dump() : std::string("missing")) +
                  " is not supported (this build reads " + std::to_string(kSchema) + ")");
  if (!j.contains("entries") || !j["entries"].is_object()) return reject("no \"entries\" object");
  for (const auto& [name, entry] : j["entries"].items()) {
    try {
      const Plan plan = plan_from_json(entry.at("plan"), path_ + " entry " + name);
      const auto& k = entry.at("key");
      const CacheKey key{k.at("gpu").get<std::string>(), k.at("sms").get<int32_t>(), k.at("world").get<int32_t>(),
                         parse_collective(k.at("op").get<std::string>()), parse_dtype(k.at("dtype").get<std::string>()),
                         k.at("m").get<int64_t>(), k.at("n").get<int64_t>(), k.at("k").get<int64_t>()};
      std::string why = key.str() != name ? "its key fields say " + key.str() : contradiction(key, plan);
      if (!why.empty()) {
        warnings_.push_back("tuning cache " + path_ + ": dropping entry " + name + ": " + why);
        continue;
      }
      entries_[name] = entry;
    } catch (const std::exception& e) {  // InvalidArgument from the plan, json errors from the key
      warnings_.push_back("tuning cache " + path_ + ": dropping entry " + name + ": " + e.what());
    }
  }
  return true;
}

std::optional<Plan> TuningCache::lookup(const CacheKey& key) const {
  const auto it = entries_.find(key.str());
  if (it == entries_.end()) return std::nullopt;
  return plan_from_json(it->second.at("plan"), path_);  // validated when read
}

void TuningCache::store(const CacheKey& key, const Plan& plan) {
  if (const std::string why = contradiction(key, plan); !why.empty()) throw InvalidArgument("tuning cache: " + why);
  // Without it, two writers that both re-read before either renames each
  // write their own entry only, and the last rename drops the other's.
  const FileLock lock(path_);
  if (!read()) {  // keep the damaged file for inspection instead of losing it silently
    const std::string aside = path_ + ".corrupt";
    if (std::rename(path_.c_str(), aside.c_str()) == 0)
      warnings_.push_back("tuning cache " + path_ + ": moved the damaged file to " + aside);
  }
  entries_[key.str()] = {{"key", key.to_json()}, {"plan", to_json(plan)}};
  nlohmann::json j{{"format", kFormat}, {"schema", kSchema}, {"entries", nlohmann::json::object()}};
  for (const auto& [name, entry] : entries_) j["entries"][name] = entry;
  write_file_atomic(path_, j.dump(1) + "\n");
}

}  // namespace flashoverlap::plan
