#!/usr/bin/env bash
# check_wgmma_pipeline.sh NVCC SOURCE_DIR [HOST_COMPILER] — compiles the GEMM
# kernels as the build does, with ptxas's report, and fails if ptxas
# serialised the wgmma pipeline of any kernel ("wgmma.mma_async instructions
# are serialized ...": C7511 and its kin). That is an info line, not a
# warning, and it made every 4-stage kernel ~7% slower when it last
# appeared, so the build alone would not catch it.
set -euo pipefail
nvcc=${1:?usage: check_wgmma_pipeline.sh NVCC SOURCE_DIR [HOST_COMPILER]}
src=${2:?usage: check_wgmma_pipeline.sh NVCC SOURCE_DIR [HOST_COMPILER]}
host=()
[ -n "${3:-}" ] && host=(-ccbin "$3")
report=$("$nvcc" "${host[@]}" -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++20 -O3 \
  -DNDEBUG -I"$src/src" -I"$src/include" -Xptxas=-v -c "$src/src/kernels/gemm_sm90.cu" -o /dev/null 2>&1) || {
  echo "$report"
  exit 1
}
kernels=$(grep -c "Compiling entry function" <<<"$report" || true)
if [ "$kernels" -eq 0 ]; then
  echo "$report"
  echo "FAIL: ptxas reported no kernels (no -v report?): nothing was checked"
  exit 1
fi
if grep -q "instructions are serialized" <<<"$report"; then
  grep "instructions are serialized" <<<"$report"
  echo "FAIL: ptxas serialised wgmma in the kernels above"
  exit 1
fi
echo "ok: $kernels kernels, no serialised wgmma"
