#!/usr/bin/env bash
# The AllReduce sweep: every shape of the GEMM shape set, all variants, on all
# local GPUs (one process each). Usage: bench/sweep_allreduce.sh OUTDIR [extra bench args]
# Writes OUTDIR/allreduce-h200x<W>.csv (+ a plot). REPEAT=N (default 1) runs
# the sweep N times (OUTDIR/allreduce-h200x<W>-run<i>.csv, each with its own
# tuner picks) and writes the median of the runs (bench/median_of_sweeps.py)
# as the main CSV.
set -eu -o pipefail
out=${1:?output directory}
shift
cli=${CLI:-build/tools/flashoverlap}
here=$(dirname "$0")
shapes="2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,1024x8192x8192,8192x4096x2048,4096x7168x5120,3001x8192x8192"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # never NVLink multicast on these machines
# The GPUs bench runs on: CUDA_VISIBLE_DEVICES's, else every GPU (no MIG lines).
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  world=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
  world=$(nvidia-smi --query-gpu=index --format=csv,noheader | grep -c .)
fi
csv="$out/allreduce-h200x${world}.csv"
repeat=${REPEAT:-1}
rm -f "$csv"
if [ "$repeat" -le 1 ]; then
  "$cli" bench --op allreduce --shapes "${SHAPES:-$shapes}" --csv "$csv" "$@"
else
  runs=()
  for i in $(seq 1 "$repeat"); do
    echo "##### sweep run $i of $repeat ($(date -u +%H:%M:%S))"
    run="$out/allreduce-h200x${world}-run$i.csv"
    rm -f "$run"
    "$cli" bench --op allreduce --shapes "${SHAPES:-$shapes}" --csv "$run" "$@"
    runs+=("$run")
  done
  python3 "$here/median_of_sweeps.py" "$csv" "${runs[@]}"
fi
python3 "$here/plot_allreduce.py" "$csv" "$out/allreduce-h200x${world}.png" || echo "(plot skipped)"
