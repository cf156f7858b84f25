// Curves kept between runs (plan/curve_files.h): names, which files are
// used, and that every rank measures when any rank lacks the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "plan/curve_files.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;

namespace {

fo::BandwidthCurve random_curve(fo::Collective op, int world, const std::string& gpu, std::mt19937_64& rng) {
  std::vector<fo::CurveSample> s;
  double ms = 0.005 + double(rng() % 100) / 1e4;
  for (double b = 65536; b <= 64.0 * (1 << 20); b *= 2) {
    ms += b / (100e6 + double(rng() % 300) * 1e6);  // increasing in bytes
    s.push_back({b, ms});
  }
  return fo::BandwidthCurve(op, world, s, gpu);
}

void expect_same(const fo::BandwidthCurve& a, const fo::BandwidthCurve& b) {
  ASSERT_EQ(a.samples().size(), b.samples().size());
  for (size_t i = 0; i < a.samples().size(); ++i) {
    EXPECT_DOUBLE_EQ(a.samples()[i].bytes, b.samples()[i].bytes);
    EXPECT_DOUBLE_EQ(a.samples()[i].ms, b.samples()[i].ms);
  }
}

}  // namespace

TEST(PlanCurveFiles, NamesSayOpCtasWorldAndType) {
  EXPECT_EQ(fo::allreduce_curve_file("d", 0, 2, "bf16"), "d/allreduce-ctasdefault-w2-bf16.json");
  EXPECT_EQ(fo::allreduce_curve_file("d", 16, 8, "fp16"), "d/allreduce-ctas16-w8-fp16.json");
}

TEST(PlanCurveFiles, UsesOnlyACurveOfThisOpGpuAndWorld) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  const std::string path = dir.file("c.json");
  std::ostringstream log;
  EXPECT_FALSE(fo::load_fitting_curve(path, fo::Collective::AllReduce, "NVIDIA H200", 2, log));  // no file
  EXPECT_TRUE(log.str().empty());
  const fo::BandwidthCurve c = random_curve(fo::Collective::AllReduce, 2, "NVIDIA H200", rng);
  c.save(path);
  auto got = fo::load_fitting_curve(path, fo::Collective::AllReduce, "NVIDIA H200", 2, log);
  ASSERT_TRUE(got);
  expect_same(*got, c);
  EXPECT_FALSE(fo::load_fitting_curve(path, fo::Collective::AllReduce, "NVIDIA H200", 4, log));
  EXPECT_NE(log.str().find("measured on 2 ranks"), std::string::npos) << log.str();
  EXPECT_FALSE(fo::load_fitting_curve(path, fo::Collective::AllReduce, "NVIDIA H100", 2, log));
  EXPECT_NE(log.str().find("NVIDIA H200"), std::string::npos) << log.str();
  EXPECT_FALSE(fo::load_fitting_curve(path, fo::Collective::AllGather, "NVIDIA H200", 2, log));
  EXPECT_NE(log.str().find("allreduce curve"), std::string::npos) << log.str();
  std::ofstream(path) << "{ not json";
  std::ostringstream log2;
  EXPECT_FALSE(fo::load_fitting_curve(path, fo::Collective::AllReduce, "NVIDIA H200", 2, log2));
  EXPECT_NE(log2.str().find("not used"), std::string::npos) << log2.str();
}

// bench --curves DIR: a malformed file there is not used, and the log says
// why in the curve-file message (file and problem), not in nlohmann's words;
// not thrown, since the ranks must reach the agreement on measuring together.
TEST(PlanCurveFiles, MalformedFileIsReportedByNameAndMeasured) {
  fo_test::TempDir dir;
  const std::pair<std::string, std::string> cases[] = {
      {R"({"format": "flashoverlap.bandwidth_curve", "schema": 1, "collective": "allreduce", "world": 2,
           "gpu": "NVIDIA H200", "samples": [[1024, 1e999], [2048, 0.1]]})",
       "number overflow parsing '1e999'"},
      {R"({"format": "flashoverlap.bandwidth_curve", "schema": 1, "collective": "allreduce", "world": 2,
           "gpu": "NVIDIA H200", "samples": [[4096, 0.05], [2048, 0.1]]})",
       "bytes must increase strictly"},
      {"", "empty file"},
  };
  for (const auto& [text, problem] : cases) {
    SCOPED_TRACE(text);
    const std::string path = dir.write("c.json", text);
    std::ostringstream log;
    EXPECT_FALSE(fo::load_fitting_curve(path, fo::Collective::AllReduce, "NVIDIA H200", 2, log));
    EXPECT_EQ(log.str().rfind("curve " + path + " not used (bandwidth curve " + path + ": ", 0), 0u) << log.str();
    EXPECT_NE(log.str().find(problem), std::string::npos) << log.str();
    EXPECT_EQ(log.str().find("json.exception"), std::string::npos) << log.str();
  }
}

TEST(PlanCurveFiles, MeasuresUnlessEveryRankHasTheFileAndSavesWhenAsked) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  const std::string path = dir.file("sub/dir/c.json");  // directories are created on save
  const fo::BandwidthCurve measured = random_curve(fo::Collective::AllGather, 2, "NVIDIA H200", rng);
  int measures = 0;
  auto measure = [&] {
    ++measures;
    return measured;
  };
  std::ostringstream log;
  const fo::RankAgreement everyone{[](bool mine) { return mine; }, [](const std::string& t) { return t; }};
  // Missing: measured, and saved by the rank that saves.
  expect_same(fo::cached_curve(path, fo::Collective::AllGather, "NVIDIA H200", 2, false, everyone, measure, log),
              measured);
  EXPECT_FALSE(std::filesystem::exists(path));
  expect_same(fo::cached_curve(path, fo::Collective::AllGather, "NVIDIA H200", 2, true, everyone, measure, log),
              measured);
  EXPECT_EQ(measures, 2);
  ASSERT_TRUE(std::filesystem::exists(path));
  // Present on every rank: read, not measured.
  expect_same(fo::cached_curve(path, fo::Collective::AllGather, "NVIDIA H200", 2, true, everyone, measure, log),
              measured);
  EXPECT_EQ(measures, 2);
  // Present here but missing on another rank: all ranks measure together.
  const fo::RankAgreement another_lacks_it{[](bool) { return false; }, [](const std::string& t) { return t; }};
  fo::cached_curve(path, fo::Collective::AllGather, "NVIDIA H200", 2, false, another_lacks_it, measure, log);
  EXPECT_EQ(measures, 3);
  // Every rank has a fitting file: every rank plans with rank 0's curve.
  const fo::BandwidthCurve rank0 = random_curve(fo::Collective::AllGather, 2, "NVIDIA H200", rng);
  const fo::RankAgreement rank0_differs{[](bool mine) { return mine; },
                                        [&](const std::string&) { return rank0.to_json().dump(); }};
  expect_same(fo::cached_curve(path, fo::Collective::AllGather, "NVIDIA H200", 2, false, rank0_differs, measure, log),
              rank0);
  EXPECT_EQ(measures, 3);
  // A directory that cannot be written: measured, reported, not thrown.
  const std::string blocked = dir.write("a_file", "x") + "/c.json";
  std::ostringstream log2;
  fo::cached_curve(blocked, fo::Collective::AllGather, "NVIDIA H200", 2, true, everyone, measure, log2);
  EXPECT_EQ(measures, 4);
  EXPECT_NE(log2.str().find("not saved"), std::string::npos) << log2.str();
  // No directory given: always measured, nothing written.
  fo::cached_curve("", fo::Collective::AllGather, "NVIDIA H200", 2, true, everyone, measure, log);
  EXPECT_EQ(measures, 5);
}
