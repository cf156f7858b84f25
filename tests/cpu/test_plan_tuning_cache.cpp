// The tuning cache: round trips, merging, atomic writes, concurrent writers
// (threads and processes), damaged files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <latch>
#include <set>
#include <thread>

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

// The keys of writer w: `count` of them, distinct from every other writer's
// (the GPU name is free text; the plan matches every key).
std::vector<fo::CacheKey> keys_of(int trial, int w, int count) {
  std::vector<fo::CacheKey> keys;
  for (int i = 0; i < count; ++i) {
    fo::CacheKey k = kA;
    k.gpu = "GPU trial " + std::to_string(trial) + " writer " + std::to_string(w) + " key " + std::to_string(i);
    keys.push_back(k);
  }
  return keys;
}

// The keys the file lacks of `expected`, as text ("" when none).
std::string missing(const std::string& path, const std::vector<fo::CacheKey>& expected) {
  fo::TuningCache cache(path);
  std::string out;
  for (const auto& w : cache.warnings()) out += "warning: " + w + "\n";
  for (const fo::CacheKey& k : expected)
    if (!cache.lookup(k)) out += "lost " + k.gpu + "\n";
  return out;
}

// Writers and keys per writer of one trial, at random.
struct Trial {
  int writers;
  std::vector<int> keys;  // per writer
};
Trial random_trial(std::mt19937_64& rng, int most_writers) {
  Trial t{int(2 + rng() % (most_writers - 1)), {}};
  for (int w = 0; w < t.writers; ++w) t.keys.push_back(int(1 + rng() % 3));
  return t;
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
  // Only the cache file and its lock file remain: the temporary files were
  // renamed over it.
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path)) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"cache.json", "cache.json.lock"}));
}

// Threads storing at the same instant into one file, each through its own
// TuningCache: without the lock, two that re-read before either renames
// each write back only their own entry and the last rename drops the other's.
TEST(PlanTuningCache, ConcurrentThreadsKeepEveryEntry) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  const fo::Plan plan = plan_for(kA);
  for (int trial = 0; trial < 40; ++trial) {
    const std::string path = dir.file("cache" + std::to_string(trial) + ".json");
    const Trial t = random_trial(rng, 6);
    std::latch start(t.writers);
    std::vector<std::string> errors(size_t(t.writers));
    std::vector<std::thread> threads;
    std::vector<fo::CacheKey> all;
    for (int w = 0; w < t.writers; ++w) {
      const auto keys = keys_of(trial, w, t.keys[size_t(w)]);
      all.insert(all.end(), keys.begin(), keys.end());
      threads.emplace_back([&, w, keys] {
        start.arrive_and_wait();  // all at once
        try {
          for (const fo::CacheKey& k : keys) fo::TuningCache(path).store(k, plan);
        } catch (const std::exception& e) {
          errors[size_t(w)] = e.what();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int w = 0; w < t.writers; ++w) EXPECT_EQ(errors[size_t(w)], "") << "writer " << w;
    const std::string lost = missing(path, all);
    ASSERT_EQ(lost, "") << "trial " << trial << ": " << t.writers << " writers";
  }
}

// The ranks of a job share one file: processes storing at once, likewise.
TEST(PlanTuningCache, ConcurrentProcessesKeepEveryEntry) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  const fo::Plan plan = plan_for(kA);
  for (int trial = 0; trial < 15; ++trial) {
    const std::string path = dir.file("cache" + std::to_string(trial) + ".json");
    const Trial t = random_trial(rng, 6);
    int gate[2];  // the children start storing when it closes
    ASSERT_EQ(::pipe(gate), 0);
    std::vector<pid_t> children;
    std::vector<fo::CacheKey> all;
    for (int w = 0; w < t.writers; ++w) {
      const auto keys = keys_of(trial, w, t.keys[size_t(w)]);
      all.insert(all.end(), keys.begin(), keys.end());
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(gate[1]);
        char c;
        while (::read(gate[0], &c, 1) < 0 && errno == EINTR) {}
        int code = 0;
        try {
          for (const fo::CacheKey& k : keys) fo::TuningCache(path).store(k, plan);
        } catch (const std::exception& e) {
          std::cerr << "writer " << w << ": " << e.what() << std::endl;
          code = 1;
        }
        ::_exit(code);  // not exit(): no gtest teardown in the child
      }
      children.push_back(pid);
    }
    ::close(gate[0]);
    ::close(gate[1]);
    for (size_t w = 0; w < children.size(); ++w) {
      int status = 0;
      ASSERT_EQ(::waitpid(children[w], &status, 0), children[w]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer " << w << " status " << status;
    }
    const std::string lost = missing(path, all);
    ASSERT_EQ(lost, "") << "trial " << trial << ": " << t.writers << " processes";
  }
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
