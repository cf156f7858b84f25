// flashoverlap/error.h — the one exception type the library throws.
// Host-only, no CUDA headers: the planner uses it too.
#pragma once
#include <stdexcept>
#include <string>

namespace flashoverlap {

// Every failure carries its context in the message (shape, rank, group,
// CUDA/NCCL error string). The library never calls exit().
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown for input the caller can fix (bad shape, bad partition, bad file).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what) {}
};

}  // namespace flashoverlap
