#include "plan/collective.h"

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

std::string_view to_string(Collective op) {
  switch (op) {
    case Collective::AllReduce: return "allreduce";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::AllToAll: return "alltoall";
    case Collective::AllGather: return "allgather";
  }
  return "unknown";
}

std::string_view to_string(DType t) { return t == DType::FP16 ? "fp16" : "bf16"; }

Collective parse_collective(std::string_view s) {
  for (Collective op : {Collective::AllReduce, Collective::ReduceScatter, Collective::AllToAll, Collective::AllGather})
    if (s == to_string(op)) return op;
  throw InvalidArgument("unknown collective '" + std::string(s) +
                        "' (expected allreduce, reducescatter, alltoall or allgather)");
}

DType parse_dtype(std::string_view s) {
  if (s == "bf16") return DType::BF16;
  if (s == "fp16") return DType::FP16;
  throw InvalidArgument("unknown dtype '" + std::string(s) + "' (expected bf16 or fp16)");
}

}  // namespace flashoverlap::plan
