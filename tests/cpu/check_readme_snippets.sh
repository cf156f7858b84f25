#!/usr/bin/env bash
# check_readme_snippets.sh CXX SOURCE_DIR — the README's "Use it from C++"
# snippet compiles against the public headers (inside a function that
# declares what it uses), and its "Use it from PyTorch" snippet is valid
# Python. (They run for real in examples/cpp, which cpu.package builds and
# runs, and in tests/python; this keeps the README's copies from drifting.)
set -euo pipefail
cxx=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The first fenced block of a language after a heading.
block() {  # block HEADING LANG
  awk -v h="$1" -v lang="$2" '
    $0 == h { in_section = 1; next }
    in_section && /^## / { exit }
    in_section && $0 == "```" lang { grab = 1; next }
    grab && $0 == "```" { exit }
    grab { print }' "$src/README.md"
}
cpp=$(block "## Use it from C++" cpp)
py=$(block "## Use it from PyTorch" python)
[ -n "$cpp" ] || { echo "no C++ snippet under '## Use it from C++' in README.md"; exit 1; }
[ -n "$py" ] || { echo "no Python snippet under '## Use it from PyTorch' in README.md"; exit 1; }
{  # (its #include lines first, the rest inside a function that declares what it uses)
  echo '#include <cuda_runtime_api.h>'
  echo '#include <nccl.h>'
  echo '#include <cstdint>'
  printf '%s\n' "$cpp" | grep '^#include' || true
  echo 'void snippet(ncclComm_t nccl_comm, const void* x, const void* w, void* y, int64_t m, cudaStream_t stream,'
  echo '             const void* residual, const void* norm_weight, void* residual_out,'
  echo '             const flashoverlap::AllToAllRouting& routing) {'
  printf '%s\n' "$cpp" | grep -v '^#include' || true
  echo '}'
} >"$work/snippet.cpp"
"$cxx" -std=c++20 -fsyntax-only -I"$src/include" -I/usr/local/cuda/include "$work/snippet.cpp"
printf '%s\n' "$py" >"$work/snippet.py"
python3 -m py_compile "$work/snippet.py"
echo "ok: the README's C++ snippet compiles, its Python snippet parses"
