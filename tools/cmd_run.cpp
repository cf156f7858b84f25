// The main job (`flashoverlap` without a subcommand): the default benchmark on
// all local GPUs; on a machine without a GPU, the plan for the same shape.
#include <iostream>

#include "commands.h"
#include "runtime/core/buffer.h"

namespace flashoverlap::cli {

int run_default_job(std::ostream& out) {
  const rt::GpuProbe gpus = rt::probe_gpus();
  if (gpus.hopper > 0) return run_default_bench();
  out << "No Hopper (sm_90) GPU on this machine (" << gpus.reason << ").\n";
  out << "Nothing can run, so here is the plan FlashOverlap would\n"
         "use for its default job (GEMM 4096x8192x8192 bf16 + AllReduce on 2 H200s), from the built-in\n"
         "H200 model. On a GPU machine the same command runs it and the baselines.\n\n";
  const int rc = print_plan(PlanOptions{}, out);
  out << "\nThis is the paper's slot layout (host model only). On the GPU machine the tuner also predicts\n"
         "the row-band, copy-engine (gathered) and NVLink (pushed) layouts and measures the best of each;\n"
         "for this shape on 2 H200s it picked pushed row bands (bench/results/allreduce-h200x2.csv).\n";
  // A GPU machine whose CUDA does not start is a failure, not a CPU machine.
  return gpus.cuda_failed ? 1 : rc;
}

}  // namespace flashoverlap::cli
