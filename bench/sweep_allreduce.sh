#!/usr/bin/env bash
# The AllReduce sweep: every shape of the GEMM shape set, all variants, on all
# local GPUs (one process each). Usage: bench/sweep_allreduce.sh OUTDIR [extra bench args]
# Writes OUTDIR/allreduce-h200x<W>.csv (+ .json metadata) and a plot.
set -eu -o pipefail
out=${1:?output directory}
shift
cli=${CLI:-build/tools/flashoverlap}
shapes="2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,1024x8192x8192,8192x4096x2048,4096x7168x5120,3001x8192x8192"
world=$(nvidia-smi -L | wc -l)
csv="$out/allreduce-h200x${world}.csv"
rm -f "$csv"
"$cli" bench --op allreduce --shapes "${SHAPES:-$shapes}" --csv "$csv" "$@"
python3 "$(dirname "$0")/plot_allreduce.py" "$csv" "$out/allreduce-h200x${world}.png" || echo "(plot skipped)"
