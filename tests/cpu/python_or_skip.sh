#!/bin/sh
# python_or_skip.sh PYTHON SCRIPT [ARGS...] — runs SCRIPT with PYTHON, the
# python3 that CMake found (if it found none, or it is gone, python3 from
# PATH). With no python3 at all it says so and exits 77, the test's
# SKIP_RETURN_CODE: ctest lists the test as skipped rather than losing it.
py=$1
shift
if [ -z "$py" ] || [ ! -x "$py" ]; then
  py=$(command -v python3) || {
    echo "python3 not found (neither at configure time nor in PATH): skipped"
    exit 77
  }
fi
exec "$py" "$@"
