#!/usr/bin/env bash
# Runs a plain CUDA C++ kernel file's kernels on the CPU (gen_cu.py rewrites the
# launches and __shared__ arrays, emu_cuda.h emulates threads, warps, shuffles,
# atomics and guarded memory) and compares them with a float64 reference.
# A development tool for sessions without a GPU, not part of CI.
#   bash scripts/cuda_emu/run_kernels.sh norm       # layer norm, forward and backward (test_norm.cpp)
#   bash scripts/cuda_emu/run_kernels.sh indexing   # gather_rows_kernel / gather_kernel (test_indexing.cpp)
#   bash scripts/cuda_emu/run_kernels.sh index_add  # index_add_sorted_cuda: the embedding/index_select backward,
#                                                   # both run kernels, vs a host reference (test_index_add.cpp)
#   bash scripts/cuda_emu/run_kernels.sh scatter_add  # scatter_add_cuda (atomic) and scatter_add_sorted_cuda (keys, sort,
#                                                   # runs): gather's backward, vs a host reference (test_scatter_add.cpp)
#   bash scripts/cuda_emu/run_kernels.sh nll_loss   # cross_entropy.cu's nll_loss forward/backward vs kernels/cpu/softmax.cpp
#                                                   # bit for bit (test_nll_loss.cpp)
#   bash scripts/cuda_emu/run_kernels.sh random     # dropout forward/backward, uniform/normal/randint vs
#                                                   # kernels/cpu/random.cpp bit for bit (test_random.cpp)
#   bash scripts/cuda_emu/run_kernels.sh reduction  # reduce_cuda (sum/mean/var/amax/amin/arg/norm/all) vs
#                                                   # kernels/cpu/reduction.cpp (test_reduction.cpp)
#   bash scripts/cuda_emu/run_kernels.sh reduce_grad  # reduce_grad_kernel (every reduction's backward) vs
#                                                   # kernels/cpu/reduction.cpp bit for bit (test_reduce_grad.cpp)
#   bash scripts/cuda_emu/run_kernels.sh pool       # max/avg/adaptive pooling, forward and backward, channels-last
#                                                   # vs kernels/cpu/pool.cpp and vs pool.cu's NCHW (test_pool.cpp)
#   bash scripts/cuda_emu/run_kernels.sh batch_norm # batch_norm.cu (+ fused ReLU), forward/backward, NCHW and
#                                                   # rows/NHWC vs kernels/cpu/batch_norm.cpp and float64; the fused
#                                                   # 2x2 max pool vs batch norm then pool.cpp (test_batch_norm.cpp; `pool`)
#   bash scripts/cuda_emu/run_kernels.sh transforms # crop/flip/normalize/erasing/gather_rows vs kernels/cpu/transforms.cpp
#                                                   # bit for bit (test_transforms.cpp)
#   bash scripts/cuda_emu/run_kernels.sh optim      # optim.cu + multi_tensor_apply.cuh (optimizers, step prologue, grad scaler,
#                                                   # clipping, averaging, schedules) vs kernels/cpu/optim.cpp (test_optim.cpp)
#   bash scripts/cuda_emu/run_kernels.sh elementwise # elementwise.cu + elementwise_binary.cu + copy.cu through
#                       # elementwise_launch.cuh (unary/binary/where/casts; dense, every alignment, strided,
#                       # broadcast, channels-last) vs kernels/cpu/elementwise*.cpp, copy.cpp (test_elementwise.cpp)
#   bash scripts/cuda_emu/run_kernels.sh scan       # cumsum vs kernels/cpu/scan.cpp bit for bit (test_scan.cpp)
#   bash scripts/cuda_emu/run_kernels.sh triangular # tril/triu vs kernels/cpu/triangular.cpp bit for bit (test_triangular.cpp)
#   bash scripts/cuda_emu/run_kernels.sh sort       # topk's kernels around CUB (emu_cuda.h's stand-in sort) vs
#                                                   # kernels/cpu/sort.cpp (test_sort.cpp)
#   bash scripts/cuda_emu/run_kernels.sh attention  # attention.cu's reference kernels (float32, and 16-bit through
#                       # emulated mma.sync/ldmatrix) and its delta kernel vs float64 (test_attention.cpp; `attention
#                       # 64 f32`: one head dim, one dtype). The tensor-core kernels: run.sh
#   bash scripts/cuda_emu/run_kernels.sh selftest   # the emulator's primitives vs CUDA's semantics (selftest.cu)
#   EMU_REV=f518d36 bash scripts/cuda_emu/run_kernels.sh softmax
#                       # softmax, its backward, cross-entropy as committed at EMU_REV (f518d36's file ran
#                       # on an H200: the emulator's own check); without EMU_REV the work tree's file
#   bash scripts/cuda_emu/run_kernels.sh softmax_paths  # softmax.cu's and cross_entropy.cu's launch paths (every row layout, widths
#                       # to 50257, offset buffers, label smoothing) vs float64 (softmax_paths.cpp)
#   EMU_SRC=/tmp/broken.cu bash scripts/cuda_emu/run_kernels.sh random   # that file instead (mutation checks)
#   extra arguments go to the test program (e.g. `norm 768`: one width); EMU_STOP=1 stops at the first
#   failure, EMU_TRACE=1 prints every launch's configuration. Each test runs twice: buffers end at a
#   guard page (overruns fault), then start at one (EMU_GUARD_FRONT=1: underruns fault).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="${KILN_EMU_DIR:-/tmp/kiln-cuda-emu}"
family="${1:?usage: run_kernels.sh attention|norm|indexing|index_add|scatter_add|softmax|softmax_paths|nll_loss|random|reduction|reduce_grad|pool|batch_norm|transforms|optim|elementwise|scan|triangular|sort|selftest [args]}"
shift
mkdir -p "$work"
driver="test_$family.cpp"
if [ "$family" = softmax_paths ]; then family=softmax; driver=softmax_paths.cpp; fi  # a second softmax driver
if [ "$family" = index_add ]; then family=indexing; driver=test_index_add.cpp; fi  # a second indexing driver
if [ "$family" = scatter_add ]; then family=indexing; driver=test_scatter_add.cpp; fi  # a third
if [ "$family" = nll_loss ]; then family=softmax; driver=test_nll_loss.cpp; fi  # a third softmax driver
if [ "$family" = reduce_grad ]; then family=reduction; driver=test_reduce_grad.cpp; fi  # a second reduction driver
src="kernels/cuda/$family.cu"
[ "$family" = selftest ] && src="scripts/cuda_emu/selftest.cu"
# Inline-PTX wrappers gen_cu.py removes from the family's .cu (the driver defines them with emulations).
emulate=()
[ "$family" = attention ] && emulate=(--emulate mma_m16n8k16,ldmatrix_x4_trans)
if [ -n "${EMU_SRC:-}" ]; then  # another file in the family's place (e.g. a deliberately broken copy)
  python3 "$here/gen_cu.py" "$EMU_SRC" "$work/emu_$family.inc" "${emulate[@]}"
elif [ -n "${EMU_REV:-}" ]; then  # the file as committed at EMU_REV (headers still from the work tree)
  mkdir -p "$work/rev"
  git -C "$root" show "$EMU_REV:$src" > "$work/rev/$family.cu"
  python3 "$here/gen_cu.py" "$work/rev/$family.cu" "$work/emu_$family.inc" "$src@$EMU_REV" "${emulate[@]}"
else
  (cd "$root" && python3 "$here/gen_cu.py" "$src" "$work/emu_$family.inc" "${emulate[@]}")
fi
# Families whose kernels span several files: each is rewritten too (a .cu to emu_<name>.inc, a .cuh
# with launches to $work/<family>_inc/, searched before the tree); an EMU_SRC named like one of them
# (e.g. /tmp/m1/elementwise_launch.cuh) replaces that one instead of the family's .cu.
more_src=()
case "$family" in
  elementwise) more_src=(kernels/cuda/elementwise_binary.cu kernels/cuda/copy.cu kernels/cuda/elementwise_launch.cuh) ;;
  optim) more_src=(kernels/cuda/multi_tensor_apply.cuh) ;;
  softmax) more_src=(kernels/cuda/cross_entropy.cu) ;;  # softmax_rows.cuh has no launch: read from the tree
  attention) more_src=(kernels/cuda/attention_common.cuh) ;;  # launch()
esac
more_inc=()
for s in "${more_src[@]}"; do
  from="$root/$s"
  # A file the family did not have yet at EMU_REV (cross_entropy.cu was part of softmax.cu): empty.
  if [ -n "${EMU_REV:-}" ] && ! git -C "$root" cat-file -e "$EMU_REV:$s" 2>/dev/null; then
    echo "// $s: not in $EMU_REV" >"$work/emu_$(basename "$s" .cu).inc"
    continue
  fi
  if [ -n "${EMU_SRC:-}" ] && [ "$(basename "$EMU_SRC")" = "$(basename "$s")" ]; then
    from="$EMU_SRC"
    (cd "$root" && python3 "$here/gen_cu.py" "$src" "$work/emu_$family.inc" "${emulate[@]}")  # the family's own .cu after all
  fi
  case "$s" in
    *.cuh) mkdir -p "$work/${family}_inc/$(dirname "$s")"; more_inc=(-I"$work/${family}_inc")
           python3 "$here/gen_cu.py" "$from" "$work/${family}_inc/$s" "$s" ;;
    *) python3 "$here/gen_cu.py" "$from" "$work/emu_$(basename "$s" .cu).inc" "$s" ;;
  esac
done
# The CPU kernels some drivers compare with (bit for bit), built as the project builds them
# (x86-64-v3 where the host has AVX2; no OpenMP: the CPU results never depend on the thread count).
cpu_src=()
case "$family" in
  random) cpu_src=(kernels/cpu/random.cpp) ;;
  reduction) cpu_src=(kernels/cpu/reduction.cpp) ;;
  pool) cpu_src=(kernels/cpu/pool.cpp) ;;
  transforms) cpu_src=(kernels/cpu/transforms.cpp) ;;
  optim) cpu_src=(kernels/cpu/optim.cpp) ;;
  elementwise) cpu_src=(kernels/cpu/elementwise.cpp kernels/cpu/elementwise_binary.cpp kernels/cpu/copy.cpp) ;;
  scan|triangular|sort) cpu_src=("kernels/cpu/$family.cpp") ;;
esac
if [ "$driver" = test_batch_norm.cpp ]; then cpu_src=(kernels/cpu/batch_norm.cpp kernels/cpu/pool.cpp); fi
if [ "$driver" = test_nll_loss.cpp ]; then cpu_src=(kernels/cpu/softmax.cpp); fi
# optim.cpp with its own flag (-fno-math-errno) and no FMA contraction: the emulated .cu has none (baseline
# x86-64), and test_optim.cpp compares optim_math.h's updates bit for bit.
cpu_flags=()
if [ "$family" = optim ]; then cpu_flags=(-ffp-contract=off -fno-math-errno); fi
cpu_obj=()
arch=()
grep -qw avx2 /proc/cpuinfo && grep -qw f16c /proc/cpuinfo && grep -qw fma /proc/cpuinfo && arch=(-march=x86-64-v3)
for s in "${cpu_src[@]}"; do
  obj="$work/cpu_$(basename "$s" .cpp).o"
  nice -n 10 g++ -std=c++20 -O2 "${arch[@]}" "${cpu_flags[@]}" -Wno-unknown-pragmas -I"$root" -I/usr/local/cuda/include \
    -I/usr/include/eigen3 -c "$root/$s" -o "$obj"
  cpu_obj+=("$obj")
done
nice -n 10 g++ -std=c++20 -O1 -g -pthread -Wall -Wno-unknown-pragmas -Wno-unused-function -Wno-class-memaccess \
  "${more_inc[@]}" -I"$work" -I"$here" -I"$root" -I/usr/local/cuda/include \
  "$here/$driver" "$here/emu_runtime.cpp" "$root/kernels/dtype.cpp" "$root/kernels/strided.cpp" \
  "${cpu_obj[@]}" -o "$work/${driver%.cpp}"
# Twice: buffers end at a guard page (overruns fault), then start at one (underruns fault).
# A deadlock (e.g. __syncthreads reached by some threads only) hangs the emulation: hence the timeout.
timeout "${EMU_TIMEOUT:-1800}" "$work/${driver%.cpp}" "$@"
echo "-- again with the guard pages before the buffers (EMU_GUARD_FRONT=1)"
EMU_GUARD_FRONT=1 timeout "${EMU_TIMEOUT:-1800}" "$work/${driver%.cpp}" "$@" | tail -n 1
