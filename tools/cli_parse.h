// cli_parse.h — option values shared by the benchmark commands and `plan`.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
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

// The GEMM shapes the kernel runs, checked alike by `plan`, `bench` and `lab-bench` so
// that plan never shows a plan for a shape they refuse: M, N, K are int32 in the
// kernel's parameters, and K % 8 == 0 because TMA loads the rows of A and B
// (K elements of 2 bytes) with 16-byte strides. Throws InvalidArgument.
inline void check_gemm_shape(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const auto in_range = [](int64_t v) { return v >= 1 && v <= kMax; };
  if (!in_range(m) || !in_range(n) || !in_range(k) || k % 8 != 0)
    throw InvalidArgument("bad shape " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                          ": M, N, K in [1, 2^31-1] and K a multiple of 8 (16-byte rows of A and B for TMA)");
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
