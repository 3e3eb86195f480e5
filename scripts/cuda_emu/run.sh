#!/usr/bin/env bash
# Runs kernels/cuda/attention_tc*.cu's kernels on the CPU under a PTX emulation
# (one OS thread per CUDA thread; mma.sync m16n8k16, ldmatrix, cp.async and
# wgmma m64nNk16 with its swizzled shared-memory descriptors emulated from the
# PTX ISA's tables, mbarriers and named barriers; shared memory and outputs
# start as NaN; a tensor-core read of bytes a cp.async has not yet landed
# fails; a wgmma whose D or A registers its wgmma_fence did not name, a
# wgmma_wait that does not name the D it completes (on the GPU those names pin
# the registers for the compiler), and A's registers written before the wait
# that completes their product fail; EMU_COPY_DELAY_US /
# EMU_COPY_DELAY_FROM (prelude.h) make copies land late)
# and compares out, lse, dq, dk and dv with a float64 reference. A development
# tool for sessions without a GPU, not part of CI: it shares the author's
# reading of the PTX fragment layouts, so it checks the schedule, indexing,
# masking, synchronization and pipelining, not the hardware's layouts.
#   bash scripts/cuda_emu/run.sh            # every head dim, both dtypes (tens of minutes: hundreds of threads)
#   bash scripts/cuda_emu/run.sh 64         # one head dim; extra arguments go to the test program
#   KILN_ATTENTION_FORWARD_SHAPE=2 bash scripts/cuda_emu/run.sh 64
#                                           # the forward's candidate CTA shape 2 (attention_tc_forward.cu)
#                                           # on the problems without dropout or a mask
#   KILN_ATTENTION_FORWARD_SHAPE=7 bash scripts/cuda_emu/run.sh 128
#                                           # the wgmma forward (shapes 7-13; head dims 64 and 128, 13: 64)
#   KILN_ATTENTION_WGMMA_BACKWARD=1 bash scripts/cuda_emu/run.sh 64
#                                           # the wgmma backward (dK/dV and dQ; head dims 64 and 128)
# Kernel files without inline PTX (norm.cu, indexing.cu, softmax.cu, ...) and attention.cu: run_kernels.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="${KILN_EMU_DIR:-/tmp/kiln-cuda-emu}"
mkdir -p "$work"
python3 "$here/gen.py" "$work/emu_attention_tc.inc" >/dev/null
g++ -std=c++20 -O2 -pthread -I"$work" -I"$here" -I"$root" -I/usr/local/cuda/include \
  "$here/main.cpp" -o "$work/emu_main"
"$work/emu_main" "$@"
