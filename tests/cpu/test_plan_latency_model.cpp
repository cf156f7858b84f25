// Bandwidth curves (interpolation, envelope, files), their scaling, the GEMM model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "flashoverlap/error.h"
#include "plan/latency_model.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
namespace fs = std::filesystem;

namespace {

const fo::Collective kOps[] = {fo::Collective::AllReduce, fo::Collective::ReduceScatter, fo::Collective::AllToAll};

}  // namespace

TEST(PlanLatencyModel, BuiltinCurvesUseTheRunningMaximumEnvelope) {
  for (fo::Collective op : kOps) {
    const fo::BandwidthCurve c = fo::BandwidthCurve::builtin_h200(op);
    EXPECT_EQ(c.world(), 2);
    double running = 0;
    for (const fo::CurveSample& s : c.samples()) {
      running = std::max(running, s.ms);
      EXPECT_DOUBLE_EQ(c.latency_ms(s.bytes), running) << s.bytes;
    }
    double prev = 0;
    for (double b = 1; b < 1e10; b *= 1.07) {
      const double t = c.latency_ms(b);
      EXPECT_GE(t, prev) << "latency decreases at " << b << " bytes";
      prev = t;
    }
    EXPECT_DOUBLE_EQ(c.latency_ms(1), c.samples().front().ms);  // clamp below
    EXPECT_DOUBLE_EQ(c.latency_ms(0), c.samples().front().ms);
  }
  // The AllReduce samples dip at 2-4 MiB (0.0718 after 0.0788): the envelope holds 0.0788.
  EXPECT_DOUBLE_EQ(fo::BandwidthCurve::builtin_h200(fo::Collective::AllReduce).latency_ms(4194304), 0.0788);
}

TEST(PlanLatencyModel, InterpolatesInLogBytesAndExtrapolatesAtTheLastBandwidth) {
  const fo::BandwidthCurve c(fo::Collective::AllReduce, 2, {{1000, 1.0}, {4000, 2.0}, {8000, 4.0}});
  EXPECT_DOUBLE_EQ(c.latency_ms(2000), 1.5);                 // geometric midpoint -> arithmetic mean
  EXPECT_NEAR(c.latency_ms(4000 * std::sqrt(2.0)), 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(c.latency_ms(16000), 4.0 + 8000 * (2.0 / 4000));  // last segment: 2 ms per 4000 bytes
  EXPECT_DOUBLE_EQ(c.overhead_ms(), 1.0);
}

TEST(PlanLatencyModel, RejectsBadSampleSets) {
  using S = std::vector<fo::CurveSample>;
  for (const S& bad : {S{{100, 1}}, S{{100, 1}, {100, 2}}, S{{200, 1}, {100, 2}}, S{{0, 1}, {100, 2}},
                       S{{100, -1}, {200, 2}}, S{{100, 1}, {200, NAN}}, S{{100, 1}, {INFINITY, 2}}})
    EXPECT_THROW(fo::BandwidthCurve(fo::Collective::AllReduce, 2, bad), flashoverlap::InvalidArgument);
  EXPECT_THROW(fo::BandwidthCurve(fo::Collective::AllReduce, 0, {{1, 1}, {2, 2}}), flashoverlap::InvalidArgument);
}

TEST(PlanLatencyModel, SavesAndLoadsCurves) {
  fo_test::TempDir dir;
  for (fo::Collective op : kOps) {
    const fo::BandwidthCurve c = fo::BandwidthCurve::builtin_h200(op);
    const std::string path = (dir.path / "curve.json").string();
    c.save(path);
    const fo::BandwidthCurve back = fo::BandwidthCurve::load(path);
    EXPECT_EQ(back.op(), op);
    EXPECT_EQ(back.world(), 2);
    EXPECT_EQ(back.gpu(), c.gpu());
    ASSERT_EQ(back.samples().size(), c.samples().size());
    for (size_t i = 0; i < c.samples().size(); ++i) {
      EXPECT_EQ(back.samples()[i].bytes, c.samples()[i].bytes);
      EXPECT_EQ(back.samples()[i].ms, c.samples()[i].ms);
    }
  }
  // "gpu" is optional.
  const std::string minimal = dir.write("min.json", R"({"format": "flashoverlap.bandwidth_curve", "schema": 1,
      "collective": "alltoall", "world": 8, "samples": [[1024, 0.05], [1048576, 0.1]]})");
  EXPECT_EQ(fo::BandwidthCurve::load(minimal).world(), 8);
}

TEST(PlanLatencyModel, BadCurveFilesGiveClearErrors) {
  fo_test::TempDir dir;
  const std::string head = R"("format": "flashoverlap.bandwidth_curve", "schema": 1, "collective": "allreduce", "world": 2)";
  const std::pair<std::string, std::string> cases[] = {
      {"not JSON at all {", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"schema": 1, "samples": []})", "not a flashoverlap bandwidth curve"},
      {R"({"format": "something.else", "schema": 1})", "not a flashoverlap bandwidth curve"},
      {R"({"format": "flashoverlap.bandwidth_curve", "schema": 2, "collective": "allreduce", "world": 2, "samples": []})",
       "schema version 2"},
      {R"({"format": "flashoverlap.bandwidth_curve", "schema": "1"})", "schema"},
      {"{" + head + "}", "samples"},
      {"{" + head + R"(, "samples": {"a": 1}})", "samples"},
      {"{" + head + R"(, "samples": [[1024, 0.1]]})", "at least 2 samples"},
      {"{" + head + R"(, "samples": [[2048, 0.1], [1024, 0.2]]})", "increase strictly"},
      {"{" + head + R"(, "samples": [[1024, 0.1], [2048, -0.2]]})", "positive"},
      {"{" + head + R"(, "samples": [[1024, 0.1], [2048]]})", "not a [bytes, ms] pair"},
      {"{" + head + R"(, "samples": [[1024, 0.1], ["2048", 0.2]]})", "not a [bytes, ms] pair"},
      {R"({"format": "flashoverlap.bandwidth_curve", "schema": 1, "collective": "broadcast", "world": 2,
          "samples": [[1, 1], [2, 2]]})", "unknown collective"},
      {R"({"format": "flashoverlap.bandwidth_curve", "schema": 1, "collective": "allreduce", "world": 0,
          "samples": [[1, 1], [2, 2]]})", "world"},
      {R"({"format": "flashoverlap.bandwidth_curve", "schema": 1, "collective": "allreduce", "world": 2, "gpu": 7,
          "samples": [[1, 1], [2, 2]]})", "gpu"},
  };
  int i = 0;
  for (const auto& [text, expect] : cases) {
    const std::string path = dir.write("bad" + std::to_string(i++) + ".json", text);
    try {
      fo::BandwidthCurve::load(path);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const flashoverlap::InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(expect), std::string::npos) << "expected '" << expect << "' in: " << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  try {
    fo::BandwidthCurve::load((dir.path / "missing.json").string());
    ADD_FAILURE();
  } catch (const flashoverlap::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
}

TEST(PlanLatencyModel, CommModelScalesWithWorldAndNcclCtas) {
  const fo::BandwidthCurve c = fo::BandwidthCurve::builtin_h200(fo::Collective::AllReduce);
  const double b = 64.0 * 1024 * 1024;
  const fo::CommModel two(c, 2), four(c, 4), eight(c, 8), one(c, 1);
  EXPECT_DOUBLE_EQ(two.bytes_scale(), 1.0);
  EXPECT_DOUBLE_EQ(four.bytes_scale(), 1.5);   // (3/4) / (1/2)
  EXPECT_DOUBLE_EQ(eight.bytes_scale(), 1.75);
  EXPECT_DOUBLE_EQ(one.bytes_scale(), 0.0);    // nothing crosses a link
  EXPECT_DOUBLE_EQ(four.ms(b, 0), c.latency_ms(1.5 * b));
  EXPECT_DOUBLE_EQ(one.ms(b, 0), c.overhead_ms());
  EXPECT_NE(four.describe().find("x1.5"), std::string::npos) << four.describe();
  // Fewer NCCL CTAs than saturating: the bandwidth term grows as 16/ctas.
  const double full = two.ms(b, 0), over = c.overhead_ms();
  EXPECT_DOUBLE_EQ(two.ms(b, 16), full);
  EXPECT_DOUBLE_EQ(two.ms(b, 32), full);
  EXPECT_NEAR(two.ms(b, 8) - over, 2 * (full - over), 1e-12);
  EXPECT_NEAR(two.ms(b, 4) - over, 4 * (full - over), 1e-12);
  // The fit reproduces docs/design.md §6.2's 64 MiB AllReduce with 8 channels (0.55 ms) within 10%.
  EXPECT_NEAR(two.ms(b, 8), 0.55, 0.055);
  const fo::BandwidthCurve solo(fo::Collective::AllReduce, 1, {{1, 1}, {2, 2}});
  EXPECT_THROW(fo::CommModel(solo, 2), flashoverlap::InvalidArgument);
  EXPECT_NO_THROW(fo::CommModel(solo, 1));
}

TEST(PlanLatencyModel, GemmWaveEstimate) {
  const fo::GemmModel g;
  const double per_sm = 770e12 / 132;
  EXPECT_NEAR(g.wave_ms({128, 256}, 8192), 2.0 * 128 * 256 * 8192 / per_sm * 1e3, 1e-12);
  EXPECT_NEAR(g.wave_ms({128, 128}, 8192), g.wave_ms({128, 256}, 8192) / 2 / 0.92, 1e-12);
  EXPECT_THROW(g.wave_ms({64, 64}, 8192), flashoverlap::InvalidArgument);
  // 4096x8192x8192 on all 132 SMs: 8 waves of 1024 tiles, ~0.74 ms (cuBLAS: 0.715).
  const fo::Schedule s = fo::make_schedule(4096, 8192, {128, 256}, 132, fo::Raster::AlongN, 8);
  const auto waves = g.waves_ms(s, 8192);
  ASSERT_EQ(waves.size(), 8u);
  EXPECT_NEAR(waves[0] * 8, 0.736, 0.01);
  EXPECT_EQ(waves.back(), waves.front());  // the partial last wave takes a full wave's time
}
