// Multi-tensor apply: one kernel launch over a whole list of tensors.
//
// The list's metadata (addresses, sizes, per-tensor step pointers, the first
// block of each tensor) is packed into a struct passed by value as the
// kernel's parameter, as in apex and PyTorch's multi_tensor_apply, so a launch
// needs no host-to-device copy and can be captured in a CUDA graph. Each block
// handles one chunk of kOptimChunk elements; block b finds its tensor by a
// binary search over block_start. The struct stays under the 32 KiB kernel
// parameter limit of CUDA >= 12.1 (Volta and newer); a list longer than
// MaxTensors takes several launches of the same kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/optim.h"

namespace kiln::kernels::mta {

constexpr int kThreads = 512;

template <int Depth, int MaxTensors, bool kSteps>
struct TensorListMeta {
  static constexpr int kDepth = Depth;
  static constexpr int kMaxTensors = MaxTensors;
  void* addresses[Depth][MaxTensors];
  int64_t numel[MaxTensors];
  int64_t* steps[kSteps ? MaxTensors : 1];  // per-tensor step counters (optimizers)
  int32_t block_start[MaxTensors + 1];      // first block of each tensor; [count] = grid size
  int64_t partial_base[MaxTensors];         // list-wide index of the tensor's first chunk
  int32_t count;
};

// Optimizers: param, grad, master, state0, state1, state2.
using OptimMeta = TensorListMeta<6, 128, true>;
// Gradient lists (unscale, norms, scale, clamp).
using ListMeta = TensorListMeta<1, 512, false>;
// Averages and params.
using PairMeta = TensorListMeta<2, 384, false>;
static_assert(sizeof(OptimMeta) < 32000 && sizeof(ListMeta) < 32000 && sizeof(PairMeta) < 32000,
              "kernel parameters are limited to 32764 bytes");

// The tensor (slot) and chunk of block `block`.
template <typename Meta>
__device__ inline void locate(const Meta& meta, int block, int& slot, int64_t& chunk) {
  int lo = 0, hi = meta.count - 1;  // the last slot whose first block is <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (meta.block_start[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  slot = lo;
  chunk = block - meta.block_start[lo];
}

// Packs tensors 0..count-1 into metas and calls launch(meta, blocks) for each
// full meta and the last one. fill(meta, slot, t) sets addresses (and steps)
// of tensor t; numel_of(t) its size. Empty tensors are left out.
template <typename Meta, typename NumelOf, typename Fill, typename Launch>
void multi_tensor_apply(int64_t count, NumelOf numel_of, Fill fill, Launch launch) {
  Meta meta;
  meta.count = 0;
  int64_t blocks = 0, global_chunk = 0;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t numel = numel_of(t);
    const int64_t chunks = optim_chunks(numel);
    if (chunks == 0) continue;
    if (meta.count == Meta::kMaxTensors || blocks + chunks > (int64_t{1} << 30)) {
      meta.block_start[meta.count] = static_cast<int32_t>(blocks);
      launch(meta, static_cast<int>(blocks));
      meta.count = 0;
      blocks = 0;
    }
    const int slot = meta.count++;
    fill(meta, slot, t);
    meta.numel[slot] = numel;
    meta.block_start[slot] = static_cast<int32_t>(blocks);
    meta.partial_base[slot] = global_chunk;
    blocks += chunks;
    global_chunk += chunks;
  }
  if (meta.count > 0) {
    meta.block_start[meta.count] = static_cast<int32_t>(blocks);
    launch(meta, static_cast<int>(blocks));
  }
}

// ---------------------------------------------------------------- element types
// kiln::Half / kiln::BFloat16 are reinterpreted as __half / __nv_bfloat16.
template <typename T> struct device_type { using type = T; };
template <> struct device_type<Half> { using type = __half; };
template <> struct device_type<BFloat16> { using type = __nv_bfloat16; };
template <typename T> using device_t = typename device_type<T>::type;

// The compute type of a device element type: double for double, else float.
template <typename T> struct device_compute { using type = float; };
template <> struct device_compute<double> { using type = double; };
template <typename T> using device_compute_t = typename device_compute<T>::type;

__device__ inline float to_compute(float x) { return x; }
__device__ inline double to_compute(double x) { return x; }
__device__ inline float to_compute(__half x) { return __half2float(x); }
__device__ inline float to_compute(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ inline T from_compute(float x);
template <> __device__ inline float from_compute<float>(float x) { return x; }
template <> __device__ inline __half from_compute<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 from_compute<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T> __device__ inline T from_compute(double x);
template <> __device__ inline double from_compute<double>(double x) { return x; }

// ---------------------------------------------------------------- block reductions
// Deterministic: a fixed shuffle tree within warps, then over the warp results.
template <typename Combine>
__device__ inline double block_reduce(double value, Combine combine) {
  __shared__ double warp_values[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_down_sync(0xffffffffu, value, offset));
  __syncthreads();  // warp_values may still be read by a previous reduction
  if (lane == 0) warp_values[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  if (warp == 0) {
    value = lane < warps ? warp_values[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) {
      const double other = __shfl_down_sync(0xffffffffu, value, offset);
      if (lane + offset < warps) value = combine(value, other);
    }
  }
  return value;  // valid in thread 0
}

}  // namespace kiln::kernels::mta
