// preload.cu — loads every kernel of the library into the current context.
#include "kernels/alltoall_tables.h"
#include "kernels/combine_tables.h"
#include "kernels/flags.h"
#include "kernels/gemm.h"
#include "kernels/grouped_tables.h"
#include "kernels/reorder.h"

namespace flashoverlap::kernels {

void preload_gemm_kernels();  // gemm_sm90.cu

void preload_kernels() {
  preload_gemm_kernels();
  preload_flag_kernels();
  preload_reorder_kernels();
  preload_alltoall_table_kernels();
  preload_combine_table_kernels();
  preload_grouped_table_kernels();
}

}  // namespace flashoverlap::kernels
