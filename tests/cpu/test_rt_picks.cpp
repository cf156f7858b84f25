// CPU tests of the measured picks' file (runtime/tune/picks.h): plans round
// trip through JSON for the shape of their key, entries are looked up by
// tile rows, bad files and entries read as empty or dropped with a warning,
// every plan the online tuner returns or measures is one the file stores,
// and writers in several threads keep every entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "flashoverlap/error.h"
#include "plan/partition.h"
#include "plan/tile_grid.h"
#include "runtime/tune/picks.h"
#include "runtime/tune/tuner.h"
#include "test_plan_util.h"

using namespace flashoverlap;

namespace {

rt::PickKey key_of(int64_t tile_rows, int64_t n = 8192, int64_t k = 4096) {
  rt::PickKey key;
  key.gpu = "NVIDIA H200", key.sms = 132, key.world = 2, key.tile_rows = tile_rows, key.n = n, key.k = k;
  return key;
}

// A random valid plan for key's shape: any layout, tile, grid and groups.
rt::AllReducePlan random_plan(std::mt19937_64& rng, const rt::PickKey& key) {
  const rt::ArLayout layouts[] = {rt::ArLayout::Slots, rt::ArLayout::RowBands, rt::ArLayout::Owners};
  rt::AllReducePlan p;
  p.layout = layouts[rng() % 3];
  p.sequential = rng() % 5 == 0;
  const plan::TileShape tile{128, rng() % 2 ? 256 : 128};
  p.sched = plan::make_schedule(key.tile_rows * 128, key.n, tile, int32_t(100 + rng() % 33),
                                rng() % 2 && !rt::is_banded(p.layout) ? plan::Raster::AlongM : plan::Raster::AlongN,
                                int32_t(1 + rng() % 8));
  const bool bands = rt::is_banded(p.layout) && !p.sequential;
  const int units = bands ? plan::band_count(p.sched) : p.sched.waves();
  plan::Partition part = p.sequential ? plan::Partition{units} : fo_test::random_partition(rng, units);
  if (!p.sequential && part.size() == 1 && units > 1) part = {units - 1, 1};
  if (!p.sequential && part.size() == 1) p.sequential = true;
  p.groups = bands ? plan::band_groups(p.sched, part) : plan::make_groups(p.sched, part);
  p.reserve = int(rng() % 20), p.copy_in_gemm = rng() % 2, p.four_stages = rng() % 2;
  p.fallback_cublas = p.sequential && rng() % 2;
  p.predicted_ms = double(rng() % 1000) / 100;
  return p;
}

void expect_same(const rt::AllReducePlan& a, const rt::AllReducePlan& b) {
  EXPECT_EQ(rt::describe(a), rt::describe(b));
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.sched.ctas, b.sched.ctas);
  EXPECT_EQ(a.sched.raster, b.sched.raster);
  EXPECT_EQ(a.reserve, b.reserve);
  EXPECT_EQ(a.copy_in_gemm, b.copy_in_gemm);
  EXPECT_EQ(a.four_stages, b.four_stages);
  EXPECT_EQ(a.sequential, b.sequential);
  EXPECT_EQ(a.fallback_cublas, b.fallback_cublas);
  EXPECT_EQ(a.predicted_ms, b.predicted_ms);
}

TEST(Picks, PlansRoundTripForTheirKeysShape) {
  FO_SEEDED_RNG(rng);
  for (int i = 0; i < 300; ++i) {
    const rt::PickKey key = key_of(1 + int64_t(rng() % 64), 256 * (1 + int64_t(rng() % 40)));
    const rt::AllReducePlan p = random_plan(rng, key);
    expect_same(rt::allreduce_plan_from_json(rt::to_json(p), key, "test"), p);
  }
}

TEST(Picks, MalformedPlansAreRefusedNamingTheProblem) {
  FO_SEEDED_RNG(rng);
  const rt::PickKey key = key_of(32);
  const nlohmann::json good = rt::to_json(random_plan(rng, key));
  auto refused = [&](auto change, const std::string& part) {
    nlohmann::json j = good;
    change(j);
    try {
      rt::allreduce_plan_from_json(j, key, "src");
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("src: ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused([](auto& j) { j["layout"] = "sideways"; }, "unknown layout");
  refused([](auto& j) { j["bn"] = 96; }, "unsupported tile");
  refused([](auto& j) { j["ctas"] = 500; }, "ctas");
  refused([](auto& j) { j["units"].push_back(1); }, "do not cover");
  refused([](auto& j) { j["units"] = nlohmann::json::array(); }, "do not cover");
  refused([](auto& j) { j.erase("swizzle"); }, "swizzle");
  refused([](auto& j) { j.erase("copy_in_gemm"); }, "fuse_sum");  // (neither key: the older one is named)
  // The layouts of blocks (gathered, pushed) were retired: their picks are refused, saying so; an owner pick
  // written before ("pushed" moved by owners) is read as owners.
  refused([](auto& j) { j["layout"] = "gathered"; }, "retired");
  refused([](auto& j) { j["layout"] = "pushed", j["push_by"] = "gemm"; }, "retired");
  for (int i = 0; i < 50; ++i) {
    const rt::AllReducePlan p = random_plan(rng, key);
    if (p.layout != rt::ArLayout::Owners) continue;
    nlohmann::json old = rt::to_json(p);
    old["layout"] = "pushed", old["push_by"] = "owners", old["fuse_sum"] = old["copy_in_gemm"];
    old.erase("copy_in_gemm");
    expect_same(rt::allreduce_plan_from_json(old, key, "an older cache"), p);
  }
}

TEST(Picks, StoredEntriesAreFoundByTileRowsAndShapeOnly) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  const std::string path = dir.file("picks.json");
  std::map<int64_t, rt::AllReducePlan> stored;
  {
    rt::PickCache cache(path);
    EXPECT_EQ(cache.size(), 0u);
    for (int64_t rows : {1, 8, 32, 33}) {
      stored[rows] = random_plan(rng, key_of(rows));
      cache.store(key_of(rows), stored[rows]);
    }
    cache.store(key_of(8, 4096), random_plan(rng, key_of(8, 4096)));  // another n: not this shape's
    EXPECT_THROW(cache.store(key_of(64), stored[1]), InvalidArgument);  // one tile row's plan (one unit) for 64
  }
  const rt::PickCache cache(path);
  EXPECT_TRUE(cache.warnings().empty());
  EXPECT_EQ(cache.size(), 5u);
  for (const auto& [rows, p] : stored) expect_same(*cache.lookup(key_of(rows)), p);
  EXPECT_FALSE(cache.lookup(key_of(2)).has_value());
  rt::PickKey other_gpu = key_of(8);
  other_gpu.gpu = "NVIDIA H100";
  EXPECT_FALSE(cache.lookup(other_gpu).has_value());
  // What rank 0 hands the others: this shape's entries, every tile rows.
  const std::map<int64_t, rt::AllReducePlan> got = rt::PickCache::parse_entries(cache.entries_for(key_of(1)), key_of(1));
  ASSERT_EQ(got.size(), stored.size());
  for (const auto& [rows, p] : stored) expect_same(got.at(rows), p);
  EXPECT_TRUE(rt::PickCache::parse_entries("", key_of(1)).empty());
}

// The ReduceScatter's picks (GemmReduceScatter's tuning cache): random ones
// round-trip for their key's shape, bad ones are refused naming the problem,
// and the AllReduce's and the ReduceScatter's entries (and the two layouts')
// never answer for each other, in one file.
namespace {

rt::PickKey rs_key_of(int64_t tile_rows, plan::RsLayout layout = plan::RsLayout::Standard) {
  rt::PickKey key = key_of(tile_rows);
  key.op = rt::reducescatter_op(layout);
  return key;
}

rt::ReduceScatterPick random_rs_pick(std::mt19937_64& rng, const rt::PickKey& key) {
  using Path = rt::ReduceScatterPick::Path;
  rt::ReduceScatterPick p;
  p.bm = 128, p.bn = rng() % 2 ? 256 : 128, p.nccl_sms = int(rng() % 24);
  p.predicted_ms = double(rng() % 1000) / 100;
  const plan::Schedule s = plan::make_schedule(key.tile_rows * 128, key.n, {p.bm, p.bn}, key.sms - p.nccl_sms,
                                               plan::Raster::AlongN, 1);
  const int kind = int(rng() % 3);
  p.path = kind == 0 || s.waves() < 2 ? Path::Sequential
           : kind == 1 && key.op == rt::reducescatter_op(plan::RsLayout::Standard) ? Path::NVLink
                                                                                   : Path::Slots;
  if (p.path == Path::Sequential) p.cublas = rng() % 2;
  if (p.path == Path::Slots) {
    plan::Partition part = fo_test::random_partition(rng, s.waves());
    if (part.size() == 1) part = {s.waves() - 1, 1};
    p.waves.assign(part.begin(), part.end());
  }
  return p;
}

void expect_same(const rt::ReduceScatterPick& a, const rt::ReduceScatterPick& b) {
  EXPECT_EQ(a.path, b.path);
  EXPECT_EQ(a.bm, b.bm);
  EXPECT_EQ(a.bn, b.bn);
  EXPECT_EQ(a.nccl_sms, b.nccl_sms);
  EXPECT_EQ(a.cublas, b.cublas);
  EXPECT_EQ(a.waves, b.waves);
  EXPECT_DOUBLE_EQ(a.predicted_ms, b.predicted_ms);
}

}  // namespace

TEST(Picks, ReduceScatterPicksRoundTripAndAreRefusedWhenTheyDoNotFit) {
  FO_SEEDED_RNG(rng);
  for (int i = 0; i < 300; ++i) {
    const rt::PickKey key = rs_key_of(1 + int64_t(rng() % 64), rng() % 2 ? plan::RsLayout::Standard : plan::RsLayout::SubTile);
    const rt::ReduceScatterPick p = random_rs_pick(rng, key);
    expect_same(rt::reducescatter_pick_from_json(rt::to_json(p), key, "test"), p);
  }
  const rt::PickKey key = rs_key_of(32);
  rt::ReduceScatterPick slots;
  slots.path = rt::ReduceScatterPick::Path::Slots, slots.bn = 256, slots.nccl_sms = 8;
  const int waves = plan::make_schedule(32 * 128, 8192, {128, 256}, 124, plan::Raster::AlongN, 1).waves();
  slots.waves = {waves - 1, 1};
  (void)rt::reducescatter_pick_from_json(rt::to_json(slots), key, "test");  // (valid: the base of the bad ones)
  auto refused = [&](const rt::PickKey& k, const std::function<void(nlohmann::json&)>& spoil, const std::string& what) {
    nlohmann::json j = rt::to_json(slots);
    spoil(j);
    try {
      (void)rt::reducescatter_pick_from_json(j, k, "src");
      ADD_FAILURE() << what << ": accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("src: ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(key, [](auto& j) { j["path"] = "pigeons"; }, "unknown path");
  refused(key, [](auto& j) { j["bn"] = 96; }, "unsupported tile");
  refused(key, [](auto& j) { j["nccl_sms"] = 132; }, "nccl_sms");
  refused(key, [&](auto& j) { j["waves"] = nlohmann::json::array({waves}); }, "groups of waves");
  refused(key, [&](auto& j) { j["waves"] = nlohmann::json::array({waves, 1}); }, "groups of waves");
  refused(key, [](auto& j) { j["cublas"] = true; }, "cuBLAS");
  refused(key, [](auto& j) { j["path"] = "sequential"; }, "groups of waves on a path without them");
  refused(rs_key_of(32, plan::RsLayout::SubTile), [](auto& j) { j["path"] = "nvlink", j["waves"] = nlohmann::json::array(); },
          "standard layout only");
  refused(key_of(32), [](auto&) {}, "under an AllReduce's key");
  refused(key, [](auto& j) { j.erase("waves"); }, "waves");
}

TEST(Picks, AllReduceAndReduceScatterEntriesNeverAnswerForEachOther) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  const std::string path = dir.file("picks.json");
  const rt::AllReducePlan ar = random_plan(rng, key_of(8));
  const rt::ReduceScatterPick standard = random_rs_pick(rng, rs_key_of(8));
  const rt::ReduceScatterPick subtile = random_rs_pick(rng, rs_key_of(8, plan::RsLayout::SubTile));
  {
    rt::PickCache cache(path);
    cache.store(key_of(8), ar);
    cache.store(rs_key_of(8), standard);
    cache.store(rs_key_of(8, plan::RsLayout::SubTile), subtile);
    EXPECT_THROW(cache.store(key_of(9), standard), InvalidArgument);  // (no op: an AllReduce key)
  }
  const rt::PickCache cache(path);
  EXPECT_TRUE(cache.warnings().empty());
  EXPECT_EQ(cache.size(), 3u);
  expect_same(*cache.lookup(key_of(8)), ar);
  const auto ar_entries = rt::PickCache::parse_entries(cache.entries_for(key_of(1)), key_of(1));
  ASSERT_EQ(ar_entries.size(), 1u);
  expect_same(ar_entries.at(8), ar);
  const auto std_entries =
      rt::PickCache::parse_reducescatter_entries(cache.entries_for(rs_key_of(1)), rs_key_of(1));
  ASSERT_EQ(std_entries.size(), 1u);
  expect_same(std_entries.at(8), standard);
  const rt::PickKey sub = rs_key_of(1, plan::RsLayout::SubTile);
  const auto sub_entries = rt::PickCache::parse_reducescatter_entries(cache.entries_for(sub), sub);
  ASSERT_EQ(sub_entries.size(), 1u);
  expect_same(sub_entries.at(8), subtile);
  EXPECT_TRUE(rt::PickCache::parse_reducescatter_entries(cache.entries_for(key_of(1)), rs_key_of(1)).empty());
  EXPECT_EQ(rs_key_of(8).str(), key_of(8).str() + "|reducescatter:standard");
}

TEST(Picks, DamagedFilesReadAsEmptyAndBadEntriesAreDropped) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  for (const std::string text : {"", "not json", "{\"format\": \"x\"}", "[1, 2]",
                                 "{\"format\": \"flashoverlap.picks\", \"schema\": 1e999}",  // (no overflow thrown)
                                 "{\"format\": \"flashoverlap.picks\", \"schema\": 9, \"entries\": {}}",
                                 "{\"format\": \"flashoverlap.picks\", \"schema\": 1}"}) {
    const rt::PickCache cache(dir.write("bad.json", text));
    EXPECT_EQ(cache.size(), 0u) << text;
    EXPECT_EQ(cache.warnings().size(), 1u) << text;
  }
  const std::string path = dir.file("mixed.json");
  rt::PickCache(path).store(key_of(4), random_plan(rng, key_of(4)));
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  nlohmann::json broken = j["entries"].begin().value();
  broken["plan"]["units"] = nlohmann::json::array({1000});
  j["entries"]["NVIDIA H200|132|2|bf16|5|8192|4096"] = broken;  // (its key fields say 4)
  std::ofstream(path) << j.dump();
  const rt::PickCache cache(path);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.warnings().size(), 1u);
}

TEST(Picks, ConcurrentWritersKeepEveryEntry) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  const std::string path = dir.file("picks.json");
  const int threads = 4, per_thread = 6;
  std::vector<rt::AllReducePlan> plans;
  for (int i = 0; i < threads * per_thread; ++i) plans.push_back(random_plan(rng, key_of(1 + i)));
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = t * per_thread; i < (t + 1) * per_thread; ++i) rt::PickCache(path).store(key_of(1 + i), plans[size_t(i)]);
    });
  for (auto& t : ts) t.join();
  const rt::PickCache cache(path);
  EXPECT_EQ(cache.size(), size_t(threads * per_thread));
}

}  // namespace

// The online tuner (the public op's planning: a GEMM model, nothing
// measured) on random shapes, world sizes and collective costs: every plan
// it returns, and every finalist it would measure, is one the tuning cache
// stores for its shape's key (sequential exactly when it is one group).
// Where the AllReduce costs ~nothing (one rank) the model's best groups are
// one: that is the sequential plan, not an overlapped plan of one group,
// which the cache refused (bench --tuning-cache failed on one GPU).
TEST(Picks, EveryPlanTheTunerReturnsOrMeasuresIsOneTheCacheStores) {
  FO_SEEDED_RNG(rng);
  int one_group_searched = 0;
  for (int i = 0; i < 60; ++i) {
    const int world = std::array<int, 4>{1, 2, 4, 8}[rng() % 4];
    const int64_t m = 1 + int64_t(rng() % 16384), n = 256 * (1 + int64_t(rng() % 48)), k = 64 * (1 + int64_t(rng() % 128));
    // NCCL's latency: fixed + bytes / bandwidth; one rank's: about nothing.
    const double fixed_ms = world == 1 ? 1e-4 : 0.005 + 0.02 * double(rng() % 100) / 100;
    const double gb_s = world == 1 ? 1e6 : 50 + double(rng() % 400);
    std::vector<plan::CurveSample> samples;
    for (double b = 1024; b <= 4e9; b *= 4) samples.push_back({b, fixed_ms + b / (gb_s * 1e6)});
    const plan::BandwidthCurve curve(plan::Collective::AllReduce, world, samples);
    const double tflops = 500 + double(rng() % 300);  // the GEMM's speed on all 132 SMs
    rt::AllReduceTuning t;
    t.world = world;
    t.curve_for = [&](int) -> const plan::BandwidthCurve& { return curve; };
    t.gemm_ms = [&](const plan::Schedule& s) {
      return double(s.waves()) * s.ctas * s.bm * s.bn * 2.0 * double(k) / (tflops * 1e9 * s.ctas / 132.0);
    };
    t.layouts = {rt::ArLayout::RowBands, rt::ArLayout::Slots};
    if (world >= 2 && rng() % 2) t.layouts.push_back(rt::ArLayout::Owners), t.push_reachable = true;
    t.reserve = rng() % 2 ? -1 : int(rng() % 24);
    t.cublas_gemm_ms = rng() % 2 ? 0 : double(m) * n * k * 2 / (tflops * 1e9) * (0.9 + 0.2 * double(rng() % 100) / 100);
    std::vector<rt::AllReducePlan> ranked;
    t.ranked = &ranked;
    const double sequential_ms = double(m) * n * k * 2 / (tflops * 1e9) * (0.8 + 0.4 * double(rng() % 100) / 100) +
                                 curve.latency_ms(double(m) * n * 2);
    SCOPED_TRACE(testing::Message() << "world " << world << ", " << m << "x" << n << "x" << k << ", NCCL " << fixed_ms
                                    << " ms + " << gb_s << " GB/s, sequential " << sequential_ms << " ms");
    rt::AllReducePlan best;
    try {
      best = rt::tune_allreduce(t, m, n, k, nullptr, nullptr, nullptr, sequential_ms);
    } catch (const rt::NoPlan& e) {
      ADD_FAILURE() << "no plan: " << e.what();
      continue;
    }
    rt::PickKey key = key_of(rt::tile_rows_of(m), n, k);
    key.world = world;
    std::vector<rt::AllReducePlan> check = rt::finalists_of(ranked);
    check.push_back(best);
    for (const rt::AllReducePlan& p : check) {
      EXPECT_EQ(p.sequential, p.groups.size() == 1) << rt::describe(p);
      try {
        (void)rt::allreduce_plan_from_json(rt::to_json(p), key, "the cache");
      } catch (const InvalidArgument& e) {
        ADD_FAILURE() << rt::describe(p) << ": " << e.what();
      }
    }
    one_group_searched += std::any_of(ranked.begin(), ranked.end(),
                                      [](const rt::AllReducePlan& p) { return !p.sequential && p.groups.size() == 1; });
  }
  RecordProperty("one_group_searched", one_group_searched);  // (how often the case above came up)
}
