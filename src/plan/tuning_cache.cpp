#include "plan/tuning_cache.h"

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

TuningCache::TuningCache(std::string path)
    : file_(std::move(path), kFormat, kSchema, "tuning cache", [](const std::string& name, const nlohmann::json& entry) {
        const Plan plan = plan_from_json(entry.at("plan"), "entry " + name);
        const auto& k = entry.at("key");
        const CacheKey key{k.at("gpu").get<std::string>(), k.at("sms").get<int32_t>(), k.at("world").get<int32_t>(),
                           parse_collective(k.at("op").get<std::string>()), parse_dtype(k.at("dtype").get<std::string>()),
                           k.at("m").get<int64_t>(), k.at("n").get<int64_t>(), k.at("k").get<int64_t>()};
        const std::string why = key.str() != name ? "its key fields say " + key.str() : contradiction(key, plan);
        if (!why.empty()) throw InvalidArgument(why);
      }) {}

std::optional<Plan> TuningCache::lookup(const CacheKey& key) const {
  const auto it = file_.entries().find(key.str());
  if (it == file_.entries().end()) return std::nullopt;
  return plan_from_json(it->second.at("plan"), file_.path());  // validated when read
}

void TuningCache::store(const CacheKey& key, const Plan& plan) {
  if (const std::string why = contradiction(key, plan); !why.empty()) throw InvalidArgument("tuning cache: " + why);
  file_.store(key.str(), {{"key", key.to_json()}, {"plan", to_json(plan)}});
}

}  // namespace flashoverlap::plan
