// picks.cpp — see picks.h.
#include "runtime/tune/picks.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "flashoverlap/error.h"
#include "kernels/gemm.h"
#include "plan/json_file.h"
#include "plan/tile_grid.h"

namespace flashoverlap::rt {
namespace {

const ArLayout kLayouts[] = {ArLayout::Slots, ArLayout::RowBands, ArLayout::Owners};

// The sizes of the plan's groups in its layout's units.
std::vector<int> unit_sizes(const AllReducePlan& p) {
  std::vector<int> sizes;
  const int64_t band_tiles = int64_t(p.sched.swizzle) * p.sched.tiles_n();
  for (const plan::Group& g : p.groups)
    sizes.push_back(is_banded(p.layout) && !p.sequential ? int((g.tiles() + band_tiles - 1) / band_tiles)
                                                         : g.end_wave - g.first_wave);
  return sizes;
}

}  // namespace

std::string PickKey::str() const {
  return gpu + "|" + std::to_string(sms) + "|" + std::to_string(world) + "|" +
         (dtype == kernels::DType::BF16 ? "bf16" : "fp16") + "|" + std::to_string(tile_rows) + "|" +
         std::to_string(n) + "|" + std::to_string(k) + (op.empty() ? "" : "|" + op);
}

nlohmann::json PickKey::to_json() const {
  nlohmann::json j = {{"gpu", gpu},        {"sms", sms}, {"world", world}, {"dtype", dtype == kernels::DType::BF16 ? "bf16" : "fp16"},
                      {"tile_rows", tile_rows}, {"n", n},   {"k", k}};
  if (!op.empty()) j["op"] = op;
  return j;
}

PickKey PickKey::from_json(const nlohmann::json& j) {
  try {
    PickKey k;
    k.gpu = j.at("gpu").get<std::string>();
    k.sms = j.at("sms").get<int32_t>(), k.world = j.at("world").get<int32_t>();
    const std::string dt = j.at("dtype").get<std::string>();
    if (dt != "bf16" && dt != "fp16") throw InvalidArgument("dtype " + dt);
    k.dtype = dt == "bf16" ? kernels::DType::BF16 : kernels::DType::FP16;
    k.tile_rows = j.at("tile_rows").get<int64_t>(), k.n = j.at("n").get<int64_t>(), k.k = j.at("k").get<int64_t>();
    if (k.sms < 1 || k.world < 1 || k.tile_rows < 1 || k.n < 1 || k.k < 8) throw InvalidArgument("values out of range");
    if (j.contains("op")) {
      k.op = j.at("op").get<std::string>();
      if (k.op != reducescatter_op(plan::RsLayout::Standard) && k.op != reducescatter_op(plan::RsLayout::SubTile))
        throw InvalidArgument("op " + k.op);
    }
    return k;
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("key: ") + e.what());
  }
}

nlohmann::json to_json(const AllReducePlan& p) {
  return {{"layout", layout_name(p.layout)},
          {"bm", p.sched.bm},
          {"bn", p.sched.bn},
          {"ctas", p.sched.ctas},
          {"along_m", p.sched.raster == plan::Raster::AlongM},
          {"swizzle", p.sched.swizzle},
          {"units", unit_sizes(p)},
          {"reserve", p.reserve},
          {"sequential", p.sequential},
          {"fallback_cublas", p.fallback_cublas},
          {"copy_in_gemm", p.copy_in_gemm},
          {"four_stages", p.four_stages},
          {"predicted_ms", p.predicted_ms}};
}

AllReducePlan allreduce_plan_from_json(const nlohmann::json& j, const PickKey& key, const std::string& source) {
  auto bad = [&](const std::string& why) { return InvalidArgument(source + ": " + why); };
  try {
    AllReducePlan p;
    const std::string layout = j.at("layout").get<std::string>();
    bool known = false;
    for (ArLayout l : kLayouts)
      if (layout == layout_name(l)) p.layout = l, known = true;
    // (entries written before the layouts of blocks were retired: owners were "pushed" moved by owners)
    if (layout == "pushed" && j.value("push_by", "") == "owners") p.layout = ArLayout::Owners, known = true;
    if (!known) throw bad("unknown layout '" + layout + "' (a retired layout's pick: tune the shape again)");
    const int bm = j.at("bm").get<int>(), bn = j.at("bn").get<int>(), ctas = j.at("ctas").get<int>();
    const int swizzle = j.at("swizzle").get<int>();
    if (!kernels::tile_supported(bm, bn)) throw bad("unsupported tile " + std::to_string(bm) + "x" + std::to_string(bn));
    if (ctas < 1 || ctas > key.sms) throw bad("ctas " + std::to_string(ctas) + " outside [1, " + std::to_string(key.sms) + "]");
    if (swizzle < 1) throw bad("swizzle " + std::to_string(swizzle));
    p.sched = plan::make_schedule(key.tile_rows * 128, key.n, {bm, bn}, ctas,
                                  j.at("along_m").get<bool>() ? plan::Raster::AlongM : plan::Raster::AlongN, swizzle);
    p.reserve = j.at("reserve").get<int>();
    p.sequential = j.at("sequential").get<bool>(), p.fallback_cublas = j.at("fallback_cublas").get<bool>();
    p.copy_in_gemm = (j.contains("copy_in_gemm") ? j.at("copy_in_gemm") : j.at("fuse_sum")).get<bool>();
    p.four_stages = j.at("four_stages").get<bool>();
    p.predicted_ms = j.at("predicted_ms").get<double>();
    const std::vector<int> units = j.at("units").get<std::vector<int>>();
    const bool bands = is_banded(p.layout) && !p.sequential;
    const int total = bands ? plan::band_count(p.sched) : p.sched.waves();
    if (units.empty() || std::accumulate(units.begin(), units.end(), 0) != total ||
        std::any_of(units.begin(), units.end(), [](int u) { return u < 1; }))
      throw bad("groups of " + std::string(bands ? "bands" : "waves") + " that do not cover the " + std::to_string(total) +
                " of " + std::to_string(key.tile_rows) + " tile rows");
    p.groups = bands ? plan::band_groups(p.sched, units) : plan::make_groups(p.sched, units);
    if (p.sequential != (p.groups.size() == 1)) throw bad("a sequential plan has one group, and only it");
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw bad(e.what());
  }
}

std::string reducescatter_op(plan::RsLayout layout) {
  return layout == plan::RsLayout::Standard ? "reducescatter:standard" : "reducescatter:subtile";
}

nlohmann::json to_json(const ReduceScatterPick& p) {
  using Path = ReduceScatterPick::Path;
  return {{"path", p.path == Path::Sequential ? "sequential" : p.path == Path::Slots ? "slots" : "nvlink"},
          {"bm", p.bm},
          {"bn", p.bn},
          {"nccl_sms", p.nccl_sms},
          {"cublas", p.cublas},
          {"waves", p.waves},
          {"predicted_ms", p.predicted_ms}};
}

ReduceScatterPick reducescatter_pick_from_json(const nlohmann::json& j, const PickKey& key, const std::string& source) {
  using Path = ReduceScatterPick::Path;
  auto bad = [&](const std::string& why) { return InvalidArgument(source + ": " + why); };
  try {
    if (key.op.empty()) throw bad("a ReduceScatter's pick under an AllReduce's key");
    ReduceScatterPick p;
    const std::string path = j.at("path").get<std::string>();
    if (path != "sequential" && path != "slots" && path != "nvlink") throw bad("unknown path '" + path + "'");
    p.path = path == "sequential" ? Path::Sequential : path == "slots" ? Path::Slots : Path::NVLink;
    p.bm = j.at("bm").get<int>(), p.bn = j.at("bn").get<int>(), p.nccl_sms = j.at("nccl_sms").get<int>();
    p.cublas = j.at("cublas").get<bool>(), p.waves = j.at("waves").get<std::vector<int>>();
    p.predicted_ms = j.at("predicted_ms").get<double>();
    if (!kernels::tile_supported(p.bm, p.bn)) throw bad("unsupported tile " + std::to_string(p.bm) + "x" + std::to_string(p.bn));
    if (p.nccl_sms < 0 || p.nccl_sms >= key.sms) throw bad("nccl_sms " + std::to_string(p.nccl_sms) + " outside [0, sms)");
    if (p.cublas && p.path != Path::Sequential) throw bad("cuBLAS's GEMM runs the sequential path only");
    if (p.path == Path::NVLink && key.op != reducescatter_op(plan::RsLayout::Standard))
      throw bad("the NVLink form runs the standard layout only");
    if (p.path != Path::Slots) {
      if (!p.waves.empty()) throw bad("groups of waves on a path without them");
      return p;
    }
    const plan::Schedule s =
        plan::make_schedule(key.tile_rows * 128, key.n, {p.bm, p.bn}, key.sms - p.nccl_sms, plan::Raster::AlongM, 1);
    if (p.waves.size() < 2 || std::accumulate(p.waves.begin(), p.waves.end(), 0) != s.waves() ||
        std::any_of(p.waves.begin(), p.waves.end(), [](int u) { return u < 1; }))
      throw bad("groups of waves that are not two or more covering the " + std::to_string(s.waves()) + " waves of " +
                std::to_string(key.tile_rows) + " tile rows");
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw bad(e.what());
  }
}

PickCache::PickCache(std::string path)
    : file_(std::move(path), kFormat, kSchema, "tuning cache", [](const std::string& name, const nlohmann::json& entry) {
        const PickKey key = PickKey::from_json(entry.at("key"));
        if (key.str() != name) throw InvalidArgument("its key fields say " + key.str());
        if (key.op.empty())
          (void)allreduce_plan_from_json(entry.at("plan"), key, "plan");
        else
          (void)reducescatter_pick_from_json(entry.at("plan"), key, "plan");
      }) {}

std::optional<AllReducePlan> PickCache::lookup(const PickKey& key) const {
  const auto it = file_.entries().find(key.str());
  if (it == file_.entries().end()) return std::nullopt;
  return allreduce_plan_from_json(it->second.at("plan"), key, file_.path());
}

std::string PickCache::entries_for(const PickKey& shape) const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, entry] : file_.entries()) {
    PickKey k = PickKey::from_json(entry.at("key"));
    k.tile_rows = shape.tile_rows;
    if (k == shape) out.push_back(entry);
  }
  return out.dump();
}

namespace {

// The entries of a text from entries_for that are of `shape` (any tile
// rows), by tile rows, each read by `read` (bad ones left out).
template <class Pick, class Read>
std::map<int64_t, Pick> entries_by_rows(const std::string& text, const PickKey& shape, Read read) {
  std::map<int64_t, Pick> by_rows;
  if (text.empty()) return by_rows;
  for (const nlohmann::json& entry : nlohmann::json::parse(text)) {
    try {
      const PickKey k = PickKey::from_json(entry.at("key"));
      PickKey same = k;
      same.tile_rows = shape.tile_rows;
      if (same == shape) by_rows[k.tile_rows] = read(entry.at("plan"), k, "rank 0's tuning cache");
    } catch (const std::exception&) {  // (rank 0 read it already: its own warnings said so)
    }
  }
  return by_rows;
}

}  // namespace

std::map<int64_t, AllReducePlan> PickCache::parse_entries(const std::string& text, const PickKey& shape) {
  return entries_by_rows<AllReducePlan>(text, shape, allreduce_plan_from_json);
}

std::map<int64_t, ReduceScatterPick> PickCache::parse_reducescatter_entries(const std::string& text,
                                                                           const PickKey& shape) {
  return entries_by_rows<ReduceScatterPick>(text, shape, reducescatter_pick_from_json);
}

void PickCache::store(const PickKey& key, const ReduceScatterPick& pick) {
  nlohmann::json pj = to_json(pick);
  (void)reducescatter_pick_from_json(pj, key, "tuning cache: the pick stored for " + key.str());  // (fits the key)
  file_.store(key.str(), {{"key", key.to_json()}, {"plan", std::move(pj)}});
}

void PickCache::store(const PickKey& key, const AllReducePlan& plan) {
  nlohmann::json pj = to_json(plan);
  (void)allreduce_plan_from_json(pj, key, "tuning cache: the plan stored for " + key.str());  // (fits the key)
  file_.store(key.str(), {{"key", key.to_json()}, {"plan", std::move(pj)}});
}

}  // namespace flashoverlap::rt
