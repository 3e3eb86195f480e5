#!/usr/bin/env bash
# Builds the CPU test suite under a sanitizer and runs it:
#   bash scripts/sanitize.sh address   # AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   bash scripts/sanitize.sh thread    # ThreadSanitizer (build-tsan/)
# Extra arguments go to ctest (e.g. -R test_data_loader). Not part of CI: a
# sanitizer build of the whole suite takes about 35 minutes on 2 cores.
#
# CPU only (no sanitizer sees into CUDA kernels: use compute-sanitizer on a GPU,
# scripts/gpu_kit.sh run memcheck racecheck). -O2 -g keeps reports readable. Warnings are not
# errors here: GCC 12 reports false -Wstringop-overflow/-Wmaybe-uninitialized
# inside libstdc++ once instrumented (the normal build keeps -Werror).
# Under ThreadSanitizer OpenMP runs one thread: libgomp is not instrumented and
# its barriers would be reported as races; kiln's own threads (DataLoader
# workers, Gloo, the TCP store) are what it checks.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
case "$mode" in
  address)
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    build=build-asan
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
    ;;
  thread)
    flags="-fsanitize=thread"
    build=build-tsan
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
    export OMP_NUM_THREADS=1
    ;;
  *)
    echo "usage: bash scripts/sanitize.sh address|thread [ctest arguments]" >&2
    exit 2
    ;;
esac
shift
cmake -S . -B "$build" -G Ninja -DKILN_ENABLE_CUDA=OFF -DKILN_BUILD_BENCH=OFF -DKILN_WERROR=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="-march=x86-64-v3 $flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -E install_package "$@"
