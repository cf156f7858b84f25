#!/usr/bin/env bash
# build.sh — configure and build everything (Release) in ./build.
# Installs the two header-only libraries a fresh Debian/Ubuntu machine may lack
# (CLI11, nlohmann-json) when run as root with apt-get available.
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
have() { [ -f "$1" ] || [ -f "/usr/local/include/${1#/usr/include/}" ]; }
missing=()
have /usr/include/CLI/CLI.hpp || missing+=(libcli11-dev)
have /usr/include/nlohmann/json.hpp || missing+=(nlohmann-json3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "build.sh: installing ${missing[*]}"
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; }
  else
    echo "build.sh: missing ${missing[*]} (install them, e.g. apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
export PATH="$PATH:/usr/local/cuda/bin"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
[ -f build/CMakeCache.txt ] && gen=()  # keep the generator of an existing build
cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
