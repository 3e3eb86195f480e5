#!/usr/bin/env bash
# The README's test command: set-up, configure, build, run every test, then
# pack the GPU kit from this build and rehearse it (scripts/gpu_kit.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# --tests: also Debian's python3-torch and .venv (safetensors, tensorboard) for the interop checks.
bash scripts/setup.sh --tests
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -G Ninja ${KILN_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
# The two-node tests (network namespaces; CI runs as root) must run here, not skip.
export KILN_REQUIRE_NETNS=1
# The PyTorch round trip and TensorBoard's own reader must run here, not skip.
KILN_REQUIRE_PYTHON_CHECKS=1 ctest --test-dir build --output-on-failure -j "$(nproc)"
# Only a CUDA-enabled build makes a kit.
if ldd build/bin/kiln_tests | grep -q 'libcudart\.so'; then
  bash scripts/gpu_kit.sh pack
  bash scripts/gpu_kit.sh dry-run
else
  echo "test.sh: a CPU-only build: no GPU kit to pack"
fi
