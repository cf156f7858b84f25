#!/usr/bin/env bash
# run_gpu_tests.sh [WORLD...] — the Python package's GPU tests
# (tests/python/test_gpu.py) under torchrun, one process per GPU, at each
# world size given (default: 1, then 2 where there are two Hopper GPUs or
# more, then all of them where there are more than two), then
# examples/python/tp_linear.py at the largest of them.
#
#   tests/python/run_gpu_tests.sh                      # (scripts/gpu_all.sh: cmd:tests/python/run_gpu_tests.sh)
#   FLASHOVERLAP_LIBRARY=/path/libflashoverlap.so tests/python/run_gpu_tests.sh 2
#
# The package is the source tree's (python/ on PYTHONPATH), the library
# $FLASHOVERLAP_LIBRARY (default: build/src/api/libflashoverlap.so);
# FO_PYTHON3 names the interpreter (default python3). pytest runs the tests
# where it is installed, unittest otherwise.
#
# Exit status: 0 passed; 77 skipped, saying why (no python3, no torch >= 2.4
# or no Hopper GPU: ctest's SKIP_RETURN_CODE); 1 failed, or no GPU where
# FO_REQUIRE_GPUS=N (N >= 1) promises one (as the C++ GPU tests do).
set -u -o pipefail
cd "$(dirname "$0")/../.."
PY=${FO_PYTHON3:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  PY=$(command -v python3) || { echo "run_gpu_tests: python3 not found: skipped"; exit 77; }
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1
export FLASHOVERLAP_LIBRARY=${FLASHOVERLAP_LIBRARY:-$PWD/build/src/api/libflashoverlap.so}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # (never NVLink multicast on these machines)
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
need=${FO_REQUIRE_GPUS:-0}

# What this machine offers: "skip <why>", "nogpu <why>" or "gpus <Hopper GPUs>".
probe=$("$PY" - <<'EOF' 2>&1 | tail -1
import re
try:
    import torch
except ImportError as e:
    print("skip torch is not importable:", e)
    raise SystemExit
v = re.match(r"(\d+)\.(\d+)", torch.__version__)
if (int(v.group(1)), int(v.group(2))) < (2, 4):
    print(f"skip torch {torch.__version__} is older than 2.4")
elif not torch.cuda.is_available():
    print("nogpu torch sees no CUDA GPU")
else:
    n = sum(torch.cuda.get_device_capability(i) == (9, 0) for i in range(torch.cuda.device_count()))
    print("gpus", n) if n else print("nogpu no Hopper (sm_90) GPU among", torch.cuda.device_count())
EOF
)
case "$probe" in
  gpus\ *) gpus=${probe#gpus } ;;
  nogpu\ *)
    if [ "$need" -ge 1 ] 2>/dev/null; then
      echo "run_gpu_tests: ${probe#nogpu }, but FO_REQUIRE_GPUS=$need promises GPUs: failed"
      exit 1
    fi
    echo "run_gpu_tests: ${probe#nogpu }: skipped"
    exit 77 ;;
  skip\ *) echo "run_gpu_tests: ${probe#skip }: skipped"; exit 77 ;;
  *) echo "run_gpu_tests: the probe failed: $probe"; exit 1 ;;
esac

if [ ! -f "$FLASHOVERLAP_LIBRARY" ]; then
  echo "run_gpu_tests: no library at $FLASHOVERLAP_LIBRARY (build it, or set FLASHOVERLAP_LIBRARY)"
  exit 1
fi

if [ $# -gt 0 ]; then
  worlds=("$@")
else
  worlds=(1)
  [ "$gpus" -ge 2 ] && worlds+=(2)
  [ "$gpus" -gt 2 ] && worlds+=("$gpus")
fi
if "$PY" -c "import pytest" 2>/dev/null; then
  tests=(-m pytest -q -s -rs -p no:cacheprovider tests/python/test_gpu.py)
else
  tests=(tests/python/test_gpu.py -v)
fi

status=0
largest=0
for w in "${worlds[@]}"; do
  if [ "$w" -gt "$gpus" ]; then
    if [ "$need" -ge "$w" ] 2>/dev/null; then
      echo "run_gpu_tests: world $w needs $w Hopper GPUs, $gpus here (FO_REQUIRE_GPUS=$need): failed"
      status=1
    else
      echo "run_gpu_tests: world $w needs $w Hopper GPUs, $gpus here: skipped"
    fi
    continue
  fi
  echo "=== test_gpu.py at world $w ($(date -u +%H:%M:%S))"
  timeout "${PY_TEST_TIMEOUT:-900}" "$PY" -m torch.distributed.run --standalone --nproc-per-node="$w" "${tests[@]}" ||
    { echo "run_gpu_tests: test_gpu.py at world $w FAILED"; status=1; }
  [ "$w" -gt "$largest" ] && largest=$w
done
if [ "$largest" -ge 1 ]; then
  echo "=== examples/python/tp_linear.py at world $largest ($(date -u +%H:%M:%S))"
  timeout 600 "$PY" -m torch.distributed.run --standalone --nproc-per-node="$largest" examples/python/tp_linear.py ||
    { echo "run_gpu_tests: tp_linear.py at world $largest FAILED"; status=1; }
fi
exit $status
