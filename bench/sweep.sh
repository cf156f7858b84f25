#!/usr/bin/env bash
# A sweep of one op: every shape of its shape set, all variants of
# `flashoverlap-lab lab-bench` (the internal variants and the measured tuner; the
# public ops are `flashoverlap bench`'s), on all local GPUs (one process each).
# Usage: [OP=allreduce|reducescatter|alltoall] bench/sweep.sh OUTDIR [extra lab-bench args]
# Writes OUTDIR/<op>-h200x<W>.csv (+ a plot). REPEAT=N (default 1) runs the
# sweep N times (OUTDIR/<op>-h200x<W>-run<i>.csv, each with its own tuner
# picks) and writes the median of the runs (bench/median_of_sweeps.py) as the
# main CSV. SHAPES overrides the shape set. alltoall: shapes TxNxK (T tokens
# per rank), each for every routing of ROUTINGS ("kind@topk ...", default on
# W ranks: uniform@1 uniform@2 zipf:1.2@2 one:0@2 empty:1@1; one rank:
# uniform@1), the routings' CSVs merged into the main one (REPEAT: not here).
set -eu -o pipefail
out=${1:?output directory}
shift
# The lab tool: LAB, else CLI (an older tree's flashoverlap for an A/B, from
# before the lab split), else this build's flashoverlap-lab.
cli=${LAB:-${CLI:-build/tools/flashoverlap-lab}}
# (`bench` in a build from before the rename, e.g. an older tree's CLI for an A/B)
sub=lab-bench
"$cli" lab-bench --help >/dev/null 2>&1 || sub=bench
here=$(dirname "$0")
op=${OP:-allreduce}
case $op in
  allreduce)
    shapes="2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,1024x8192x8192,8192x4096x2048,4096x7168x5120,3001x8192x8192" ;;
  reducescatter)  # (M = the rows of A on every rank; 3000: M/W not a tile multiple; the last three: Llama-3-8B MLP
                  # down, Llama-3-70B attention output, Qwen2.5-32B attention output at TP 2)
    shapes="2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,1024x8192x8192,8192x4096x2048,4096x7168x5120,3000x8192x8192,8192x4096x7168,8192x8192x4096,8192x5120x2560" ;;
  alltoall)  # (N, K): Mixtral-8x7B-like, DeepSeek-V3-like, Qwen3-30B-A3B-like experts; T = 2048, 4096, 8192
    shapes="2048x4096x14336,4096x4096x14336,8192x4096x14336,2048x7168x2048,4096x7168x2048,8192x7168x2048,2048x2048x768,4096x2048x768,8192x2048x768" ;;
  *) echo "sweep.sh: OP must be allreduce, reducescatter or alltoall, not $op" >&2; exit 2 ;;
esac
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # never NVLink multicast on these machines
# The GPUs lab-bench runs on: CUDA_VISIBLE_DEVICES's, else every GPU (no MIG lines).
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  world=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
  world=$(nvidia-smi --query-gpu=index --format=csv,noheader | grep -c .)
fi
csv="$out/${op}-h200x${world}.csv"
repeat=${REPEAT:-1}
failed=()

# One sweep into CSV $1 (rows appended shape by shape). If lab-bench fails, the
# first shape it left out of the CSV is recorded as failed and the rest run
# again, so that one failing shape does not cost the others; three failures
# in a row without a new shape end the sweep.
sweep_into() {
  local file=$1 left=${SHAPES:-$shapes} stuck=0 s first
  shift
  while [ -n "$left" ]; do
    if "$cli" "$sub" --op "$op" --shapes "$left" --csv "$file" "$@"; then return 0; fi
    local done_shapes rest=() progressed=0
    done_shapes=$(awk -F, 'NR > 1 { print $1 "x" $2 "x" $3 }' "$file" 2>/dev/null | sort -u)
    first=""
    for s in ${left//,/ }; do
      if grep -qx "$s" <<<"$done_shapes"; then progressed=1; continue; fi
      if [ -z "$first" ]; then first=$s; else rest+=("$s"); fi
    done
    [ -z "$first" ] && return 0  # every shape's rows are there
    stuck=$((progressed ? 0 : stuck + 1))
    if [ "$stuck" -ge 3 ]; then
      echo "##### $sub failed 3 times without finishing a shape: giving up on ${left}" >&2
      failed+=("${left//,/ }")
      return 1
    fi
    echo "##### $first failed ($sub's output above says why); going on without it" >&2
    failed+=("$first")
    left=$(IFS=,; echo "${rest[*]}")
  done
}

rm -f "$csv"
if [ "$op" = alltoall ]; then
  if [ "$world" -ge 2 ]; then routings=${ROUTINGS:-"uniform@1 uniform@2 zipf:1.2@2 one:0@2 empty:1@1"}; else routings=${ROUTINGS:-uniform@1}; fi
  for r in $routings; do
    echo "##### routing ${r%@*}, top-${r#*@} ($(date -u +%H:%M:%S))"
    part="$out/${op}-h200x${world}-${r//[:@]/_}.csv"
    rm -f "$part"
    sweep_into "$part" --routing "${r%@*}" --topk "${r#*@}" "$@" || true
    if [ -s "$part" ]; then
      if [ -s "$csv" ]; then tail -n +2 "$part" >>"$csv"; else cp "$part" "$csv"; fi
    fi
  done
elif [ "$repeat" -le 1 ]; then
  sweep_into "$csv" "$@" || true
else
  runs=()
  for i in $(seq 1 "$repeat"); do
    echo "##### sweep run $i of $repeat ($(date -u +%H:%M:%S))"
    run="$out/${op}-h200x${world}-run$i.csv"
    rm -f "$run"
    sweep_into "$run" "$@" || true
    [ -s "$run" ] && runs+=("$run")
  done
  [ ${#runs[@]} -gt 0 ] && python3 "$here/median_of_sweeps.py" "$csv" "${runs[@]}"
fi
[ -s "$csv" ] && { python3 "$here/plot_sweep.py" "$csv" "$out/${op}-h200x${world}.png" || echo "(plot skipped)"; }
if [ ${#failed[@]} -gt 0 ]; then
  echo "##### failed (left out of the CSV): ${failed[*]}" >&2
  exit 1
fi
