// CUDA batch norm, optionally fused with ReLU, or with ReLU and a 2x2 max pool
// (see kernels/norm.h).
//
// Three launches each way, around one small per-channel step:
//  forward:  (1) per-(channel, split) Welford partials -> workspace; (2) one
//            warp per channel merges them: saved mean/invstd, the running
//            stats, the channel's affine y = x * scale + shift; (3) y, or
//            with the pool its pooled y and argmax indices (the full-size y
//            is never stored).
//  backward: (1) per-(channel, split) sums of dz and dz * (x - mean); (2) one
//            warp per channel: dweight, dbias and dx's per-channel
//            coefficients; (3) dx.
// Two layouts (the front end's (outer, C, inner)):
//  - rows (inner == 1: channels-last NHWC, BatchNorm1d): a block is a tile of
//    `lanes` channel packs x (256 / lanes) rows. A thread owns one pack of V
//    adjacent channels and keeps its per-channel values in registers, so each
//    row costs one 16-byte load (and store) per thread.
//  - planes (inner > 1: NCHW): the reductions take a block per (channel,
//    split); the elementwise passes are flat over packs of V elements, all in
//    one plane, with one channel lookup per pack.
// V (the pack) is the largest power of two up to 16 bytes of elements that
// divides the channels (rows) or the plane size (planes): 8 bfloat16 channels
// of 64, 4 elements of a 196-element plane (14x14), 1 of 49. The previous
// kernels (one element per thread, four parameter loads and a division per
// element) ran bn+relu's forward at 21% (NCHW) and 18% (NHWC) of the H200's
// copy rate in bfloat16.
//
// Deterministic: splits, the thread -> element map and every reduction tree
// are functions of the shape and dtype only, never of the GPU. Whether a
// pointer is 16-byte aligned only picks one vector load or V scalar loads of
// the same elements. Nothing here synchronizes; 16-bit types compute in float,
// float64 in double.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/error.h"
#include "kernels/cuda/fast_divide.cuh"
#include "kernels/cuda/native_types.cuh"
#include "kernels/cuda/pack.cuh"
#include "kernels/norm.h"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;               // rows loaded before any is used (the rows kernels)
constexpr int64_t kTargetBlocks = 1024;  // per reduction launch: several waves on 132 SMs

// ---------------------------------------------------------------- geometry

// The launch geometry of every kernel of one call, from the shape and dtype only.
struct Geometry {
  bool rows = false;    // inner == 1
  int pack = 1;         // V
  // rows: lanes = channel packs per block (a power of two, at most 32), row_lanes = 256 / lanes.
  int lanes = 1, row_lanes = kThreads;
  int64_t channel_blocks = 1;
  int64_t splits = 1;   // of each channel's reduced elements (rows: rows; planes: packs)
  int64_t chunk = 1;    // rows or packs per split; every split holds at least one
};

template <typename T>
Geometry geometry_for(const BatchNormShape& shape) {
  Geometry g;
  g.rows = shape.inner == 1;
  const int64_t divides = g.rows ? shape.channels : shape.inner;
  g.pack = kFullPack<T>;
  while (divides % g.pack != 0) g.pack /= 2;
  int64_t per_channel;  // reduced elements per channel, in units the splits count
  int64_t min_chunk;
  if (g.rows) {
    const int64_t packs = shape.channels / g.pack;
    g.lanes = static_cast<int>(std::min<int64_t>(32, std::bit_ceil(static_cast<uint64_t>(packs))));
    g.row_lanes = kThreads / g.lanes;
    g.channel_blocks = (packs + g.lanes - 1) / g.lanes;
    per_channel = shape.outer;
    min_chunk = int64_t{g.row_lanes} * 16;  // 16 rows per thread at least
  } else {
    g.channel_blocks = shape.channels;
    per_channel = shape.reduced() / g.pack;
    min_chunk = 16384 / g.pack;  // 16K elements
  }
  const int64_t most = std::clamp<int64_t>(kTargetBlocks / g.channel_blocks, 1, 1024);
  g.splits = std::clamp<int64_t>((per_channel + min_chunk - 1) / min_chunk, 1, most);
  g.chunk = (per_channel + g.splits - 1) / g.splits;
  g.splits = std::max<int64_t>(1, (per_channel + g.chunk - 1) / g.chunk);
  return g;
}

// Blocks (along y) of a rows-layout elementwise pass: about 8 rows per
// thread, so that its loads go kUnroll at a time.
int64_t row_blocks(const Geometry& g, int64_t rows) {
  const int64_t rows_per_block = int64_t{g.row_lanes} * 8;
  return std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, 65535);
}

int flat_blocks(int64_t work) {
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 4096));
}

// ---------------------------------------------------------------- per-channel values

template <typename A>
struct Stats {
  A mean, m2, count;
};

template <typename A>
__device__ __forceinline__ Stats<A> merge(const Stats<A>& a, const Stats<A>& b) {
  const A count = a.count + b.count;
  if (count == A(0)) return {A(0), A(0), A(0)};
  const A delta = b.mean - a.mean;
  const A share = b.count / count;
  return {a.mean + delta * share, a.m2 + b.m2 + delta * delta * a.count * share, count};
}

template <typename A>
struct GradSums {
  A dz, dz_xmu;
};

// y = x * scale + shift with scale = invstd * w, shift = b - mean * scale; the
// backward recomputes the ReLU mask with the same expression.
template <typename A>
struct ChannelAffine {
  A scale, shift;
};

template <typename A>
__device__ __forceinline__ ChannelAffine<A> channel_affine(int64_t c, const A* mean, const A* invstd, const A* weight,
                                                    const A* bias) {
  const A w = weight != nullptr ? weight[c] : A(1), b = bias != nullptr ? bias[c] : A(0);
  const A scale = invstd[c] * w;
  return {scale, b - mean[c] * scale};
}

// dx = scale * dz - mean_term - slope * (x - mean), dz = dy masked by the ReLU.
// Eval mode (the statistics are constants): mean_term = slope = 0.
template <typename A>
struct GradCoefficients {
  ChannelAffine<A> affine;
  A mean, slope, mean_term;
};

template <typename A>
__device__ __forceinline__ A masked(A g, A x, const ChannelAffine<A>& affine, bool relu) {
  return !relu || x * affine.scale + affine.shift > A(0) ? g : A(0);
}

template <typename A>
__device__ __forceinline__ A grad_input(A g, A x, const GradCoefficients<A>& k, bool relu) {
  return k.affine.scale * masked(g, x, k.affine, relu) - k.mean_term - k.slope * (x - k.mean);
}

template <typename A>
__device__ __forceinline__ Stats<A> shuffle_down(const Stats<A>& s, int offset) {
  return {__shfl_down_sync(0xffffffffu, s.mean, offset), __shfl_down_sync(0xffffffffu, s.m2, offset),
          __shfl_down_sync(0xffffffffu, s.count, offset)};
}

template <typename A>
__device__ __forceinline__ GradSums<A> shuffle_down(const GradSums<A>& s, int offset) {
  return {__shfl_down_sync(0xffffffffu, s.dz, offset), __shfl_down_sync(0xffffffffu, s.dz_xmu, offset)};
}

template <typename A>
__device__ __forceinline__ Stats<A> combine(const Stats<A>& a, const Stats<A>& b) {
  return merge(a, b);
}

template <typename A>
__device__ __forceinline__ GradSums<A> combine(const GradSums<A>& a, const GradSums<A>& b) {
  return {a.dz + b.dz, a.dz_xmu + b.dz_xmu};
}

// Channel (warp index) c's `splits` partials combined in a fixed order: lane l
// takes splits l, l + 32, ... in turn, then lanes fold downwards in halves.
// The whole warp calls it; lane 0 holds the result.
template <typename Value>
__device__ __forceinline__ Value combine_partials(const Value* partials, int64_t splits, int lane, Value zero) {
  Value total = zero;
  for (int64_t s = lane; s < splits; s += 32) total = combine(total, partials[s]);
  for (int offset = 16; offset > 0; offset /= 2) {
    const Value other = shuffle_down(total, offset);
    if (lane < offset) total = combine(total, other);
  }
  return total;
}

// Rows-layout partials of a block: values[row lane][lane][e] folded along the
// row lanes in halves (a fixed tree); row lane 0 then holds the block's.
template <typename Value, int kPack>
__device__ __forceinline__ void fold_row_lanes(Value (*values)[kPack], int lanes, int row_lanes) {
  const int lane = threadIdx.x, row_lane = threadIdx.y;
  for (int stride = row_lanes / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (row_lane < stride) {
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        values[row_lane * lanes + lane][e] =
            combine(values[row_lane * lanes + lane][e], values[(row_lane + stride) * lanes + lane][e]);
      }
    }
  }
  __syncthreads();
}

// Planes-layout partials: values[0..kThreads) folded in halves into values[0].
template <typename Value>
__device__ __forceinline__ void fold_block(Value* values) {
  const int tid = threadIdx.x;
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (tid < stride) values[tid] = combine(values[tid], values[tid + stride]);
  }
  __syncthreads();
}

// Packs [first, last) of channel c, pack index m = o * inner_packs + i,
// visited by kThreads threads from first + threadIdx.x, one at a time:
// visit(flat pack index (o * C + c) * inner_packs + i).
template <typename F>
__device__ __forceinline__ void for_channel_packs(int64_t first, int64_t last, int64_t inner_packs, int64_t channels,
                                                  int64_t c, F visit) {
  int64_t m = first + threadIdx.x;
  if (m >= last) return;
  int64_t o = m / inner_packs, i = m % inner_packs;
  const int64_t step_o = kThreads / inner_packs, step_i = kThreads % inner_packs;
  for (; m < last; m += kThreads) {
    visit((o * channels + c) * inner_packs + i);
    i += step_i;
    o += step_o;
    if (i >= inner_packs) {
      i -= inner_packs;
      ++o;
    }
  }
}

// ---------------------------------------------------------------- forward

// Rows: block (channel block, split); a thread's V channels over its rows.
template <typename T, typename A, int V>
__global__ void __launch_bounds__(kThreads)
    bn_stats_rows(const T* x, int64_t rows, int64_t channels, int64_t chunk, int64_t splits, bool aligned,
                  Stats<A>* partials) {
  __shared__ Stats<A> shared[kThreads][V];
  const int lanes = blockDim.x, row_lanes = blockDim.y;
  const int64_t c0 = (blockIdx.x * int64_t{lanes} + threadIdx.x) * V, split = blockIdx.y;
  const int64_t last = std::min(rows, (split + 1) * chunk);
  A mean[V], m2[V], count = A(0);
#pragma unroll
  for (int e = 0; e < V; ++e) mean[e] = m2[e] = A(0);
  const auto update = [&](const Pack<T, V>& p) {
    count += A(1);
    const A share = A(1) / count;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A v = to_acc(p.v[e]), delta = v - mean[e];
      mean[e] += delta * share;
      m2[e] += delta * (v - mean[e]);
    }
  };
  if (c0 < channels) {
    int64_t r = split * chunk + threadIdx.y;
    for (; r + (kUnroll - 1) * row_lanes < last; r += kUnroll * row_lanes) {
      Pack<T, V> p[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) p[k] = load_pack<T, V>(x + (r + k * row_lanes) * channels + c0, aligned);
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) update(p[k]);
    }
    for (; r < last; r += row_lanes) update(load_pack<T, V>(x + r * channels + c0, aligned));
  }
  const int slot = threadIdx.y * lanes + threadIdx.x;
#pragma unroll
  for (int e = 0; e < V; ++e) shared[slot][e] = {mean[e], m2[e], count};
  fold_row_lanes<Stats<A>, V>(shared, lanes, row_lanes);
  if (threadIdx.y == 0 && c0 < channels) {
#pragma unroll
    for (int e = 0; e < V; ++e) partials[(c0 + e) * splits + split] = shared[threadIdx.x][e];
  }
}

// Planes: block (channel, split) -> the Welford partial of its packs. A pack's
// V values (one plane) are summarized exactly (their mean is a sum times 1/V,
// a power of two) and merged with one division.
template <typename T, typename A, int V>
__global__ void __launch_bounds__(kThreads)
    bn_stats_planes(const T* x, BatchNormShape shape, int64_t chunk, int64_t splits, bool aligned,
                    Stats<A>* partials) {
  __shared__ Stats<A> shared[kThreads];
  const int64_t c = blockIdx.x, split = blockIdx.y, packs = shape.reduced() / V;
  Stats<A> local{A(0), A(0), A(0)};
  for_channel_packs(split * chunk, std::min(packs, (split + 1) * chunk), shape.inner / V, shape.channels, c,
                    [&](int64_t at) {
                      const Pack<T, V> p = load_pack<T, V>(x + at * V, aligned);
                      A sum = A(0);
#pragma unroll
                      for (int e = 0; e < V; ++e) sum += to_acc(p.v[e]);
                      const A pack_mean = sum * (A(1) / A(V));
                      A squares = A(0);
#pragma unroll
                      for (int e = 0; e < V; ++e) {
                        const A d = to_acc(p.v[e]) - pack_mean;
                        squares += d * d;
                      }
                      local = merge(local, Stats<A>{pack_mean, squares, A(V)});
                    });
  shared[threadIdx.x] = local;
  fold_block(shared);
  if (threadIdx.x == 0) partials[c * splits + split] = shared[0];
}

// One warp per channel: the batch statistics, the running-stat update, the affine.
template <typename A>
__global__ void __launch_bounds__(kThreads)
    bn_finalize_stats(const Stats<A>* partials, int64_t channels, int64_t splits, double eps, double momentum,
                      const A* weight, const A* bias, A* running_mean, A* running_var, A* save_mean,
                      A* save_invstd, ChannelAffine<A>* affine) {
  const int64_t c = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (c >= channels) return;  // the whole warp
  const Stats<A> total = combine_partials(partials + c * splits, splits, lane, Stats<A>{A(0), A(0), A(0)});
  if (lane != 0) return;
  const A var = total.m2 / total.count;
  save_mean[c] = total.mean;
  save_invstd[c] = reciprocal_sqrt(var + static_cast<A>(eps));
  affine[c] = channel_affine(c, save_mean, save_invstd, weight, bias);
  if (running_mean != nullptr) {
    const A m = static_cast<A>(momentum);
    running_mean[c] = (A(1) - m) * running_mean[c] + m * total.mean;
    running_var[c] = (A(1) - m) * running_var[c] + m * total.m2 / (total.count - A(1));
  }
}

template <typename A>
__global__ void bn_eval_stats(const A* running_mean, const A* running_var, int64_t channels, double eps,
                              const A* weight, const A* bias, A* save_mean, A* save_invstd, ChannelAffine<A>* affine) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= channels) return;
  save_mean[c] = running_mean[c];
  save_invstd[c] = reciprocal_sqrt(running_var[c] + static_cast<A>(eps));
  affine[c] = channel_affine(c, save_mean, save_invstd, weight, bias);
}

template <typename A>
__device__ __forceinline__ A normalize(A x, const ChannelAffine<A>& affine, bool relu) {
  const A v = x * affine.scale + affine.shift;
  return relu && !(v > A(0)) ? A(0) : v;
}

template <typename T, typename A, int V, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    bn_apply_rows(const T* x, int64_t rows, int64_t channels, bool aligned, const ChannelAffine<A>* affine, T* y) {
  const int row_lanes = blockDim.y;
  const int64_t c0 = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * V;
  if (c0 >= channels) return;
  ChannelAffine<A> a[V];
#pragma unroll
  for (int e = 0; e < V; ++e) a[e] = affine[c0 + e];
  const auto apply = [&](int64_t r, const Pack<T, V>& in) {
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_acc<T>(normalize(to_acc(in.v[e]), a[e], kRelu));
    store_pack(y + r * channels + c0, out, aligned);
  };
  const int64_t step = int64_t{gridDim.y} * row_lanes;
  int64_t r = blockIdx.y * int64_t{row_lanes} + threadIdx.y;
  for (; r + (kUnroll - 1) * step < rows; r += kUnroll * step) {
    Pack<T, V> p[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) p[k] = load_pack<T, V>(x + (r + k * step) * channels + c0, aligned);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) apply(r + k * step, p[k]);
  }
  for (; r < rows; r += step) apply(r, load_pack<T, V>(x + r * channels + c0, aligned));
}

// Planes: flat over packs; a pack lies in one plane, so one channel per pack.
template <typename T, typename A, int V, bool kRelu, typename D>
__global__ void __launch_bounds__(kThreads)
    bn_apply_planes(const T* x, int64_t packs, D inner, D channels, bool aligned, const ChannelAffine<A>* affine,
                    T* y) {
  for (int64_t k = blockIdx.x * int64_t{kThreads} + threadIdx.x; k < packs; k += int64_t{gridDim.x} * kThreads) {
    const int64_t plane = inner.div(k * V);
    const ChannelAffine<A> a = affine[plane - channels.div(plane) * channels.value()];
    const Pack<T, V> in = load_pack<T, V>(x + k * V, aligned);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_acc<T>(normalize(to_acc(in.v[e]), a, kRelu));
    store_pack(y + k * V, out, aligned);
  }
}

// ---------------------------------------------------------------- apply + 2x2 max pool
// max_pool2d(relu(bn(x)), 2) without the full-size y: each window's four
// values normalized as bn_apply normalizes them and rounded to T as y would be
// stored, then pool.cu's rule (the first, then greater or NaN). Same values
// and indices as bn_apply then max_pool2d's kernels, bit for bit.

// A window's maximum and its position k (row k >> 1, column k & 1).
template <typename T>
struct WindowMax {
  T value;
  int at;
};

template <typename T, typename A>
__device__ __forceinline__ WindowMax<T> max_normalized(T x0, T x1, T x2, T x3, const ChannelAffine<A>& affine) {
  const T window[4] = {x0, x1, x2, x3};
  A best = to_acc(from_acc<T>(normalize(to_acc(window[0]), affine, true)));
  int at = 0;
#pragma unroll
  for (int k = 1; k < 4; ++k) {
    const A v = to_acc(from_acc<T>(normalize(to_acc(window[k]), affine, true)));
    if (v > best || v != v) {
      best = v;
      at = k;
    }
  }
  return {from_acc<T>(best), at};
}

// NCHW: a thread per output element (flat over N*C planes of OH x OW).
template <typename T, typename A, typename D>
__global__ void __launch_bounds__(kThreads)
    bn_relu_pool_planes(const T* x, int64_t outputs, D out_w, D out_h, D channels, int64_t in_h, int64_t in_w,
                        const ChannelAffine<A>* affine, T* y, int32_t* indices) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < outputs; i += int64_t{gridDim.x} * kThreads) {
    const int64_t row = out_w.div(i), ow = i - row * out_w.value();
    const int64_t plane = out_h.div(row), oh = row - plane * out_h.value();
    const ChannelAffine<A> a = affine[plane - channels.div(plane) * channels.value()];
    const T* src = x + (plane * in_h + 2 * oh) * in_w + 2 * ow;
    const WindowMax<T> m = max_normalized(src[0], src[1], src[in_w], src[in_w + 1], a);
    y[i] = m.value;
    indices[i] = static_cast<int32_t>((2 * oh + (m.at >> 1)) * in_w + 2 * ow + (m.at & 1));
  }
}

// NHWC: a thread per output pixel's pack of V channels (V divides C): four
// pack loads per window, the y pack and the index pack stored.
template <typename T, typename A, int V, typename D>
__global__ void __launch_bounds__(kThreads)
    bn_relu_pool_rows(const T* x, int64_t packs, D channel_packs, D out_w, D out_h, int64_t channels, int64_t in_h,
                      int64_t in_w, bool aligned, const ChannelAffine<A>* affine, T* y, int32_t* indices) {
  for (int64_t k = blockIdx.x * int64_t{kThreads} + threadIdx.x; k < packs; k += int64_t{gridDim.x} * kThreads) {
    const int64_t pixel = channel_packs.div(k), c0 = (k - pixel * channel_packs.value()) * V;
    const int64_t row = out_w.div(pixel), ow = pixel - row * out_w.value();
    const int64_t b = out_h.div(row), oh = row - b * out_h.value();
    const int64_t next_row = in_w * channels;
    const T* src = x + ((b * in_h + 2 * oh) * in_w + 2 * ow) * channels + c0;
    const Pack<T, V> window[4] = {load_pack<T, V>(src, aligned), load_pack<T, V>(src + channels, aligned),
                                  load_pack<T, V>(src + next_row, aligned),
                                  load_pack<T, V>(src + next_row + channels, aligned)};
    Pack<T, V> out;
    Pack<int32_t, V> where;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const WindowMax<T> m = max_normalized(window[0].v[e], window[1].v[e], window[2].v[e], window[3].v[e],
                                            affine[c0 + e]);
      out.v[e] = m.value;
      where.v[e] = static_cast<int32_t>((2 * oh + (m.at >> 1)) * in_w + 2 * ow + (m.at & 1));
    }
    store_pack(y + k * V, out, aligned);
    store_pack(indices + k * V, where, aligned);
  }
}

// ---------------------------------------------------------------- backward
// The kernels read dy through a Gradient: load<V>(at, aligned) gives the pack
// of the full-size gradient at flat element index `at` (a pack lies in one
// row of channels, or in one plane). DenseGradient reads dy itself; the
// pooled ones form it from the 2x2 max pool's dy and argmax indices, as
// max_pool2d's backward would have written it (0 + dy where the index names
// the element, else 0, in T), so the full-size gradient is never stored.

// Each also says which kernels it needs instantiated: the layouts it serves
// (kRows, kPlanes), whether only the ReLU variants (the pooled ones: the fused
// op always has its ReLU), and the planes' index arithmetic (index_type: the
// pooled ones' own D, chosen by the same rule, so no other is compiled).
template <typename T>
struct DenseGradient {
  static constexpr bool kRows = true, kPlanes = true, kReluOnly = false;
  template <typename Body>
  static void index_type(bool fast, Body&& body) {
    dispatch_divider(fast, body);
  }
  const T* dy;
  template <int V>
  __device__ __forceinline__ Pack<T, V> load(int64_t at, bool aligned) const {
    return load_pack<T, V>(dy + at, aligned);
  }
};

template <typename T>
__device__ __forceinline__ T unpooled(T g, int32_t index, int64_t here) {
  using A = typename Acc<T>::type;
  A total = A(0);  // as max_pool2d's backward sums (-0.0 becomes +0.0)
  if (index == here) total += to_acc(g);
  return from_acc<T>(total);
}

// NHWC (rows): a pack is V channels of one pixel; the pooled dy and indices
// are (N, OH, OW, C), read as packs too (V divides C).
template <typename T, typename D>
struct PooledRowsGradient {
  static constexpr bool kRows = true, kPlanes = false, kReluOnly = true;
  template <typename Body>
  static void index_type(bool, Body&& body) {
    body.template operator()<D>();
  }
  const T* dy;
  const int32_t* indices;
  D channels, width, height;
  int64_t out_h, out_w;
  template <int V>
  __device__ __forceinline__ Pack<T, V> load(int64_t at, bool aligned) const {
    const int64_t pixel = channels.div(at), c = at - pixel * channels.value();
    const int64_t row = width.div(pixel), w = pixel - row * width.value();
    const int64_t n = height.div(row), h = row - n * height.value();
    Pack<T, V> out;
    if ((h >> 1) < out_h && (w >> 1) < out_w) {
      const int64_t o = ((n * out_h + (h >> 1)) * out_w + (w >> 1)) * channels.value() + c;
      const Pack<T, V> g = load_pack<T, V>(dy + o, aligned);
      const Pack<int32_t, V> index = load_pack<int32_t, V>(indices + o, aligned);
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = unpooled(g.v[e], index.v[e], h * width.value() + w);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = unpooled(T{}, 0, -1);
    }
    return out;
  }
};

// NCHW (planes): a pack is V elements of one plane (V divides H * W), which
// may span rows; each element finds its window. dy and indices are (N, C, OH, OW).
template <typename T, typename D>
struct PooledPlanesGradient {
  static constexpr bool kRows = false, kPlanes = true, kReluOnly = true;
  template <typename Body>
  static void index_type(bool, Body&& body) {
    body.template operator()<D>();
  }
  const T* dy;
  const int32_t* indices;
  D plane_size, width;
  int64_t out_h, out_w;
  template <int V>
  __device__ __forceinline__ Pack<T, V> load(int64_t at, bool) const {
    const int64_t plane = plane_size.div(at), first = at - plane * plane_size.value();
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int64_t here = first + e, h = width.div(here), w = here - h * width.value();
      if ((h >> 1) < out_h && (w >> 1) < out_w) {
        const int64_t o = (plane * out_h + (h >> 1)) * out_w + (w >> 1);
        out.v[e] = unpooled(dy[o], indices[o], here);
      } else {
        out.v[e] = unpooled(T{}, 0, -1);
      }
    }
    return out;
  }
};

template <typename T, typename A, int V, bool kRelu, typename Gradient>
__global__ void __launch_bounds__(kThreads)
    bn_grad_sums_rows(const T* x, Gradient dy, int64_t rows, int64_t channels, int64_t chunk, int64_t splits,
                      bool aligned, const A* mean, const A* invstd, const A* weight, const A* bias,
                      GradSums<A>* partials) {
  __shared__ GradSums<A> shared[kThreads][V];
  const int lanes = blockDim.x, row_lanes = blockDim.y;
  const int64_t c0 = (blockIdx.x * int64_t{lanes} + threadIdx.x) * V, split = blockIdx.y;
  const int64_t last = std::min(rows, (split + 1) * chunk);
  GradSums<A> local[V];
#pragma unroll
  for (int e = 0; e < V; ++e) local[e] = {A(0), A(0)};
  if (c0 < channels) {
    ChannelAffine<A> a[V];
    A mu[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      a[e] = channel_affine(c0 + e, mean, invstd, weight, bias);
      mu[e] = mean[c0 + e];
    }
    const auto add = [&](const Pack<T, V>& xp, const Pack<T, V>& gp) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A xv = to_acc(xp.v[e]), dz = masked(to_acc(gp.v[e]), xv, a[e], kRelu);
        local[e].dz += dz;
        local[e].dz_xmu += dz * (xv - mu[e]);
      }
    };
    int64_t r = split * chunk + threadIdx.y;
    for (; r + (kUnroll - 1) * row_lanes < last; r += kUnroll * row_lanes) {
      Pack<T, V> xp[kUnroll], gp[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t at = (r + k * row_lanes) * channels + c0;
        xp[k] = load_pack<T, V>(x + at, aligned);
        gp[k] = dy.template load<V>(at, aligned);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) add(xp[k], gp[k]);
    }
    for (; r < last; r += row_lanes) {
      add(load_pack<T, V>(x + r * channels + c0, aligned), dy.template load<V>(r * channels + c0, aligned));
    }
  }
  const int slot = threadIdx.y * lanes + threadIdx.x;
#pragma unroll
  for (int e = 0; e < V; ++e) shared[slot][e] = local[e];
  fold_row_lanes<GradSums<A>, V>(shared, lanes, row_lanes);
  if (threadIdx.y == 0 && c0 < channels) {
#pragma unroll
    for (int e = 0; e < V; ++e) partials[(c0 + e) * splits + split] = shared[threadIdx.x][e];
  }
}

template <typename T, typename A, int V, bool kRelu, typename Gradient>
__global__ void __launch_bounds__(kThreads)
    bn_grad_sums_planes(const T* x, Gradient dy, BatchNormShape shape, int64_t chunk, int64_t splits, bool aligned,
                        const A* mean, const A* invstd, const A* weight, const A* bias, GradSums<A>* partials) {
  __shared__ GradSums<A> shared[kThreads];
  const int64_t c = blockIdx.x, split = blockIdx.y, packs = shape.reduced() / V;
  const ChannelAffine<A> a = channel_affine(c, mean, invstd, weight, bias);
  const A mu = mean[c];
  GradSums<A> local{A(0), A(0)};
  for_channel_packs(split * chunk, std::min(packs, (split + 1) * chunk), shape.inner / V, shape.channels, c,
                    [&](int64_t at) {
                      const Pack<T, V> xp = load_pack<T, V>(x + at * V, aligned);
                      const Pack<T, V> gp = dy.template load<V>(at * V, aligned);
#pragma unroll
                      for (int e = 0; e < V; ++e) {
                        const A xv = to_acc(xp.v[e]), dz = masked(to_acc(gp.v[e]), xv, a, kRelu);
                        local.dz += dz;
                        local.dz_xmu += dz * (xv - mu);
                      }
                    });
  shared[threadIdx.x] = local;
  fold_block(shared);
  if (threadIdx.x == 0) partials[c * splits + split] = shared[0];
}

// One warp per channel: dweight, dbias and dx's coefficients. splits == 0:
// no sums were taken (eval mode without dweight/dbias).
template <typename A>
__global__ void __launch_bounds__(kThreads)
    bn_finalize_grads(const GradSums<A>* partials, int64_t channels, int64_t splits, int64_t reduced,
                      bool training, const A* mean, const A* invstd, const A* weight, const A* bias, A* dweight,
                      A* dbias, GradCoefficients<A>* coefficients) {
  const int64_t c = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (c >= channels) return;  // the whole warp
  const GradSums<A> total = combine_partials(partials + c * splits, splits, lane, GradSums<A>{A(0), A(0)});
  if (lane != 0) return;
  if (dweight != nullptr) dweight[c] = total.dz_xmu * invstd[c];
  if (dbias != nullptr) dbias[c] = total.dz;
  GradCoefficients<A> k{channel_affine(c, mean, invstd, weight, bias), mean[c], A(0), A(0)};
  if (training) {
    const A inv_m = A(1) / static_cast<A>(reduced), s = invstd[c];
    k.mean_term = k.affine.scale * total.dz * inv_m;
    k.slope = k.affine.scale * total.dz_xmu * inv_m * s * s;
  }
  coefficients[c] = k;
}

template <typename T, typename A, int V, bool kRelu, typename Gradient>
__global__ void __launch_bounds__(kThreads)
    bn_grad_input_rows(const T* x, Gradient dy, int64_t rows, int64_t channels, bool aligned,
                       const GradCoefficients<A>* coefficients, T* dx) {
  const int row_lanes = blockDim.y;
  const int64_t c0 = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * V;
  if (c0 >= channels) return;
  GradCoefficients<A> k[V];
#pragma unroll
  for (int e = 0; e < V; ++e) k[e] = coefficients[c0 + e];
  const auto apply = [&](int64_t at, const Pack<T, V>& xp, const Pack<T, V>& gp) {
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_acc<T>(grad_input(to_acc(gp.v[e]), to_acc(xp.v[e]), k[e], kRelu));
    store_pack(dx + at, out, aligned);
  };
  const int64_t step = int64_t{gridDim.y} * row_lanes;
  int64_t r = blockIdx.y * int64_t{row_lanes} + threadIdx.y;
  for (; r + (kUnroll - 1) * step < rows; r += kUnroll * step) {
    Pack<T, V> xp[kUnroll], gp[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t at = (r + u * step) * channels + c0;
      xp[u] = load_pack<T, V>(x + at, aligned);
      gp[u] = dy.template load<V>(at, aligned);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) apply((r + u * step) * channels + c0, xp[u], gp[u]);
  }
  for (; r < rows; r += step) {
    const int64_t at = r * channels + c0;
    apply(at, load_pack<T, V>(x + at, aligned), dy.template load<V>(at, aligned));
  }
}

template <typename T, typename A, int V, bool kRelu, typename D, typename Gradient>
__global__ void __launch_bounds__(kThreads)
    bn_grad_input_planes(const T* x, Gradient dy, int64_t packs, D inner, D channels, bool aligned,
                         const GradCoefficients<A>* coefficients, T* dx) {
  for (int64_t p = blockIdx.x * int64_t{kThreads} + threadIdx.x; p < packs; p += int64_t{gridDim.x} * kThreads) {
    const int64_t plane = inner.div(p * V);
    const GradCoefficients<A> k = coefficients[plane - channels.div(plane) * channels.value()];
    const Pack<T, V> xp = load_pack<T, V>(x + p * V, aligned), gp = dy.template load<V>(p * V, aligned);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_acc<T>(grad_input(to_acc(gp.v[e]), to_acc(xp.v[e]), k, kRelu));
    store_pack(dx + p * V, out, aligned);
  }
}

// ---------------------------------------------------------------- launches

// Workspace: the per-channel values (affine or coefficients), then the partials.
template <typename A>
size_t channel_bytes(int64_t channels) {
  const size_t per = std::max(sizeof(ChannelAffine<A>), sizeof(GradCoefficients<A>));
  return (per * static_cast<size_t>(channels) + 255) / 256 * 256;
}

template <typename T, typename A>
size_t workspace_bytes_typed(const BatchNormShape& shape) {
  const Geometry g = geometry_for<T>(shape);
  const size_t partial = std::max(sizeof(Stats<A>), sizeof(GradSums<A>));
  return channel_bytes<A>(shape.channels) + partial * static_cast<size_t>(shape.channels * g.splits);
}

unsigned warp_per_channel_blocks(int64_t channels) {
  return static_cast<unsigned>((channels + kThreads / 32 - 1) / (kThreads / 32));
}

// body.template operator()<V>() with V the geometry's pack (a power of two up to kFullPack<T>).
template <typename T, typename Body>
void dispatch_pack(const Geometry& g, Body&& body) {
  switch (g.pack) {
    case 1: body.template operator()<1>(); break;
    case 2: body.template operator()<2>(); break;
    case 4:
      if constexpr (kFullPack<T> >= 4) body.template operator()<4>();
      break;
    default:
      if constexpr (kFullPack<T> >= 8) body.template operator()<8>();
      break;
  }
}

template <typename Body>
void dispatch_relu(bool relu, Body&& body) {
  if (relu) {
    body.template operator()<true>();
  } else {
    body.template operator()<false>();
  }
}

// dispatch_relu for a Gradient's kernels: the ReLU variants only where it says so.
template <typename Gradient, typename Body>
void dispatch_relu_for(bool relu, Body&& body) {
  if constexpr (Gradient::kReluOnly) {
    body.template operator()<true>();
  } else {
    dispatch_relu(relu, body);
  }
}


// The forward's first half: the batch statistics (training, with the running
// stats' update) or the running ones (eval), saved, and each channel's affine
// form in the workspace, which it returns.
template <typename T, typename A>
ChannelAffine<A>* forward_statistics(const BatchNormArgs& args, const Geometry& g, const T* xs, bool aligned,
                                     const A* w, const A* b, void* running_mean, void* running_var, A* mean,
                                     A* invstd, void* workspace, cudaStream_t s) {
  const BatchNormShape shape = args.shape;
  ChannelAffine<A>* affine = static_cast<ChannelAffine<A>*>(workspace);
  if (args.training) {
    auto* partials = reinterpret_cast<Stats<A>*>(static_cast<char*>(workspace) + channel_bytes<A>(shape.channels));
    dispatch_pack<T>(g, [&]<int V>() {
      if (g.rows) {
        bn_stats_rows<T, A, V>
            <<<dim3(static_cast<unsigned>(g.channel_blocks), static_cast<unsigned>(g.splits)),
               dim3(g.lanes, g.row_lanes), 0, s>>>(xs, shape.outer, shape.channels, g.chunk, g.splits, aligned,
                                                   partials);
      } else {
        bn_stats_planes<T, A, V>
            <<<dim3(static_cast<unsigned>(shape.channels), static_cast<unsigned>(g.splits)), kThreads, 0, s>>>(
                xs, shape, g.chunk, g.splits, aligned, partials);
      }
    });
    cuda::check_last_launch("batch_norm statistics");
    bn_finalize_stats<A><<<warp_per_channel_blocks(shape.channels), kThreads, 0, s>>>(
        partials, shape.channels, g.splits, args.eps, args.momentum, w, b, static_cast<A*>(running_mean),
        static_cast<A*>(running_var), mean, invstd, affine);
    cuda::check_last_launch("batch_norm finalize statistics");
  } else {
    bn_eval_stats<A><<<static_cast<unsigned>((shape.channels + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        static_cast<const A*>(running_mean), static_cast<const A*>(running_var), shape.channels, args.eps, w, b,
        mean, invstd, affine);
    cuda::check_last_launch("batch_norm eval statistics");
  }
  return affine;
}

// The backward's three launches (see the top of the file) with dy read through `dy` (a Gradient).
template <typename T, typename Gradient>
void backward_launches(const BatchNormArgs& args, const T* xs, const Gradient& dy, bool aligned,
                       const void* save_mean, const void* save_invstd, const void* weight, const void* bias, void* dx,
                       void* dweight, void* dbias, void* workspace, cudaStream_t s) {
  using A = typename Acc<T>::type;
  const BatchNormShape shape = args.shape;
  const Geometry g = geometry_for<T>(shape);
  const A* mean = static_cast<const A*>(save_mean);
  const A* invstd = static_cast<const A*>(save_invstd);
  const A* w = static_cast<const A*>(weight);
  const A* b = static_cast<const A*>(bias);
  auto* coefficients = static_cast<GradCoefficients<A>*>(workspace);
  auto* partials = reinterpret_cast<GradSums<A>*>(static_cast<char*>(workspace) + channel_bytes<A>(shape.channels));
  // The sums are needed for dweight/dbias, and for dx in training mode.
  const bool sums = dweight != nullptr || dbias != nullptr || args.training;
  if (sums) {
    dispatch_pack<T>(g, [&]<int V>() {
      dispatch_relu_for<Gradient>(args.relu, [&]<bool kRelu>() {
        if constexpr (Gradient::kRows) {
          if (g.rows) {
            bn_grad_sums_rows<T, A, V, kRelu>
                <<<dim3(static_cast<unsigned>(g.channel_blocks), static_cast<unsigned>(g.splits)),
                   dim3(g.lanes, g.row_lanes), 0, s>>>(xs, dy, shape.outer, shape.channels, g.chunk, g.splits,
                                                       aligned, mean, invstd, w, b, partials);
          }
        }
        if constexpr (Gradient::kPlanes) {
          if (!g.rows) {
            bn_grad_sums_planes<T, A, V, kRelu>
                <<<dim3(static_cast<unsigned>(shape.channels), static_cast<unsigned>(g.splits)), kThreads, 0, s>>>(
                    xs, dy, shape, g.chunk, g.splits, aligned, mean, invstd, w, b, partials);
          }
        }
      });
    });
    cuda::check_last_launch("batch_norm backward sums");
  }
  bn_finalize_grads<A><<<warp_per_channel_blocks(shape.channels), kThreads, 0, s>>>(
      partials, shape.channels, sums ? g.splits : 0, shape.reduced(), args.training, mean, invstd, w, b,
      static_cast<A*>(dweight), static_cast<A*>(dbias), coefficients);
  cuda::check_last_launch("batch_norm backward finalize");
  if (dx == nullptr) return;
  dispatch_pack<T>(g, [&]<int V>() {
    dispatch_relu_for<Gradient>(args.relu, [&]<bool kRelu>() {
      if constexpr (Gradient::kRows) {
        if (g.rows) {
          bn_grad_input_rows<T, A, V, kRelu>
              <<<dim3(static_cast<unsigned>(g.channel_blocks), static_cast<unsigned>(row_blocks(g, shape.outer))),
                 dim3(g.lanes, g.row_lanes), 0, s>>>(xs, dy, shape.outer, shape.channels, aligned, coefficients,
                                                     static_cast<T*>(dx));
        }
      }
      if constexpr (Gradient::kPlanes) {
        if (!g.rows) {
          const int64_t n = shape.reduced() * shape.channels;
          Gradient::index_type(fast_divide_fits(n), [&]<typename D>() {
            bn_grad_input_planes<T, A, V, kRelu, D><<<flat_blocks(n / V), kThreads, 0, s>>>(
                xs, dy, n / V, divider_for<D>(shape.inner), divider_for<D>(shape.channels), aligned, coefficients,
                static_cast<T*>(dx));
          });
        }
      }
    });
  });
  cuda::check_last_launch("batch_norm backward input");
}

// The fused pool's arguments: relu on, an NCHW (N, C, H*W) or NHWC (N*H*W, C, 1) shape of at least 2 x 2.
void check_pooled(const BatchNormArgs& args, int64_t height, int64_t width, const char* op) {
  const BatchNormShape shape = args.shape;
  const bool rows = shape.inner == 1;
  KILN_CHECK(args.relu && height >= 2 && width >= 2 && (rows || shape.inner == height * width) &&
                 (!rows || shape.outer % (height * width) == 0),
             op, ": expected relu on and an NCHW or NHWC input of at least 2 x 2 (outer ", shape.outer, ", inner ",
             shape.inner, ", height ", height, ", width ", width, ")");
}

}  // namespace

// ---------------------------------------------------------------- entry points

size_t batch_norm_workspace_bytes(const BatchNormArgs& args) {
  size_t bytes = 0;
  dispatch_floating_as_native(args.dtype, "batch_norm (cuda)", [&]<typename T>() {
    bytes = workspace_bytes_typed<T, typename Acc<T>::type>(args.shape);
  });
  return bytes;
}

void batch_norm_forward_cuda(const BatchNormArgs& args, const void* x, const void* weight, const void* bias,
                             void* running_mean, void* running_var, void* y, void* save_mean, void* save_invstd,
                             void* workspace, cuda::Stream stream) {
  const BatchNormShape shape = args.shape;
  if (shape.reduced() * shape.channels == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  dispatch_floating_as_native(args.dtype, "batch_norm (cuda)", [&]<typename T>() {
    using A = typename Acc<T>::type;
    const Geometry g = geometry_for<T>(shape);
    const bool aligned = aligned16({x, y});
    const T* xs = static_cast<const T*>(x);
    const ChannelAffine<A>* affine = forward_statistics<T, A>(
        args, g, xs, aligned, static_cast<const A*>(weight), static_cast<const A*>(bias), running_mean, running_var,
        static_cast<A*>(save_mean), static_cast<A*>(save_invstd), workspace, s);
    dispatch_pack<T>(g, [&]<int V>() {
      dispatch_relu(args.relu, [&]<bool kRelu>() {
        if (g.rows) {
          bn_apply_rows<T, A, V, kRelu>
              <<<dim3(static_cast<unsigned>(g.channel_blocks), static_cast<unsigned>(row_blocks(g, shape.outer))),
                 dim3(g.lanes, g.row_lanes), 0, s>>>(xs, shape.outer, shape.channels, aligned, affine,
                                                     static_cast<T*>(y));
        } else {
          const int64_t n = shape.reduced() * shape.channels;
          dispatch_divider(fast_divide_fits(n), [&]<typename D>() {
            bn_apply_planes<T, A, V, kRelu, D><<<flat_blocks(n / V), kThreads, 0, s>>>(
                xs, n / V, divider_for<D>(shape.inner), divider_for<D>(shape.channels), aligned, affine,
                static_cast<T*>(y));
          });
        }
      });
    });
    cuda::check_last_launch("batch_norm apply");
  });
}

// NCHW (inner = height * width) or NHWC (rows: inner == 1, outer = N * H * W).
void batch_norm_relu_max_pool2d_forward_cuda(const BatchNormArgs& args, int64_t height, int64_t width, const void* x,
                                             const void* weight, const void* bias, void* running_mean,
                                             void* running_var, void* y, int32_t* indices, void* save_mean,
                                             void* save_invstd, void* workspace, cuda::Stream stream) {
  const char* op = "batch_norm_relu_max_pool2d (cuda)";
  check_pooled(args, height, width, op);
  const BatchNormShape shape = args.shape;
  const bool rows = shape.inner == 1;
  if (shape.reduced() * shape.channels == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  dispatch_floating_as_native(args.dtype, op, [&]<typename T>() {
    using A = typename Acc<T>::type;
    const Geometry g = geometry_for<T>(shape);
    const T* xs = static_cast<const T*>(x);
    const ChannelAffine<A>* affine = forward_statistics<T, A>(
        args, g, xs, aligned16({x}), static_cast<const A*>(weight), static_cast<const A*>(bias), running_mean,
        running_var, static_cast<A*>(save_mean), static_cast<A*>(save_invstd), workspace, s);
    const int64_t out_h = height / 2, out_w = width / 2, C = shape.channels;
    const int64_t images = rows ? shape.outer / (height * width) : shape.outer;
    const int64_t outputs = images * C * out_h * out_w;
    dispatch_divider(fast_divide_fits(outputs), [&]<typename D>() {
      if (!rows) {
        bn_relu_pool_planes<T, A, D><<<flat_blocks(outputs), kThreads, 0, s>>>(
            xs, outputs, divider_for<D>(out_w), divider_for<D>(out_h), divider_for<D>(C), height, width, affine,
            static_cast<T*>(y), indices);
        return;
      }
      const bool aligned = aligned16({x, y, indices});
      const auto launch = [&]<int V>() {
        bn_relu_pool_rows<T, A, V, D><<<flat_blocks(outputs / V), kThreads, 0, s>>>(
            xs, outputs / V, divider_for<D>(C / V), divider_for<D>(out_w), divider_for<D>(out_h), C, height, width,
            aligned, affine, static_cast<T*>(y), indices);
      };
      if (C % kFullPack<T> == 0) {
        launch.template operator()<kFullPack<T>>();
      } else {
        launch.template operator()<1>();
      }
    });
    cuda::check_last_launch("batch_norm_relu_max_pool2d apply");
  });
}

void batch_norm_backward_cuda(const BatchNormArgs& args, const void* x, const void* dy, const void* weight,
                              const void* bias, const void* save_mean, const void* save_invstd, void* dx,
                              void* dweight, void* dbias, void* workspace, cuda::Stream stream) {
  if (args.shape.reduced() * args.shape.channels == 0) return;
  dispatch_floating_as_native(args.dtype, "batch_norm backward (cuda)", [&]<typename T>() {
    backward_launches<T>(args, static_cast<const T*>(x), DenseGradient<T>{static_cast<const T*>(dy)},
                         aligned16({x, dy, dx}), save_mean, save_invstd, weight, bias, dx, dweight, dbias, workspace,
                         static_cast<cudaStream_t>(stream));
  });
}

void batch_norm_relu_max_pool2d_backward_cuda(const BatchNormArgs& args, int64_t height, int64_t width,
                                              const void* x, const void* dy, const int32_t* indices,
                                              const void* weight, const void* bias, const void* save_mean,
                                              const void* save_invstd, void* dx, void* dweight, void* dbias,
                                              void* workspace, cuda::Stream stream) {
  const char* op = "batch_norm_relu_max_pool2d backward (cuda)";
  check_pooled(args, height, width, op);
  const BatchNormShape shape = args.shape;
  const int64_t n = shape.reduced() * shape.channels;
  if (n == 0) return;
  dispatch_floating_as_native(args.dtype, op, [&]<typename T>() {
    const T* dys = static_cast<const T*>(dy);
    const bool aligned = aligned16({x, dy, indices, dx});
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    dispatch_divider(fast_divide_fits(n), [&]<typename D>() {
      if (shape.inner == 1) {
        const PooledRowsGradient<T, D> gradient{dys,
                                                indices,
                                                divider_for<D>(shape.channels),
                                                divider_for<D>(width),
                                                divider_for<D>(height),
                                                height / 2,
                                                width / 2};
        backward_launches<T>(args, static_cast<const T*>(x), gradient, aligned, save_mean, save_invstd, weight, bias,
                             dx, dweight, dbias, workspace, s);
      } else {
        const PooledPlanesGradient<T, D> gradient{dys, indices, divider_for<D>(shape.inner), divider_for<D>(width),
                                                  height / 2, width / 2};
        backward_launches<T>(args, static_cast<const T*>(x), gradient, aligned, save_mean, save_invstd, weight, bias,
                             dx, dweight, dbias, workspace, s);
      }
    });
  });
}

}  // namespace kiln::kernels
