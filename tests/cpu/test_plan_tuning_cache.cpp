// The tuning cache: round trips, merging, atomic writes, damaged files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "flashoverlap/error.h"
#include "plan/tuning_cache.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
namespace fs = std::filesystem;

namespace {

fo::Plan plan_for(const fo::CacheKey& key) {
  fo::PlanRequest r;
  r.op = key.op;
  r.dtype = key.dtype;
  r.m = key.m;
  r.n = key.n;
  r.k = key.k;
  r.world = key.world;
  r.sms = key.sms;
  return fo::make_plan(r);
}

const fo::CacheKey kA{"NVIDIA H200", 132, 2, fo::Collective::AllReduce, fo::DType::BF16, 4096, 8192, 8192};
const fo::CacheKey kB{"NVIDIA H200", 132, 2, fo::Collective::ReduceScatter, fo::DType::FP16, 8192, 8192, 4096};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(PlanTuningCache, StoresAndFindsPlansAcrossInstances) {
  fo_test::TempDir dir;
  const std::string path = dir.file("cache.json");
  fo::TuningCache cache(path);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_TRUE(cache.warnings().empty());
  EXPECT_FALSE(cache.lookup(kA));
  const fo::Plan a = plan_for(kA);
  cache.store(kA, a);
  fo::TuningCache again(path);
  EXPECT_TRUE(again.warnings().empty());
  ASSERT_TRUE(again.lookup(kA));
  EXPECT_EQ(fo::to_json(*again.lookup(kA)), fo::to_json(a));
  fo::CacheKey other = kA;
  other.gpu = "NVIDIA H100";
  EXPECT_FALSE(again.lookup(other));
  other = kA;
  other.k = 4096;
  EXPECT_FALSE(again.lookup(other));
}

TEST(PlanTuningCache, StoreKeepsEntriesOthersWroteMeanwhile) {
  fo_test::TempDir dir;
  const std::string path = dir.file("cache.json");
  fo::TuningCache first(path), second(path);  // both opened on an empty cache
  first.store(kA, plan_for(kA));
  second.store(kB, plan_for(kB));  // re-reads the file: kA survives
  fo::TuningCache both(path);
  EXPECT_EQ(both.size(), 2u);
  EXPECT_TRUE(both.lookup(kA));
  EXPECT_TRUE(both.lookup(kB));
  // Only the cache file remains: the temporary files were renamed over it.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST(PlanTuningCache, DamagedFilesAreIgnoredWithAWarningAndKeptAside) {
  fo_test::TempDir dir;
  const std::string cases[] = {"{ not json", "[]", R"({"format": "other"})",
                               R"({"format": "flashoverlap.tuning_cache", "schema": 9, "entries": {}})",
                               R"({"format": "flashoverlap.tuning_cache", "schema": 1, "entries": []})"};
  int i = 0;
  for (const std::string& text : cases) {
    const std::string path = dir.file("bad" + std::to_string(i++) + ".json");
    std::ofstream(path) << text;
    fo::TuningCache cache(path);  // never throws
    EXPECT_EQ(cache.size(), 0u);
    ASSERT_EQ(cache.warnings().size(), 1u) << text;
    EXPECT_NE(cache.warnings()[0].find(path), std::string::npos) << cache.warnings()[0];
    cache.store(kA, plan_for(kA));
    EXPECT_EQ(slurp(path + ".corrupt"), text);
    fo::TuningCache fixed(path);
    EXPECT_TRUE(fixed.warnings().empty());
    EXPECT_TRUE(fixed.lookup(kA));
  }
}

TEST(PlanTuningCache, BadEntriesAreDroppedOthersKept) {
  fo_test::TempDir dir;
  const std::string path = dir.file("cache.json");
  {
    fo::TuningCache cache(path);
    cache.store(kA, plan_for(kA));
    cache.store(kB, plan_for(kB));
  }
  nlohmann::json j = nlohmann::json::parse(slurp(path));
  j["entries"][kA.str()]["plan"]["m"] = 1024;  // plan no longer matches its key
  j["entries"]["junk"] = 5;
  std::ofstream(path) << j.dump();
  fo::TuningCache cache(path);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_TRUE(cache.lookup(kB));
  EXPECT_FALSE(cache.lookup(kA));
  EXPECT_EQ(cache.warnings().size(), 2u);
}

TEST(PlanTuningCache, RefusesAPlanForAnotherKey) {
  fo_test::TempDir dir;
  fo::TuningCache cache(dir.file("cache.json"));
  EXPECT_THROW(cache.store(kB, plan_for(kA)), flashoverlap::InvalidArgument);
  fo::CacheKey sms = kA;
  sms.sms = 114;
  EXPECT_THROW(cache.store(sms, plan_for(kA)), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::TuningCache(dir.file("no/such/dir/cache.json")).store(kA, plan_for(kA)), flashoverlap::Error);
}
