#!/usr/bin/env bash
# The GPU kit: everything a GPU machine needs to give kiln's whole GPU verdict
# in ONE command, built and packed on the CPU machine (../shared/GPU.md).
#
#   bash scripts/gpu_kit.sh pack [--build DIR]   (CPU machine) strips and packs the binaries of a
#        CUDA-enabled build (default build/), the libraries the GPU machine lacks (found with ldd),
#        Fashion-MNIST, the PyTorch peer scripts, the list of GPU test cases and the commit into
#        .gpu-kit/ (git-ignored); fails when .gpu-kit plus the working tree exceed 56 MiB
#   bash scripts/gpu_kit.sh dry-run               (CPU machine, CI) unpacks the kit into a scratch
#        folder and rehearses it there: library resolution, a few CPU test cases, a short
#        train_fashion on the kit's data, the GPU-case count against the sources, and the run
#        step's own plumbing on two test files
#   bash scripts/gpu_kit.sh run [STEP...] [--tests FILES] [--deadline SECONDS]   (GPU machine)
#        carry [".gpu-kit"]; default steps: preflight tests bench compare memcheck, within the
#        deadline (default 450 s; each step bounded by the time left, a failed step never stops
#        the next). Optional steps: racecheck, compile (torch.compile rows in compare), train
#        (train_fashion --accelerator gpu with no other flag), profile (one GPT-2 124M step, one
#        ResNet-9 channels-last and one FashionCNN 16-mixed iteration of kiln and of PyTorch under
#        a CUPTI trace: GPU busy and idle time, kernel time by family, profile.md; 1-2 minutes), accuracy
#        (ResNet-9 bf16-mixed to 93% and 94% test accuracy, kiln against PyTorch,
#        bench/time_to_accuracy.py: accuracy.md, about 1-2 minutes). --tests test_a,test_b
#        limits the tests, memcheck and racecheck steps to those files (a rerun of the failures).
#        summary.md is rewritten after every step (a killed run still leaves one), and with
#        logs.tar.xz written on any exit; a failed preflight ends the run (nothing else could pass).
# run writes at most 7 files to $OUT (default /tmp/kiln-kit-out): summary.md (device, driver,
# commit, each step's verdict, each failing case with its first error lines, what did not run
# for lack of time), bench.md, compare.md, train.md, profile.md, accuracy.md and logs.tar.xz.
# Environment: KILN_GPU_KIT (kit folder, default .gpu-kit), KILN_TORCH_PYTHON (the Python with
# CUDA torch; default: /opt/*/.venv/bin/python3, else python3).
set -euo pipefail

case "${1:-}" in -h | --help | "") sed -n '2,24p' "$0"; exit 0 ;; esac

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kit="${KILN_GPU_KIT:-$repo/.gpu-kit}"
archive_name="kiln-bin.tar.xz"
max_travel_mib=56

die() { echo "gpu_kit: $*" >&2; exit 1; }

# The GPU test cases of the sources: doctest names with "[gpu]" or "[gpu2]", one per line.
source_gpu_cases() {
  grep -ho 'TEST_CASE("[^"]*\[gpu2\?\][^"]*"' "$repo"/tests/test_*.cpp | sed 's/^TEST_CASE("//; s/"$//' | sort
}

# doctest's --list-test-cases output, names only.
list_cases() {
  "$@" --list-test-cases --no-version 2>/dev/null | sed -n '/^=\{10,\}/,/^=\{10,\}/p' | sed '/^=\{10,\}/d' | sed '/^$/d'
}

# Libraries the GPU machine has (glibc; the CUDA libraries, which must be the ones torch loads
# there) and the ones it has in a version that may be too old (a fallback folder).
is_system_library() {
  case "$1" in
    linux-vdso.so* | ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libcudnn*.so* | libnccl.so* | libnvrtc*.so*) return 0 ;;
  esac
  return 1
}
is_fallback_library() {
  case "$1" in libstdc++.so* | libgcc_s.so* | libgomp.so*) return 0 ;; esac
  return 1
}

# Fashion-MNIST from the kit into `dir`: each IDX file raw (kiln reads it
# first) and gzipped (torch_fashion.py reads the .gz names).
install_data() {
  local dir="$1" packed raw
  mkdir -p "$dir" || return 1
  for packed in "$kit/data"/*.xz; do
    raw="$dir/$(basename "${packed%.xz}")"
    xz -dc "$packed" >"$raw" && gzip -1 -c "$raw" >"$raw.gz" || return 1
  done
}

# ==================================================================== pack

cmd_pack() {
  local build="$repo/build"
  while [ $# -gt 0 ]; do
    case "$1" in
      --build) build="$(cd "$2" && pwd)"; shift 2 ;;
      *) die "pack: unknown argument '$1' (expected --build DIR)" ;;
    esac
  done
  local bin="$build/bin"
  [ -x "$bin/kiln_tests" ] || die "pack: $bin/kiln_tests not found: build first (bash scripts/test.sh, or cmake --build build)"
  ldd "$bin/kiln_tests" | grep -q 'libcudart\.so' ||
    die "pack: $bin/kiln_tests is not linked against the CUDA runtime: this build has no CUDA backend (is nvcc on PATH at configure time?)"
  local data=/usr/share/datasets/fashion-mnist file
  for file in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    [ -f "$data/$file" ] || die "pack: $data/$file not found (Debian's dataset-fashion-mnist; bash scripts/setup.sh installs it)"
  done

  local stage
  stage="$(mktemp -d /tmp/kiln-kit-pack.XXXXXX)"
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback"
  local programs=() program
  for program in "$bin"/*; do
    # bench_distributed measures Gloo over TCP on the CPU: no run step or test uses it.
    [ "$(basename "$program")" = bench_distributed ] && continue
    [ -f "$program" ] && [ -x "$program" ] && programs+=("$program")
  done
  for program in "${programs[@]}"; do
    strip --strip-unneeded -o "$stage/bin/$(basename "$program")" "$program"
  done
  # Every library the binaries load that the GPU machine may lack, under its soname.
  local line name path
  while read -r name path; do
    is_system_library "$name" && continue
    [ -f "$path" ] || die "pack: ldd resolves $name to '$path', which does not exist"
    if is_fallback_library "$name"; then
      cp -L "$path" "$stage/lib-fallback/$name"
    else
      cp -L "$path" "$stage/lib/$name"
    fi
  done < <(for program in "${programs[@]}"; do ldd "$program"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
  if for program in "${programs[@]}"; do ldd "$program"; done | grep -q 'not found'; then
    die "pack: a library of the build is not found here: $(for program in "${programs[@]}"; do ldd "$program"; done | grep 'not found' | sort -u | tr '\n' ' ')"
  fi

  rm -rf "$kit"
  mkdir -p "$kit/data" "$kit/scripts" "$kit/bench"
  echo "gpu_kit: packing ${#programs[@]} stripped binaries and $(ls "$stage/lib" "$stage/lib-fallback" | grep -c '\.so') libraries (xz, 384 MiB dictionary; about 2 minutes on 2 cores)"
  # A 384 MiB dictionary spans the whole tar (390 MiB of binaries that each link
  # the same static libraries): 17 MiB instead of 25 with xz -9's 64 MiB.
  # Unpacking needs about 400 MiB of memory.
  tar -C "$stage" -cf - bin lib lib-fallback | xz -T1 --lzma2=preset=9,dict=384MiB >"$kit/$archive_name"
  # xz instead of gzip: 4.4 MiB less to carry (the kit is near its 56 MiB); install_data restores the files.
  local gz
  for gz in "$data"/*-ubyte.gz; do zcat "$gz" | xz -9 -T2 >"$kit/data/$(basename "${gz%.gz}").xz"; done
  cp "$repo/scripts/check_torch_interop.py" "$repo/scripts/check_tensorboard.py" "$kit/scripts/"
  cp "$repo/bench/compare_fashion.py" "$repo/bench/torch_fashion.py" "$repo/bench/compare_transformers.py" \
    "$repo/bench/torch_transformer.py" "$repo/bench/torch_attention.py" "$repo/bench/profile_step.py" \
    "$repo/bench/compare_gemm.py" "$repo/bench/compare_conv.py" "$repo/bench/time_to_accuracy.py" \
    "$repo/bench/peer_runs.py" "$kit/bench/"

  # The GPU cases per test file, as the binary lists them; the test files.
  local source test_name
  : >"$kit/gpu_cases.tsv"
  for source in "$repo"/tests/test_*.cpp; do
    test_name="$(basename "$source" .cpp)"
    echo "$test_name" >>"$kit/test_files.txt"
    list_cases "$bin/kiln_tests" "--source-file=*/$test_name.cpp" '--test-case=*[gpu]*,*[gpu2]*' |
      while IFS= read -r name; do printf '%s\t%s\n' "$test_name" "$name"; done >>"$kit/gpu_cases.tsv"
  done
  {
    echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "packed: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
    echo "build: $build"
    local header
    header="$(ls /usr/local/cuda/include/cudnn_version.h /usr/local/include/cudnn_version.h \
      /usr/include/cudnn_version.h 2>/dev/null | head -n 1 || true)"
    echo "cuDNN headers: $([ -n "$header" ] && awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{printf "%s%s", sep, $3; sep="."}' "$header")"
    echo "binaries: $(ls "$stage/bin" | tr '\n' ' ')"
    echo "libraries: $(ls "$stage/lib" | tr '\n' ' ')"
    echo "fallback libraries: $(ls "$stage/lib-fallback" | tr '\n' ' ')"
  } >"$kit/COMMIT"

  local kit_kib tree_kib
  kit_kib="$(du -sk "$kit" | cut -f1)"
  # What travels: tracked files and untracked files that git does not ignore.
  tree_kib="$(git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 du -ck 2>/dev/null) | tail -n 1 | cut -f1)"
  local total_mib=$(((kit_kib + tree_kib + 1023) / 1024))
  echo "gpu_kit: kit $((kit_kib / 1024)) MiB ($(du -k "$kit/$archive_name" | cut -f1) KiB archive, $(grep -c . "$kit/gpu_cases.tsv") GPU cases) + working tree $((tree_kib / 1024)) MiB = $total_mib MiB (limit $max_travel_mib)"
  [ "$total_mib" -le "$max_travel_mib" ] || die "pack: kit plus working tree is $total_mib MiB, over the $max_travel_mib MiB that may travel"
  echo "gpu_kit: packed into $kit; on the GPU machine: carry [\".gpu-kit\"], run: bash scripts/gpu_kit.sh run"
}

# ==================================================================== shared by run and dry-run

# unpack DEST: the archive into DEST (bin/, lib/, lib-fallback/).
unpack() {
  [ -f "$kit/$archive_name" ] || die "no kit at $kit: run 'bash scripts/gpu_kit.sh pack' on the CPU machine and carry .gpu-kit"
  rm -rf "$1"
  mkdir -p "$1"
  xz -dc "$kit/$archive_name" | tar -C "$1" -xf -
}

now() { date +%s; }

# ==================================================================== run

# Folders with the CUDA libraries that torch loads there (pip's nvidia/*/lib), best first.
cuda_library_dirs() {
  local python dir package_dir
  for python in "$torch_python" /opt/*/.venv/bin/python3 python3; do
    command -v "$python" >/dev/null 2>&1 || continue
    "$python" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null || true
  done | sort -u | while IFS= read -r dir; do
    for package_dir in "$dir"/nvidia/*/lib; do [ -d "$package_dir" ] && echo "$package_dir"; done
  done
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/extras/CUPTI/lib64; do
    [ -d "$dir" ] && echo "$dir"
  done
  return 0
}

find_torch_python() {
  local python
  if [ -n "${KILN_TORCH_PYTHON:-}" ]; then echo "$KILN_TORCH_PYTHON"; return; fi
  for python in /opt/*/.venv/bin/python3; do [ -x "$python" ] && { echo "$python"; return; }; done
  echo python3
}

# Seconds left before the deadline, minus what packing the outputs needs.
left() { echo $((deadline - $(now) - 20)); }
# bounded CAP: the smaller of CAP and the time left (at least 1).
bounded() {
  local remaining
  remaining="$(left)"
  [ "$remaining" -lt "$1" ] && { [ "$remaining" -lt 1 ] && echo 1 || echo "$remaining"; } || echo "$1"
}

note() { echo "$*" | tee -a "$summary"; }
# verdict STEP VERDICT DETAIL: one line of the step table.
verdict() {
  printf '| %s | %s | %s |\n' "$1" "$2" "$3" >>"$verdicts"
  echo "gpu_kit: [$1] $2 $3"
  [ "$2" = FAILED ] && failures=$((failures + 1))
  return 0
}

# run_bounded LOG CAP COMMAND...: the command's exit status (124/137: out of time); output in LOG,
# line-buffered (stdbuf) so that a C++ program cut short still leaves the rows it printed (the
# H200 run at b59d5ed lost bench_attention's last table in a full 4 KiB stdout buffer).
run_bounded() {
  local log="$1" cap="$2"
  shift 2
  local rc=0
  timeout --kill-after=5 "$(bounded "$cap")" stdbuf -oL -eL "$@" >>"$log" 2>&1 || rc=$?
  return "$rc"
}

step_preflight() {
  local log="$logs/preflight.log" rc=0
  {
    echo "== nvidia-smi"; nvidia-smi 2>&1 || true
    echo "== compute-sanitizer: $(compute-sanitizer --version 2>&1 | tail -n 1 || echo 'not found')"
    echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "== ldd kiln_tests"; ldd "$bins/kiln_tests"
  } >>"$log" 2>&1
  if ldd "$bins/kiln_tests" 2>&1 | grep -q 'not found'; then
    verdict preflight FAILED "libraries not found: $(ldd "$bins/kiln_tests" 2>&1 | grep 'not found' | tr -s ' \t' ' ' | tr '\n' ';')"
    preflight_failed=1
    return 0
  fi
  # The cuDNN torch loads there is the one kiln runs with: older than the headers kiln was built with?
  local cudnn_runtime
  cudnn_runtime="$("$torch_python" -c 'import torch; print(torch.backends.cudnn.version())' 2>/dev/null || echo unknown)"
  echo "== cuDNN loaded by torch: $cudnn_runtime; kiln built with $(sed -n 's/^cuDNN headers: //p' "$kit/COMMIT")" >>"$log"
  # One GPU case as a smoke test: it must run, not skip; the runtime reports why CUDA is unusable.
  run_bounded "$log" 60 "$bins/kiln_tests" --no-version '--test-case=tensor: to(cuda) round trip [gpu]' --success=false || rc=$?
  if [ "$rc" -ne 0 ] || grep -q 'SKIPPED' "$log"; then
    verdict preflight FAILED "the smoke case did not pass (exit $rc): $(grep -m 3 -E 'SKIPPED|CUDA|ERROR|error' "$log" | tr '\n' ' ')"
    preflight_failed=1
  else
    verdict preflight ok "$device_line; $(grep -m 1 'compute-sanitizer' "$log" | sed 's/== //'); $(grep -m 1 'cuDNN loaded' "$log" | sed 's/== //')"
  fi
}

# The test files the tests/memcheck/racecheck steps cover.
selected_test_files() {
  if [ -n "$only_tests" ]; then
    tr ', ' '\n\n' <<<"$only_tests" | sed '/^$/d; s/\.cpp$//; s#.*/##'
  else
    cat "$kit/test_files.txt"
  fi
}

# The parallel worker of step_tests: one test file in its own process, ending by the epoch second END.
run_test_file() {
  local name="$1" end="$2" rc=0 cap
  cap=$((end - $(date +%s)))
  [ "$cap" -ge 1 ] || { echo 124 >"$logs/test_$name.rc"; echo "not started: out of time" >"$logs/test_$name.log"; return 0; }
  timeout --kill-after=5 "$cap" "$bins/kiln_tests" "--source-file=*/$name.cpp" '--test-case-exclude=*[alone]*' \
    --no-version --duration=true >"$logs/test_$name.log" 2>&1 || rc=$?
  echo "$rc" >"$logs/test_$name.rc"
}
export -f run_test_file

step_tests() {
  local files=() name end
  mapfile -t files < <(selected_test_files)
  end=$(($(now) + $(bounded 180)))
  export bins logs
  printf '%s\n' "${files[@]}" | xargs -P "$test_jobs" -I{} bash -c "run_test_file {} $end"
  # The cases marked [alone] (the one that fills the GPU to provoke a real
  # out-of-memory error) by themselves, at the end.
  local source_filter alone_rc=0
  source_filter="$(printf '*/%s.cpp,' "${files[@]}")"
  run_bounded "$logs/test_alone.log" 120 "$bins/kiln_tests" "--source-file=${source_filter%,}" '--test-case=*[alone]*' \
    --no-version --duration=true || alone_rc=$?
  echo "$alone_rc" >"$logs/test_alone.rc"
  # Verdict: exit codes, skipped GPU cases, and every listed GPU case seen running.
  local failed=() timed_out=() skipped ran_gpu=0 expected_gpu=0 missing=() file
  for file in "$logs"/test_*.rc; do
    name="$(basename "$file" .rc)"
    case "$(cat "$file")" in
      0) ;;
      124 | 137) timed_out+=("${name#test_}") ;;
      *) failed+=("${name#test_}") ;;
    esac
  done
  skipped="$(cat "$logs"/test_*.log | grep -c 'SKIPPED (no GPU' || true)"
  local test_name case_name gpus
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  while IFS=$'\t' read -r test_name case_name; do
    printf '%s\n' "${files[@]}" | grep -qx "$test_name" || continue
    [[ "$case_name" == *'[gpu2]'* ]] && [ "$gpus" -lt 2 ] && continue  # skips on one GPU, by design
    expected_gpu=$((expected_gpu + 1))
    # (grep reads the files itself: `cat | grep -q` would make cat die of SIGPIPE, failing the pipeline)
    if grep -qF "s: $case_name" "$logs/test_$test_name.log" "$logs/test_alone.log" 2>/dev/null; then
      ran_gpu=$((ran_gpu + 1))
    else
      missing+=("$case_name")
    fi
  done <"$kit/gpu_cases.tsv"
  {
    [ $((${#failed[@]} + ${#timed_out[@]})) -eq 0 ] || { echo; echo "## Failing test files"; }
    for name in "${failed[@]}" "${timed_out[@]}"; do
      echo
      echo "### $name ($(cat "$logs/test_$name.rc" 2>/dev/null || echo '?'))"
      echo '```'
      { grep -E -m 40 -A 3 'TEST CASE:|ERROR:|FATAL ERROR|error:|Error|SKIPPED' "$logs/test_$name.log" || true; } |
        head -n 60  # (a log with no match, e.g. "not started: out of time", must not stop the run)
      echo '```'
    done
    [ ${#missing[@]} -eq 0 ] || { echo; echo "GPU cases that did not report running: ${missing[*]}"; }
  } >>"$details"
  local detail="${#files[@]} files; GPU cases ran $ran_gpu of $expected_gpu; GPU skips $skipped"
  [ ${#failed[@]} -eq 0 ] || detail="$detail; failed: ${failed[*]}"
  [ ${#timed_out[@]} -eq 0 ] || detail="$detail; out of time: ${timed_out[*]}"
  if [ ${#failed[@]} -gt 0 ] || [ ${#timed_out[@]} -gt 0 ] || { [ "$skipped" -gt 0 ] && [ "$rehearsal" -eq 0 ]; } ||
    { [ "$ran_gpu" -lt "$expected_gpu" ] && [ "$rehearsal" -eq 0 ]; }; then
    verdict tests FAILED "$detail"
  else
    verdict tests ok "$detail"
  fi
}

step_bench() {
  local bench rc out="$OUT/bench.md" ran=() step_end=$(($(now) + 180))  # the whole step: 3 minutes at most
  echo "# kiln GPU benchmarks, $(date -u '+%Y-%m-%d'), $device_line, commit $commit" >"$out"
  # GPU rows only where a bench has both: the CPU rows are measured on the CPU machine.
  # bench_attention's 20 repeats of 12 shapes took over a minute on the H200: 5 suffice for a median.
  local -A gpu_only=([bench_kernels]=--gpu-only [bench_gemm]=--gpu [bench_attention]="--gpu-only --repeats 5")
  # The issue's figures first (kernels, GEMM, the fused AdamW step), then the rest as time allows.
  # GEMM and convolutions run through their compare scripts (kiln's rows, then torch on the same rows,
  # one table with the ratio) when this machine's torch sees the GPU; else kiln's rows alone.
  local torch_gpu=0
  "$torch_python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1 && torch_gpu=1
  # (bench_conv is CPU-only, and its figures belong to the CPU machine)
  for bench in bench_kernels bench_gemm bench_optim bench_conv_gpu bench_attention bench_checkpointing \
    bench_dataloader; do
    if [ "$(left)" -lt 15 ] || [ $((step_end - $(now))) -lt 10 ]; then not_run+=("bench: $bench"); continue; fi
    rc=0
    {
      echo; echo "## $bench"; echo '```'
    } >>"$out"
    if [ "$torch_gpu" -eq 1 ] && [ "$bench" = bench_gemm ]; then
      run_bounded "$out" $((step_end - $(now))) env KILN_COMMIT="$commit" "$torch_python" \
        "$kit/bench/compare_gemm.py" --kiln "$bins/bench_gemm" || rc=$?
    elif [ "$torch_gpu" -eq 1 ] && [ "$bench" = bench_conv_gpu ]; then
      run_bounded "$out" $((step_end - $(now))) env KILN_COMMIT="$commit" "$torch_python" \
        "$kit/bench/compare_conv.py" --kiln "$bins/bench_conv_gpu" --save-rows "$logs/conv_rows.jsonl" || rc=$?
    else
      run_bounded "$out" $((step_end - $(now))) "$bins/$bench" ${gpu_only[$bench]:-} || rc=$?
    fi
    echo '```' >>"$out"
    [ "$rc" -eq 0 ] && ran+=("$bench") || ran+=("$bench(exit $rc)")
  done
  local failed_benches=() ok_benches=() entry
  for entry in "${ran[@]}"; do
    [[ "$entry" == *'(exit '* ]] && failed_benches+=("$entry") || ok_benches+=("$entry")
  done
  if [ ${#failed_benches[@]} -gt 0 ]; then
    verdict bench FAILED "${failed_benches[*]}; ran: ${ok_benches[*]:-none}"
  else
    verdict bench ok "${ran[*]}"
  fi
}

step_compare() {
  local out="$OUT/compare.md" rc=0 compile=()
  [ "$with_compile" -eq 1 ] && compile=(--torch-compile)
  if ! "$torch_python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >>"$logs/compare.log" 2>&1; then
    verdict compare FAILED "$torch_python has no torch that sees the GPU (see compare.log)"
    return 0
  fi
  # torch.compile (from cold: minutes) only for the FashionCNN and GPT-2 rows, where issue 22 and
  # issue 21 set their goals against it: reduce-overhead (CUDA graphs) for the launch-bound FashionCNN.
  local common=(--accelerator gpu --python "$torch_python" --kiln "$bins/bench_fashion")
  local cap=75 compiled_cap=75
  [ "$with_compile" -eq 1 ] && compiled_cap=200
  local cnn_compile=()
  [ "$with_compile" -eq 1 ] && cnn_compile=(--torch-compile --torch-compile-mode reduce-overhead)
  local rc2=0 rc3=0 rc4=0 rc5=0
  # First, issue 22's headline: FashionCNN 16-mixed with the step as one CUDA graph, kiln eager and torch eager
  # (this one run gives all three: no separate eager-only FashionCNN run).
  run_bounded "$out" "$compiled_cap" env KILN_COMMIT="$commit" "$torch_python" "$kit/bench/compare_fashion.py" \
    --model cnn --batch-size 64 --precision 16-mixed --limit-train-batches 600 --cuda-graph "${common[@]}" \
    "${cnn_compile[@]}" || rc5=$?
  # Both ResNet-9 runs tune cuDNN on both sides (--cudnn-benchmark: kiln's set_cudnn_benchmark, torch's
  # cudnn.benchmark), as speed runs do; the H200 at b59d5ed ran them without it.
  run_bounded "$out" "$cap" env KILN_COMMIT="$commit" "$torch_python" "$kit/bench/compare_fashion.py" \
    --model resnet9 --batch-size 512 --precision bf16-mixed --limit-train-batches 60 --cudnn-benchmark --cudnn-api legacy \
    "${common[@]}" || rc2=$?
  # Issue 22's recipe: ResNet-9 with the model and images channels-last on both sides. Both ResNet-9 runs
  # also time kiln with cuDNN's legacy API (a row each; bf16 takes the graph API by default), as
  # bench_conv_gpu does per convolution.
  local rc6=0
  run_bounded "$out" "$cap" env KILN_COMMIT="$commit" "$torch_python" "$kit/bench/compare_fashion.py" \
    --model resnet9 --batch-size 512 --precision bf16-mixed --limit-train-batches 60 --channels-last \
    --cudnn-benchmark --cudnn-api legacy "${common[@]}" || rc6=$?
  # GPT-2 124M's training step, batch 16 x 1024 in bf16-mixed, and attention against torch's SDPA. kiln
  # also replays the step as one CUDA graph (--cuda-graph): its gap to kiln eager is the host's share; and
  # runs it with its attention on wgmma (forward shapes 8 and 12, the second warp-specialized, with the
  # wgmma backward; not yet the default), each such run killed after 30 s should a kernel hang.
  run_bounded "$out" "$((compiled_cap + 55))" env KILN_COMMIT="$commit" "$torch_python" \
    "$kit/bench/compare_transformers.py" --model gpt2-124m --batch-size 16 --steps 10 --rounds 1 --accelerator gpu \
    --precision bf16-mixed --cuda-graph --wgmma-attention 8,12 --optional-timeout 30 --python "$torch_python" \
    --kiln "$bins/bench_transformer" "${compile[@]}" || rc3=$?
  run_bounded "$out" 60 "$torch_python" "$kit/bench/torch_attention.py" --dtype bf16 || rc4=$?
  if [ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$rc3" -eq 0 ] && [ "$rc4" -eq 0 ] && [ "$rc5" -eq 0 ] &&
    [ "$rc6" -eq 0 ]; then
    verdict compare ok "FashionCNN 16-mixed (kiln eager and CUDA graph), ResNet-9 bf16-mixed (NCHW, channels-last), GPT-2 124M bf16-mixed and SDPA against torch eager${compile:+ and torch.compile}"
  else
    verdict compare FAILED "ResNet-9 exit $rc2, GPT-2 exit $rc3, SDPA exit $rc4, FashionCNN with a CUDA graph exit $rc5, ResNet-9 channels-last exit $rc6 (see compare.md)"
  fi
}

# One GPT-2 124M training step (batch 16 x 1024, bf16-mixed), one ResNet-9
# iteration (batch 512, bf16-mixed, channels-last: issue 22's recipe) and one
# FashionCNN iteration (batch 64, 16-mixed) of kiln and of PyTorch eager under
# ncu, kernel by kernel: where kiln's step loses to torch's.
# Traced with bench/kernel_trace.cpp's CUPTI injection library (seconds per run; ncu, which
# serializes kernel by kernel, took minutes: `profile_step.py --tracer ncu` by hand).
step_profile() {
  local out="$OUT/profile.md" rc=0 rc2=0 rc3=0
  run_bounded "$out" 90 "$torch_python" "$kit/bench/profile_step.py" --kiln "$bins/bench_transformer" \
    --python "$torch_python" --out-dir "$logs/profile" || rc=$?
  echo >>"$out"
  run_bounded "$out" 75 "$torch_python" "$kit/bench/profile_step.py" --model resnet9 --channels-last \
    --kiln "$bins/bench_fashion" --python "$torch_python" --out-dir "$logs/profile" || rc2=$?
  # FashionCNN batch 64 16-mixed: issue 22's launch-bound case, where the kernel count and idle time decide.
  echo >>"$out"
  run_bounded "$out" 45 "$torch_python" "$kit/bench/profile_step.py" --model cnn --precision 16-mixed \
    --kiln "$bins/bench_fashion" --python "$torch_python" --out-dir "$logs/profile" || rc3=$?
  if [ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$rc3" -eq 0 ]; then
    verdict profile ok "GPT-2 124M step, ResNet-9 channels-last and FashionCNN 16-mixed iterations: GPU busy and idle, kernel time by family, kiln and torch eager (profile.md)"
  else
    verdict profile FAILED "GPT-2 exit $rc, ResNet-9 exit $rc2, FashionCNN exit $rc3 (see profile.md)"
  fi
}

# Issue 22's time to accuracy: ResNet-9 bf16-mixed channels-last (its benchmark's recipe) to 93%
# and 94% test accuracy, kiln's train_fashion against torch_fashion.py with the same recipe, one seed each.
step_accuracy() {
  local out="$OUT/accuracy.md" rc=0 step_start
  step_start="$(now)"
  run_bounded "$out" 240 env KILN_COMMIT="$commit" "$torch_python" "$kit/bench/time_to_accuracy.py" \
    --accelerator gpu --model resnet9 --precision bf16-mixed --channels-last --epochs 10 --seeds 1 --targets 93 94 \
    --kiln "$bins/train_fashion" --python "$torch_python" || rc=$?
  # The 10-epoch recipe reaching 94% is a guess: when a side falls short, the
  # same recipe over 20 epochs (OneCycle spans the longer schedule), if it fits.
  # It takes about twice the first run's time: started only when that fits, and a retry cut short
  # leaves the first run's verdict standing.
  local first_seconds=$(($(now) - step_start)) retry_rc=0
  if [ "$rc" -eq 0 ] && grep -q '^94%: not reached' "$out" &&
    [ $((240 - ($(now) - step_start))) -gt $((first_seconds * 22 / 10)) ] && [ "$(left)" -gt $((first_seconds * 22 / 10)) ]; then
    echo >>"$out"
    echo "(the same recipe over 20 epochs:)" >>"$out"
    run_bounded "$out" $((240 - ($(now) - step_start))) env KILN_COMMIT="$commit" "$torch_python" \
      "$kit/bench/time_to_accuracy.py" --accelerator gpu --model resnet9 --precision bf16-mixed --channels-last --epochs 20 \
      --seeds 1 --targets 93 94 --kiln "$bins/train_fashion" --python "$torch_python" || retry_rc=$?
    [ "$retry_rc" -eq 0 ] || echo "(the 20-epoch run ended early: exit $retry_rc)" >>"$out"
  fi
  if [ "$rc" -eq 0 ]; then
    verdict accuracy ok "$(grep '^| kiln\|sooner\|not reached by' "$out" | tr -s ' ' | tr '\n' ' ')"
  else
    verdict accuracy FAILED "exit $rc (see accuracy.md)"
  fi
}

step_train() {
  local out="$OUT/train.md" rc=0 start
  start="$(now)"
  echo '```' >"$out"
  run_bounded "$out" 300 "$bins/train_fashion" --accelerator gpu --default-root-dir "$work/runs" --enable-progress-bar false || rc=$?
  echo '```' >>"$out"
  echo "wall time: $(($(now) - start)) s, exit $rc" >>"$out"
  if [ "$rc" -eq 0 ]; then
    verdict train ok "$(grep -m 1 -i 'test accuracy\|test_acc' "$out" | tr -s ' ') in $(($(now) - start)) s"
  else
    verdict train FAILED "exit $rc after $(($(now) - start)) s (see train.md)"
  fi
}

# The parallel worker of step_sanitizer: compute-sanitizer TOOL over one file's GPU cases, ending by
# the epoch second END; its exit status in <tool>_<name>.rc ("not started" when too little time is left).
run_sanitizer_file() {
  local name="$1" tool="$2" end="$3" rc=0 cap no_caching=1
  local log="$logs/${tool}_$name.log"
  cap=$((end - $(date +%s)))
  [ "$cap" -ge 20 ] || { echo "not started" >"$logs/${tool}_$name.rc"; return 0; }
  # Caching off so that the sanitizer sees the end of each tensor; CUDA graphs
  # need the caching allocator's pools, so a file with graph cases keeps it on.
  grep "^$name	" "$kit/gpu_cases.tsv" | grep -qi 'graph' && no_caching=0
  # (not line-buffered: compute-sanitizer preloads its own library into the program)
  KILN_NO_CUDA_MEMORY_CACHING=$no_caching timeout --kill-after=5 "$cap" "$sanitizer" --tool "$tool" \
    --error-exitcode 86 --target-processes application-only --report-api-errors no --print-limit 50 \
    "$bins/kiln_tests" "--source-file=*/$name.cpp" '--test-case=*[gpu]*' '--test-case-exclude=*[alone]*' \
    --no-version >"$log" 2>&1 || rc=$?
  echo "$rc" >"$logs/${tool}_$name.rc"
}
export -f run_sanitizer_file

# step_sanitizer TOOL: compute-sanitizer over the GPU cases, one process per file, sanitizer_jobs
# files at a time (the H200 run at b59d5ed checked 5 files in 230 s one at a time), the files whose
# GPU cases were quickest first (from the tests step: the most files checked before the deadline),
# with the caching allocator off, child processes (the CLI tests' train_fashion runs) unchecked.
step_sanitizer() {
  local tool="$1"
  sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
  [ -n "$sanitizer" ] || { verdict "$tool" FAILED "compute-sanitizer not found"; return 0; }
  local files=() name
  mapfile -t files < <(
    selected_test_files | while IFS= read -r name; do
      # Files with GPU cases outside [alone] (the sanitizer step runs no [alone] case).
      grep "^$name	" "$kit/gpu_cases.tsv" | grep -qv '\[alone\]' || continue
      # The seconds its GPU cases took in the tests step (0 when unknown).
      local seconds
      # (grep finds nothing for a file whose only GPU case runs alone: not a failure under pipefail)
      seconds="$({ grep -F '[gpu' "$logs/test_$name.log" 2>/dev/null || true; } | awk '$2 == "s:" {sum += $1} END {printf "%.3f", sum + 0}')"
      echo "$seconds $name"
    done | sort -n | cut -d' ' -f2)
  local end=$(($(now) + $(left)))
  export bins logs kit sanitizer
  rm -f "$logs/${tool}"_*.rc
  [ ${#files[@]} -eq 0 ] || printf '%s\n' "${files[@]}" | xargs -P "$sanitizer_jobs" -I{} bash -c "run_sanitizer_file {} $tool $end"
  local ran=() errors=0 file_errors rc log
  for name in "${files[@]}"; do
    log="$logs/${tool}_$name.log"
    rc="$(cat "$logs/${tool}_$name.rc" 2>/dev/null || echo 'not started')"
    if [ "$rc" = "not started" ]; then not_run+=("$tool: $name"); continue; fi
    file_errors="$(grep -m 1 -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')"
    # A file whose GPU cases made no CUDA call (test_gpu_support's marker checks): nothing to check.
    if [ "$rc" -ne 0 ] && grep -q 'terminated before first instrumented API call' "$log" &&
      grep -q 'Status: SUCCESS' "$log"; then
      rc=0 file_errors="no CUDA call"
    fi
    case "$rc" in
      124 | 137) ran+=("$name(out of time)"); errors=$((errors + 1)) ;;
      0) ran+=("$name:$file_errors") ;;
      *) ran+=("$name:$file_errors(exit $rc)"); errors=$((errors + 1))
         { echo; echo "### $tool: $name (exit $rc)"; echo '```'; grep -m 30 -E '=========|ERROR' "$log" || true; echo '```'; } >>"$details" ;;
    esac
  done
  if [ "$errors" -gt 0 ]; then verdict "$tool" FAILED "${ran[*]}"; else verdict "$tool" ok "${ran[*]:-nothing ran}"; fi
}

# summary.md from what the steps wrote so far (after each step, and at the end).
write_summary() {
  {
    echo "# kiln GPU kit: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo
    echo "- device: $device_line"
    echo "- driver/runtime: $(nvidia-smi 2>/dev/null | grep -o 'Driver Version: [0-9.]*.*CUDA Version: [0-9.]*' | tr -s ' ' || echo 'nvidia-smi not found')"
    echo "- kit: $(tr '\n' ';' <"$kit/COMMIT" | sed 's/;/; /g')"
    echo "- steps: ${steps[*]}${only_tests:+ (tests: $only_tests)}; deadline ${deadline_s} s; used $((deadline_s - deadline + $(now))) s"
    echo "- library path: $LD_LIBRARY_PATH"
    echo
    cat "$summary"
    echo "| step | verdict | detail |"
    echo "|---|---|---|"
    cat "$verdicts"
    echo
    if [ ${#not_run[@]} -gt 0 ]; then echo "Not run: ${not_run[*]}"; else echo "Everything asked for ran (so far)."; fi
    cat "$details"
  } >"$OUT/summary.md.tmp" && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
}

# On any exit of a run (the end, an error, a TERM from a deadline outside): the summary and the logs.
finish_run() {
  local status=$?
  trap - EXIT
  trap '' TERM INT
  [ "$status" -eq 0 ] || note "gpu_kit: the run stopped early (exit $status): the verdicts below are those it reached"
  write_summary || true
  tar -C "$work" -cf - logs | xz -6 >"$OUT/logs.tar.xz" || true
  echo "gpu_kit: summary in $OUT/summary.md; $failures step(s) failed"
  [ "$rehearsal" -eq 0 ] || rm -rf "$work"
  [ "$status" -ne 0 ] || [ "$failures" -eq 0 ] || status=1
  exit "$status"
}

cmd_run() {
  steps=()
  only_tests=""
  with_compile=0
  rehearsal=0
  deadline_s=450
  while [ $# -gt 0 ]; do
    case "$1" in
      --tests) only_tests="$2"; shift 2 ;;
      --deadline) deadline_s="$2"; shift 2 ;;
      --rehearsal) rehearsal=1; shift ;;  # dry-run's: no GPU expected, skips are not failures
      preflight | tests | bench | compare | memcheck | racecheck | train | profile | accuracy) steps+=("$1"); shift ;;
      compile) with_compile=1; steps+=(compare); shift ;;
      *) die "run: unknown argument '$1' (steps: preflight tests bench compare memcheck racecheck compile train profile accuracy; --tests FILES, --deadline SECONDS)" ;;
    esac
  done
  [ ${#steps[@]} -gt 0 ] || steps=(preflight tests bench compare memcheck)
  deadline=$(($(now) + deadline_s))
  OUT="${OUT:-/tmp/kiln-kit-out}"
  mkdir -p "$OUT"
  work="$(mktemp -d /tmp/kiln-kit.XXXXXX)"
  logs="$work/logs"
  mkdir -p "$logs"
  summary="$work/summary-head.md"
  verdicts="$work/verdicts.md"
  details="$work/details.md"
  : >"$summary"; : >"$verdicts"; : >"$details"
  failures=0
  not_run=()
  # (every step's header names the GPU, with or without the preflight step)
  device_line="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 || true)"
  [ -n "$device_line" ] || device_line="no GPU seen (nvidia-smi: $(command -v nvidia-smi || echo 'not found'))"
  commit="$(sed -n 's/^commit: //p' "$kit/COMMIT" 2>/dev/null || echo unknown)"

  trap finish_run EXIT
  trap 'exit 143' TERM INT
  unpack "$work/kit"
  bins="$work/kit/bin"
  torch_python="$(find_torch_python)"
  local dirs
  dirs="$(cuda_library_dirs | tr '\n' ':')"
  export LD_LIBRARY_PATH="${dirs}$work/kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The image's libstdc++/libgomp when they are recent enough; the kit's otherwise.
  if ldd "$bins/kiln_tests" 2>&1 | grep -qE 'not found|version .* not found'; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$work/kit/lib-fallback"
    ldd "$bins/kiln_tests" 2>&1 | grep -q 'version .* not found' && export LD_LIBRARY_PATH="$work/kit/lib-fallback:$LD_LIBRARY_PATH"
  fi
  # Tests find the interop/TensorBoard scripts and the peer Python here.
  export KILN_SOURCE_DIR="$kit"
  "$torch_python" -c 'import torch' >/dev/null 2>&1 && export KILN_TORCH_PYTHON="$torch_python"
  "$torch_python" -c 'import tensorboard' >/dev/null 2>&1 && export KILN_TENSORBOARD_PYTHON="$torch_python"
  export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2
  export PYTHONUNBUFFERED=1  # a Python step cut short still leaves its rows in its .md
  # A kit packed before the tree's last change to its scripts or GPU cases: say so first.
  local stale=() script
  for script in "$kit"/bench/*.py "$kit"/scripts/*.py; do
    cmp -s "$script" "$repo/${script#"$kit"/}" || stale+=("${script#"$kit"/}")
  done
  [ "$(grep -c . "$kit/gpu_cases.tsv")" -eq "$(source_gpu_cases | grep -c .)" ] || stale+=("the GPU case list")
  [ ${#stale[@]} -eq 0 ] || note "WARNING: the kit is older than this tree (${stale[*]} differ): pack again on the CPU machine"
  preflight_failed=0
  # (nproc obeys OMP_NUM_THREADS, set to 2 above: ask for every core, or the files run one at a time)
  test_jobs=$(($(nproc --all) / 2))
  [ "$test_jobs" -ge 1 ] || test_jobs=1
  # compute-sanitizer runs on the host as much as on the GPU: 4 files at a time on 16 cores.
  sanitizer_jobs="${KILN_KIT_SANITIZER_JOBS:-4}"
  # Fashion-MNIST where kiln and torch_fashion.py look by default.
  local data=/usr/share/datasets/fashion-mnist
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    install_data "$data" 2>/dev/null ||
      note "warning: could not install Fashion-MNIST into $data (not root?): the cases that read it fail"
  fi

  local step
  for step in "${steps[@]}"; do
    if [ "$preflight_failed" -eq 1 ]; then not_run+=("step $step (the preflight failed)"); continue; fi
    if [ "$(left)" -lt 10 ]; then not_run+=("step $step (out of time)"); continue; fi
    case "$step" in
      preflight) step_preflight ;;
      tests) step_tests ;;
      bench) step_bench ;;
      compare) step_compare ;;
      train) step_train ;;
      profile) step_profile ;;
      accuracy) step_accuracy ;;
      memcheck | racecheck) step_sanitizer "$step" ;;
    esac
    write_summary
  done
  # finish_run (the EXIT trap) writes the summary and the logs, and sets the exit status.
}

# ==================================================================== dry-run

cmd_dry_run() {
  local scratch
  scratch="$(mktemp -d /tmp/kiln-kit-dry.XXXXXX)"
  trap 'rm -rf "$scratch"' RETURN
  local start
  start="$(now)"
  unpack "$scratch"
  local bins="$scratch/bin" program line problems=0
  # Every library resolves, and the ones the kit carries resolve into the kit. The CUDA
  # libraries come from this machine's toolkit here (from torch's venv there).
  local path="$scratch/lib:/usr/local/cuda/lib64"
  for program in "$bins"/*; do
    while read -r line; do
      echo "gpu_kit: dry-run: $(basename "$program"): $line" >&2
      problems=$((problems + 1))
    done < <(LD_LIBRARY_PATH="$path" ldd "$program" | awk -v kit="$scratch/lib/" '
      /not found/ {print; next}
      $2 == "=>" && $3 ~ /^\// && $1 ~ /^lib(gloo|hiredis|ibverbs|nl-)/ && index($3, kit) != 1 {print $1 " resolves outside the kit: " $3}')
  done
  [ "$problems" -eq 0 ] || die "dry-run: $problems library problems (above)"
  # A few CPU test cases from the unpacked binary.
  LD_LIBRARY_PATH="$path" "$bins/kiln_tests" --no-version --source-file='*/test_tensor.cpp' >"$scratch/tensor.log" 2>&1 ||
    { cat "$scratch/tensor.log" >&2; die "dry-run: the unpacked kiln_tests failed test_tensor"; }
  # The kit's data set is whole: a short training run reads it.
  install_data "$scratch/data" || die "dry-run: the kit's data set does not unpack"
  LD_LIBRARY_PATH="$path" "$bins/train_fashion" --fast-dev-run 2 --num-workers 0 --data-dir "$scratch/data" \
    --default-root-dir "$scratch/runs" >"$scratch/train.log" 2>&1 ||
    { cat "$scratch/train.log" >&2; die "dry-run: train_fashion on the kit's data failed"; }
  # The profile step's CUPTI injection library is in the kit and loads (recording needs a GPU).
  [ -f "$bins/libkiln_kernel_trace.so" ] || die "dry-run: the kit has no libkiln_kernel_trace.so (the profile step's tracer)"
  python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1]).InitializeInjection' "$bins/libkiln_kernel_trace.so" ||
    die "dry-run: libkiln_kernel_trace.so does not load or lacks InitializeInjection"
  # The GPU cases: the sources, the binary and the kit's list agree.
  local in_sources in_binary in_kit
  in_sources="$(source_gpu_cases | grep -c . || true)"
  in_binary="$(LD_LIBRARY_PATH="$path" list_cases "$bins/kiln_tests" '--test-case=*[gpu]*,*[gpu2]*' | grep -c . || true)"
  in_kit="$(grep -c . "$kit/gpu_cases.tsv" || true)"
  if [ "$in_sources" -ne "$in_binary" ] || [ "$in_binary" -ne "$in_kit" ]; then
    diff <(source_gpu_cases) <(LD_LIBRARY_PATH="$path" list_cases "$bins/kiln_tests" '--test-case=*[gpu]*,*[gpu2]*' | sort) >&2 || true
    die "dry-run: GPU cases: $in_sources in the sources, $in_binary in the binary, $in_kit in the kit's list"
  fi
  # The run step's own plumbing on two files, without a GPU (skips expected).
  if ! OUT="$scratch/out" bash "$0" run tests --tests test_tensor,test_allocator --rehearsal --deadline 120 >"$scratch/run.log" 2>&1; then
    cat "$scratch/run.log" "$scratch/out/summary.md" >&2 2>/dev/null || true
    die "dry-run: 'run tests' failed in rehearsal"
  fi
  grep -q '| tests | ok |' "$scratch/out/summary.md" || { cat "$scratch/out/summary.md" >&2; die "dry-run: the rehearsal's summary has no tests verdict"; }
  [ -s "$scratch/out/logs.tar.xz" ] || die "dry-run: the rehearsal wrote no logs.tar.xz"
  echo "gpu_kit: dry-run ok in $(($(now) - start)) s: libraries resolve, the kernel tracer loads, test_tensor passes from the kit, train_fashion reads the kit's data, $in_binary GPU cases (sources = binary = kit list), the run step's plumbing works"
}

command="$1"
shift
case "$command" in
  pack) cmd_pack "$@" ;;
  run) cmd_run "$@" ;;
  dry-run) cmd_dry_run "$@" ;;
  *) die "unknown command '$command' (expected pack, dry-run or run)" ;;
esac
