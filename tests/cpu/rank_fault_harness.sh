#!/bin/sh
# rank_fault_harness.sh PYTHON ROOT: bench/rank_fault.py's harness on the CPU
# (gloo, no GPU): a killed rank's peers fail with a message (exit 0), and
# survivors that hang are reported as hung (exit 1). 77 (skipped) where the
# interpreter has no torch with gloo.
py=$1
root=$2
"$py" "$root/bench/rank_fault.py" --self-test
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "rank_fault_harness: the self-test failed (status $rc)"; exit 1; }
out=$("$py" "$root/bench/rank_fault.py" --self-test-hang 2>&1)
rc=$?
echo "$out"
if [ $rc -ne 1 ] || ! echo "$out" | grep -q HUNG; then
  echo "rank_fault_harness: hung survivors were not reported (status $rc)"
  exit 1
fi
echo "rank_fault_harness: ok"
