#!/usr/bin/env bash
# The README's test command: set-up, configure, build, run every test, then
# pack the GPU kit from this build and rehearse it (scripts/gpu_kit.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -G Ninja ${KILN_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
# Only a CUDA-enabled build makes a kit.
if ldd build/bin/kiln_tests | grep -q 'libcudart\.so'; then
  bash scripts/gpu_kit.sh pack
  bash scripts/gpu_kit.sh dry-run
else
  echo "test.sh: a CPU-only build: no GPU kit to pack"
fi
