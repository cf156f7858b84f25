// `flashoverlap plan` end to end: the built CLI for all three collectives, text
// and JSON, and one-line errors with exit code 2 for bad input (plan's, and
// those of bench, bench-gemm and tune that need no GPU to find).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>

#include "test_plan_util.h"

namespace {

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `flashoverlap <command> <args>` (command "plan" unless given).
Result run(const std::string& args, const std::string& command = "plan") {
  fo_test::TempDir dir;
  const std::string cmd =
      std::string(FO_CLI_PATH) + " " + command + " " + args + " >" + dir.file("out") + " 2>" + dir.file("err");
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir.file("out")), slurp(dir.file("err"))};
}

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST(PlanCli, PrintsAPlanForEveryCollective) {
  for (const char* op : {"allreduce", "reducescatter", "alltoall"}) {
    SCOPED_TRACE(op);
    const Result r = run(std::string("--op ") + op);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    for (const char* part : {"tiles: 128x", "waves", "partition: ", "predicted: ", "vs sequential", "speedup"})
      EXPECT_NE(r.out.find(part), std::string::npos) << part << " missing in:\n" << r.out;
    EXPECT_LT(lines(r.out), 40u) << r.out;
  }
  const Result a2a = run("--op alltoall --world 4 --routing empty:1 --m 3000");
  ASSERT_EQ(a2a.rc, 0) << a2a.err;
  EXPECT_NE(a2a.out.find("rows to each peer"), std::string::npos) << a2a.out;
  const Result wide = run("--op alltoall --world 64 --m 4096 --routing skewed");
  ASSERT_EQ(wide.rc, 0) << wide.err;
  EXPECT_LT(lines(wide.out), 40u) << wide.out;
}

TEST(PlanCli, JsonOutputIsOneParsableObject) {
  for (const char* op : {"allreduce", "reducescatter", "alltoall"}) {
    SCOPED_TRACE(op);
    const Result r = run(std::string("--json --world 4 --m 2048 --op ") + op);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(lines(r.out), 1u);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["op"], op);
    EXPECT_EQ(j["world"], 4);
    const auto partition = j["partition"].get<std::vector<int>>();
    EXPECT_EQ(std::accumulate(partition.begin(), partition.end(), 0), j["waves"].get<int>());
    ASSERT_EQ(j["slots"]["groups"].size(), partition.size());
    // The groups' send spans tile the send buffer.
    int64_t at = 0;
    for (const auto& g : j["slots"]["groups"]) {
      EXPECT_EQ(g["send"][0].get<int64_t>(), at);
      at += g["send"][1].get<int64_t>();
    }
    EXPECT_EQ(at, j["slots"]["send_elements"].get<int64_t>());
    EXPECT_LE(j["predicted_ms"].get<double>(), j["baseline"]["total_ms"].get<double>());
    if (std::string(op) == "alltoall") {
      EXPECT_EQ(j["busiest_link_rows"].size(), partition.size());
      EXPECT_EQ(j["slots"]["groups"][0]["send_to"].size(), 4u);
    }
  }
  const Result fixed = run("--json --tile 128x256 --reserve-sms 16 --partition 3,3,3");
  ASSERT_EQ(fixed.rc, 0) << fixed.err;
  EXPECT_EQ(nlohmann::json::parse(fixed.out)["partition"], nlohmann::json({3, 3, 3}));
}

TEST(PlanCli, BadInputIsOneLineAndExitCode2) {
  fo_test::TempDir dir;
  const std::string malformed = dir.write("bad_curve.json", "{\"format\": \"flashoverlap.bandwidth_curve\", \"schema\": 1}");
  const std::pair<std::string, std::string> cases[] = {
      {"--m 0", "--m"},
      {"--m -5", "--m"},
      {"--op gather", "--op"},
      {"--tile 64x64", "--tile"},
      {"--tile 128x", "--tile"},
      {"--world 0", "--world"},
      {"--world 1025", "--world"},
      {"--dtype fp32", "--dtype"},
      {"--tile 128x256 --reserve-sms 16 --partition 1,2,2", "sums to 5"},
      {"--partition 1,x", "bad partition"},
      {"--partition 2,0,7", "group 1"},
      {"--op reducescatter --m 4000 --world 3", "world == 0"},
      {"--reserve-sms 132", "reserved SMs"},
      {"--op alltoall --routing empty:7", "empty rank"},
      {"--op alltoall --routing zipf", "unknown routing"},
      {"--curve " + dir.file("missing.json"), "cannot open"},
      {"--curve " + malformed, "missing \"collective\""},
      {"--op alltoall --curve " + [&] {  // a valid curve of another collective
         return dir.write("ar.json", R"({"format": "flashoverlap.bandwidth_curve", "schema": 1,
            "collective": "allreduce", "world": 2, "samples": [[1024, 0.05], [1048576, 0.1]]})");
       }(), "curve is for allreduce"},
      {"--no-such-option", "no-such-option"},
  };
  for (const auto& [args, expect] : cases) {
    SCOPED_TRACE(args);
    const Result r = run(args);
    EXPECT_EQ(r.rc, 2) << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("flashoverlap: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// Argument errors of the GPU commands are found before they look for a GPU:
// the same one line and exit code 2 on a machine without one.
TEST(BenchCli, BadArgumentsAreOneLineAndExitCode2) {
  const std::tuple<std::string, std::string, std::string> cases[] = {
      {"bench", "--band-swizzles 0", "--band-swizzles: a band is at least 1 tile row, not 0"},
      {"bench", "--band-swizzles 4,x", "bad band swizzle list"},
      {"bench", "--band-swizzles ''", "no band heights"},
      {"bench", "--push-tma every", "--push-tma"},
      {"bench", "--owner-pushers maybe", "--owner-pushers"},
      {"bench", "--diag-no-final-bytes", "--diag-no-final-bytes measures owners pushed on 4 stages"},
      {"bench", "--diag-no-final-bytes --push-by owners --three-stages", "needs --push-by owners"},
      {"bench", "--iters 0", "--iters: must be a number >= 1, not 0"},
      {"bench", "--m 0", "--m: must be a number >= 1"},
      {"bench", "--warmup -1", "--warmup: must be a number >= 0"},
      {"bench", "--wait-timeout 0", "--wait-timeout: must be a number > 0, not 0"},
      {"bench", "--power -2", "--power: must be a number >= 0"},
      {"bench", "--copy-streams 9", "--copy-streams"},
      {"bench", "--shapes 1x2", "bad shape '1x2'"},
      {"bench", "--dtype fp32", "--dtype"},
      {"bench", "--tile 64x64", "--tile must be auto, 128x256 or 128x128, not 64x64"},
      {"bench", "--layout diagonal", "--layout"},
      {"bench", "--op gather", "must be allreduce, reducescatter or alltoall"},
      {"bench", "--op alltoall --topk 2", "top-k 2 outside [1, world = 1]"},
      {"bench", "--op alltoall --routing zipf", "unknown MoE routing 'zipf'"},
      {"bench", "--op alltoall --shapes 100x1001x64", "N = 1001 must be a multiple of 8"},
      {"bench", "--op alltoall --layout rows --with-rmsnorm", "--layout, --with-rmsnorm are not for the all-to-all"},
      {"bench", "--op alltoall --tokens -1", "--tokens must be >= 0"},
      {"bench", "--op alltoall --routing file:/nonexistent/r.json", "/nonexistent/r.json"},
      {"bench", "--op alltoall --routing file:/nonexistent/r.json --topk 1", "the file gives the tokens and top-K"},
      {"bench", "--topk 1", "--routing, --topk and --tokens are for --op alltoall"},
      {"bench", "--rs-layout subtile", "--rs-layout is for --op reducescatter"},
      {"bench", "--op reducescatter --rs-layout diagonal", "--rs-layout"},
      {"bench", "--op reducescatter --layout rows --trace", "--layout, --trace are for --op allreduce only"},
      {"bench", "--op reducescatter --decomposition 2,0", "chunk counts are at least 1, not 0"},
      {"bench", "--op reducescatter --partition 1,x", "bad partition"},
      {"bench-gemm", "--iters 0", "--iters: must be a number >= 1"},
      {"tune", "--iters 0", "--iters: must be a number >= 1"},
  };
  for (const auto& [command, args, expect] : cases) {
    SCOPED_TRACE(command + " " + args);
    const Result r = run(args, command);
    EXPECT_EQ(r.rc, 2) << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("flashoverlap: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// bench --op reducescatter checks M against the world size of the job's
// environment (a process of a launched job: RANK and WORLD_SIZE set) before
// it looks for a GPU: one shape that the layout cannot split is an error.
TEST(BenchCli, ReduceScatterRefusesShapesTheWorldCannotSplit) {
  struct Env {  // RANK=0 WORLD_SIZE=<world> for the commands run while it lives
    explicit Env(int world) {
      setenv("RANK", "0", 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    }
    ~Env() {
      unsetenv("RANK");
      unsetenv("WORLD_SIZE");
    }
  };
  const std::tuple<int, std::string, std::string> cases[] = {
      {2, "--m 4095", "M = 4095 is not a multiple of the world size 2"},
      {4, "--m 4098 --rs-layout standard", "M = 4098 is not a multiple of the world size 4"},
      {3, "--rs-layout subtile", "the world size must divide 128"},
      {8, "--m 100 --rs-layout subtile", "M = 100 leaves rank 7 no rows"},
  };
  for (const auto& [world, args, expect] : cases) {
    SCOPED_TRACE(std::to_string(world) + " ranks: " + args);
    const Env env(world);
    const Result r = run("--op reducescatter " + args, "bench");
    EXPECT_EQ(r.rc, 2) << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("flashoverlap: error: bench --op reducescatter", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(PlanCli, HasItsOwnHelp) {
  const Result r = run("--help");
  EXPECT_EQ(r.rc, 0);
  for (const char* opt : {"--op", "--m", "--world", "--tile", "--reserve-sms", "--curve", "--partition", "--routing", "--json"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
}

// plan and bench check shapes with one rule (check_gemm_shape, cli_parse.h):
// plan shows no plan for a shape bench refuses, and says so in bench's words.
// bench checks shapes before it looks for a GPU, so this runs on any machine
// (and every bench case here is refused: none starts a benchmark).
TEST(PlanCli, RefusesTheShapesBenchRefusesWithTheSameMessage) {
  const std::pair<std::string, std::string> cases[] = {
      {"--m 4096 --n 8192 --k 8191", "4096x8192x8191"},  // K not a multiple of 8 (TMA's 16-byte rows)
      {"--k 4", "4096x8192x4"},
      {"--k 12", "4096x8192x12"},
      {"--m 2147483648", "2147483648x8192x8192"},  // sides are int32 in the kernel
      {"--n 2147483648", "4096x2147483648x8192"},
      {"--k 2147483648", "4096x8192x2147483648"},  // (a multiple of 8, still too large)
  };
  for (const auto& [shape, name] : cases) {
    SCOPED_TRACE(shape);
    const Result plan = run("--op allreduce --world 2 " + shape);
    const Result bench = run(shape, "bench");
    EXPECT_EQ(plan.rc, 2) << plan.out << plan.err;
    EXPECT_EQ(bench.rc, 2) << bench.out << bench.err;
    EXPECT_EQ(lines(plan.err), 1u) << plan.err;
    EXPECT_EQ(plan.err.rfind("flashoverlap: error: bad shape " + name + ": ", 0), 0u) << plan.err;
    EXPECT_NE(plan.err.find("multiple of 8"), std::string::npos) << plan.err;
    EXPECT_EQ(plan.err, bench.err);
    EXPECT_TRUE(plan.out.empty()) << plan.out;
  }
  // The same rule through bench's --shapes.
  const Result shapes = run("--shapes 1024x8192x8192,4096x8192x8191", "bench");
  EXPECT_EQ(shapes.rc, 2) << shapes.err;
  EXPECT_EQ(shapes.err, run("--m 4096 --n 8192 --k 8191").err);
  // What the rule lets through, plan plans: the smallest and largest K.
  for (const char* k : {"--k 8", "--k 2147483640", "--op alltoall --k 8"}) {
    SCOPED_TRACE(k);
    const Result r = run(k);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("predicted: "), std::string::npos) << r.out;
  }
}

// Whatever is wrong in a curve file (read by the shared JSON reader and the
// curve's own checks), `plan --curve` says so in one line that names the file,
// exit code 2; never nlohmann's raw message with exit code 1.
TEST(PlanCli, MalformedCurveFileIsOneLineNamingTheFileAndExitCode2) {
  fo_test::TempDir dir;
  const std::string head = R"("format": "flashoverlap.bandwidth_curve", "schema": 1, "collective": "allreduce")";
  auto curve = [&](const std::string& world, const std::string& samples) {
    return "{" + head + ", \"world\": " + world + ", \"samples\": " + samples + "}";
  };
  const std::pair<std::string, std::string> cases[] = {
      {curve("2", "[[1024, 1e999], [2048, 0.1]]"), "number overflow parsing '1e999'"},
      {curve("2", "[[-1e999, 0.05], [2048, 0.1]]"), "number overflow parsing '-1e999'"},
      {curve("1e999", "[[1024, 0.05], [2048, 0.1]]"), "number overflow parsing '1e999'"},
      {curve("2", "[[1024, NaN], [2048, 0.1]]"), "not valid JSON"},
      {curve("2", "[[1024, Infinity], [2048, 0.1]]"), "not valid JSON"},
      {"", "empty file"},
      {" \n\t", "empty file"},
      {"[]", "not a JSON object"},
      {curve("\"2\"", "[[1024, 0.05], [2048, 0.1]]"), "missing integer \"world\""},
      {curve("2.5", "[[1024, 0.05], [2048, 0.1]]"), "missing integer \"world\""},
      {curve("2", "[[\"1024\", 0.05], [2048, 0.1]]"), "sample 0 is not a [bytes, ms] pair of numbers"},
      {curve("2", "{\"1024\": 0.05}"), "missing \"samples\" array"},
      {curve("2", "[[1024, -0.05], [2048, 0.1]]"), "sample 0 needs positive finite bytes and ms"},
      {curve("2", "[[0, 0.05], [2048, 0.1]]"), "sample 0 needs positive finite bytes and ms"},
      {curve("2", "[[1024, 1e-999], [2048, 0.1]]"), "sample 0 needs positive finite bytes and ms"},  // reads as 0
      {curve("2", "[[4096, 0.05], [2048, 0.1]]"), "bytes must increase strictly"},
      {curve("2", "[[2048, 0.05], [2048, 0.1]]"), "bytes must increase strictly"},
      {curve("2", "[]"), "at least 2 samples"},
  };
  int n = 0;
  for (const auto& [text, problem] : cases) {
    SCOPED_TRACE(text);
    const std::string path = dir.write("c" + std::to_string(n++) + ".json", text);
    const Result r = run("--curve " + path);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("flashoverlap: error: bandwidth curve " + path + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(problem), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const Result d = run("--curve " + dir.path.string());  // a directory reads as nothing: say what it is
  EXPECT_EQ(d.rc, 2) << d.err;
  EXPECT_EQ(d.err, "flashoverlap: error: bandwidth curve " + dir.path.string() + ": is a directory\n");
}
