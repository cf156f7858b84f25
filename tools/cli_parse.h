// cli_parse.h — option values shared by the benchmark commands.
#pragma once
#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "flashoverlap/error.h"

namespace flashoverlap::cli {

// "a,b,c" -> {"a", "b", "c"} (as std::getline splits: "" -> {}, "a,," -> {"a", ""}).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// "4096x8192x8192,1024x8192x8192" -> {{4096, 8192, 8192}, ...}; M, N, K >= 1.
inline std::vector<std::array<int64_t, 3>> parse_shapes(const std::string& s) {
  std::vector<std::array<int64_t, 3>> out;
  for (const std::string& item : split_list(s)) {
    std::array<int64_t, 3> sh{};
    char x1 = 0, x2 = 0;
    std::stringstream is(item);
    if (!(is >> sh[0] >> x1 >> sh[1] >> x2 >> sh[2]) || x1 != 'x' || x2 != 'x' || sh[0] < 1 || sh[1] < 1 || sh[2] < 1)
      throw InvalidArgument("bad shape '" + item + "' (expected MxNxK, e.g. 4096x8192x8192)");
    out.push_back(sh);
  }
  if (out.empty()) throw InvalidArgument("no shapes given");
  return out;
}

// "0,8,16" -> {0, 8, 16}; `what` names the option in the error.
inline std::vector<int> parse_ints(const std::string& s, const char* what) {
  std::vector<int> out;
  for (const std::string& item : split_list(s)) {
    try {
      out.push_back(std::stoi(item));
    } catch (...) {
      throw InvalidArgument(std::string("bad ") + what + " list '" + s + "'");
    }
  }
  return out;
}

}  // namespace flashoverlap::cli
