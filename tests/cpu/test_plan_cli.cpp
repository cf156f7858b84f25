// `flashoverlap plan` end to end: the built CLI for all three collectives, text
// and JSON, and one-line errors with exit code 2 for bad input (plan's, and
// those of bench, lab-bench, bench-gemm and tune that need no GPU to find).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>

#include "flashoverlap/flashoverlap.h"
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

// `flashoverlap <command> <args>` (command "plan" unless given; lab-bench and
// bench-gemm: flashoverlap-lab's).
Result run(const std::string& args, const std::string& command = "plan", const char* binary = nullptr) {
  fo_test::TempDir dir;
  const bool lab = command == "lab-bench" || command == "bench-gemm";
  if (!binary) binary = lab ? FO_LAB_PATH : FO_CLI_PATH;
  const std::string cmd =
      std::string(binary) + " " + command + " " + args + " >" + dir.file("out") + " 2>" + dir.file("err");
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir.file("out")), slurp(dir.file("err"))};
}

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

// A line of flashoverlap's ("flashoverlap: ...") as flashoverlap-lab prints it.
std::string as_lab(const std::string& line) { return "flashoverlap-lab" + line.substr(std::string("flashoverlap").size()); }

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
  // The All-to-All: the MoE plan, named, and each rank's rows (an empty
  // expert: none).
  const Result a2a = run("--op alltoall --world 4 --routing empty:1 --m 3000");
  ASSERT_EQ(a2a.rc, 0) << a2a.err;
  for (const char* part : {"alltoall, the MoE combine, over 4 ranks: 3000 tokens a rank, top-2 by routing empty:1",
                           "moe plan: ", "off-rank slot rows sent / received", "busiest link slot rows"})
    EXPECT_NE(a2a.out.find(part), std::string::npos) << part << " missing in:\n" << a2a.out;
  const size_t row1 = a2a.out.find("\n  1 ");  // rank 1: tokens, rows, tiles, waves
  ASSERT_NE(row1, std::string::npos) << a2a.out;
  std::istringstream fields(a2a.out.substr(row1));
  std::string rank, tokens, rows, tiles, waves;
  fields >> rank >> tokens >> rows >> tiles >> waves;
  EXPECT_EQ(tokens + " " + rows + " " + tiles + " " + waves, "3000 0 0 0") << a2a.out;
  const Result wide = run("--op alltoall --world 64 --m 4096 --routing zipf:1.2 --topk 4");
  ASSERT_EQ(wide.rc, 0) << wide.err;
  EXPECT_LT(lines(wide.out), 40u) << wide.out;
  EXPECT_NE(wide.out.find("... 52 more ranks (--json lists all)"), std::string::npos) << wide.out;
}

TEST(PlanCli, JsonOutputIsOneParsableObject) {
  for (const char* op : {"allreduce", "reducescatter"}) {
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
  }
  const Result fixed = run("--json --tile 128x256 --reserve-sms 16 --partition 3,3,3");
  ASSERT_EQ(fixed.rc, 0) << fixed.err;
  EXPECT_EQ(nlohmann::json::parse(fixed.out)["partition"], nlohmann::json({3, 3, 3}));
}

// A recorded routing of random picks (each rank its own token count, some
// none; top-K random; random gates) and what `plan --op alltoall --json`
// says of it: each rank's rows and tokens, its off-rank slot rows summed over
// its groups, every rank's groups a run of its own waves, the busiest link
// of each group, and the plan's own consistency.
TEST(PlanCli, AllToAllJsonDescribesTheRoutingsPlan) {
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  for (int it = 0; it < 6; ++it) {
    const int W = int(fo_test::uniform(rng, 2, 6)), K = int(fo_test::uniform(rng, 1, std::min(W, 3)));
    const int64_t n = 256 * fo_test::uniform(rng, 1, 24) + (it % 2 ? fo_test::uniform(rng, 1, 255) : 0);
    std::vector<int64_t> tokens(static_cast<size_t>(W)), rows(static_cast<size_t>(W), 0), sent(rows), received(rows);
    nlohmann::json picks = nlohmann::json::array();
    int topk = 0;
    for (int s = 0; s < W; ++s) {
      tokens[size_t(s)] = fo_test::uniform(rng, 0, 3) ? fo_test::uniform(rng, 1, 3000) : 0;
      nlohmann::json mine = nlohmann::json::array();
      for (int64_t t = 0; t < tokens[size_t(s)]; ++t) {
        std::vector<int> ranks(static_cast<size_t>(W));
        std::iota(ranks.begin(), ranks.end(), 0);
        std::shuffle(ranks.begin(), ranks.end(), rng);
        const int k = int(fo_test::uniform(rng, 1, K));
        topk = std::max(topk, k);
        nlohmann::json token = nlohmann::json::array();
        for (int j = 0; j < k; ++j) {
          const int e = ranks[size_t(j)];
          token.push_back({e, double(fo_test::uniform(rng, 1, 1000)) / 1000});
          ++rows[size_t(e)];  // expert e's row goes back to rank s
          if (e != s) ++sent[size_t(e)], ++received[size_t(s)];
        }
        mine.push_back(token);
      }
      picks.push_back(mine);
    }
    const std::string file = dir.write("r" + std::to_string(it) + ".json",
                                       nlohmann::json{{"format", "flashoverlap.moe_routing"}, {"schema", 1},
                                                      {"world", W}, {"picks", picks}}.dump());
    const std::string args = "--op alltoall --json --world " + std::to_string(W) + " --routing file:" + file +
                             " --n " + std::to_string(n) + " --k " + std::to_string(64 * fo_test::uniform(rng, 1, 128));
    SCOPED_TRACE(args);
    const Result r = run(args);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(lines(r.out), 1u);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["op"], "alltoall");
    EXPECT_EQ(j["routing"], "file:" + file);
    EXPECT_EQ(j["world"], W);
    EXPECT_EQ(j["topk"], topk);
    EXPECT_EQ(j["tokens"], *std::max_element(tokens.begin(), tokens.end()));
    const int64_t bn = j["tile"] == "128x256" ? 256 : 128, tiles_n = (n + bn - 1) / bn;
    const auto common = j["common"].get<std::vector<int>>();
    const int waves = j["waves"];
    EXPECT_EQ(std::accumulate(common.begin(), common.end(), 0), std::max(waves, 1));
    EXPECT_EQ(j["ctas"].get<int>(), j["sequential"] ? 132 : 132 - j["reserve_sms"].get<int>());
    EXPECT_LE(j["predicted_ms"].get<double>(), j["baseline_ms"].get<double>());
    EXPECT_EQ(j["describe"].get<std::string>().rfind(j["sequential"] ? "sequential, " : "waves ", 0), 0u) << j["describe"];
    ASSERT_EQ(j["groups"].size(), common.size());
    ASSERT_EQ(j["ranks"].size(), size_t(W));
    std::vector<int64_t> busiest(common.size(), 0);
    int most_waves = 0;
    for (int x = 0; x < W; ++x) {
      SCOPED_TRACE("rank " + std::to_string(x));
      const nlohmann::json& rank = j["ranks"][size_t(x)];
      EXPECT_EQ(rank["tokens"], tokens[size_t(x)]);
      EXPECT_EQ(rank["rows"], rows[size_t(x)]);
      most_waves = std::max(most_waves, rank["waves"].get<int>());
      ASSERT_EQ(rank["groups"].size(), common.size());
      int64_t out = 0, in = 0, at = 0;
      for (size_t g = 0; g < common.size(); ++g) {
        const nlohmann::json& gr = rank["groups"][g];
        EXPECT_EQ(gr["waves"][0].get<int64_t>(), at);
        at = gr["waves"][1].get<int64_t>();
        out += gr["sent_rows"].get<int64_t>();
        in += gr["received_rows"].get<int64_t>();
        busiest[g] = std::max({busiest[g], gr["sent_rows"].get<int64_t>(), gr["received_rows"].get<int64_t>()});
      }
      EXPECT_EQ(at, rank["waves"].get<int64_t>());
      EXPECT_EQ(out, sent[size_t(x)] * tiles_n);
      EXPECT_EQ(in, received[size_t(x)] * tiles_n);
    }
    EXPECT_EQ(most_waves, waves);
    for (size_t g = 0; g < common.size(); ++g) EXPECT_EQ(j["groups"][g]["busiest_link_rows"], busiest[g]) << g;
  }
}

// A drawn routing is the shape's (the tokens per rank: --tokens, else --m;
// seeded as bench seeds it): --m T and --tokens T plan alike, and a forced
// partition of the common axis is evaluated, not searched.
TEST(PlanCli, AllToAllTokensAreTheShapesMAndPartitionsAreForced) {
  const std::string flags = "--op alltoall --json --world 4 --topk 3 --routing zipf:1.2 --n 4096 --k 2048";
  const Result by_m = run(flags + " --m 1500"), by_tokens = run(flags + " --m 4096 --tokens 1500");
  ASSERT_EQ(by_m.rc, 0) << by_m.err;
  EXPECT_EQ(by_m.out, by_tokens.out);
  const nlohmann::json j = nlohmann::json::parse(by_m.out);
  EXPECT_EQ(j["tokens"], 1500);
  EXPECT_EQ(j["topk"], 3);
  int64_t rows = 0;
  for (const auto& rank : j["ranks"]) rows += rank["rows"].get<int64_t>();
  EXPECT_EQ(rows, 4 * 1500 * 3);  // every token's K rows, somewhere
  EXPECT_NE(by_m.out, run(flags + " --m 1501").out);
  // Forced: 128x256 on 116 CTAs, the last wave its own group.
  const Result probe = run(flags + " --m 1500 --tile 128x256 --reserve-sms 16 --partition 1000");
  ASSERT_EQ(probe.rc, 2);
  const std::string at = "common wave axis has T = ";
  const size_t p = probe.err.find(at);
  ASSERT_NE(p, std::string::npos) << probe.err;
  const int T = std::stoi(probe.err.substr(p + at.size()));
  ASSERT_GE(T, 2);
  const std::string part = std::to_string(T - 1) + ",1";
  const Result forced = run(flags + " --m 1500 --tile 128x256 --reserve-sms 16 --partition " + part);
  ASSERT_EQ(forced.rc, 0) << forced.err;
  const nlohmann::json f = nlohmann::json::parse(forced.out);
  EXPECT_EQ(f["common"], nlohmann::json({T - 1, 1}));
  EXPECT_FALSE(f["sequential"]);
  EXPECT_EQ(f["ctas"], 116);
  EXPECT_EQ(f["tile"], "128x256");
  const Result text = run("--op alltoall --world 4 --topk 3 --routing zipf:1.2 --n 4096 --k 2048 --m 1500 "
                          "--tile 128x256 --reserve-sms 16 --partition " + part);
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("moe plan: waves " + part + " of " + std::to_string(T) + " (128x256, 116 CTAs)"),
            std::string::npos) << text.out;
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
      {"--op alltoall --routing empty:7", "bad MoE routing 'empty:7': the rank must be in [0, 2)"},
      {"--op alltoall --routing zipf", "unknown MoE routing 'zipf'"},
      {"--op alltoall --routing skewed", "unknown MoE routing 'skewed'"},  // (the retired planner's)
      {"--op alltoall --routing zipf:-1", "Zipf exponent"},
      {"--op alltoall --topk 3", "top-k 3 outside [1, world = 2]"},
      {"--op alltoall --world 2 --routing empty:1 --topk 2", "needs world > top-k"},
      {"--op alltoall --topk -1", "--topk: must be an integer >= 0"},
      {"--op alltoall --tokens -1", "--tokens: must be an integer >= 0"},
      // What a command with no GPU may take is bounded: every rank's routing on the host.
      {"--op alltoall --tokens 1073741824", "more than 16777216 rows in all (every rank's routing is made on the host)"},
      {"--op alltoall --m 1 --tokens 100000000", "100000000 tokens per rank x top-2 x 2 ranks: more than 16777216"},
      {"--m 2147483647 --n 8 --k 8", "too many slot rows for int32 slot indices"},
      // Integers are decimal digits, one message for every kind of bad one.
      {"--m 0x10", "--m: must be an integer >= 1, not 0x10"},
      {"--m 1e3", "--m: must be an integer >= 1, not 1e3"},
      {"--m abc", "--m: must be an integer >= 1, not abc"},
      {"--world 2.5", "--world: must be an integer in [1, 1024], not 2.5"},
      {"--partition ''", "--partition: must not be empty"},
      {"--op alltoall --routing file:" + dir.file("missing.json"), dir.file("missing.json")},
      {"--op alltoall --routing file:" + dir.file("missing.json") + " --topk 1", "the file gives the tokens and top-K"},
      {"--op alltoall --routing file:" + dir.write("w3.json", R"({"format": "flashoverlap.moe_routing", "schema": 1,
          "world": 3, "picks": [[[[1, 1.0]]], [], []]})"), "a routing of 3 ranks, the world is 2"},
      {"--op alltoall --tile 128x256 --partition 1,2,2", "partition 1,2,2 sums to 5 waves but the common wave axis has T = "},
      {"--op alltoall --sms 8", "--reserve-sms -1 means 8 for alltoall"},
      {"--op alltoall --reserve-sms 132", "reserved SMs 132"},
      {"--topk 2", "--routing, --topk, --tokens and --experts are for --op alltoall"},
      {"--op reducescatter --routing zipf:1", "--routing, --topk, --tokens and --experts are for --op alltoall"},
      {"--tokens 5", "--routing, --topk, --tokens and --experts are for --op alltoall"},
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
      {"lab-bench", "--band-swizzles 0", "--band-swizzles: a band is at least 1 tile row, not 0"},
      {"lab-bench", "--band-swizzles 4,x", "bad band swizzle list"},
      {"lab-bench", "--band-swizzles ''", "no band heights"},
      {"lab-bench", "--push-tma every", "--push-tma"},
      {"lab-bench", "--owner-pushers maybe", "--owner-pushers"},
      {"lab-bench", "--iters 0", "--iters: must be an integer >= 1, not 0"},
      {"lab-bench", "--m 0", "--m: must be an integer >= 1"},
      {"lab-bench", "--partition x", "--partition: bad partition 'x'"},
      {"lab-bench", "--partition ''", "--partition: must not be empty"},
      {"lab-bench", "--reserve-sms 9999", "--reserve-sms: must be an integer in [-1, 66], not 9999"},
      {"lab-bench", "--warmup -1", "--warmup: must be an integer >= 0"},
      {"lab-bench", "--wait-timeout 0", "--wait-timeout: must be a number > 0, not 0"},
      {"lab-bench", "--power -2", "--power: must be a number >= 0"},
      {"lab-bench", "--layout gathered", "the gathered and pushed layouts were retired"},
      {"lab-bench", "--shapes 1x2", "bad shape '1x2'"},
      {"lab-bench", "--dtype fp32", "--dtype"},
      {"lab-bench", "--tile 64x64", "--tile must be auto, 128x256 or 128x128, not 64x64"},
      {"lab-bench", "--layout diagonal", "--layout"},
      {"lab-bench", "--op gather", "lab-bench --op gather: must be allreduce, reducescatter or alltoall"},
      {"lab-bench", "--op alltoall --topk 2", "top-k 2 outside [1, world = 1]"},
      {"lab-bench", "--op alltoall --routing zipf", "unknown MoE routing 'zipf'"},
      {"lab-bench", "--op alltoall --shapes 100x1001x64", "N = 1001 must be a multiple of 8"},
      {"lab-bench", "--op alltoall --layout rows --with-rmsnorm", "--layout, --with-rmsnorm are not for the all-to-all"},
      {"lab-bench", "--op alltoall --tokens -1", "--tokens: must be an integer >= 0"},
      {"lab-bench", "--op alltoall --routing file:/nonexistent/r.json", "/nonexistent/r.json"},
      {"lab-bench", "--op alltoall --routing file:/nonexistent/r.json --topk 1", "the file gives the tokens and top-K"},
      {"lab-bench", "--topk 1", "--routing, --topk and --tokens are for --op alltoall"},
      {"lab-bench", "--rs-layout subtile", "--rs-layout is for --op reducescatter"},
      {"lab-bench", "--op reducescatter --rs-layout diagonal", "--rs-layout"},
      {"lab-bench", "--op reducescatter --layout rows --trace", "--layout, --trace are for --op allreduce only"},
      {"lab-bench", "--op reducescatter --decomposition 2,0", "chunk counts are at least 1, not 0"},
      {"lab-bench", "--op reducescatter --partition 1,x", "bad partition"},
      // bench: the public ops; its flags alone, checked before any GPU is looked for.
      {"bench", "--shapes 1x2", "bad shape '1x2'"},
      {"bench", "--shapes ''", "no shapes given"},
      {"bench", "--shapes 4096x8192x8192,,1x8x8", "bad shape ''"},
      {"bench", "--k 12", "bad shape 4096x8192x12: "},
      {"bench", "--op xyz", "bench --op xyz: must be allreduce, reducescatter or alltoall"},
      {"bench", "--iters 0", "--iters: must be an integer >= 1, not 0"},
      {"bench", "--turns 0", "--turns: must be an even integer >= 2, not 0"},
      {"bench", "--turns 5", "--turns: must be an even integer >= 2, not 5"},
      {"bench", "--warmup -1", "--warmup: must be an integer >= 0"},
      {"bench", "--m 0", "--m: must be an integer >= 1"},
      {"bench", "--nccl-sms 0", "--nccl-sms: must be an integer >= 1"},
      {"bench", "--dtype fp32", "bench --dtype fp32: must be bf16 or fp16"},
      {"bench", "--path owner", "bench --op allreduce --path owner: must be auto, sequential, row-bands, slots, nvlink"},
      {"bench", "--op reducescatter --path owners", "must be auto, sequential, slots, nvlink (GemmReduceScatterOptions"},
      {"bench", "--op alltoall --path row-bands", "must be auto, sequential, slots, nvlink (GemmAllToAllOptions"},
      {"bench", "--topk 1", "bench: --topk and --tokens are for --op alltoall"},
      {"bench", "--op reducescatter --tokens 5", "bench: --topk and --tokens are for --op alltoall"},
      {"bench", "--op alltoall --topk 2", "--topk 2 is outside [1, world = 1]"},
      {"bench", "--op alltoall --tokens -1", "--tokens: must be an integer >= 0"},
      {"bench", "--op alltoall --tuning-cache picks.json", "GemmAllToAllOptions has no tuning cache"},
      {"bench", "--op reducescatter --registered-output", "--registered-output is for --op allreduce"},
      // (the lab's flags are not bench's)
      {"bench", "--layout rows", "--layout"},
      {"bench", "--power 1", "--power"},
      {"bench-gemm", "--iters 0", "--iters: must be an integer >= 1"},
      {"tune", "--iters 0", "--iters: must be an integer >= 1"},
      {"tune", "--op allgather --curve x.json", "tune --op allgather: the AllReduce's curve is what the ops read"},
      {"tune", "--max-mib -1", "--max-mib: must be a number in [1, 65536], not -1"},
      {"tune", "--ctas -5", "--ctas: must be an integer in [0, 1024], not -5"},
  };
  for (const auto& [command, args, expect] : cases) {
    SCOPED_TRACE(command + " " + args);
    const Result r = run(args, command);
    EXPECT_EQ(r.rc, 2) << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    const bool lab = command == "lab-bench" || command == "bench-gemm";
    EXPECT_EQ(r.err.rfind(lab ? "flashoverlap-lab: error: " : "flashoverlap: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// lab-bench --op reducescatter (and bench's, the public op's) checks M against
// the world size of the job's environment (a process of a launched job: RANK
// and WORLD_SIZE set) before it looks for a GPU: one shape that the layout
// cannot split is an error.
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
  const std::tuple<std::string, int, std::string, std::string> cases[] = {
      {"lab-bench", 2, "--m 4095", "M = 4095 is not a multiple of the world size 2"},
      {"lab-bench", 4, "--m 4098 --rs-layout standard", "M = 4098 is not a multiple of the world size 4"},
      {"lab-bench", 3, "--rs-layout subtile", "the world size must divide 128"},
      {"lab-bench", 8, "--m 100 --rs-layout subtile", "M = 100 leaves rank 7 no rows"},
      {"bench", 2, "--m 4095", "M = 4095 is not a multiple of the world size 2"},
      {"bench", 4, "--shapes 4096x8192x8192,4098x8192x8192", "M = 4098 is not a multiple of the world size 4"},
  };
  for (const auto& [command, world, args, expect] : cases) {
    SCOPED_TRACE(command + ", " + std::to_string(world) + " ranks: " + args);
    const Env env(world);
    const Result r = run("--op reducescatter " + args, command);
    EXPECT_EQ(r.rc, 2) << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    const std::string name = command == "lab-bench" ? "flashoverlap-lab" : "flashoverlap";
    EXPECT_EQ(r.err.rfind(name + ": error: " + command + " --op reducescatter", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // The public op's top-K against the job's world.
  const Env env(4);
  const Result r = run("--op alltoall --topk 5", "bench");
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--topk 5 is outside [1, world = 4]"), std::string::npos) << r.err;
}

// Without a GPU (none visible, whatever the machine has): bench and lab-bench
// say so and exit 1 once their arguments are good; the main job says so,
// prints the plan and exits 0, naming the public op it runs on a GPU.
TEST(BenchCli, WithoutAGpuBenchSaysSoAndTheMainJobPrintsThePlan) {
  struct NoGpu {
    NoGpu() { setenv("CUDA_VISIBLE_DEVICES", "", 1); }
    ~NoGpu() { unsetenv("CUDA_VISIBLE_DEVICES"); }
  } no_gpu;
  for (const std::string command : {"bench", "lab-bench"}) {
    for (const std::string args : {"", "--op reducescatter --shapes 4096x8192x8192,1024x4096x4096", "--op alltoall"}) {
      SCOPED_TRACE(command + " " + args);
      const Result r = run(args, command);
      EXPECT_EQ(r.rc, 1) << r.out << r.err;
      EXPECT_EQ(r.err.rfind(command + ": no Hopper (sm_90) GPU found on this machine (", 0), 0u) << r.err;
      EXPECT_EQ(lines(r.err), 1u) << r.err;
      EXPECT_TRUE(r.out.empty()) << r.out;
    }
  }
  const Result main_job = run("", "");
  EXPECT_EQ(main_job.rc, 0) << main_job.err;
  for (const char* part : {"No Hopper (sm_90) GPU on this machine", "flashoverlap::GemmAllReduce", "cuBLAS + NCCL",
                           "predicted: ", "`flashoverlap-lab lab-bench`"})
    EXPECT_NE(main_job.out.find(part), std::string::npos) << part << " missing in:\n" << main_job.out;
}

// bench's help: the public ops' flags, not the lab's; lab-bench's says what it is.
TEST(BenchCli, HelpTellsBenchFromLabBench) {
  const Result bench = run("--help", "bench");
  EXPECT_EQ(bench.rc, 0) << bench.err;
  for (const char* opt : {"--op", "--m", "--shapes", "--dtype", "--path", "--nccl-sms", "--tokens", "--topk",
                          "--warmup", "--iters", "--turns", "--csv", "--json", "--nproc", "--tuning-cache",
                          "--registered-output", "GemmAllReduce", "lab-bench"})
    EXPECT_NE(bench.out.find(opt), std::string::npos) << opt << " missing in:\n" << bench.out;
  for (const char* opt : {"--layout", "--power", "--partition", "--push-by", "--routing"})
    EXPECT_EQ(bench.out.find(opt), std::string::npos) << opt << " in:\n" << bench.out;
  const Result lab = run("--help", "lab-bench");
  EXPECT_EQ(lab.rc, 0) << lab.err;
  for (const char* part : {"lab: the internal variants and the measured tuner, for experiments; not the public ops",
                           "--layout", "--power", "--tuning-cache", "--registered-output", "--routing"})
    EXPECT_NE(lab.out.find(part), std::string::npos) << part << " missing in:\n" << lab.out;
  const Result top = run("--help", "");
  EXPECT_EQ(top.rc, 0) << top.err;
  for (const char* part : {"bench", "plan", "tune", "launch", "GemmAllReduce"})
    EXPECT_NE(top.out.find(part), std::string::npos) << part << " missing in:\n" << top.out;
  // The installed tool has no lab commands; flashoverlap-lab has them.
  for (const char* part : {"lab-bench", "bench-gemm"})
    EXPECT_EQ(top.out.find(part), std::string::npos) << part << " in:\n" << top.out;
  for (const char* command : {"lab-bench", "bench-gemm"}) {
    const Result gone = run("", command, FO_CLI_PATH);
    EXPECT_EQ(gone.rc, 2) << gone.err;
    EXPECT_NE(gone.err.find("flashoverlap: error: "), std::string::npos) << gone.err;
  }
}

// plan --op allreduce (reducescatter) prints what GemmAllReduce
// (GemmReduceScatter) runs for the same inputs: flashoverlap::plan_gemm_allreduce
// (plan_gemm_reducescatter), the op's own planning code on the model's
// stand-ins for what it measures when built (text and JSON alike).
TEST(PlanCli, PrintsThePlanTheOpRuns) {
  using flashoverlap::DType;
  struct Case {
    int64_t m, n, k;
    int world, reserve;
  };
  // (the ReduceScatter's: rank 0, the standard layout)
  for (const std::string op : {"allreduce", "reducescatter"}) {
    for (const Case& c : {Case{4096, 8192, 8192, 2, -1}, Case{32, 8192, 8192, 1, -1},
                          Case{8192, 5120, 13824, 8, 16}, Case{300, 4096, 4096, 4, -1}}) {
      const std::string args = "--op " + op + " --m " + std::to_string(c.m) + " --n " + std::to_string(c.n) +
                               " --k " + std::to_string(c.k) + " --world " + std::to_string(c.world) +
                               (c.reserve > 0 ? " --reserve-sms " + std::to_string(c.reserve) : "");
      SCOPED_TRACE(args);
      flashoverlap::GemmAllReduceOptions ar;
      flashoverlap::GemmReduceScatterOptions rs;
      if (c.reserve > 0) ar.nccl_sms = rs.nccl_sms = c.reserve;
      const std::string expect = op == "allreduce"
                                     ? flashoverlap::plan_gemm_allreduce(c.m, c.n, c.k, c.world, DType::BF16, ar)
                                     : flashoverlap::plan_gemm_reducescatter(c.m, c.n, c.k, c.world, DType::BF16, rs);
      const Result text = run(args);
      ASSERT_EQ(text.rc, 0) << text.err;
      EXPECT_NE(text.out.find(") runs: " + expect + "\n"), std::string::npos) << text.out;
      const Result json = run(args + " --json");
      ASSERT_EQ(json.rc, 0) << json.err;
      EXPECT_EQ(nlohmann::json::parse(json.out).at("op_plan").get<std::string>(), expect);
      // One rank has nothing to overlap: the sequential path, whatever the shape.
      if (c.world == 1)
        EXPECT_EQ(expect.rfind(op == "allreduce" ? "sequential: " : "sequential, standard layout", 0), 0u) << expect;
    }
  }
  {  // where the AllReduce costs a quarter of the time, the op overlaps
    const std::string big = flashoverlap::plan_gemm_allreduce(4096, 8192, 8192, 2, DType::BF16);
    EXPECT_EQ(big.rfind("sequential", 0), std::string::npos) << big;
  }
  // A path forced where the shape has several bands overlaps; the inputs are checked.
  flashoverlap::GemmAllReduceOptions bands;
  bands.path = flashoverlap::GemmAllReduceOptions::Path::RowBands;
  const std::string forced = flashoverlap::plan_gemm_allreduce(8192, 8192, 8192, 2, DType::BF16, bands);
  EXPECT_NE(forced.find("row bands"), std::string::npos) << forced;
  EXPECT_NE(forced.find("(path row bands"), std::string::npos) << forced;
  flashoverlap::GemmReduceScatterOptions subtile;
  subtile.layout = flashoverlap::GemmReduceScatterOptions::Layout::SubTile;
  for (int rank = 0; rank < 2; ++rank) {  // (a sub-tile plan names its layout on every rank)
    const std::string sub = flashoverlap::plan_gemm_reducescatter(200, 4096, 4096, 2, DType::BF16, subtile, 132,
                                                                  "NVIDIA H200", rank);
    EXPECT_NE(sub.find("sub"), std::string::npos) << sub;
  }
  EXPECT_THROW(flashoverlap::plan_gemm_reducescatter(4095, 8192, 8192, 2, DType::BF16),
               flashoverlap::InvalidArgument);  // (the standard layout: m a multiple of the world size)
  EXPECT_THROW(flashoverlap::plan_gemm_reducescatter(4096, 8192, 8192, 2, DType::BF16, {}, 132, "NVIDIA H200", 2),
               flashoverlap::InvalidArgument);
  EXPECT_THROW(flashoverlap::plan_gemm_allreduce(0, 8192, 8192, 2, DType::BF16), flashoverlap::InvalidArgument);
  EXPECT_THROW(flashoverlap::plan_gemm_allreduce(64, 8192, 8191, 2, DType::BF16), flashoverlap::InvalidArgument);
  flashoverlap::GemmAllReduceOptions owners;
  owners.path = flashoverlap::GemmAllReduceOptions::Path::NVLink;
  EXPECT_THROW(flashoverlap::plan_gemm_allreduce(64, 8192, 8192, 1, DType::BF16, owners), flashoverlap::InvalidArgument);
}

// The FP8 sequential GEMM's tile, from the model's wave times: 128x160
// where its tiles fill one wave that 128x192's leave part idle (m 2048,
// n 1280: 128 tiles against 112 on 132 SMs), 128x192 where both run many
// waves (16384 x 8192), 128x112 where all take one wave (m 256, n 7168: 128
// tiles against 128x128's 112; one tile row of a narrow n), 128x128 where
// 128x112's tiles take a second wave (m 256, n 8192: 148 against 128).
TEST(PlanGemmFp8, SequentialTileIsTheFastestOfTheFive) {
  using Opts = flashoverlap::GemmReduceScatterOptions;
  Opts o;
  o.input = flashoverlap::InputType::E4M3;
  o.path = Opts::Path::Sequential;
  auto tile_of = [&](int64_t m, int64_t n, int64_t k) {
    const std::string plan = flashoverlap::plan_gemm_reducescatter(m, n, k, 1, flashoverlap::DType::BF16, o);
    const size_t at = plan.find(" tiles, ");
    return at == std::string::npos ? plan : plan.substr(plan.rfind('(', at) + 1, at - plan.rfind('(', at) - 1);
  };
  EXPECT_EQ(tile_of(2048, 1280, 8192), "128x160");
  EXPECT_EQ(tile_of(16384, 8192, 7392), "128x192");
  EXPECT_EQ(tile_of(256, 7168, 2304), "128x112");
  EXPECT_EQ(tile_of(128, 1024, 4096), "128x112");
  EXPECT_EQ(tile_of(256, 8192, 3584), "128x128");
}

// FP8 inputs (the options' input E4M3): every AllReduce and ReduceScatter plan on
// the FP8 GEMM's tiles (128x192, 128x160, 128x144, 128x128, 128x112; never 128x256), the ReduceScatter's
// NVLink form on 128x128 (its scatter epilogue's), on every path the inputs
// take; the misuses refused, saying why.
TEST(PlanGemmFp8, AllReduceAndReduceScatterPlanOnFp8TilesAndMisusesAreRefused) {
  using flashoverlap::DType;
  using Opts = flashoverlap::GemmAllReduceOptions;
  FO_SEEDED_RNG(rng);
  int overlapped = 0, wide = 0;
  for (int trial = 0; trial < 40; ++trial) {
    Opts o;
    o.input = flashoverlap::InputType::E4M3;
    o.scales = std::array{flashoverlap::ScaleKind::None, flashoverlap::ScaleKind::PerTensor,
                          flashoverlap::ScaleKind::RowWise}[trial % 3];
    o.path = std::array{Opts::Path::Auto, Opts::Path::RowBands, Opts::Path::Slots, Opts::Path::Sequential}[trial % 4];
    const int64_t m = 1 + int64_t(rng() % 16384), n = 1024 * (1 + int64_t(rng() % 16)),
                  k = 16 * (1 + int64_t(rng() % 1024));
    const int world = std::array{1, 2, 4, 8}[rng() % 4];
    const std::string plan = flashoverlap::plan_gemm_allreduce(m, n, k, world, DType::BF16, o);
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " on " +
                 std::to_string(world) + ": " + plan);
    if (plan.rfind("sequential", 0) == 0) continue;
    ++overlapped;
    wide += plan.find("128x192") != std::string::npos;
    EXPECT_TRUE(plan.find("128x128") != std::string::npos || plan.find("128x160") != std::string::npos ||
                plan.find("128x192") != std::string::npos || plan.find("128x112") != std::string::npos ||
                plan.find("128x144") != std::string::npos);
    EXPECT_EQ(plan.find("128x256"), std::string::npos);
  }
  EXPECT_GT(overlapped, 5);
  EXPECT_GT(wide, 0);
  // The ReduceScatter's FP8 plans alike (every path, both layouts).
  int rs_overlapped = 0;
  for (int trial = 0; trial < 40; ++trial) {
    using RsOpts = flashoverlap::GemmReduceScatterOptions;
    RsOpts o;
    o.input = flashoverlap::InputType::E4M3;
    o.scales = flashoverlap::ScaleKind::RowWise;
    o.path = std::array{RsOpts::Path::Auto, RsOpts::Path::Slots, RsOpts::Path::Sequential, RsOpts::Path::NVLink}[trial % 4];
    const int world = std::array{1, 2, 4, 8}[rng() % 4];
    const int64_t m = world * (1 + int64_t(rng() % (16384 / world))), n = 1024 * (1 + int64_t(rng() % 8)),
                  k = 16 * (1 + int64_t(rng() % 1024));
    const std::string plan = flashoverlap::plan_gemm_reducescatter(m, n, k, world, DType::BF16, o);
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " on " +
                 std::to_string(world) + ": " + plan);
    EXPECT_EQ(plan.find("128x256"), std::string::npos);
    if (o.path == RsOpts::Path::NVLink)
      EXPECT_TRUE(plan.find("128x192") == std::string::npos && plan.find("128x160") == std::string::npos &&
                  plan.find("128x112") == std::string::npos && plan.find("128x144") == std::string::npos);
    rs_overlapped += plan.find("128x128") != std::string::npos || plan.find("128x160") != std::string::npos ||
                     plan.find("128x192") != std::string::npos || plan.find("128x112") != std::string::npos ||
                     plan.find("128x144") != std::string::npos;
  }
  EXPECT_GT(rs_overlapped, 5);
  auto refused = [&](int64_t k, const Opts& o, const std::string& what) {
    try {
      flashoverlap::plan_gemm_allreduce(4096, 8192, k, 2, DType::BF16, o);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const flashoverlap::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Opts fp8;
  fp8.input = flashoverlap::InputType::E4M3;
  refused(8200, fp8, "k % 16 == 0");
  Opts nv = fp8;
  nv.path = Opts::Path::NVLink;
  refused(8192, nv, "not on the NVLink path yet");
  Opts scaled_16bit;
  scaled_16bit.scales = flashoverlap::ScaleKind::RowWise;
  refused(8192, scaled_16bit, "scales are for FP8 inputs");
}

// The All-to-All's line: fresh random picks written as a routing file, which
// the CLI reads; the expected text from the public planning call on the
// ranks' routings built here from the same picks, as a dispatch delivers
// the rows (rank e's rows: by source rank, then token, then pick).
TEST(PlanCli, PrintsTheAllToAllPlanTheOpRuns) {
  using flashoverlap::AllToAllRouting;
  FO_SEEDED_RNG(rng);
  fo_test::TempDir dir;
  for (int round = 0; round < 6; ++round) {
    const int world = std::array{1, 2, 4, 8}[rng() % 4];
    const int topk = 1 + int(rng() % std::min(2, world));
    const int64_t tokens = 1 + int64_t(rng() % 3000), n = 1024 * (1 + int64_t(rng() % 7)), k = 8 * (64 + rng() % 1000);
    struct Row {
      int32_t rank, token;
      float gate;
    };
    std::vector<std::vector<Row>> rows(static_cast<size_t>(world));  // by expert rank
    nlohmann::json picks = nlohmann::json::array();
    for (int src = 0; src < world; ++src) {
      nlohmann::json mine = nlohmann::json::array();
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<int> ranks(static_cast<size_t>(world));
        std::iota(ranks.begin(), ranks.end(), 0);
        std::shuffle(ranks.begin(), ranks.end(), rng);
        nlohmann::json token = nlohmann::json::array();
        for (int j = 0; j < topk; ++j) {
          const float gate = float(rng() % 1000) / 1000.f;
          token.push_back(nlohmann::json::array({ranks[size_t(j)], gate}));
          rows[size_t(ranks[size_t(j)])].push_back({src, int32_t(t), gate});
        }
        mine.push_back(token);
      }
      picks.push_back(mine);
    }
    const std::string file = dir.file("routing" + std::to_string(round) + ".json");
    std::ofstream(file) << nlohmann::json{{"format", "flashoverlap.moe_routing"}, {"schema", 1}, {"world", world},
                                          {"picks", picks}}.dump();
    // rank e's rows sorted by source (stable: token, pick order kept).
    std::vector<std::vector<int32_t>> dest(static_cast<size_t>(world)), token(static_cast<size_t>(world));
    std::vector<std::vector<float>> gate(static_cast<size_t>(world));
    std::vector<int64_t> send(static_cast<size_t>(world * world), 0), recv(static_cast<size_t>(world * world), 0);
    std::vector<AllToAllRouting> routings(static_cast<size_t>(world));
    for (int e = 0; e < world; ++e) {
      std::stable_sort(rows[size_t(e)].begin(), rows[size_t(e)].end(),
                       [](const Row& a, const Row& b) { return a.rank < b.rank; });
      for (const Row& r : rows[size_t(e)]) {
        dest[size_t(e)].push_back(r.rank), token[size_t(e)].push_back(r.token), gate[size_t(e)].push_back(r.gate);
        ++send[size_t(e * world + r.rank)], ++recv[size_t(r.rank * world + e)];
      }
    }
    for (int e = 0; e < world; ++e) {
      AllToAllRouting& x = routings[size_t(e)];
      x.rows = int64_t(dest[size_t(e)].size()), x.tokens = tokens;
      x.dest_rank = dest[size_t(e)].data(), x.dest_token = token[size_t(e)].data(), x.gate = gate[size_t(e)].data();
      x.send_counts = send.data() + e * world, x.recv_counts = recv.data() + e * world;
    }
    const int reserve = rng() % 2 ? 16 : -1;
    const std::string args = "--op alltoall --m " + std::to_string(tokens) + " --n " + std::to_string(n) + " --k " +
                             std::to_string(k) + " --world " + std::to_string(world) + " --routing file:" + file +
                             (reserve > 0 ? " --reserve-sms 16" : "");
    SCOPED_TRACE(args);
    flashoverlap::GemmAllToAllOptions options;
    if (reserve > 0) options.nccl_sms = reserve;
    const std::string expect = flashoverlap::plan_gemm_alltoall(routings, n, k, flashoverlap::DType::BF16, options);
    const Result text = run(args);
    ASSERT_EQ(text.rc, 0) << text.err;
    EXPECT_NE(text.out.find("GemmAllToAll (rank 0, path auto, NCCL on " + std::to_string(options.nccl_sms) +
                            " SMs) runs: " + expect + "\n"),
              std::string::npos)
        << text.out;
    const Result json = run(args + " --json");
    ASSERT_EQ(json.rc, 0) << json.err;
    EXPECT_EQ(nlohmann::json::parse(json.out).at("op_plan").get<std::string>(), expect);
    // Sequential on the model's GEMM (ours), or slots; one rank has nothing to overlap.
    const bool sequential = expect.rfind("sequential", 0) == 0;
    EXPECT_TRUE(sequential ? expect.ends_with("; our GEMM") : expect.rfind("slots: waves ", 0) == 0) << expect;
    if (world == 1) EXPECT_TRUE(sequential) << expect;
    // A routing that does not add up is refused as the op refuses it, naming the rank.
    if (world > 1) {
      std::vector<int64_t> bad = recv;
      ++bad[1];  // rank 0 claims one more row from rank 1 than rank 1 sends it
      std::vector<AllToAllRouting> off = routings;
      off[0].recv_counts = bad.data();
      try {
        flashoverlap::plan_gemm_alltoall(off, n, k, flashoverlap::DType::BF16);
        ADD_FAILURE() << "a recv count off by one was accepted";
      } catch (const flashoverlap::InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("rank 0's recv_counts[1]"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_THROW(flashoverlap::plan_gemm_alltoall({}, 4096, 4096, flashoverlap::DType::BF16),
               flashoverlap::InvalidArgument);  // (no rank)
}

// The planning call with several experts per rank: their rows by (source,
// expert), each source's counts given; at world 1 with every row on one
// expert the grouped GEMM's tile rows are the plain ones, so the plan is one
// expert's; what does not add up is refused naming the rank.
TEST(PlanGemmAllToAll, SeveralExpertsPlanTheGroupedRowsAndRefuseCountsThatDoNotAddUp) {
  using flashoverlap::AllToAllRouting;
  FO_SEEDED_RNG(rng);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t rows = 1 + int64_t(rng() % 3000), n = 4096, k = 2048;
    const int E = 2 + int(rng() % 6);
    std::vector<int32_t> dest(size_t(rows), 0), token(static_cast<size_t>(rows));
    std::vector<float> gate(size_t(rows), 0.5f);
    for (int64_t i = 0; i < rows; ++i) token[size_t(i)] = int32_t(i);
    std::vector<int64_t> send{rows}, recv{rows}, counts(size_t(E), 0);
    const int on = int(rng() % uint64_t(E));
    counts[size_t(on)] = rows;
    AllToAllRouting r;
    r.rows = rows, r.tokens = rows, r.dest_rank = dest.data(), r.dest_token = token.data(), r.gate = gate.data();
    r.send_counts = send.data(), r.recv_counts = recv.data();
    const std::string one = flashoverlap::plan_gemm_alltoall({r}, n, k, flashoverlap::DType::BF16);
    flashoverlap::GemmAllToAllOptions o;
    o.experts = E;
    AllToAllRouting g = r;
    g.expert_counts = counts.data();
    EXPECT_EQ(flashoverlap::plan_gemm_alltoall({g}, n, k, flashoverlap::DType::BF16, o), one) << "E " << E;
    auto refused = [&](const AllToAllRouting& x, const flashoverlap::GemmAllToAllOptions& opts, const std::string& what) {
      try {
        flashoverlap::plan_gemm_alltoall({x}, n, k, flashoverlap::DType::BF16, opts);
        ADD_FAILURE() << "accepted: " << what;
      } catch (const flashoverlap::InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
    };
    refused(r, o, "expert_counts must not be null");
    refused(g, {}, "expert_counts is for several experts per rank");
    std::vector<int64_t> short_counts = counts;
    short_counts[size_t(on)] -= 1;  // (one row of the source's block in no expert)
    g.expert_counts = short_counts.data();
    refused(g, o, "rank 0");
    g.expert_counts = counts.data();
    // The NVLink form takes several experts too: every row in one expert plans as one expert's rows.
    flashoverlap::GemmAllToAllOptions nv = o, nv_one;
    nv.path = nv_one.path = flashoverlap::GemmAllToAllOptions::Path::NVLink;
    EXPECT_EQ(flashoverlap::plan_gemm_alltoall({g}, n, k, flashoverlap::DType::BF16, nv),
              flashoverlap::plan_gemm_alltoall({r}, n, k, flashoverlap::DType::BF16, nv_one))
        << "E " << E;
  }
}

// --experts: the routing drawn with E experts per rank (topk of world x E),
// the op's plan GemmAllToAll's with experts = E; refused for the other ops.
TEST(PlanCli, AllToAllWithSeveralExpertsPerRank) {
  const Result r = run("--op alltoall --m 300 --n 1024 --k 256 --world 2 --experts 3 --topk 4 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("experts").get<int>(), 3);
  EXPECT_EQ(j.at("topk").get<int>(), 4);
  EXPECT_TRUE(j.at("op_plan").get<std::string>().ends_with("; our GEMM")) << j.at("op_plan");
  const Result text = run("--op alltoall --m 300 --n 1024 --k 256 --world 2 --experts 3 --topk 4");
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("top-4 by routing uniform, 3 experts per rank"), std::string::npos) << text.out;
  const Result many = run("--op alltoall --m 300 --n 1024 --k 256 --world 2 --experts 3 --topk 7");
  EXPECT_EQ(many.rc, 2);
  const Result other = run("--op allreduce --experts 2");
  EXPECT_EQ(other.rc, 2);
  EXPECT_NE(other.err.find("--experts are for --op alltoall"), std::string::npos) << other.err;
}

TEST(PlanCli, HasItsOwnHelp) {
  const Result r = run("--help");
  EXPECT_EQ(r.rc, 0);
  for (const char* opt : {"--op", "--m", "--world", "--tile", "--reserve-sms", "--curve", "--partition", "--routing",
                          "--topk", "--tokens", "--experts", "--json"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
}

// plan, bench and lab-bench check shapes with one rule (check_gemm_shape,
// cli_parse.h): plan shows no plan for a shape the benches refuse, and says so
// in their words. They check shapes before they look for a GPU, so this runs
// on any machine (and every bench case here is refused: none starts a benchmark).
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
    const Result bench = run(shape, "bench"), lab = run(shape, "lab-bench");
    EXPECT_EQ(plan.rc, 2) << plan.out << plan.err;
    EXPECT_EQ(bench.rc, 2) << bench.out << bench.err;
    EXPECT_EQ(lab.rc, 2) << lab.out << lab.err;
    EXPECT_EQ(as_lab(plan.err), lab.err);
    EXPECT_EQ(lines(plan.err), 1u) << plan.err;
    EXPECT_EQ(plan.err.rfind("flashoverlap: error: bad shape " + name + ": ", 0), 0u) << plan.err;
    EXPECT_NE(plan.err.find("multiple of 8"), std::string::npos) << plan.err;
    EXPECT_EQ(plan.err, bench.err);
    EXPECT_TRUE(plan.out.empty()) << plan.out;
  }
  // The same rule through the benches' --shapes.
  for (const char* command : {"bench", "lab-bench"}) {
    const Result shapes = run("--shapes 1024x8192x8192,4096x8192x8191", command);
    EXPECT_EQ(shapes.rc, 2) << shapes.err;
    const std::string plan_err = run("--m 4096 --n 8192 --k 8191").err;
    EXPECT_EQ(shapes.err, std::string(command) == "lab-bench" ? as_lab(plan_err) : plan_err);
  }
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
      {curve("2", "[[1000, 1], [1e9, 1e308]]"), "not a measured collective"},  // (the search's sums overflow on it)
      {curve("2", "[[1000, 1], [2000, 1e100]]"), "not a measured collective"},
      {curve("2", "[[1e300, 1], [2e300, 2]]"), "not a measured collective"},
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
  for (const char* op : {"reducescatter", "alltoall"}) {  // (every collective's planner gets the curve refused)
    const Result r = run(std::string("--op ") + op + " --curve " + dir.write("big.json", curve("2", "[[1000, 1], [1e9, 1e308]]")));
    EXPECT_EQ(r.rc, 2) << op << ": " << r.err;
    EXPECT_NE(r.err.find("not a measured collective"), std::string::npos) << op << ": " << r.err;
  }
  const Result d = run("--curve " + dir.path.string());  // a directory reads as nothing: say what it is
  EXPECT_EQ(d.rc, 2) << d.err;
  EXPECT_EQ(d.err, "flashoverlap: error: bandwidth curve " + dir.path.string() + ": is a directory\n");
}
