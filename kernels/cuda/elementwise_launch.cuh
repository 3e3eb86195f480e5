// The CUDA elementwise machinery shared by copy.cu and elementwise*.cu: one
// output and any number of inputs (none for fill) over a common broadcast
// iteration shape, with
//   - a contiguous kernel that moves 16 bytes per operand per step (vector
//     loads/stores of Pack<V, T>), used when every operand is dense and aligned;
//   - a strided kernel for the rest: below 2^31 elements its linear index is
//     32-bit and split into coordinates by FastDivmod (multiply-high and
//     shift: kernels/strided.h); above, by 64-bit division.
// All are grid-stride loops (int64 indices but the 32-bit strided one).
// 16-bit floats are converted with the hardware conversions (__half /
// __nv_bfloat16 share kiln's layout) and computed in float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"
#include "kernels/strided.h"

namespace kiln::kernels::cuda_detail {

// ---------------------------------------------------------------- conversions
template <typename T>
__device__ __forceinline__ compute_t<T> load(T value) {
  return static_cast<compute_t<T>>(value);
}
__device__ __forceinline__ float load(Half value) {
  __half_raw raw;
  raw.x = value.bits;
  return __half2float(__half(raw));
}
__device__ __forceinline__ float load(BFloat16 value) {
  __nv_bfloat16_raw raw;
  raw.x = value.bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

template <typename T>
struct Convert {
  __device__ __forceinline__ static T from(T value) { return value; }
  template <typename V>
  __device__ __forceinline__ static T from(V value) {
    return static_cast<T>(value);
  }
};
template <>
struct Convert<Half> {
  __device__ __forceinline__ static Half from(Half value) { return value; }
  template <typename V>
  __device__ __forceinline__ static Half from(V value) {
    Half out;
    out.bits = __half_raw(__float2half_rn(static_cast<float>(value))).x;
    return out;
  }
};
template <>
struct Convert<BFloat16> {
  __device__ __forceinline__ static BFloat16 from(BFloat16 value) { return value; }
  template <typename V>
  __device__ __forceinline__ static BFloat16 from(V value) {
    BFloat16 out;
    out.bits = __nv_bfloat16_raw(__float2bfloat16_rn(static_cast<float>(value))).x;
    return out;
  }
};

// ---------------------------------------------------------------- kernels
template <int V, typename T>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, typename Out, typename F, typename... In>
__device__ __forceinline__ void apply_pack(F f, Out* out, Pack<V, In>... in) {
  Pack<V, Out> result;
#pragma unroll
  for (int j = 0; j < V; ++j) result.v[j] = Convert<Out>::from(f(load(in.v[j])...));
  *reinterpret_cast<Pack<V, Out>*>(out) = result;
}

// Dense operands aligned to Pack<V, .>: each thread handles V elements per step.
template <int V, typename Out, typename F, typename... In>
__global__ void contiguous_kernel(int64_t n, F f, Out* out, const In*... in) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; base < n; base += step) {
    if (base + V <= n) {
      apply_pack<V, Out, F, In...>(f, out + base, *reinterpret_cast<const Pack<V, In>*>(in + base)...);
    } else {
      for (int64_t i = base; i < n; ++i) out[i] = Convert<Out>::from(f(load(in[i])...));
    }
  }
}

struct OperandArray {
  Operand op[kMaxOperands];
};

template <typename Out, typename... In, typename F, size_t... I>
__device__ __forceinline__ void strided_apply(F f, const OperandArray& ops, const int64_t* offsets,
                                              std::index_sequence<I...>) {
  static_cast<Out*>(ops.op[0].data)[offsets[0]] =
      Convert<Out>::from(f(load(static_cast<const In*>(ops.op[I + 1].data)[offsets[I + 1]])...));
}

template <typename Out, typename F, typename... In>
__global__ void strided_kernel(int64_t n, IterShape shape, OperandArray ops, F f) {
  constexpr int count = 1 + static_cast<int>(sizeof...(In));
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t offsets[count];
    offsets_of(i, shape, ops.op, count, offsets);
    strided_apply<Out, In...>(f, ops, offsets, std::index_sequence_for<In...>{});
  }
}

// Fewer than 2^31 elements: 32-bit index, coordinates by FastDivmod.
template <typename Out, typename F, typename... In>
__global__ void strided32_kernel(uint32_t n, FastIterShape shape, OperandArray ops, F f) {
  constexpr int count = 1 + static_cast<int>(sizeof...(In));
  const uint32_t step = gridDim.x * blockDim.x;  // i + step < 2^31 + 2^24: no overflow
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t offsets[count];
    fast_offsets_of(i, shape, ops.op, count, offsets);
    strided_apply<Out, In...>(f, ops, offsets, std::index_sequence_for<In...>{});
  }
}

// ---------------------------------------------------------------- host launcher
constexpr int kThreads = 256;
// Grid-stride loops: more blocks than this only adds scheduling overhead.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

inline unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

template <typename... T>
constexpr size_t max_size() {
  size_t size = 1;
  ((size = std::max(size, sizeof(T))), ...);
  return size;
}

template <typename Out, typename... In, typename F, size_t... I>
void launch_impl(std::index_sequence<I...>, const IterShape& input_shape, const Operand* operands, F f,
                 cuda::Stream stream, const char* name) {
  constexpr int count = 1 + static_cast<int>(sizeof...(In));
  IterShape shape = input_shape;
  OperandArray ops{};
  for (int k = 0; k < count; ++k) ops.op[k] = operands[k];
  coalesce(shape, ops.op, count);
  const int64_t n = shape.numel();
  if (n == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (all_contiguous(shape, ops.op, count)) {
    constexpr int V = static_cast<int>(16 / max_size<Out, In...>());
    const bool aligned = reinterpret_cast<uintptr_t>(ops.op[0].data) % (V * sizeof(Out)) == 0 &&
                         ((reinterpret_cast<uintptr_t>(ops.op[I + 1].data) % (V * sizeof(In)) == 0) && ...);
    if (aligned) {
      contiguous_kernel<V, Out, F, In...><<<blocks_for((n + V - 1) / V), kThreads, 0, s>>>(
          n, f, static_cast<Out*>(ops.op[0].data), static_cast<const In*>(ops.op[I + 1].data)...);
      cuda::check_last_launch(name);
      return;
    }
  }
  if (n < (int64_t{1} << 31)) {
    strided32_kernel<Out, F, In...><<<blocks_for(n), kThreads, 0, s>>>(static_cast<uint32_t>(n), fast_iter_shape(shape),
                                                                       ops, f);
  } else {
    strided_kernel<Out, F, In...><<<blocks_for(n), kThreads, 0, s>>>(n, shape, ops, f);
  }
  cuda::check_last_launch(name);
}

// Runs out = f(in...) elementwise on `stream`; operands[0] is the output,
// operands[1..] the inputs (one per In). Asynchronous.
template <typename Out, typename... In, typename F>
void launch(const IterShape& shape, const Operand* operands, F f, cuda::Stream stream, const char* name) {
  launch_impl<Out, In...>(std::index_sequence_for<In...>{}, shape, operands, f, stream, name);
}

}  // namespace kiln::kernels::cuda_detail
