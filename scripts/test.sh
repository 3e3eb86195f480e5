#!/usr/bin/env bash
# The README's test command: set-up, configure, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -G Ninja ${KILN_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
