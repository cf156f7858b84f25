// The planner's JSON reader (plan/json_file.h): whatever is wrong with a file
// comes out as InvalidArgument naming the file and the problem, never as one
// of nlohmann's exceptions (which the CLI would report raw, as a failure), so
// that the picks file (runtime/tune/picks.h), which must never stop a run,
// reads such a file as empty (tests/cpu/test_rt_picks.cpp).
#include <gtest/gtest.h>

#include <string>

#include "flashoverlap/error.h"
#include "plan/json_file.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using flashoverlap::InvalidArgument;

namespace {

// The message of read_json_file's InvalidArgument ("" if it threw nothing;
// anything else thrown fails the test).
std::string read_error(const std::string& path) {
  try {
    fo::read_json_file(path, "thing");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PlanJsonFile, EveryProblemIsAnInvalidArgumentNamingTheFile) {
  fo_test::TempDir dir;
  const std::pair<std::string, std::string> cases[] = {
      {"[1e999]", "number overflow parsing '1e999'"},  // nlohmann: out_of_range, not parse_error
      {"{\"a\": -1e400}", "number overflow parsing '-1e400'"},
      {"{\"a\": NaN}", "not valid JSON (byte "},
      {"{\"a\": 1", "not valid JSON (byte "},
      {"", "empty file"},
      {"\n \r\n", "empty file"},
  };
  int n = 0;
  for (const auto& [text, problem] : cases) {
    SCOPED_TRACE(text);
    const std::string path = dir.write("f" + std::to_string(n++) + ".json", text);
    EXPECT_EQ(read_error(path).rfind("thing " + path + ": " + problem, 0), 0u) << read_error(path);
  }
  EXPECT_EQ(read_error(dir.path.string()), "thing " + dir.path.string() + ": is a directory");
  EXPECT_NE(read_error(dir.file("missing.json")).find("cannot open"), std::string::npos);
  EXPECT_EQ(fo::read_json_file(dir.write("ok.json", "{\"a\": [1e308, -2]}"), "thing")["a"][0].get<double>(), 1e308);
}

