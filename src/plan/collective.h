// collective.h — names of the collectives and element types the planner knows.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace flashoverlap::plan {

// AllGather is not planned on its own (the ReduceScatter's sub-tile chain
// ends with one, after the op); a curve may still be tagged with it.
enum class Collective : int32_t { AllReduce = 0, ReduceScatter = 1, AllToAll = 2, AllGather = 3 };

// Element types of C. Both are 2 bytes; the type matters for the cache key and
// for the kernels, not for the slot maps (which count elements).
enum class DType : int32_t { BF16 = 0, FP16 = 1 };

// "allreduce" | "reducescatter" | "alltoall" | "allgather" (the CLI spelling).
std::string_view to_string(Collective op);
std::string_view to_string(DType t);
// Accepts the CLI spelling; throws InvalidArgument naming the accepted values.
Collective parse_collective(std::string_view s);
DType parse_dtype(std::string_view s);

inline constexpr int64_t element_bytes(DType) { return 2; }

}  // namespace flashoverlap::plan
