#!/usr/bin/env bash
# Runs every emulated family (run_kernels.sh, then run.sh for the tensor-core
# attention) and prints one line per family (passed / FAILED, seconds), then
# the __global__ kernels of kernels/cuda/*.cu* that no emulated launch named
# (EMU_TRACE=1 records each launch's kernel expression): kernels nothing on
# the CPU has ever run. Launches through a variable (optim.cu's launch_chunks,
# attention_common.cuh's launch) name the variable, so those files' kernels
# are listed as unresolved rather than missing. A development tool for
# sessions without a GPU, not part of CI; about 50 minutes on two cores.
#   bash scripts/cuda_emu/run_all.sh            # logs in $KILN_EMU_DIR/all (default /tmp/kiln-cuda-emu/all)
#   bash scripts/cuda_emu/run_all.sh quick      # without elementwise, attention and run.sh (about 12 minutes)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
logs="${KILN_EMU_DIR:-/tmp/kiln-cuda-emu}/all"
mkdir -p "$logs"
families=(selftest norm batch_norm indexing index_add scatter_add softmax softmax_paths nll_loss random reduction
          reduce_grad pool transforms optim scan triangular sort)
[ "${1:-}" = quick ] || families+=(elementwise attention)
failed=0
for family in "${families[@]}"; do
  start=$(date +%s)
  if EMU_TRACE=1 bash "$here/run_kernels.sh" "$family" >"$logs/$family.log" 2>&1; then status=passed; else status=FAILED; failed=1; fi
  printf '%-14s %-7s %5d s   %s\n' "$family" "$status" $(( $(date +%s) - start )) "$(grep -v '^launch ' "$logs/$family.log" | grep -m1 'checks failed\|failures' || true)"
done
if [ "${1:-}" != quick ]; then
  start=$(date +%s)
  if bash "$here/run.sh" >"$logs/attention_tc.log" 2>&1; then status=passed; else status=FAILED; failed=1; fi
  printf '%-14s %-7s %5d s   %s\n' attention_tc "$status" $(( $(date +%s) - start )) "$(tail -n 1 "$logs/attention_tc.log")"
  # The wgmma forward (candidate shape 7) and backward on their two head dims.
  start=$(date +%s)
  wgmma_log="$logs/attention_wgmma.log"
  if KILN_ATTENTION_FORWARD_SHAPE=7 KILN_ATTENTION_WGMMA_BACKWARD=1 bash "$here/run.sh" 64 >"$wgmma_log" 2>&1 &&
    KILN_ATTENTION_FORWARD_SHAPE=7 KILN_ATTENTION_WGMMA_BACKWARD=1 bash "$here/run.sh" 128 >>"$wgmma_log" 2>&1; then
    status=passed
  else
    status=FAILED
    failed=1
  fi
  printf '%-14s %-7s %5d s   %s\n' attention_wgmma "$status" $(( $(date +%s) - start )) "$(tail -n 1 "$wgmma_log")"
  # The warp-specialized forward (shapes 12 and 13), its producer's copies landing late at random
  # (up to 40 ms): a consumer that read a stage before its mbarrier said so would read bytes in flight.
  start=$(date +%s)
  pingpong_log="$logs/attention_pingpong.log"
  export EMU_COPY_DELAY_US=20000 EMU_COPY_DELAY_FROM=256
  if KILN_ATTENTION_FORWARD_SHAPE=12 bash "$here/run.sh" 64 >"$pingpong_log" 2>&1 &&
    KILN_ATTENTION_FORWARD_SHAPE=12 bash "$here/run.sh" 128 >>"$pingpong_log" 2>&1 &&
    EMU_COPY_DELAY_FROM=384 KILN_ATTENTION_FORWARD_SHAPE=13 bash "$here/run.sh" 64 >>"$pingpong_log" 2>&1; then
    status=passed
  else
    status=FAILED
    failed=1
  fi
  unset EMU_COPY_DELAY_US EMU_COPY_DELAY_FROM
  printf '%-14s %-7s %5d s   %s\n' attention_ws "$status" $(( $(date +%s) - start )) "$(tail -n 1 "$pingpong_log")"
fi
# Kernels never launched: every __global__ name, against the names the traces saw.
launched="$(cat "$logs"/*.log | sed -n 's/^launch \([A-Za-z_0-9:]*\).*/\1/p' | sed 's/.*:://' | sort -u)"
echo "-- __global__ kernels no emulated launch named (attention_tc*: run.sh, which does not trace):"
for file in "$root"/kernels/cuda/*.cu "$root"/kernels/cuda/*.cuh; do
  name_of_file="$(basename "$file")"
  case "$name_of_file" in attention_tc*) continue ;; esac
  missing="$(grep -zo '__global__ void\( __launch_bounds__([^)]*)\)\?[[:space:]]*[A-Za-z_0-9]*' "$file" | tr '\0' '\n' |
    sed 's/.*[[:space:])]\([A-Za-z_0-9]*\)$/\1/' | sort -u | while read -r kernel; do
      [ -n "$kernel" ] && ! grep -qx "$kernel" <<<"$launched" && echo "$kernel"
    done | tr '\n' ' ')"
  [ -z "$missing" ] && continue
  case "$name_of_file" in
    optim.cu | attention.cu) echo "  $name_of_file (launched through a variable, so the trace cannot name them): $missing" ;;
    *) echo "  $name_of_file: $missing" ;;
  esac
done
exit $failed
