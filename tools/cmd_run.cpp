// The main job (`flashoverlap` without a subcommand): `bench`'s defaults on
// all local GPUs (flashoverlap::GemmAllReduce 4096x8192x8192 bf16 against
// cuBLAS + NCCL); on a machine without a GPU, the model's plan for the shape.
#include <iostream>

#include "commands.h"
#include "flashoverlap/flashoverlap.h"

namespace flashoverlap::cli {

int run_default_job(std::ostream& out) {
  const LocalGpus gpus = local_gpus();
  if (gpus.hopper > 0) return run_default_ops_bench();
  out << "No Hopper (sm_90) GPU on this machine (" << gpus.reason << ").\n";
  out << "Nothing can run, so here is the plan FlashOverlap would\n"
         "use for its default job (GEMM 4096x8192x8192 bf16 + AllReduce on 2 H200s), from the built-in\n"
         "H200 model. On a GPU machine the same command builds flashoverlap::GemmAllReduce and times it\n"
         "against cuBLAS + NCCL (`flashoverlap bench`).\n\n";
  const int rc = print_plan(PlanOptions{}, out);
  out << "\nAbove: the slot layout's plan from the host model, then the plan GemmAllReduce runs: its Auto\n"
         "path plans row bands, slots and the sequential path by the same latency model (on a GPU, from its\n"
         "GEMM's times measured when built), or takes the tuning cache's pick; its Owners path runs only\n"
         "when asked for (`bench --path owners`). The measured tuner is `flashoverlap-lab lab-bench`'s.\n";
  // A GPU machine whose CUDA does not start is a failure, not a CPU machine.
  return gpus.cuda_failed ? 1 : rc;
}

}  // namespace flashoverlap::cli
