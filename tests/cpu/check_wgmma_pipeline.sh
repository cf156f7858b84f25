#!/usr/bin/env bash
# check_wgmma_pipeline.sh NVCC SOURCE_DIR — compiles the GEMM kernels as the
# build does, with ptxas's report, and fails if ptxas serialised the wgmma
# pipeline of any kernel (C7511: "insufficient register resources"). That is
# an info line, not a warning, and it made every 4-stage kernel ~7% slower
# when it last appeared, so the build alone would not catch it.
set -euo pipefail
nvcc=$1 src=$2
report=$("$nvcc" -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++20 -O3 -DNDEBUG \
  -I"$src/src" -I"$src/include" -Xptxas=-v -c "$src/src/kernels/gemm_sm90.cu" -o /dev/null 2>&1) || {
  echo "$report"
  exit 1
}
if grep -q "C7511" <<<"$report"; then
  grep "C7511" <<<"$report"
  echo "FAIL: ptxas serialised wgmma (C7511) in the kernels above"
  exit 1
fi
echo "ok: $(grep -c "Compiling entry function" <<<"$report") kernels, no serialised wgmma"
