// CUDA pooling (see kernels/pool.h): one thread per output element forward,
// one thread per input element backward (a gather over the windows that cover
// it, so no atomics: deterministic). 16-bit types compute in float.
// Each kernel serves both layouts through kChannelsLast: a tensor is read as
// (B, H, W, C) with C = p.channels and B = planes / C (NHWC), or with C = 1
// and B = planes (NCHW: each plane an image of one channel, so the channel
// index and the divisions by C fold away). Flat thread indices follow memory
// order, so consecutive threads walk W in NCHW and the channels in NHWC:
// coalesced either way.
// Index arithmetic (PoolIndex): a launch over fewer than 2^30 elements
// divides by FastDivmod (multiply-high and shift, kernels/strided.h) by the
// sizes fixed at launch; a larger one by 64-bit division, a software routine
// of tens of instructions on the GPU, several per element here (the flat index
// into (b, y, x, c); the stride tests of the backward's covering windows).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/fast_divide.cuh"
#include "kernels/pool.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/cuda/pack.cuh"
#include "kernels/strided.h"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

#define KILN_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// The divisors of one launch: the iterated tensor's C (read only for
// NHWC), W and H (the output's forward, the input's backward), and the strides.
template <typename D>
struct PoolIndex {
  D channels, width, height, stride_h, stride_w;
};

// The (b, y, x, c) of flat index i over (B, H, W, C), the sizes ix divides by; C = 1 in NCHW.
template <bool kChannelsLast, typename D>
struct Coordinates {
  int64_t b, y, x, c;
  __device__ __forceinline__ Coordinates(int64_t i, const PoolIndex<D>& ix) {
    const int64_t pixel = kChannelsLast ? ix.channels.div(i) : i;
    c = kChannelsLast ? i - pixel * ix.channels.value() : 0;
    const int64_t row = ix.width.div(pixel);
    x = pixel - row * ix.width.value();
    b = ix.height.div(row);
    y = row - b * ix.height.value();
  }
};

// The window positions k in [0, kernel) with index * stride - pad + k * dilation == at,
// visited for each output index along one dim (stride_div divides by stride).
template <typename D, typename F>
__device__ __forceinline__ void covering_outputs(int64_t at, int64_t out_size, int64_t kernel, int64_t stride,
                                                 const D& stride_div, int64_t pad, int64_t dilation, F visit) {
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t t = at + pad - k * dilation;
    if (t < 0) continue;
    const int64_t o = stride_div.div(t);
    if (o * stride != t) continue;
    if (o < out_size) visit(o);
  }
}

// C of the (B, H, W, C) view above.
template <bool kChannelsLast>
__device__ __forceinline__ int64_t channels(const Pool2dParams& p) {
  return kChannelsLast ? p.channels : 1;
}

template <typename T, bool kChannelsLast, typename D>
__global__ void max_forward(Pool2dParams p, const T* x, T* y, int32_t* indices, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.out_h * p.out_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t c = cell.c, ow = cell.x, oh = cell.y, b = cell.b;
    const T* src = x + b * p.in_h * p.in_w * C + c;
    // As the CPU: a window that lies wholly in the padding (possible with
    // dilation) gives -inf and index -1, which no input position matches.
    A best = static_cast<A>(-INFINITY);
    int64_t at = -1;
    for (int64_t ki = 0; ki < p.kernel_h; ++ki) {
      const int64_t ih = oh * p.stride_h - p.pad_h + ki * p.dilation_h;
      if (ih < 0 || ih >= p.in_h) continue;
      for (int64_t kj = 0; kj < p.kernel_w; ++kj) {
        const int64_t iw = ow * p.stride_w - p.pad_w + kj * p.dilation_w;
        if (iw < 0 || iw >= p.in_w) continue;
        const A v = to_acc(src[(ih * p.in_w + iw) * C]);
        if (at < 0 || v > best || v != v) {  // the CPU's rule: greater, or NaN
          best = v;
          at = ih * p.in_w + iw;
        }
      }
    }
    y[i] = from_acc<T>(best);
    indices[i] = static_cast<int32_t>(at);
  }
}

// 2x2 windows with stride 2, no padding or dilation, every window inside the
// input (ResNet's and FashionCNN's pools): a window is four fixed loads and
// an input lies in at most one window, so these skip the general kernels'
// window loops, bounds tests and covering-window divisions. The general
// kernels ran at 34% (NCHW) and 21% (NHWC) of the H200's copy rate forward.
// The same values, indices and bits as the general kernels.
bool plain_2x2(const Pool2dParams& p) {
  return p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 0 && p.pad_w == 0 &&
         p.dilation_h == 1 && p.dilation_w == 1 && 2 * p.out_h <= p.in_h && 2 * p.out_w <= p.in_w;
}

template <typename T, bool kChannelsLast, typename D>
__global__ void max_forward_2x2(Pool2dParams p, const T* x, T* y, int32_t* indices, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.out_h * p.out_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t ih = 2 * cell.y, iw = 2 * cell.x, next_row = p.in_w * C;
    const T* src = x + ((cell.b * p.in_h + ih) * p.in_w + iw) * C + cell.c;
    const A window[4] = {to_acc(src[0]), to_acc(src[C]), to_acc(src[next_row]), to_acc(src[next_row + C])};
    // The general kernel's rule in its order: the first, then greater or NaN.
    A best = window[0];
    int at = 0;
#pragma unroll
    for (int k = 1; k < 4; ++k) {
      if (window[k] > best || window[k] != window[k]) {
        best = window[k];
        at = k;
      }
    }
    y[i] = from_acc<T>(best);
    indices[i] = static_cast<int32_t>((ih + (at >> 1)) * p.in_w + iw + (at & 1));
  }
}

template <typename T, bool kChannelsLast, typename D>
__global__ void max_backward_2x2(Pool2dParams p, const T* dy, const int32_t* indices, T* dx, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.in_h * p.in_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t oh = cell.y >> 1, ow = cell.x >> 1;
    A total = A(0);  // 0 + dy, as the general kernel sums (-0.0 becomes +0.0 there too)
    if (oh < p.out_h && ow < p.out_w) {
      const int64_t o = ((cell.b * p.out_h + oh) * p.out_w + ow) * C + cell.c;
      if (indices[o] == static_cast<int32_t>(cell.y * p.in_w + cell.x)) total += to_acc(dy[o]);
    }
    dx[i] = from_acc<T>(total);
  }
}

// The same two kernels over 16-byte packs of channels, NHWC with C a multiple
// of the pack and every pointer aligned: a thread owns V channels of one
// pixel (ix.channels divides by C / V, so Coordinates' c is the pack), four
// 16-byte loads per window forward. Element for element the rules above.
template <typename T, typename D>
__global__ void max_forward_2x2_packed(Pool2dParams p, const T* x, T* y, int32_t* indices, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  constexpr int V = kFullPack<T>;
  const int64_t packs = p.planes * p.out_h * p.out_w / V, C = p.channels;
  KILN_GRID_STRIDE(i, packs) {
    const Coordinates<true, D> cell(i, ix);
    const int64_t ih = 2 * cell.y, iw = 2 * cell.x, next_row = p.in_w * C;
    const T* src = x + ((cell.b * p.in_h + ih) * p.in_w + iw) * C + cell.c * V;
    const Pack<T, V> window[4] = {load_pack<T, V>(src, true), load_pack<T, V>(src + C, true),
                                  load_pack<T, V>(src + next_row, true), load_pack<T, V>(src + next_row + C, true)};
    Pack<T, V> out;
    Pack<int32_t, V> at;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      A best = to_acc(window[0].v[e]);
      int k_best = 0;
#pragma unroll
      for (int k = 1; k < 4; ++k) {
        const A v = to_acc(window[k].v[e]);
        if (v > best || v != v) {
          best = v;
          k_best = k;
        }
      }
      out.v[e] = from_acc<T>(best);
      at.v[e] = static_cast<int32_t>((ih + (k_best >> 1)) * p.in_w + iw + (k_best & 1));
    }
    store_pack(y + i * V, out, true);
    store_pack(indices + i * V, at, true);
  }
}

template <typename T, typename D>
__global__ void max_backward_2x2_packed(Pool2dParams p, const T* dy, const int32_t* indices, T* dx, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  constexpr int V = kFullPack<T>;
  const int64_t packs = p.planes * p.in_h * p.in_w / V, C = p.channels;
  KILN_GRID_STRIDE(i, packs) {
    const Coordinates<true, D> cell(i, ix);
    const int64_t oh = cell.y >> 1, ow = cell.x >> 1;
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_acc<T>(A(0));
    if (oh < p.out_h && ow < p.out_w) {
      const int64_t o = ((cell.b * p.out_h + oh) * p.out_w + ow) * C + cell.c * V;
      const Pack<int32_t, V> at = load_pack<int32_t, V>(indices + o, true);
      const Pack<T, V> g = load_pack<T, V>(dy + o, true);
      const int32_t here = static_cast<int32_t>(cell.y * p.in_w + cell.x);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        A total = A(0);  // 0 + dy, as the general kernel sums
        if (at.v[e] == here) total += to_acc(g.v[e]);
        out.v[e] = from_acc<T>(total);
      }
    }
    store_pack(dx + i * V, out, true);
  }
}

// Whether the packed 2x2 kernels take this call: NHWC, C a multiple of the
// pack, every pointer 16-byte aligned (rows of C channels then are too).
template <typename T>
bool packed_2x2(const Pool2dParams& p, std::initializer_list<const void*> pointers) {
  return plain_2x2(p) && p.channels_last && p.channels % kFullPack<T> == 0 && aligned16(pointers);
}

// Blocks of a packed launch over the output (forward) or the input (backward).
template <typename T>
int packed_blocks(const Pool2dParams& p, bool over_output) {
  return blocks_for(p.planes * (over_output ? p.out_h * p.out_w : p.in_h * p.in_w) / kFullPack<T>);
}

template <typename T, bool kChannelsLast, typename D>
__global__ void max_backward(Pool2dParams p, const T* dy, const int32_t* indices, T* dx, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.in_h * p.in_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t c = cell.c, iw = cell.x, ih = cell.y, b = cell.b;
    const int64_t base = b * p.out_h * p.out_w * C + c;
    const int32_t self = static_cast<int32_t>(ih * p.in_w + iw);
    A total = A(0);
    covering_outputs(ih, p.out_h, p.kernel_h, p.stride_h, ix.stride_h, p.pad_h, p.dilation_h, [&](int64_t oh) {
      covering_outputs(iw, p.out_w, p.kernel_w, p.stride_w, ix.stride_w, p.pad_w, p.dilation_w, [&](int64_t ow) {
        const int64_t o = base + (oh * p.out_w + ow) * C;
        if (indices[o] == self) total += to_acc(dy[o]);
      });
    });
    dx[i] = from_acc<T>(total);
  }
}

template <typename T, bool kChannelsLast, typename D>
__global__ void avg_forward(Pool2dParams p, const T* x, T* y, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.out_h * p.out_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t c = cell.c, ow = cell.x, oh = cell.y, b = cell.b;
    const T* src = x + b * p.in_h * p.in_w * C + c;
    const AvgWindow wh = avg_window(oh, p.stride_h, p.pad_h, p.kernel_h, p.in_h);
    const AvgWindow ww = avg_window(ow, p.stride_w, p.pad_w, p.kernel_w, p.in_w);
    A total = A(0);
    for (int64_t ih = wh.start; ih < wh.end; ++ih) {
      for (int64_t iw = ww.start; iw < ww.end; ++iw) total += to_acc(src[(ih * p.in_w + iw) * C]);
    }
    const int64_t count =
        p.count_include_pad ? wh.padded_size * ww.padded_size : (wh.end - wh.start) * (ww.end - ww.start);
    y[i] = from_acc<T>(total / static_cast<A>(count));
  }
}

template <typename T, bool kChannelsLast, typename D>
__global__ void avg_backward(Pool2dParams p, const T* dy, T* dx, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.in_h * p.in_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t c = cell.c, iw = cell.x, ih = cell.y, b = cell.b;
    const int64_t base = b * p.out_h * p.out_w * C + c;
    A total = A(0);
    covering_outputs(ih, p.out_h, p.kernel_h, p.stride_h, ix.stride_h, p.pad_h, 1, [&](int64_t oh) {
      const AvgWindow wh = avg_window(oh, p.stride_h, p.pad_h, p.kernel_h, p.in_h);
      covering_outputs(iw, p.out_w, p.kernel_w, p.stride_w, ix.stride_w, p.pad_w, 1, [&](int64_t ow) {
        const AvgWindow ww = avg_window(ow, p.stride_w, p.pad_w, p.kernel_w, p.in_w);
        const int64_t count =
            p.count_include_pad ? wh.padded_size * ww.padded_size : (wh.end - wh.start) * (ww.end - ww.start);
        total += to_acc(dy[base + (oh * p.out_w + ow) * C]) / static_cast<A>(count);
      });
    });
    dx[i] = from_acc<T>(total);
  }
}

template <typename T, bool kChannelsLast, typename D>
__global__ void adaptive_forward(Pool2dParams p, const T* x, T* y, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.out_h * p.out_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t c = cell.c, ow = cell.x, oh = cell.y, b = cell.b;
    const T* src = x + b * p.in_h * p.in_w * C + c;
    const int64_t h0 = adaptive_start(oh, p.in_h, p.out_h), h1 = adaptive_end(oh, p.in_h, p.out_h);
    const int64_t w0 = adaptive_start(ow, p.in_w, p.out_w), w1 = adaptive_end(ow, p.in_w, p.out_w);
    A total = A(0);
    for (int64_t ih = h0; ih < h1; ++ih) {
      for (int64_t iw = w0; iw < w1; ++iw) total += to_acc(src[(ih * p.in_w + iw) * C]);
    }
    y[i] = from_acc<T>(total / static_cast<A>((h1 - h0) * (w1 - w0)));
  }
}

template <typename T, bool kChannelsLast, typename D>
__global__ void adaptive_backward(Pool2dParams p, const T* dy, T* dx, PoolIndex<D> ix) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.in_h * p.in_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const Coordinates<kChannelsLast, D> cell(i, ix);
    const int64_t c = cell.c, iw = cell.x, ih = cell.y, b = cell.b;
    const int64_t base = b * p.out_h * p.out_w * C + c;
    // Output cells whose window holds ih: from floor(ih*OH/H) to ceil((ih+1)*OH/H), checked.
    const int64_t oh0 = (ih * p.out_h) / p.in_h, oh1 = ((ih + 1) * p.out_h + p.in_h - 1) / p.in_h;
    const int64_t ow0 = (iw * p.out_w) / p.in_w, ow1 = ((iw + 1) * p.out_w + p.in_w - 1) / p.in_w;
    A total = A(0);
    for (int64_t oh = oh0; oh < oh1 && oh < p.out_h; ++oh) {
      const int64_t h0 = adaptive_start(oh, p.in_h, p.out_h), h1 = adaptive_end(oh, p.in_h, p.out_h);
      if (ih < h0 || ih >= h1) continue;
      for (int64_t ow = ow0; ow < ow1 && ow < p.out_w; ++ow) {
        const int64_t w0 = adaptive_start(ow, p.in_w, p.out_w), w1 = adaptive_end(ow, p.in_w, p.out_w);
        if (iw < w0 || iw >= w1) continue;
        total += to_acc(dy[base + (oh * p.out_w + ow) * C]) / static_cast<A>((h1 - h0) * (w1 - w0));
      }
    }
    dx[i] = from_acc<T>(total);
  }
}

#undef KILN_GRID_STRIDE

template <typename D>
PoolIndex<D> pool_index(const Pool2dParams& p, bool over_output) {
  return {divider_for<D>(p.channels_last ? p.channels : 1), divider_for<D>(over_output ? p.out_w : p.in_w),
          divider_for<D>(over_output ? p.out_h : p.in_h), divider_for<D>(p.stride_h), divider_for<D>(p.stride_w)};
}

// The launch sequence every entry point shares: nothing for no work (an empty
// grid is a CUDA error), the dtype's native type T, the layout and the index
// arithmetic (FastDivmod below 2^30 elements, with room for the backward's
// padded window positions; 64-bit division above), then
// launch.template operator()<T, kChannelsLast, D>(blocks, stream, index) and the launch check.
// over_output: the kernel iterates over the output (forward) or the input (backward).
template <typename Launch>
void launch_pool(DType dtype, const Pool2dParams& p, int64_t n, bool over_output, const char* name,
                 cuda::Stream stream, Launch&& launch) {
  if (n == 0) return;
  const bool fast = !force_64bit_index() && n < (int64_t{1} << 30) && p.pad_h < (int64_t{1} << 30) &&
                    p.pad_w < (int64_t{1} << 30) && p.stride_h <= (int64_t{1} << 30) && p.stride_w <= (int64_t{1} << 30);
  dispatch_floating(dtype, name, [&]<typename T>() {
    using N = typename Native<T>::type;
    dispatch_divider(fast, [&]<typename D>() {
      const PoolIndex<D> index = pool_index<D>(p, over_output);
      if (p.channels_last) {
        launch.template operator()<N, true, D>(blocks_for(n), static_cast<cudaStream_t>(stream), index);
      } else {
        launch.template operator()<N, false, D>(blocks_for(n), static_cast<cudaStream_t>(stream), index);
      }
    });
    cuda::check_last_launch(name);
  });
}

}  // namespace

// Forward kernels: one thread per output element; backward: one per input element.
void max_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y, int32_t* indices,
                             cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.out_h * p.out_w, /*over_output=*/true, "max_pool2d forward (cuda)", stream,
              [&]<typename T, bool kChannelsLast, typename D>(int blocks, cudaStream_t s, const PoolIndex<D>& index) {
                if (kChannelsLast && packed_2x2<T>(p, {x, y, indices})) {
                  PoolIndex<D> packed = index;
                  packed.channels = divider_for<D>(p.channels / kFullPack<T>);
                  max_forward_2x2_packed<T, D><<<packed_blocks<T>(p, true), kThreads, 0, s>>>(
                      p, static_cast<const T*>(x), static_cast<T*>(y), indices, packed);
                } else if (plain_2x2(p)) {
                  max_forward_2x2<T, kChannelsLast, D>
                      <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y), indices, index);
                } else {
                  max_forward<T, kChannelsLast, D>
                      <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y), indices, index);
                }
              });
}

void max_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, const int32_t* indices, void* dx,
                              cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.in_h * p.in_w, /*over_output=*/false, "max_pool2d backward (cuda)", stream,
              [&]<typename T, bool kChannelsLast, typename D>(int blocks, cudaStream_t s, const PoolIndex<D>& index) {
                if (kChannelsLast && packed_2x2<T>(p, {dy, indices, dx})) {
                  PoolIndex<D> packed = index;
                  packed.channels = divider_for<D>(p.channels / kFullPack<T>);
                  max_backward_2x2_packed<T, D><<<packed_blocks<T>(p, false), kThreads, 0, s>>>(
                      p, static_cast<const T*>(dy), indices, static_cast<T*>(dx), packed);
                } else if (plain_2x2(p)) {
                  max_backward_2x2<T, kChannelsLast, D>
                      <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(dy), indices, static_cast<T*>(dx), index);
                } else {
                  max_backward<T, kChannelsLast, D>
                      <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(dy), indices, static_cast<T*>(dx), index);
                }
              });
}

void avg_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y, cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.out_h * p.out_w, /*over_output=*/true, "avg_pool2d forward (cuda)", stream,
              [&]<typename T, bool kChannelsLast, typename D>(int blocks, cudaStream_t s, const PoolIndex<D>& index) {
                avg_forward<T, kChannelsLast, D>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y), index);
              });
}

void avg_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, void* dx, cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.in_h * p.in_w, /*over_output=*/false, "avg_pool2d backward (cuda)", stream,
              [&]<typename T, bool kChannelsLast, typename D>(int blocks, cudaStream_t s, const PoolIndex<D>& index) {
                avg_backward<T, kChannelsLast, D>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(dy), static_cast<T*>(dx), index);
              });
}

void adaptive_avg_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y,
                                      cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.out_h * p.out_w, /*over_output=*/true, "adaptive_avg_pool2d forward (cuda)",
              stream,
              [&]<typename T, bool kChannelsLast, typename D>(int blocks, cudaStream_t s, const PoolIndex<D>& index) {
                adaptive_forward<T, kChannelsLast, D>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y), index);
              });
}

void adaptive_avg_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, void* dx,
                                       cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.in_h * p.in_w, /*over_output=*/false, "adaptive_avg_pool2d backward (cuda)",
              stream,
              [&]<typename T, bool kChannelsLast, typename D>(int blocks, cudaStream_t s, const PoolIndex<D>& index) {
                adaptive_backward<T, kChannelsLast, D>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(dy), static_cast<T*>(dx), index);
              });
}

}  // namespace kiln::kernels
