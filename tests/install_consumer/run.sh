#!/usr/bin/env bash
# CTest's install_package: installs the build tree into a scratch prefix, then
# configures, builds and runs tests/install_consumer against it with
# find_package(kiln) — the way a downstream project uses kiln.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kiln-install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build_dir" --prefix "$scratch/prefix" > "$scratch/install.log"
test -f "$scratch/prefix/include/kiln/core/tensor.h"
test -f "$scratch/prefix/lib/cmake/kiln/kilnConfig.cmake"
cmake -S "$source_dir" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" > "$scratch/configure.log"
cmake --build "$scratch/build" > "$scratch/build.log"
"$scratch/build/kiln_consumer"
