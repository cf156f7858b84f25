#!/usr/bin/env bash
# gpu_all.sh — one call on the GPU machine: build, test, benchmark; results
# under $OUT (default ./gpu-out). Stages run in the order given:
#   build        scripts/build.sh: configure + build everything (Release) in build/
#   build-old    the lab tool of an older tree carried beside this one (OLD_SRC, default ab-old/: made before
#                the call with `git archive <rev> | tar x -C ab-old`, untracked) built in OLD_SRC/build
#                (flashoverlap-lab, or flashoverlap in a tree from before the lab split); OLD_CLI (if unset)
#                becomes it, for the A/B stages below (this build's side: flashoverlap-lab)
#   never-slower-ab  bench/never_slower.py (this tree's) on OLD_SRC's Python package and library and this build's in
#                turns, ABBA (AB_ROUNDS; NEVER_SLOWER_AB_ARGS, default a small AllReduce + ReduceScatter set) ->
#                never-slower-ab/<old|new>-<round><a|b>/ (each run's CSV) and never-slower-ab.log
#   fp8-ab       bench-fp8 of OLD_CLI (build-old first) and of this build in turns, ABBA (AB_ROUNDS; FP8_AB_ARGS:
#                shapes etc.; FP8_AB_NEW_ARGS: this build's alone, default --stream-k off, for a tree from before
#                stream-K) -> fp8-ab/<old|new>-<round><a|b>.csv; each row's ours
#                against its own run's cuBLASLt
#   main         the README's main job (build/tools/flashoverlap, all local GPUs)
#   never-slower-watch  bench/never_slower.py with the ops' call watch off (FLASHOVERLAP_CALL_WATCH=0) and on, in
#                turns (ABBA, AB_ROUNDS rounds; NEVER_SLOWER_AB_ARGS as never-slower-ab's, modes eager and latency by
#                default) -> never-slower-watch/<off|on>-<round><a|b>/ and never-slower-watch.log
#   never-slower the public PyTorch ops against F.linear + the torch.distributed call (bench/never_slower.py:
#                eager, graph, latency, host time; NEVER_SLOWER_ARGS: more arguments) -> never-slower-<gpu>.csv/.json
#   grouped      the public grouped GEMM against torch._grouped_mm and a cuBLAS loop on the experts of four
#                models (bench/grouped_gemm.py; GROUPED_ARGS: more arguments) -> grouped-gemm-<gpu>.csv
#   bench        the CLI's bench (the public C++ ops against cuBLAS + NCCL), each op -> bench-ops.csv
#   test         ctest (CPU + GPU tests), log to $OUT/ctest.log
#   gemm         bench-gemm over the GEMM shape set -> $OUT/gemm-h200.csv
#   gemm-rs      bench-gemm of the ReduceScatter epilogues (rs, rs-subtile, rs-nvlink) against plain, full grid,
#                on the ReduceScatter's shape set (SHAPES overrides) -> $OUT/gemm-rs-h200.csv
#   gemm-quick   bench-gemm on a few shapes, full grid only
#   fp8          bench-fp8: the GEMM with e4m3 inputs against cuBLASLt's FP8 matmul, both scale kinds, 30
#                shapes (FP8_ARGS: more arguments, e.g. --tile 128x128,128x192: those two tiles only)
#                -> $OUT/gemm-fp8-lab-<gpu>.csv; then torch._scaled_mm and ours again, in turns in one process,
#                on the same shapes (bench/scaled_mm.py --kernels; SCALED_MM_ARGS: more arguments, e.g. --pdl)
#                -> $OUT/gemm-fp8-<gpu>.csv (ours against it)
#   profile-fp8  Nsight Compute (ncu, if installed) on our FP8 GEMM and cuBLASLt's on one shape (PROFILE_SHAPE,
#                default 16384x8192x7392; both scale kinds; PROFILE_ARGS: more bench-fp8 arguments, e.g.
#                --tile 128x192): speed of light, warp stalls, memory,
#                issue rates and instruction mix -> profile-fp8.txt
#   fp8-phases   bench-fp8 --phases on PHASES_SHAPES (default six shapes, M = 256 to 16384, per tensor, PHASES_TILE
#                (default the ops' tiles), stream-K on and off (PHASES_SK: bench-fp8's --stream-k, default both)), once
#                per grid of PHASES_GRIDS (CTAs; default 0: one per SM): when each launch's CTAs started, put
#                their partials, did their MMAs and stores, against the launch's time -> fp8-phases.log
#   fp8-launch   where a launch's fixed cost goes, ours (128x128, whole tiles) and cuBLASLt's, on LAUNCH_SHAPES
#                (default 256x8192x128,256x8192x1024,256x7168x2304; per tensor): bench-fp8 with each launch alone
#                between its events (--calls 1), back to back (--calls 20), and ours as PDL launches in turns
#                (--pdl both); then, where ncu is installed, each kernel's own duration and SM cycles
#                (gpu__time_duration, sm__cycles_active) on the first shape -> fp8-launch.log
#   fp8-k-sweep  bench-fp8 over k at fixed m, n (SWEEP_MN, default 256x8192 and 2048x8192; k 128 to 7168), one tile
#                (SWEEP_TILE, default 128x128), whole tiles, both scale kinds; then per (m, n, scales) a least-squares
#                line time = fixed + per k-block x k-blocks for ours and for cuBLASLt: what a launch costs beside
#                its k-blocks, against what each k-block costs -> fp8-k-sweep.csv, fp8-k-sweep.log
#   gemm-ab      bench-gemm of OLD_CLI and this build in turns, ABBA (AB_ROUNDS times; default 2), the modes
#                GEMM_AB_MODES (default plain,rs,rs-nvlink), full grid, AB_SHAPES (default the gemm-rs shapes)
#                -> gemm-ab.log, each run headed "##### <cli>"
#   ar           the AllReduce sweep on all local GPUs -> $OUT/allreduce-h200x2.csv (REPEAT=N: the median
#                of N sweeps; each run's CSV goes into the pack); SWEEP_ARGS: more lab-bench arguments; then
#                the model's pick against the measured best (bench/model_vs_measured.py) -> model-vs-measured.txt; then
#                the binding's GemmAllReduce against F.linear + dist.all_reduce, the sweep's figures beside
#                (bench/torch_linear.py) -> $OUT/allreduce-torch-h200x<W>.csv
#   rs           the ReduceScatter sweep the same way -> $OUT/reducescatter-h200x<W>.csv, then PyTorch's
#                F.linear + reduce_scatter_tensor, Async-TP (symm_mem's fused_matmul_reduce_scatter) and the
#                binding's GemmReduceScatter on the same shapes -> $OUT/reducescatter-torch-h200x<W>.csv
#                (bench/torch_linear.py; 2+ GPUs: the Async-TP rows also appended to the sweep's CSV)
#   a2a          the All-to-All (MoE combine) sweep the same way -> $OUT/alltoall-h200x<W>.csv (ROUTINGS: see
#                bench/sweep.sh), then PyTorch's F.linear + all_to_all_single + index_add on the same (N, K)
#                (bench/torch_alltoall.py) -> $OUT/alltoall-torch-h200x<W>.csv
#   sanitize     compute-sanitizer memcheck/racecheck/synccheck on small GEMMs
#   power        lab-bench --power on three shapes: each variant's power, energy, SM clock, capping
#   cli-ab       builds of the tool in turns with registered outputs (the tuner's pick, then the owner plan forced;
#                AB_TRACE=1: traced): OLD_CLI="path [path...]" (e.g. main's build, carried), then this build -> cli-ab.log
#   owners-one   bench-gemm --modes plain,owners (the owner kernel on one GPU, its peer stand-ins), OLD_CLI (if
#                set) then this build -> owners-one.log
#                (cli-ab, owners-one, owners-w: AB_SHAPES overrides their shapes, AB_ROUNDS cli-ab's and
#                owners-w's 2 rounds; AB_FORCED_ONLY=1: cli-ab without the tuner's pick)
#   rank-fault   2+ GPUs: each public op (RANK_FAULT_OPS, default allreduce reducescatter alltoall) in a loop on
#                every GPU, the last rank killed (SIGKILL) mid-loop: the others must fail with a message within
#                RANK_FAULT_BOUND s (default 150), not hang (bench/rank_fault.py) -> rank-fault-<op>.json, rank-fault.log
#   owners-w     3-8 GPUs: the world tests (owners on every GPU among them), then the tuner's pick vs owners
#                forced (128x256, registered outputs), in turns -> owners-w.log
#   cli-gpu      the CLI on the GPUs: lab-bench --shapes with one shape left no plan by its options (skipped with a
#                message, the other measured, exit 2) -> cli-gpu.log
#   faults       the tests catch real faults: for each of FAULTS (default "skip_kblock swap_rows eps_twice"), a
#                Release build in build-fault-<fault> with -DFO_TEST_FAULT=<fault> (kernels wrong on purpose: see
#                FO_TEST_FAULT in CMakeLists.txt) of the GPU tests only, whose cases (ctest -R '^gpu\.') must fail
#                at least once -> faults-<fault>.log (build: faults-<fault>-build.log); one line per fault,
#                "caught by N test(s): ..." or "NOT CAUGHT" (status 1, as a failed build); build/ is not touched
#                (FAULT_FIRST=1: each fault's ctest stops at its first failing test)
#   python       the Python package's GPU tests under torchrun (tests/python/run_gpu_tests.sh: world 1, 2, all
#                GPUs, then examples/python/tp_linear.py) -> python-gpu.log
#   pack         tar the logs into $OUT/logs.tar.gz (the device tool returns at most 8 files)
#   cmd:<shell>  any command, run from the repo root
# TESTS=regex limits ctest; TEST_TIMEOUT=seconds per test (default 600).
# TUNING_CACHE=file: the ar and rs sweeps store their measured picks there (lab-bench --tuning-cache) and the
# public ops of their bench/torch_linear.py runs and of the python stage read them (FLASHOVERLAP_TUNING_CACHE):
# the library timed as users call it, with the CLI's picks. Unset: neither.
# FO_REQUIRE_GPUS=N (exported; default: the GPUs nvidia-smi lists, 0 without it): a GPU test that needs
# n <= N GPUs and cannot run fails instead of skipping (in every stage that runs them: test, sanitize,
# owners-w, faults).
# Example: scripts/gpu_all.sh build test gemm
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0          # never NVLink multicast on these machines
export CUDA_MODULE_LOADING=EAGER   # belt and braces: we also preload kernels
gpus=0
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
export FO_REQUIRE_GPUS=${FO_REQUIRE_GPUS:-$gpus}
echo "FO_REQUIRE_GPUS=$FO_REQUIRE_GPUS (nvidia-smi lists $gpus GPUs): GPU tests needing at most that many fail, not skip"
BUILD=build
CLI=$BUILD/tools/flashoverlap
LAB=$BUILD/tools/flashoverlap-lab  # (lab-bench, bench-gemm: the experiments on internal paths)
status=0

stage() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
# Nsight Compute, if installed (empty: none).
ncu_path() { command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true; }

# ABAB: lab-bench on the shapes near the bar (AB_SHAPES overrides them) with the
# arguments COMMON and each variant's (a string each, "" for none; "@PATH":
# the tool at PATH instead of this build's, no more arguments), AB_ROUNDS
# (default 2) times in turns, into $OUT/LOG: ab_runs LOG COMMON VARIANT...
ab_runs() {
  local log=$1 common=$2 r v bin args
  shift 2
  for ((r = 1; r <= ${AB_ROUNDS:-2}; r++)); do
    for v in "$@"; do
      echo "##### ${v:-(default)} $r" | tee -a "$OUT/$log"
      if [[ $v == @* ]]; then bin=${v#@} args=""; else bin=$LAB args=$v; fi
      # shellcheck disable=SC2086  # $common, $args: several arguments
      "$bin" "$("$bin" lab-bench --help >/dev/null 2>&1 && echo lab-bench || echo bench)" --shapes ${AB_SHAPES:-2048x8192x8192,3001x8192x8192,4096x4096x4096,4096x7168x5120,1024x8192x8192} \
        $common $args --curves /tmp/fo-curves 2>&1 | tee -a "$OUT/$log" |
        grep -E "^[0-9]+x|check|flashoverlap  |sequential  |GEMM tiles overl|CTA phases|rror" | cut -c1-200 || status=1
    done
  done
}
# bench/never_slower.py on every local GPU with the Python package under
# PKG and the library LIB, its CSV into DIR, SECS at most:
# never_slower PKG LIB DIR SECS [more arguments]
never_slower() {
  local pkg=$1 lib=$2 dir=$3 secs=$4
  shift 4
  PYTHONPATH=$pkg FLASHOVERLAP_LIBRARY=$lib PYTHONUNBUFFERED=1 \
    timeout "$secs" python3 -m torch.distributed.run --standalone --nproc-per-node="$gpus" bench/never_slower.py \
    --out-dir "$dir" "$@"
}
# The library as a PyTorch user calls it (its binding, the tuning cache's
# picks where TUNING_CACHE is set) against F.linear + the NCCL call in
# torch, the op's sweep figures beside (bench/torch_linear.py), on every
# local GPU, on the sweep's shapes (SHAPES overrides both): torch_linear OP
# [more arguments] -> $OUT/OP-torch-h200x<W>.csv
torch_linear() {
  local op=$1
  shift
  [ "$gpus" -ge 1 ] || { echo "torch_linear $op: no GPU: skipped"; return 0; }
  python3 -c "import torch" 2>/dev/null || { echo "torch_linear $op: no torch in python3: skipped"; return 0; }
  FLASHOVERLAP_TUNING_CACHE=${TUNING_CACHE:-} FLASHOVERLAP_LIBRARY=${FLASHOVERLAP_LIBRARY:-$PWD/$BUILD/src/api/libflashoverlap.so} \
    timeout 900 python3 -m torch.distributed.run --standalone --nproc-per-node="$gpus" bench/torch_linear.py --op "$op" \
    --csv "$OUT/$op-torch-h200x$gpus.csv" --cli-csv "$OUT/$op-h200x$gpus.csv" ${SHAPES:+--shapes "$SHAPES"} "$@" 2>&1 | tee "$OUT/$op-torch.log" || status=1
}

# The faults stage for one fault F: build-fault-F configured as
# scripts/build.sh configures build/ (Ninja where there is one, unless the
# directory has a generator already; Release) with FO_TEST_FAULT=F and no
# benchmarks; only the GPU test executables built (gpu_test_<name> for each
# tests/gpu/test_<name>.cpp or .cu: their build runs the tests' discovery for
# ctest); then their cases, of which at least one must fail: fault_run F.
fault_run() {
  local f=$1 dir=build-fault-$1 log=$OUT/faults-$1.log blog=$OUT/faults-$1-build.log src name list
  local gen=() targets=() failed=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  [ -f "$dir/CMakeCache.txt" ] && gen=()
  for src in tests/gpu/test_*.cpp tests/gpu/test_*.cu; do
    [ -e "$src" ] || continue
    name=${src##*/}
    targets+=("gpu_${name%.*}")
  done
  targets+=(cpu_test_c_api)  # (gpu.c_api: the C ABI's test executable run with --gpu)
  if [ ${#targets[@]} -eq 0 ]; then
    echo "fault $f: no tests/gpu/test_*.cpp or .cu: nothing can catch it"
    return 1
  fi
  if ! { cmake -S . -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFO_TEST_FAULT="$f" -DFO_BUILD_BENCH=OFF &&
         cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"; } >"$blog" 2>&1; then
    tail -40 "$blog"
    echo "fault $f: BUILD FAILED (log: faults-$f-build.log)"
    return 1
  fi
  # (FAULT_FIRST=1: stop at the first test that fails, enough to show the fault caught, in a fraction of the time)
  ctest --test-dir "$dir" -R '^gpu\.' --output-on-failure -j 1 --timeout "${TEST_TIMEOUT:-600}" \
    ${FAULT_FIRST:+--stop-on-failure} >"$log" 2>&1
  grep -E "tests passed|No tests were found" "$log" | sed 's/^/  ctest: /'
  # ctest's list after "The following tests FAILED:", lines "  12 - gpu.Suite.Case (Failed)"
  mapfile -t failed < <(sed -n '/^The following tests FAILED:/,$p' "$log" |
    sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) \((.*)\)[[:space:]]*$/\1 (\2)/p' | sed 's/ (Failed)$//')
  # A test whose executable was not built proves nothing: an error of this stage, not a catch.
  local notrun=() t
  for t in "${failed[@]}"; do [[ $t == *"(Not Run)" ]] && notrun+=("$t"); done
  if [ ${#notrun[@]} -gt 0 ]; then
    echo "fault $f: ${#notrun[@]} test(s) not built by this stage: ${notrun[*]}"
    return 1
  fi
  # A test that failed in this call's clean run (the test stage's ctest.log) proves nothing here.
  if [ -f "$OUT/ctest.log" ] && [ ${#failed[@]} -gt 0 ]; then
    local kept=() t
    for t in "${failed[@]}"; do
      grep -qE "[0-9]+ - ${t%% *} \(" <(sed -n '/^The following tests FAILED:/,$p' "$OUT/ctest.log") || kept+=("$t")
    done
    [ ${#kept[@]} -lt ${#failed[@]} ] && echo "fault $f: $((${#failed[@]} - ${#kept[@]})) failing test(s) fail without the fault too: not counted"
    failed=("${kept[@]}")
  fi
  if [ ${#failed[@]} -eq 0 ]; then
    echo "fault $f: NOT CAUGHT"
    return 1
  fi
  printf -v list '%s, ' "${failed[@]:0:8}"
  list=${list%, }
  [ ${#failed[@]} -gt 8 ] && list+=", ..."
  echo "fault $f: caught by ${#failed[@]} test(s): $list"
}

for s in "$@"; do
  case "$s" in
    build)
      stage build
      scripts/build.sh -DFO_PTXAS_VERBOSE=ON >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
      grep -E "warning|spill|instructions are serialized" "$OUT/build.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" | head -20
      ;;
    build-old)
      stage "build of ${OLD_SRC:-ab-old} (the older tree for the A/B stages)"
      old_src=${OLD_SRC:-ab-old}
      if [ -f "$old_src/CMakeLists.txt" ] &&
        (cmake -S "$old_src" -B "$old_src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
          { cmake --build "$old_src/build" --target flashoverlap-lab flashoverlap_lib ||
            cmake --build "$old_src/build" --target flashoverlap; }) >"$OUT/build-old.log" 2>&1; then
        # (its lab commands: flashoverlap-lab, or, in a tree from before that split, flashoverlap)
        old_lab=$old_src/build/tools/flashoverlap-lab
        [ -x "$old_lab" ] || old_lab=$old_src/build/tools/flashoverlap
        export OLD_CLI=${OLD_CLI:-$old_lab}
      else
        echo "build-old: $old_src is not a tree that builds (see build-old.log)"; status=1
      fi
      ;;
    gemm-ab)
      stage "bench-gemm, OLD_CLI and this build in turns (ABBA)"
      if [ -z "${OLD_CLI:-}" ] || [ ! -x "${OLD_CLI%% *}" ]; then
        echo "gemm-ab: OLD_CLI names no executable (build-old first): skipped"; status=1
      else
        for r in $(seq "${AB_ROUNDS:-2}"); do
          for c in ${OLD_CLI%% *} $LAB $LAB ${OLD_CLI%% *}; do
            echo "##### $c (round $r)" >>"$OUT/gemm-ab.log"
            "$c" bench-gemm --modes ${GEMM_AB_MODES:-plain,rs,rs-nvlink} --reserve-sms 0 \
              --shapes ${AB_SHAPES:-4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,8192x4096x2048,4096x7168x5120} \
              2>&1 | grep -v '^#' >>"$OUT/gemm-ab.log" || status=1
          done
        done
        awk '/^#####/ {b = $2; next} NF > 8 && $5 != "mode" {k = $1 " " $3 " " $5; s[b SUBSEP k] += $6; c[b SUBSEP k]++; keys[k]}
             END {for (k in keys) {line = k; for (bk in s) {split(bk, p, SUBSEP); if (p[2] == k) line = line "  " p[1] " " sprintf("%.3f", s[bk] / c[bk])}; print line}}' \
          "$OUT/gemm-ab.log" | sort
      fi
      ;;
    main)
      stage "the README's main job: build/tools/flashoverlap"
      $CLI 2>&1 | tee "$OUT/main-job.log" || status=1
      ;;
    never-slower)
      stage "the public ops against PyTorch (bench/never_slower.py, every local GPU) -> never-slower-<gpu>[x<W>].csv"
      if python3 -c "import torch" 2>/dev/null; then
        # shellcheck disable=SC2086  # NEVER_SLOWER_ARGS: several arguments
        never_slower "$PWD/python" "$PWD/$BUILD/src/api/libflashoverlap.so" "$OUT" 1200 ${NEVER_SLOWER_ARGS:-} 2>&1 |
          tee "$OUT/never-slower.log" || status=1
      else
        echo "never-slower: no torch in python3: skipped"
      fi
      ;;
    never-slower-ab)
      stage "never-slower, OLD_SRC's library and this build's in turns (ABBA)"
      old_src=${OLD_SRC:-ab-old}
      if [ ! -f "$old_src/build/src/api/libflashoverlap.so" ]; then
        echo "never-slower-ab: no library in $old_src/build (build-old first): skipped"; status=1
      else
        ab_args=${NEVER_SLOWER_AB_ARGS:---ops allreduce,reducescatter --pairs 8192,8192;4096,14336;7168,2304 --ms 1,32,512,4096 --dtypes bf16}
        for r in $(seq "${AB_ROUNDS:-2}"); do
          for side in old:a new:a new:b old:b; do
            tree=$PWD; [ "${side%%:*}" = old ] && tree=$PWD/$old_src
            lib=$tree/$BUILD/src/api/libflashoverlap.so; [ "${side%%:*}" = old ] && lib=$tree/build/src/api/libflashoverlap.so
            dir="$OUT/never-slower-ab/${side%%:*}-$r${side##*:}"
            mkdir -p "$dir"
            echo "##### ${side%%:*} (round $r): $lib" | tee -a "$OUT/never-slower-ab.log"
            # shellcheck disable=SC2086  # $ab_args: several arguments
            never_slower "$tree/python" "$lib" "$dir" 600 $ab_args 2>&1 |
              grep -E "^(allreduce|reducescatter|alltoall) " >>"$OUT/never-slower-ab.log" || status=1
          done
        done
      fi
      ;;
    fp8-ab)
      stage "bench-fp8, OLD_CLI and this build in turns (ABBA)"
      if [ -z "${OLD_CLI:-}" ] || [ ! -x "${OLD_CLI%% *}" ]; then
        echo "fp8-ab: OLD_CLI names no executable (build-old first): skipped"; status=1
      else
        mkdir -p "$OUT/fp8-ab"
        for r in $(seq "${AB_ROUNDS:-2}"); do
          for side in old:a new:a new:b old:b; do
            if [ "${side%%:*}" = old ]; then c=${OLD_CLI%% *}; extra=""; else c=$LAB; extra=${FP8_AB_NEW_ARGS---stream-k off}; fi
            timeout 400 "$c" bench-fp8 ${FP8_AB_ARGS:-} $extra --csv "$OUT/fp8-ab/${side%%:*}-$r${side##*:}.csv" \
              >>"$OUT/fp8-ab.log" 2>&1 || status=1
          done
        done
        python3 - "$OUT/fp8-ab" <<'PY' || status=1
import csv, glob, statistics, sys
ratio = {"old": {}, "new": {}}  # (row) -> [ours / cuBLASLt of the same run]
for path in sorted(glob.glob(sys.argv[1] + "/*.csv")):
    side = path.rsplit("/", 1)[1].split("-")[0]
    for r in csv.DictReader(open(path)):
        if r["cublaslt_ms"]:
            ratio[side].setdefault((r["M"], r["N"], r["K"], r["scales"]), []).append(float(r["ours_ms"]) / float(r["cublaslt_ms"]))
rows = sorted(set(ratio["old"]) & set(ratio["new"]))
q = [statistics.median(ratio["new"][k]) / statistics.median(ratio["old"][k]) for k in rows]
for k, x in zip(rows, q):
    print("x".join(k[:3]), k[3], "new/old (each against its own cuBLASLt) %.3f" % x)
if q:
    print("fp8-ab: %d rows, new/old median %.3f, %.3f-%.3f" % (len(q), statistics.median(q), min(q), max(q)))
PY
      fi
      ;;
    never-slower-watch)
      stage "never-slower with the call watch off and on in turns (ABBA)"
      ab_args=${NEVER_SLOWER_AB_ARGS:---ops allreduce,reducescatter --pairs 8192,8192;4096,14336 --ms 1,32,512,4096 --dtypes bf16 --modes eager,latency}
      for r in $(seq "${AB_ROUNDS:-2}"); do
        for side in off:a on:a on:b off:b; do
          dir="$OUT/never-slower-watch/${side%%:*}-$r${side##*:}"
          mkdir -p "$dir"
          echo "##### watch ${side%%:*} (round $r)" | tee -a "$OUT/never-slower-watch.log"
          # shellcheck disable=SC2086  # $ab_args: several arguments
          FLASHOVERLAP_CALL_WATCH=$([ "${side%%:*}" = off ] && echo 0 || echo 1) \
            never_slower "$PWD/python" "$PWD/$BUILD/src/api/libflashoverlap.so" "$dir" 600 $ab_args 2>&1 |
            grep -E "^(allreduce|reducescatter|alltoall) " >>"$OUT/never-slower-watch.log" || status=1
        done
      done
      ;;
    fp8)
      stage "the GEMM with e4m3 inputs against cuBLASLt's FP8 matmul (lab bench-fp8) -> gemm-fp8-<gpu>.csv"
      tag=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h100|h200' | tr A-Z a-z)
      timeout 400 $LAB bench-fp8 --csv "$OUT/gemm-fp8-lab-${tag:-gpu}.csv" ${FP8_ARGS:-} 2>&1 | tee "$OUT/fp8.log" || status=1
      # (ours timed again there, in turns with torch in one process: the table's ours_ms)
      PYTHONUNBUFFERED=1 timeout 600 python3 bench/scaled_mm.py --ours "$OUT/gemm-fp8-lab-${tag:-gpu}.csv" \
        --kernels "$PWD/$BUILD/tools/libflashoverlap_kernel_bench.so" ${SCALED_MM_ARGS:-} \
        --out "$OUT/gemm-fp8-${tag:-gpu}.csv" 2>&1 | tee -a "$OUT/fp8.log" || status=1
      ;;
    profile-fp8)
      stage "Nsight Compute on our FP8 GEMM and cuBLASLt's -> profile-fp8.txt"
      ncu_bin=$(ncu_path)
      if [[ -z $ncu_bin ]]; then
        echo "profile-fp8: no ncu on this machine: skipped"
      else
        timeout 500 "$ncu_bin" --kernel-name regex:'gemm_sm90|nvjet|sm90_xmma|cutlass' --launch-skip 4 --launch-count 6 \
          --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
          --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
          $LAB bench-fp8 --shapes "${PROFILE_SHAPE:-16384x8192x7392}" --warmup 1 --iters 2 --no-gate ${PROFILE_ARGS:-} \
          >"$OUT/profile-fp8.txt" 2>&1 || status=1
        grep -E '^  [a-z_]|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput' \
          "$OUT/profile-fp8.txt" | head -60
      fi
      ;;
    fp8-launch)
      stage "bench-fp8: a launch alone, back to back and with PDL; ncu: each kernel's own duration -> fp8-launch.log"
      lshapes=${LAUNCH_SHAPES:-256x8192x128,256x8192x1024,256x7168x2304}
      for args in "--calls 1" "--calls 20" "--calls 20 --pdl both"; do
        echo "# bench-fp8 $args" >>"$OUT/fp8-launch.log"
        timeout 120 $LAB bench-fp8 --shapes "$lshapes" --tile 128x128 --stream-k off --scales tensor $args \
          >>"$OUT/fp8-launch.log" 2>&1 || status=1
      done
      ncu_bin=$(ncu_path)
      if [[ -n $ncu_bin ]]; then
        echo "# ncu (caches flushed, clocks held by ncu) on ${lshapes%%,*}" >>"$OUT/fp8-launch.log"
        timeout 200 "$ncu_bin" --kernel-name regex:'gemm_sm90|nvjet' --launch-skip 2 --launch-count 6 \
          --metrics gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_elapsed.max,launch__grid_size \
          $LAB bench-fp8 --shapes "${lshapes%%,*}" --tile 128x128 --stream-k off --scales tensor --calls 1 \
          --warmup 1 --iters 2 --no-gate >>"$OUT/fp8-launch.log" 2>&1 || status=1
      else
        echo "fp8-launch: no ncu on this machine: the durations skipped" | tee -a "$OUT/fp8-launch.log"
      fi
      grep -E '^[0-9]+x|^# |gpu__time_duration|sm__cycles_active|^  .*gemm_sm90_kernel|^  nvjet' "$OUT/fp8-launch.log" | cut -c1-200
      ;;
    fp8-k-sweep)
      stage "bench-fp8 over k: each launch's fixed cost and its cost per k-block, ours and cuBLASLt's -> fp8-k-sweep.log"
      shapes=""
      for mn in ${SWEEP_MN:-256x8192 2048x8192}; do
        for k in 128 256 512 1024 2048 3584 7168; do shapes="$shapes${shapes:+,}${mn}x$k"; done
      done
      timeout 300 $LAB bench-fp8 --shapes "$shapes" --tile "${SWEEP_TILE:-128x128}" --stream-k off --scales tensor,row \
        --csv "$OUT/fp8-k-sweep.csv" >"$OUT/fp8-k-sweep.log" 2>&1 || status=1
      python3 - "$OUT/fp8-k-sweep.csv" <<'PY' 2>&1 | tee -a "$OUT/fp8-k-sweep.log" || status=1
import csv, sys
from collections import defaultdict
runs = defaultdict(list)  # (m, n, scales) -> [(k-blocks, ours_us, cublaslt_us)]
for r in csv.DictReader(open(sys.argv[1])):
    if r["cublaslt_ms"]:
        runs[(r["M"], r["N"], r["scales"])].append(
            ((int(r["K"]) + 127) // 128, float(r["ours_ms"]) * 1e3, float(r["cublaslt_ms"]) * 1e3))
def line(xs, ys):  # least squares: y = a + b x
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b
print("m x n scales: fixed us + us per k-block (ours | cuBLASLt)")
for (m, n, sc), pts in sorted(runs.items()):
    if len(pts) < 3:
        continue
    kb = [p[0] for p in pts]
    (a0, b0), (a1, b1) = line(kb, [p[1] for p in pts]), line(kb, [p[2] for p in pts])
    print(f"{m}x{n} {sc}: ours {a0:.2f} + {b0:.3f} x kb | cuBLASLt {a1:.2f} + {b1:.3f} x kb")
PY
      ;;
    fp8-phases)
      stage "bench-fp8 --phases: the CTAs' start and end against the launch's time -> fp8-phases.log"
      for grid in ${PHASES_GRIDS:-0}; do  # (0: one CTA per SM)
        echo "# --grid $grid" >>"$OUT/fp8-phases.log"
        timeout 300 $LAB bench-fp8 --phases --scales tensor --tile ${PHASES_TILE:-all} --stream-k ${PHASES_SK:-both} --warmup 3 \
          --iters 10 --grid "$grid" \
          --shapes "${PHASES_SHAPES:-256x1280x8192,256x4608x7168,256x8192x7392,256x8192x1024,2048x8192x7392,16384x8192x7392}" \
          2>&1 | tee -a "$OUT/fp8-phases.log" || status=1
      done
      ;;
    grouped)
      stage "the grouped GEMM against torch._grouped_mm and a cuBLAS loop (bench/grouped_gemm.py) -> grouped-gemm-<gpu>.csv"
      tag=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h100|h200' | tr A-Z a-z)
      PYTHONPATH=$PWD/python FLASHOVERLAP_LIBRARY=$PWD/$BUILD/src/api/libflashoverlap.so PYTHONUNBUFFERED=1 \
        timeout 900 python3 bench/grouped_gemm.py --out "$OUT/grouped-gemm-${tag:-gpu}.csv" ${GROUPED_ARGS:-} 2>&1 |
        tee "$OUT/grouped.log" || status=1
      ;;
    bench)
      stage "the CLI's bench: the public ops against cuBLAS + NCCL, each op on the default shapes"
      for op in allreduce reducescatter alltoall; do
        $CLI bench --op $op --shapes ${SHAPES:-4096x8192x8192,2048x8192x8192,32x8192x8192} --csv "$OUT/bench-ops.csv" 2>&1 |
          tee -a "$OUT/bench-ops.log" || status=1
      done
      ;;
    test)
      stage test
      (cd $BUILD && ctest --output-on-failure -j 1 --timeout ${TEST_TIMEOUT:-600} ${TESTS:+-R "$TESTS"}) >"$OUT/ctest.log" 2>&1 || status=1
      grep -E "tests passed|Failed|FAILED|\*\*\*|Skipped|Not Run" "$OUT/ctest.log" | head -40
      ;;
    gemm)
      stage bench-gemm
      $LAB bench-gemm --csv "$OUT/gemm-h200.csv" --meta "$OUT/gemm-h200.json" 2>&1 | tee "$OUT/gemm.log" || status=1
      python3 bench/plot_gemm.py "$OUT/gemm-h200.csv" "$OUT/gemm-h200.png" || echo "(plot skipped)"
      ;;
    gemm-rs)
      stage "bench-gemm: the ReduceScatter epilogues (slots, sub-tile, NVLink form) against the plain GEMM"
      $LAB bench-gemm --modes plain,rs,rs-subtile,rs-nvlink --reserve-sms 0 \
        --shapes ${SHAPES:-4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,8192x4096x2048,4096x7168x5120} \
        --csv "$OUT/gemm-rs-h200.csv" 2>&1 | tee "$OUT/gemm-rs.log" || status=1
      ;;
    gemm-quick)
      stage bench-gemm quick
      $LAB bench-gemm --shapes 4096x8192x8192,8192x8192x8192,4096x4096x4096,3001x8192x8192 --reserve-sms 0 \
        2>&1 | tee "$OUT/gemm-quick.log" || status=1
      ;;
    ar)
      stage allreduce sweep
      OP=allreduce bash bench/sweep.sh "$OUT" --curves /tmp/fo-curves ${TUNING_CACHE:+--tuning-cache "$TUNING_CACHE"} \
        ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/allreduce.log" || status=1
      # The model's pick against the measured best among the public op's Auto plans, then among all.
      { python3 bench/model_vs_measured.py "$OUT/allreduce.log" --only "row bands,slots,sequential" &&
          python3 bench/model_vs_measured.py "$OUT/allreduce.log"; } 2>&1 | tee "$OUT/model-vs-measured.txt"
      torch_linear allreduce
      ;;
    rs)
      stage "reducescatter sweep, then PyTorch's (Async-TP)"
      OP=reducescatter bash bench/sweep.sh "$OUT" ${TUNING_CACHE:+--tuning-cache "$TUNING_CACHE"} ${SWEEP_ARGS:-} 2>&1 |
        tee "$OUT/reducescatter.log" || status=1
      merge=()
      [ "$gpus" -ge 2 ] && merge=(--merge-into "$OUT/reducescatter-h200x$gpus.csv")
      torch_linear reducescatter "${merge[@]}"
      [ "$gpus" -ge 2 ] && { python3 bench/plot_sweep.py "$OUT/reducescatter-h200x$gpus.csv" \
        "$OUT/reducescatter-h200x$gpus.png" || echo "(plot skipped)"; }
      ;;
    a2a)
      stage "alltoall (MoE combine) sweep, then PyTorch's"
      OP=alltoall bash bench/sweep.sh "$OUT" ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/alltoall.log" || status=1
      timeout 900 python3 -m torch.distributed.run --standalone --nproc-per-node="$gpus" bench/torch_alltoall.py \
        --topk "$([ "$gpus" -ge 2 ] && echo 2 || echo 1)" --out "$OUT/alltoall-torch-h200x$gpus.csv" 2>&1 |
        tee "$OUT/alltoall-torch.log" || status=1
      ;;
    power)
      stage "power and clocks per variant (NVML)"
      $LAB lab-bench --shapes 4096x8192x8192,8192x4096x2048,2048x8192x8192,1024x8192x8192 --power 1 --curves /tmp/fo-curves 2>&1 | tee "$OUT/power.log" |
        grep -E "^[0-9]+x|power|W,|ideal gain|flashoverlap  |sequential  |rror" || status=1
      ;;
    cli-ab)
      builds=()
      for c in ${OLD_CLI:-}; do
        if [ -x "$c" ]; then builds+=("@$c"); else echo "cli-ab: OLD_CLI's $c is not an executable"; status=1; fi
      done
      if [ ${#builds[@]} -eq 0 ]; then
        echo "cli-ab: OLD_CLI (other builds of the tool, space-separated) names no executable: skipped"
        status=1
        continue
      fi
      builds+=("@$LAB")
      stage "builds in turns, registered outputs: ${builds[*]}, the tuner's pick, then the owner plan forced"
      [ "${AB_FORCED_ONLY:-0}" = 1 ] || ab_runs cli-ab.log "--registered-output" "${builds[@]}"
      # (AB_TRACE=1: --trace too; builds before 9561bda then time traced calls, 6-15 us slower each)
      ab_runs cli-ab.log "--registered-output --layout owners --tile 128x256 --no-select$([ "${AB_TRACE:-0}" = 1 ] && echo " --trace")" \
        "${builds[@]}"
      ;;
    owners-one)
      stage "the owner kernel on one GPU (stand-in peer) against the plain GEMM, in turns"
      for c in ${OLD_CLI:-} $LAB; do
        echo "##### $c" | tee -a "$OUT/owners-one.log"
        "$c" bench-gemm --shapes ${AB_SHAPES:-2048x8192x8192,3001x8192x8192,4096x4096x4096,4096x7168x5120,1024x8192x8192},8192x4096x2048 \
          --tiles 256 --modes plain,owners --reserve-sms 0 2>&1 | tee -a "$OUT/owners-one.log" || status=1
      done
      ;;
    sanitize)
      stage compute-sanitizer
      for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 $BUILD/tests/gpu/gpu_test_gemm \
          --gtest_filter='Shapes/GemmVsCublas.*/6:GemmSignal.SlotRowsFollowTheTable' >"$OUT/sanitize-$tool.log" 2>&1
        echo "$tool: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitize-$tool.log") clean summaries)"
        tail -3 "$OUT/sanitize-$tool.log"
      done
      ;;
    rank-fault)
      stage "a rank killed mid-loop: the others fail with a message, not hang (bench/rank_fault.py)"
      if [[ $gpus -lt 2 ]]; then
        echo "rank-fault: needs 2+ GPUs (this machine has $gpus): skipped" | tee -a "$OUT/rank-fault.log"
      else
        for op in ${RANK_FAULT_OPS:-allreduce reducescatter alltoall}; do
          PYTHONPATH=$PWD/python FLASHOVERLAP_LIBRARY=$PWD/$BUILD/src/api/libflashoverlap.so PYTHONUNBUFFERED=1 \
            timeout 900 python3 bench/rank_fault.py --world "$gpus" --op "$op" --bound "${RANK_FAULT_BOUND:-150}" \
            --out "$OUT/rank-fault-$op.json" 2>&1 | tee -a "$OUT/rank-fault.log" || status=1
        done
      fi
      ;;
    owners-w)
      stage "owners on every local GPU (3-8): the world test's owner cases, then the tuner's pick vs owners forced"
      (cd $BUILD && ctest --output-on-failure -R "OverlapAllReduceWorld" --timeout 600) >"$OUT/owners-w-tests.log" 2>&1 || status=1
      grep -E "tests passed|Failed|Skipped" "$OUT/owners-w-tests.log" | head
      AB_SHAPES=${AB_SHAPES:-4096x8192x8192,1024x8192x8192,8192x4096x2048,4096x7168x5120,2048x8192x8192} \
        ab_runs owners-w.log "--registered-output" "" "--layout owners --tile 128x256"
      ;;
    cli-gpu)
      stage "the CLI on the GPUs: a shape its options leave no plan is skipped, the next one runs"
      rc=0
      $LAB lab-bench --shapes 1024x8192x8192,4096x4096x4096 --layout owners --band-swizzles 8 --iters 3 --warmup 1 \
        --curves /tmp/fo-curves >"$OUT/cli-gpu.log" 2>&1 || rc=$?
      grep -E "skipped|^4096x4096x4096|flashoverlap  |rror" "$OUT/cli-gpu.log" | cut -c1-200
      if [[ $rc == 2 ]] && grep -q "1024x8192x8192: skipped" "$OUT/cli-gpu.log" && grep -q "^4096x4096x4096" "$OUT/cli-gpu.log"
      then echo "cli-gpu: ok (exit 2, 1024x8192x8192 skipped, 4096^3 measured)"
      else echo "cli-gpu: FAILED (exit $rc)"; status=1; fi
      ;;
    faults)
      stage "faults made on purpose (FO_TEST_FAULT), each in build-fault-<fault>: the GPU tests must catch each"
      for f in ${FAULTS:-skip_kblock swap_rows eps_twice}; do
        fault_run "$f" || status=1
      done
      ;;
    python)
      stage "the Python package on the GPUs (torchrun)"
      rc=0
      FLASHOVERLAP_TUNING_CACHE=${TUNING_CACHE:-} tests/python/run_gpu_tests.sh >"$OUT/python-gpu.log" 2>&1 || rc=$?
      tail -15 "$OUT/python-gpu.log"
      if [[ $rc == 77 ]] && [[ ${FO_REQUIRE_GPUS:-0} == 0 ]]; then echo "python: skipped"; elif [[ $rc != 0 ]]; then status=1; fi
      ;;
    pack)
      stage "pack logs into $OUT/logs.tar.gz"
      (cd "$OUT" && tar czf logs.tar.gz --remove-files *.log $(ls -d *-run[0-9]*.csv never-slower-ab rank-fault-*.json 2>/dev/null) 2>/dev/null
        ls)
      ;;
    cmd:*)
      stage "${s#cmd:}"
      bash -c "${s#cmd:}" || status=1
      ;;
    *) echo "unknown stage '$s'"; exit 2 ;;
  esac
done
exit $status
