#!/usr/bin/env bash
# Builds kiln from the working tree on a GPU machine without network access and
# runs, writing one log per step into "$OUT" (see /work/shared/GPU.md):
#   detect     print the cuDNN/NCCL/compute-sanitizer it finds (builds nothing)
#   stage      unpack .stage/debs/*.deb (from scripts/stage_gpu_debs.sh) with
#              dpkg -x into a staging prefix and copy its usr/ into / without
#              overwriting anything (cp -n)
#   build      find cuDNN and NCCL (/usr/local/cuda, /usr/lib/x86_64-linux-gnu,
#              Python site-packages nvidia/*), configure and build with all cores
#   test       the whole CTest suite, then the [gpu] test cases alone, which must
#              run, not skip
#   memcheck   compute-sanitizer --tool memcheck on the [gpu] test cases
#   racecheck  compute-sanitizer --tool racecheck on the [gpu] test cases
#   bench      every bench/bench_* binary
#   compare    issue 9's GPU comparisons against the machine's PyTorch (eager with
#              AMP, and torch.compile): FashionCNN batch 64 16-mixed, ResNet-9
#              batch 512 bf16-mixed, one epoch each, tables in compare.md
# The summary (summary.txt) records the GPU, driver, toolkit, commit and steps.
# Usage: scripts/gpu_run.sh [all | sanitize | STEP...]     (default: all)
# A command of the device tool may run 10 minutes at most; split the steps over
# calls when needed (the build folder stays while the machine is warm), e.g.
#   bash scripts/gpu_run.sh stage build test     then     bash scripts/gpu_run.sh stage sanitize bench compare
# Environment: OUT (log folder; default build-gpu/out), KILN_GPU_BUILD_DIR
# (default build-gpu), KILN_TORCH_PYTHON (the Python with CUDA torch; default python3),
# KILN_CUDA_ARCH (default: the project's, 90), KILN_WERROR
# (default ON), KILN_COMMIT (recorded in the logs when .git did not travel),
# KILN_TEST_TIMEOUT / KILN_SANITIZER_TIMEOUT / KILN_BENCH_TIMEOUT (seconds).
set -euo pipefail

# --help prints the text above and touches nothing.
case "${1:-}" in -h | --help) sed -n '2,27p' "$0"; exit 0 ;; esac

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KILN_GPU_BUILD_DIR:-$repo/build-gpu}"
out="${OUT:-$build/out}"
jobs="$(nproc)"
test_timeout="${KILN_TEST_TIMEOUT:-480}"
sanitizer_timeout="${KILN_SANITIZER_TIMEOUT:-480}"
bench_timeout="${KILN_BENCH_TIMEOUT:-300}"
gpu_filter='*[gpu]*'  # doctest: the test cases named "... [gpu]"

mkdir -p "$out"
summary="$out/summary.txt"
failures=0

say() { echo "gpu_run: $*" | tee -a "$summary"; }
fail() { say "ERROR: $*"; exit 1; }

# run_step NAME LOG SECONDS COMMAND...: runs COMMAND under a time limit with its
# output in LOG; a failure is counted and reported, and the next step still runs.
run_step() {
  local name="$1" log="$2" limit="$3"
  shift 3
  local start rc=0
  start="$(date +%s)"
  say "[$name] $* > $(basename "$log")"
  timeout --kill-after=30 "$limit" "$@" >>"$log" 2>&1 || rc=$?
  local seconds=$(($(date +%s) - start))
  if [ "$rc" -eq 0 ]; then
    say "[$name] ok (${seconds}s)"
  else
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      say "[$name] FAILED: timed out after ${limit}s (see $(basename "$log"))"
    else
      say "[$name] FAILED with exit status $rc after ${seconds}s (see $(basename "$log"))"
    fi
    failures=$((failures + 1))
  fi
  return 0
}

# ---------------------------------------------------------------- environment

cuda_root=""
for dir in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-13.0; do
  if [ -n "$dir" ] && [ -x "$dir/bin/nvcc" ]; then cuda_root="$dir"; break; fi
done
if [ -z "$cuda_root" ] && command -v nvcc >/dev/null; then
  cuda_root="$(dirname "$(dirname "$(command -v nvcc)")")"
fi
[ -n "$cuda_root" ] && export PATH="$cuda_root/bin:$PATH"

# Python site-packages folders, where pip's nvidia-cudnn-* / nvidia-nccl-* live.
site_dirs=()
collect_site_dirs() {
  local python dir
  for python in python3 /opt/*/.venv/bin/python3; do
    command -v "$python" >/dev/null 2>&1 || continue
    while IFS= read -r dir; do
      [ -d "$dir/nvidia" ] && site_dirs+=("$dir")
    done < <("$python" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)
  done
  for dir in /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages /opt/*/.venv/lib/python3*/site-packages; do
    [ -d "$dir/nvidia" ] && site_dirs+=("$dir")
  done
  return 0
}
collect_site_dirs

# find_file NAME...: the first existing path among the arguments (globs already expanded).
find_file() {
  local path
  for path in "$@"; do
    if [ -e "$path" ]; then echo "$path"; return 0; fi
  done
  return 1
}

# Candidate folders for libraries and headers, best first.
lib_dirs=("$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu /usr/local/lib)
include_dirs=("$cuda_root/include" "$cuda_root/targets/x86_64-linux/include" /usr/include /usr/include/x86_64-linux-gnu)
for dir in "${site_dirs[@]}"; do
  for package in cudnn nccl; do
    lib_dirs+=("$dir/nvidia/$package/lib")
    include_dirs+=("$dir/nvidia/$package/include")
  done
  for package_dir in "$dir"/nvidia/*/; do
    lib_dirs+=("${package_dir}lib")
    include_dirs+=("${package_dir}include")
  done
done
include_dirs+=("$repo/.stage/include")  # the development machine's headers, last

# find_library_file STEM: libSTEM.so, else the first libSTEM.so.N* (pip wheels ship no unversioned link).
find_library_file() {
  local stem="$1" dir candidate
  for dir in "${lib_dirs[@]}"; do
    [ -e "$dir/lib$stem.so" ] && { echo "$dir/lib$stem.so"; return 0; }
    for candidate in "$dir/lib$stem.so".[0-9]*; do
      [ -e "$candidate" ] && { echo "$candidate"; return 0; }
    done
  done
  return 1
}
find_header_dir() {
  local header="$1" dir
  for dir in "${include_dirs[@]}"; do
    [ -f "$dir/$header" ] && { echo "$dir"; return 0; }
  done
  return 1
}

# Library folders for run time: cuDNN loads its sub-libraries from its own folder.
setup_runtime_paths() {
  local extra="" dir
  for dir in "${lib_dirs[@]}"; do
    [ -d "$dir" ] && extra="$extra:$dir"
  done
  export LD_LIBRARY_PATH="${extra#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

record_environment() {
  {
    echo "== kiln gpu_run, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host $(hostname)"
    echo "commit: ${KILN_COMMIT:-$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo 'unknown (no .git; set KILN_COMMIT)')}"
    echo "steps: $*"
    echo "cores: $jobs"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    else
      echo "gpu: nvidia-smi not found"
    fi
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1 || echo 'not found')"
    echo "cmake: $(cmake --version 2>/dev/null | head -n 1 || echo 'not found')"
    echo "c++: $(c++ --version 2>/dev/null | head -n 1 || echo 'not found')"
    echo "python site-packages with nvidia/: ${site_dirs[*]:-none}"
  } >>"$summary"
}

# ---------------------------------------------------------------- steps

step_stage() {
  local debs=("$repo"/.stage/debs/*.deb)
  local dest="${KILN_STAGE_DEST:-/}"  # another folder only to try the step out
  dest="${dest%/}"
  local needed=("$dest"/usr/include/eigen3/Eigen/Core "$dest"/usr/include/doctest/doctest.h
                "$dest"/usr/include/CLI/CLI.hpp "$dest"/usr/include/nlohmann/json.hpp "$dest"/usr/include/zlib.h)
  if [ ! -e "${debs[0]}" ]; then
    local missing=0 path
    for path in "${needed[@]}"; do [ -e "$path" ] || missing=1; done
    [ "$missing" -eq 0 ] && { say "[stage] no .stage/debs, and the headers kiln needs are installed: nothing to do"; return 0; }
    fail "no .deb files in $repo/.stage/debs: run 'bash scripts/stage_gpu_debs.sh' on the development machine and carry .stage along"
  fi
  command -v dpkg >/dev/null || fail "dpkg not found: cannot unpack .stage/debs"
  local root
  root="$(mktemp -d /tmp/kiln-stage.XXXXXX)"
  local deb
  for deb in "${debs[@]}"; do
    dpkg -x "$deb" "$root" || fail "dpkg -x $deb failed"
  done
  # Merge into /usr without overwriting: the image's own files win. (cp -n
  # exits non-zero on some coreutils versions when it skips a file: the check
  # below decides.)
  mkdir -p "$dest/"
  cp -rn "$root/usr" "$dest/" 2>/dev/null || true
  rm -rf "$root"
  if [ -z "$dest" ] && command -v ldconfig >/dev/null; then ldconfig; fi
  local path
  for path in "${needed[@]}" "$dest"/usr/share/cmake/Gloo/GlooConfig.cmake; do
    [ -e "$path" ] || fail "after unpacking ${#debs[@]} packages, $path is still missing"
  done
  say "[stage] unpacked ${#debs[@]} packages from .stage/debs into ${dest:-/} (existing files kept)"
}

# Prints what the build would use, and checks the tools; builds nothing.
step_detect() {
  say "[detect] nvcc: ${cuda_root:-not found}"
  say "[detect] cmake: $(command -v cmake || echo 'not found'), ninja: $(command -v ninja || echo 'not found')"
  say "[detect] compute-sanitizer: $(command -v compute-sanitizer || find_file "$cuda_root/bin/compute-sanitizer" || echo 'not found')"
  say "[detect] libcudnn: $(find_library_file cudnn || echo 'not found'); cudnn.h in $(find_header_dir cudnn.h || echo 'not found')"
  say "[detect] libnccl: $(find_library_file nccl || echo 'not found'); nccl.h in $(find_header_dir nccl.h || echo 'not found')"
}

step_build() {
  [ -n "$cuda_root" ] || fail "nvcc not found (looked in \$CUDA_HOME, /usr/local/cuda and PATH)"
  command -v cmake >/dev/null || fail "cmake not found"
  command -v ninja >/dev/null || fail "ninja not found"
  local cudnn_lib nccl_lib cudnn_inc nccl_inc
  cudnn_lib="$(find_library_file cudnn)" || fail "libcudnn.so* not found in: ${lib_dirs[*]}"
  nccl_lib="$(find_library_file nccl)" || fail "libnccl.so* not found in: ${lib_dirs[*]}"
  cudnn_inc="$(find_header_dir cudnn.h)" || fail "cudnn.h not found in: ${include_dirs[*]} (stage_gpu_debs.sh copies a fallback into .stage/include)"
  nccl_inc="$(find_header_dir nccl.h)" || fail "nccl.h not found in: ${include_dirs[*]}"
  say "[build] cuDNN: $cudnn_lib (headers $cudnn_inc); NCCL: $nccl_lib (headers $nccl_inc)"
  local flags="" dir
  for dir in "$cudnn_inc" "$nccl_inc"; do
    case " $flags " in *" -isystem $dir "*) continue ;; esac
    [ "$dir" = "$cuda_root/include" ] || [ "$dir" = /usr/include ] || flags="$flags -isystem $dir"
  done
  flags="${flags# }"
  local configure=(cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
                   -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc"
                   -DKILN_CUDNN_LIBRARY="$cudnn_lib" -DKILN_NCCL_LIBRARY="$nccl_lib"
                   -DKILN_WERROR="${KILN_WERROR:-ON}"
                   -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_CUDA_FLAGS="$flags")
  [ -n "${KILN_CUDA_ARCH:-}" ] && configure+=(-DCMAKE_CUDA_ARCHITECTURES="$KILN_CUDA_ARCH")
  local log="$out/build.log"
  local before=$failures
  run_step configure "$log" 600 "${configure[@]}"
  [ "$failures" -eq "$before" ] || fail "configure failed; see build.log"
  grep -q "CUDA backend ON" "$log" || fail "CMake did not enable the CUDA backend; see build.log"
  run_step build "$log" 3600 cmake --build "$build" -j "$jobs"
  [ "$failures" -eq "$before" ] || fail "build failed; see build.log (last lines: $(grep -m3 -E 'error|FAILED' "$log" | tr '\n' ' '))"
}

require_built() {
  [ -x "$build/bin/kiln_tests" ] || fail "$build/bin/kiln_tests not found: run the build step first (the build folder lasts only while the machine is warm)"
}

step_test() {
  require_built
  run_step ctest "$out/ctest.log" "$test_timeout" \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout "$test_timeout"
  local log="$out/gpu_tests.log"
  run_step gpu-tests "$log" "$test_timeout" "$build/bin/kiln_tests" --test-case="$gpu_filter" --no-version
  local skipped
  skipped="$(grep -c 'SKIPPED (no GPU)' "$log" || true)"
  if [ "$skipped" -gt 0 ]; then
    say "[gpu-tests] FAILED: $skipped GPU test cases skipped on a GPU machine (see gpu_tests.log)"
    failures=$((failures + 1))
  else
    say "[gpu-tests] $(grep -m1 'test cases:' "$log" || echo 'no doctest summary found')"
  fi
}

# compute-sanitizer on the [gpu] test cases. API errors are not reported: the
# allocator tests provoke cudaErrorMemoryAllocation on purpose.
step_sanitizer() {
  local tool="$1"
  require_built
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || find_file "$cuda_root/bin/compute-sanitizer" "$cuda_root"/compute-sanitizer/compute-sanitizer)" \
    || fail "compute-sanitizer not found"
  run_step "$tool" "$out/$tool.log" "$sanitizer_timeout" "$sanitizer" --tool "$tool" --error-exitcode 86 \
    --report-api-errors no --print-limit 200 "$build/bin/kiln_tests" --test-case="$gpu_filter" --no-version
  say "[$tool] $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" || echo 'no sanitizer summary found')"
}

step_bench() {
  require_built
  local log="$out/bench.log" bench found=0
  for bench in "$build"/bin/bench_*; do
    [ -x "$bench" ] || continue
    found=1
    echo "==== $(basename "$bench") (commit ${KILN_COMMIT:-$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)})" >>"$log"
    run_step "$(basename "$bench")" "$log" "$bench_timeout" "$bench"
  done
  [ "$found" -eq 1 ] || say "[bench] no bench_* binaries in $build/bin"
}

# The kiln-vs-PyTorch tables of issue 9 on this GPU (bench/compare_fashion.py).
step_compare() {
  require_built
  local python="${KILN_TORCH_PYTHON:-python3}"
  if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >>"$out/compare.log" 2>&1; then
    say "[compare] FAILED: $python has no torch that sees a GPU (see compare.log; set KILN_TORCH_PYTHON)"
    failures=$((failures + 1))
    return 0
  fi
  local commit="${KILN_COMMIT:-$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  local common=(--accelerator gpu --torch-compile --python "$python" --kiln "$build/bin/bench_fashion")
  run_step compare-cnn "$out/compare.md" "$bench_timeout" env KILN_COMMIT="$commit" \
    "$python" "$repo/bench/compare_fashion.py" --model cnn --batch-size 64 --precision 16-mixed "${common[@]}"
  run_step compare-resnet9 "$out/compare.md" "$bench_timeout" env KILN_COMMIT="$commit" \
    "$python" "$repo/bench/compare_fashion.py" --model resnet9 --batch-size 512 --precision bf16-mixed "${common[@]}"
}

# ---------------------------------------------------------------- main

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
expanded=()
for step in "${steps[@]}"; do
  case "$step" in
    all) expanded+=(detect stage build test memcheck racecheck bench compare) ;;
    sanitize) expanded+=(memcheck racecheck) ;;
    detect | stage | build | test | memcheck | racecheck | bench | compare) expanded+=("$step") ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu_run: unknown step '$step' (expected all, detect, stage, build, test, memcheck, racecheck, sanitize, bench, compare)" >&2; exit 2 ;;
  esac
done

record_environment "${expanded[@]}"
setup_runtime_paths
say "logs in $out; build folder $build; $jobs cores"
for step in "${expanded[@]}"; do
  case "$step" in
    detect) step_detect ;;
    stage) step_stage ;;
    build) step_build ;;
    test) step_test ;;
    memcheck | racecheck) step_sanitizer "$step" ;;
    bench) step_bench ;;
    compare) step_compare ;;
  esac
done

if [ "$failures" -gt 0 ]; then
  say "done: $failures step(s) FAILED (details in $out)"
  exit 1
fi
say "done: every step passed"
