// CUDA layer norm (see kernels/norm.h); batch norm is in batch_norm.cu.
//
// Invariants:
//  - Deterministic: every reduction has a fixed split (a function of the
//    shape only, never of the GPU), a fixed per-thread order and a fixed tree;
//    per-split partials are combined in split order.
//  - Nothing here synchronizes; 16-bit types compute in float, float64 in double.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/norm.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/cuda/pack.cuh"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

template <typename A>
struct GradSums {
  A dz, dz_xmu;
};

// ---------------------------------------------------------------- layer norm

// Layer-norm dweight/dbias partial splits over rows, from the shape only.
int64_t ln_splits(const LayerNormArgs& args) { return std::clamp<int64_t>((args.rows + 63) / 64, 1, 256); }

// Forward and dx: one warp per row (kWarpsPerBlock rows per block), no
// shared memory and no __syncthreads, so that a row of GPT-2's 768 columns
// costs a few shuffles instead of a block-wide tree (the block-per-row kernels
// this replaced ran at 14-41% of the H200's copy bandwidth). Lanes read
// 16-byte vectors when every pointer is 16-byte aligned and cols is a
// multiple of the vector (RowVectors), single elements otherwise. Mean, then
// the centred variance, in two passes over the row (L1 hits after the first):
// each lane sums its columns in order, lanes combine in a fixed butterfly, so
// the result does not change from run to run.
// Compiled, not yet run on a GPU (issue 21): test_nn_ops' [gpu] layer_norm
// parity case checks it.
constexpr int kWarpsPerBlock = kThreads / 32;

template <typename T>
struct alignas(16) Vector16 {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

template <typename A>
__device__ __forceinline__ A warp_sum(A value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// f(column, value) for this lane's columns of a row, in increasing order per lane.
template <typename T, typename F>
__device__ __forceinline__ void for_lane_columns(const T* row, int64_t cols, bool vectors, int lane, F f) {
  constexpr int kVec = Vector16<T>::kSize;
  if (vectors) {
    for (int64_t j = int64_t{lane} * kVec; j < cols; j += 32 * kVec) {
      const Vector16<T> chunk = *reinterpret_cast<const Vector16<T>*>(row + j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) f(j + e, to_acc(chunk.v[e]));
    }
  } else {
    for (int64_t j = lane; j < cols; j += 32) f(j, to_acc(row[j]));
  }
}

// out[j] = f(j, a[j], b[j]) for this lane's columns (b may be null: then 0 is passed).
template <typename T, typename F>
__device__ __forceinline__ void map_lane_columns(const T* a, const T* b, T* out, int64_t cols, bool vectors, int lane,
                                                 F f) {
  using A = typename Acc<T>::type;
  constexpr int kVec = Vector16<T>::kSize;
  if (vectors) {
    for (int64_t j = int64_t{lane} * kVec; j < cols; j += 32 * kVec) {
      const Vector16<T> va = *reinterpret_cast<const Vector16<T>*>(a + j);
      Vector16<T> vb{};
      if (b != nullptr) vb = *reinterpret_cast<const Vector16<T>*>(b + j);
      Vector16<T> result;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        result.v[e] = from_acc<T>(f(j + e, to_acc(va.v[e]), b != nullptr ? to_acc(vb.v[e]) : A(0)));
      }
      *reinterpret_cast<Vector16<T>*>(out + j) = result;
    }
  } else {
    for (int64_t j = lane; j < cols; j += 32) out[j] = from_acc<T>(f(j, to_acc(a[j]), b != nullptr ? to_acc(b[j]) : A(0)));
  }
}

template <typename T>
__device__ __forceinline__ typename Acc<T>::type weight_at(const T* weight, int64_t j) {
  using A = typename Acc<T>::type;
  return weight != nullptr ? to_acc(weight[j]) : A(1);
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads) ln_forward(const T* x, const T* weight, const T* bias, int64_t rows,
                                                       int64_t cols, double eps, bool vectors, T* y, A* save_mean,
                                                       A* save_rstd) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; r < rows; r += warps) {
    const T* xs = x + r * cols;
    A sum = A(0);
    for_lane_columns(xs, cols, vectors, lane, [&](int64_t, A v) { sum += v; });
    const A mean = warp_sum(sum) / static_cast<A>(cols);
    A squares = A(0);
    for_lane_columns(xs, cols, vectors, lane, [&](int64_t, A v) {
      const A d = v - mean;
      squares += d * d;
    });
    const A rstd = reciprocal_sqrt(warp_sum(squares) / static_cast<A>(cols) + static_cast<A>(eps));
    if (lane == 0) {
      save_mean[r] = mean;
      save_rstd[r] = rstd;
    }
    // Weight and bias are read per column (L1/L2-resident across rows).
    map_lane_columns(xs, static_cast<const T*>(nullptr), y + r * cols, cols, vectors, lane, [&](int64_t j, A v, A) {
      A out = (v - mean) * rstd * weight_at(weight, j);
      if (bias != nullptr) out += to_acc(bias[j]);
      return out;
    });
  }
}

// Rows of at most kRegisterChunks vectors per lane (1024 float32 or 2048
// 16-bit columns: GPT-2's 768, the ViT's): each lane reads its columns once
// into registers and every pass runs from there, where the kernels above read
// the row again per pass (L1 keeps only part of it in between; on the H200
// LayerNorm forward ran at 59% of the copy rate in float32, 47% in bf16). The
// same per-lane column order and butterfly as those kernels.
constexpr int kRegisterChunks = 8;

// f(k, j) for each of this lane's chunks k inside the row (j: its first
// column), in increasing k: the lane's columns in the order for_lane_columns
// visits them on the vector path.
template <typename T, typename F>
__device__ __forceinline__ void for_row_chunks(int64_t cols, int lane, F f) {
#pragma unroll
  for (int k = 0; k < kRegisterChunks; ++k) {
    const int64_t j = (int64_t{k} * 32 + lane) * Vector16<T>::kSize;
    if (j < cols) f(k, j);
  }
}

template <typename T>
__device__ __forceinline__ void load_row(const T* row, int64_t cols, int lane, Vector16<T> (&chunks)[kRegisterChunks]) {
  for_row_chunks<T>(cols, lane, [&](int k, int64_t j) { chunks[k] = *reinterpret_cast<const Vector16<T>*>(row + j); });
}

// row[j + e] = out[e] after value(k, j, out) for each of this lane's chunks:
// one 16-byte store each.
template <typename T, typename F>
__device__ __forceinline__ void store_row(T* row, int64_t cols, int lane, F value) {
  for_row_chunks<T>(cols, lane, [&](int k, int64_t j) {
    typename Acc<T>::type out[Vector16<T>::kSize];
    value(k, j, out);
    Vector16<T> result;
#pragma unroll
    for (int e = 0; e < Vector16<T>::kSize; ++e) result.v[e] = from_acc<T>(out[e]);
    *reinterpret_cast<Vector16<T>*>(row + j) = result;
  });
}

// to_acc for the register kernels. bfloat16 widens by a 16-bit shift of its
// bits (exact, as cvt.f32.bf16): with cuda_bf16.h's conversion ptxas kept
// every widened value live across the kernels' passes, 98 registers for the
// forward and 167 for dx against float16's 64 and 100, so 2 and 1 blocks of
// 256 fit an SM and half the bytes were in flight (the H200 ran the bf16
// forward at 39% of the copy rate, float32's at 77%, in the same 31.5 us at
// 16 x 1024 x 768). With the shift: 64 and 100, as float16. (Not in to_acc
// itself: there it costs the bfloat16 reductions and softmax 4-14 registers.)
template <typename T>
__device__ __forceinline__ typename Acc<T>::type widen(T value) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(static_cast<unsigned>(__bfloat16_as_ushort(value)) << 16);
  } else {
    return to_acc(value);
  }
}

// The weight (or bias) at columns j .. j + kSize - 1 in one 16-byte load,
// widened; `absent` for each column when there is none. The register kernels
// run only where every row pointer is 16-byte aligned and cols a multiple of
// the vector (row_vectors), weight and bias included; a scalar load per
// column cost as many load instructions as the row itself.
template <typename T>
__device__ __forceinline__ void load_columns(const T* param, int64_t j, typename Acc<T>::type absent,
                                             typename Acc<T>::type (&out)[Vector16<T>::kSize]) {
  if (param == nullptr) {
#pragma unroll
    for (int e = 0; e < Vector16<T>::kSize; ++e) out[e] = absent;
    return;
  }
  const Vector16<T> v = *reinterpret_cast<const Vector16<T>*>(param + j);
#pragma unroll
  for (int e = 0; e < Vector16<T>::kSize; ++e) out[e] = widen(v.v[e]);
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads) ln_forward_registers(const T* x, const T* weight, const T* bias,
                                                                 int64_t rows, int64_t cols, double eps, T* y,
                                                                 A* save_mean, A* save_rstd) {
  constexpr int kVec = Vector16<T>::kSize;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; r < rows; r += warps) {
    Vector16<T> chunks[kRegisterChunks];
    load_row(x + r * cols, cols, lane, chunks);
    A sum = A(0);
    for_row_chunks<T>(cols, lane, [&](int k, int64_t) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += widen(chunks[k].v[e]);
    });
    const A mean = warp_sum(sum) / static_cast<A>(cols);
    A squares = A(0);
    for_row_chunks<T>(cols, lane, [&](int k, int64_t) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const A d = widen(chunks[k].v[e]) - mean;
        squares += d * d;
      }
    });
    const A rstd = reciprocal_sqrt(warp_sum(squares) / static_cast<A>(cols) + static_cast<A>(eps));
    if (lane == 0) {
      save_mean[r] = mean;
      save_rstd[r] = rstd;
    }
    store_row(y + r * cols, cols, lane, [&](int k, int64_t j, A (&out)[kVec]) {
      A w[kVec], b[kVec];
      load_columns(weight, j, A(1), w);
      load_columns(bias, j, A(0), b);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        out[e] = (widen(chunks[k].v[e]) - mean) * rstd * w[e];
        if (bias != nullptr) out[e] += b[e];
      }
    });
  }
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads) ln_grad_input_registers(const T* x, const T* dy, const T* weight,
                                                                    const A* save_mean, const A* save_rstd,
                                                                    int64_t rows, int64_t cols, T* dx) {
  constexpr int kVec = Vector16<T>::kSize;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; r < rows; r += warps) {
    Vector16<T> xs[kRegisterChunks], dys[kRegisterChunks];
    load_row(x + r * cols, cols, lane, xs);
    load_row(dy + r * cols, cols, lane, dys);
    const A mean = save_mean[r], rstd = save_rstd[r];
    A sum_g = A(0), sum_g_xhat = A(0);
    for_row_chunks<T>(cols, lane, [&](int k, int64_t j) {
      A w[kVec];
      load_columns(weight, j, A(1), w);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const A g = widen(dys[k].v[e]) * w[e];
        sum_g += g;
        sum_g_xhat += g * (widen(xs[k].v[e]) - mean) * rstd;
      }
    });
    const A mean_g = warp_sum(sum_g) / static_cast<A>(cols);
    const A mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<A>(cols);
    store_row(dx + r * cols, cols, lane, [&](int k, int64_t j, A (&out)[kVec]) {
      A w[kVec];
      load_columns(weight, j, A(1), w);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const A g = widen(dys[k].v[e]) * w[e];
        const A xhat = (widen(xs[k].v[e]) - mean) * rstd;
        out[e] = rstd * (g - mean_g - xhat * mean_g_xhat);
      }
    });
  }
}

// Whether a row fits the register kernels: the vector path, at most
// kRegisterChunks vectors per lane.
template <typename T>
bool row_in_registers(bool vectors, int64_t cols) {
  return vectors && cols <= int64_t{32} * kRegisterChunks * Vector16<T>::kSize;
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads) ln_grad_input(const T* x, const T* dy, const T* weight,
                                                          const A* save_mean, const A* save_rstd, int64_t rows,
                                                          int64_t cols, bool vectors, T* dx) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; r < rows; r += warps) {
    const T* xs = x + r * cols;
    const T* dys = dy + r * cols;
    const A mean = save_mean[r], rstd = save_rstd[r];
    // Sums of g and g * xhat, g = dy * weight. x's columns are read alongside
    // dy's: the lane's columns of both rows are the same.
    A sum_g = A(0), sum_g_xhat = A(0);
    for_lane_columns(dys, cols, vectors, lane, [&](int64_t j, A d) {
      const A g = d * weight_at(weight, j);
      sum_g += g;
      sum_g_xhat += g * (to_acc(xs[j]) - mean) * rstd;
    });
    const A mean_g = warp_sum(sum_g) / static_cast<A>(cols);
    const A mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<A>(cols);
    map_lane_columns(xs, dys, dx + r * cols, cols, vectors, lane, [&](int64_t j, A v, A d) {
      const A g = d * weight_at(weight, j);
      const A xhat = (v - mean) * rstd;
      return rstd * (g - mean_g - xhat * mean_g_xhat);
    });
  }
}

// Block (32 columns x 8 row lanes, split) -> partial sums of dy * xhat and dy.
template <typename T, typename A>
__global__ void ln_grad_params_partial(const T* x, const T* dy, const A* save_mean, const A* save_rstd, int64_t rows,
                                       int64_t cols, int64_t splits, GradSums<A>* partials) {
  __shared__ GradSums<A> shared[8][33];
  const int64_t j = blockIdx.x * 32 + threadIdx.x, split = blockIdx.y;
  const int64_t chunk = (rows + splits - 1) / splits;
  const int64_t first = split * chunk, last = std::min(rows, first + chunk);
  GradSums<A> local{A(0), A(0)};  // .dz = sum dy * xhat (dweight), .dz_xmu = sum dy (dbias)
  if (j < cols) {
    for (int64_t r = first + threadIdx.y; r < last; r += 8) {
      const A g = to_acc(dy[r * cols + j]);
      local.dz += g * (to_acc(x[r * cols + j]) - save_mean[r]) * save_rstd[r];
      local.dz_xmu += g;
    }
  }
  shared[threadIdx.y][threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    GradSums<A> total = shared[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) {
      total.dz += shared[k][threadIdx.x].dz;
      total.dz_xmu += shared[k][threadIdx.x].dz_xmu;
    }
    partials[split * cols + j] = total;
  }
}

template <typename T, typename A>
__global__ void ln_grad_params_finalize(const GradSums<A>* partials, int64_t cols, int64_t splits, T* dweight,
                                        T* dbias) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= cols) return;
  GradSums<A> total = partials[j];
  for (int64_t s = 1; s < splits; ++s) {
    total.dz += partials[s * cols + j].dz;
    total.dz_xmu += partials[s * cols + j].dz_xmu;
  }
  if (dweight != nullptr) dweight[j] = from_acc<T>(total.dz);
  if (dbias != nullptr) dbias[j] = from_acc<T>(total.dz_xmu);
}

int warp_row_blocks(int64_t rows) {
  return static_cast<int>(std::min<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks));
}

// Whether the warp-per-row kernels may read and write 16-byte vectors: cols a
// multiple of the vector and every (non-null) row pointer 16-byte aligned
// (rows then start aligned too).
template <typename T>
bool row_vectors(int64_t cols, std::initializer_list<const void*> pointers) {
  return cols % Vector16<T>::kSize == 0 && aligned16(pointers);
}


}  // namespace

// ---------------------------------------------------------------- entry points

size_t layer_norm_workspace_bytes(const LayerNormArgs& args) {
  const size_t element = args.dtype == DType::f64 ? sizeof(GradSums<double>) : sizeof(GradSums<float>);
  return element * static_cast<size_t>(ln_splits(args) * args.cols);
}

void layer_norm_forward_cuda(const LayerNormArgs& args, const void* x, const void* weight, const void* bias, void* y,
                             void* save_mean, void* save_rstd, cuda::Stream stream) {
  if (args.rows * args.cols == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  dispatch_floating_as_native(args.dtype, "layer_norm (cuda)", [&]<typename T>() {
    using A = typename Acc<T>::type;
    const bool vectors = row_vectors<T>(args.cols, {x, weight, bias, y});
    if (row_in_registers<T>(vectors, args.cols)) {
      ln_forward_registers<T, A><<<warp_row_blocks(args.rows), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), args.rows, args.cols,
          args.eps, static_cast<T*>(y), static_cast<A*>(save_mean), static_cast<A*>(save_rstd));
    } else {
      ln_forward<T, A><<<warp_row_blocks(args.rows), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), args.rows, args.cols,
          args.eps, vectors, static_cast<T*>(y), static_cast<A*>(save_mean), static_cast<A*>(save_rstd));
    }
    cuda::check_last_launch("layer_norm forward");
  });
}

void layer_norm_backward_cuda(const LayerNormArgs& args, const void* x, const void* dy, const void* weight,
                              const void* save_mean, const void* save_rstd, void* dx, void* dweight, void* dbias,
                              void* workspace, cuda::Stream stream) {
  if (args.rows * args.cols == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  dispatch_floating_as_native(args.dtype, "layer_norm backward (cuda)", [&]<typename T>() {
    using A = typename Acc<T>::type;
    const T* xs = static_cast<const T*>(x);
    const T* dys = static_cast<const T*>(dy);
    const A* mean = static_cast<const A*>(save_mean);
    const A* rstd = static_cast<const A*>(save_rstd);
    if (dx != nullptr) {
      const bool vectors = row_vectors<T>(args.cols, {x, dy, weight, dx});
      if (row_in_registers<T>(vectors, args.cols)) {
        ln_grad_input_registers<T, A><<<warp_row_blocks(args.rows), kThreads, 0, s>>>(
            xs, dys, static_cast<const T*>(weight), mean, rstd, args.rows, args.cols, static_cast<T*>(dx));
      } else {
        ln_grad_input<T, A><<<warp_row_blocks(args.rows), kThreads, 0, s>>>(
            xs, dys, static_cast<const T*>(weight), mean, rstd, args.rows, args.cols, vectors, static_cast<T*>(dx));
      }
      cuda::check_last_launch("layer_norm backward input");
    }
    if (dweight != nullptr || dbias != nullptr) {
      const int64_t splits = ln_splits(args);
      GradSums<A>* partials = static_cast<GradSums<A>*>(workspace);
      ln_grad_params_partial<T, A>
          <<<dim3(static_cast<unsigned>((args.cols + 31) / 32), static_cast<unsigned>(splits)), dim3(32, 8), 0, s>>>(
              xs, dys, mean, rstd, args.rows, args.cols, splits, partials);
      cuda::check_last_launch("layer_norm backward weight partials");
      ln_grad_params_finalize<T, A><<<blocks_for(args.cols), kThreads, 0, s>>>(
          partials, args.cols, splits, static_cast<T*>(dweight), static_cast<T*>(dbias));
      cuda::check_last_launch("layer_norm backward weight");
    }
  });
}

}  // namespace kiln::kernels
