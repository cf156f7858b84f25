// Plan <-> JSON (the tuning cache's payload and `flashoverlap plan --json`).
#include <cmath>

#include "flashoverlap/error.h"
#include "plan/planner.h"

namespace flashoverlap::plan {

namespace {
constexpr const char* kFormat = "flashoverlap.plan";
constexpr int kSchema = 1;
}  // namespace

nlohmann::json to_json(const Plan& p) {
  const Schedule& s = p.schedule;
  nlohmann::json j{{"format", kFormat},
                   {"schema", kSchema},
                   {"op", to_string(p.op)},
                   {"dtype", to_string(p.dtype)},
                   {"world", p.world},
                   {"m", s.m},
                   {"n", s.n},
                   {"k", p.k},
                   {"sms", p.sms},
                   {"reserve_sms", p.reserve_sms},
                   {"tile", to_string(TileShape{s.bm, s.bn})},
                   {"ctas", s.ctas},
                   {"raster", to_string(s.raster)},
                   {"swizzle", s.swizzle},
                   {"tiles", s.tiles()},
                   {"waves", s.waves()},
                   {"sequential", p.sequential},
                   {"partition", p.partition},
                   {"predicted_ms", p.predicted.total_ms},
                   {"baseline", {{"gemm_ms", p.baseline_gemm_ms}, {"comm_ms", p.baseline_comm_ms},
                                 {"total_ms", p.baseline_ms()}}},
                   {"speedup", p.speedup()},
                   {"notes", p.notes}};
  if (p.op == Collective::ReduceScatter) {
    j["rs_layout"] = to_string(p.rs_layout);
    j["padding_bytes"] = p.padding_bytes;
  }
  j["groups"] = nlohmann::json::array();
  for (size_t g = 0; g < p.groups.size(); ++g) {
    const GroupTiming& t = p.predicted.groups[g];
    j["groups"].push_back({{"waves", {p.groups[g].first_wave, p.groups[g].end_wave}},
                           {"tiles", {p.groups[g].first_tile, p.groups[g].end_tile}},
                           {"bytes", p.group_bytes[g]},
                           {"compute_ms", {t.compute_start, t.compute_end}},
                           {"comm_ms", {t.comm_start, t.comm_end}}});
  }
  return j;
}

Plan plan_from_json(const nlohmann::json& j, const std::string& source) {
  auto fail = [&](const std::string& what) -> Plan { throw InvalidArgument("plan " + source + ": " + what); };
  if (!j.is_object()) return fail("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) return fail(std::string("not a plan (expected \"format\": \"") + kFormat + "\")");
  if (!j.contains("schema") || j["schema"] != kSchema)
    return fail("schema version " + (j.contains("schema") ? j["schema"].dump() : std::string("missing")) +
                " is not supported (this build reads " + std::to_string(kSchema) + ")");
  // Inside: problems without the prefix, added once by the handlers below.
  auto bad = [](const std::string& what) -> Plan { throw InvalidArgument(what); };
  try {
    Plan p;
    p.op = parse_collective(j.at("op").get<std::string>());
    if (p.op == Collective::AllToAll)  // (make_plan refuses it: no Plan of it exists to store)
      return bad("op alltoall: its plans are made per call by make_moe_plan, not stored");
    p.dtype = parse_dtype(j.at("dtype").get<std::string>());
    p.world = j.at("world").get<int32_t>();
    p.k = j.at("k").get<int64_t>();
    p.sms = j.at("sms").get<int32_t>();
    p.reserve_sms = j.at("reserve_sms").get<int32_t>();
    p.schedule = make_schedule(j.at("m").get<int64_t>(), j.at("n").get<int64_t>(),
                               parse_tile(j.at("tile").get<std::string>()), j.at("ctas").get<int32_t>(),
                               parse_raster(j.at("raster").get<std::string>()), j.at("swizzle").get<int32_t>());
    if (p.world < 1 || p.k < 1 || p.reserve_sms < 0 || p.schedule.ctas != p.sms - p.reserve_sms)
      return bad("inconsistent world / k / SMs (ctas must be sms - reserve_sms)");
    p.sequential = j.at("sequential").get<bool>();
    p.partition = j.at("partition").get<Partition>();
    p.groups = make_groups(p.schedule, p.partition);
    if (p.op == Collective::ReduceScatter) {
      p.rs_layout = parse_rs_layout(j.at("rs_layout").get<std::string>());
      require_rs_layout(p.schedule, p.world, p.rs_layout);
      p.padding_bytes = j.at("padding_bytes").get<double>();
    }
    const auto& groups = j.at("groups");
    if (!groups.is_array() || groups.size() != p.groups.size()) return bad("\"groups\" does not match the partition");
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto tiles = groups[g].at("tiles").get<std::vector<int32_t>>();
      if (tiles != std::vector<int32_t>{p.groups[g].first_tile, p.groups[g].end_tile})
        return bad("group " + std::to_string(g) + " tiles do not match the schedule and partition");
      const auto c = groups[g].at("compute_ms").get<std::vector<double>>();
      const auto m = groups[g].at("comm_ms").get<std::vector<double>>();
      if (c.size() != 2 || m.size() != 2) return bad("group " + std::to_string(g) + " timings must be [start, end]");
      p.predicted.groups.push_back({c[0], c[1], m[0], m[1]});
      p.group_bytes.push_back(groups[g].at("bytes").get<double>());
    }
    p.predicted.total_ms = j.at("predicted_ms").get<double>();
    p.baseline_gemm_ms = j.at("baseline").at("gemm_ms").get<double>();
    p.baseline_comm_ms = j.at("baseline").at("comm_ms").get<double>();
    p.notes = j.value("notes", std::vector<std::string>{});
    if (!(p.predicted.total_ms > 0) || !(p.baseline_ms() > 0) || !std::isfinite(p.baseline_ms()))
      return bad("predicted and baseline times must be positive");
    return p;
  } catch (const nlohmann::json::exception& e) {
    return fail(std::string("missing or mistyped field (") + e.what() + ")");
  } catch (const InvalidArgument& e) {
    return fail(e.what());
  }
}

}  // namespace flashoverlap::plan
