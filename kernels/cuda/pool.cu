// CUDA pooling (see kernels/pool.h): one thread per output element forward,
// one thread per input element backward (a gather over the windows that cover
// it, so no atomics: deterministic). 16-bit types compute in float.
// Each kernel serves both layouts through kChannelsLast: a tensor is read as
// (B, H, W, C) with C = p.channels and B = planes / C (NHWC), or with C = 1
// and B = planes (NCHW: each plane an image of one channel, so the channel
// index and the divisions by C fold away). Flat thread indices follow memory
// order, so consecutive threads walk W in NCHW and the channels in NHWC:
// coalesced either way.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/pool.h"
#include "kernels/cuda/native_types.cuh"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

#define KILN_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// The window positions k in [0, kernel) with index * stride - pad + k * dilation == at,
// visited for each output index along one dim.
template <typename F>
__device__ __forceinline__ void covering_outputs(int64_t at, int64_t out_size, int64_t kernel, int64_t stride,
                                                 int64_t pad, int64_t dilation, F visit) {
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t t = at + pad - k * dilation;
    if (t < 0 || t % stride != 0) continue;
    const int64_t o = t / stride;
    if (o < out_size) visit(o);
  }
}

// C of the (B, H, W, C) view above.
template <bool kChannelsLast>
__device__ __forceinline__ int64_t channels(const Pool2dParams& p) {
  return kChannelsLast ? p.channels : 1;
}

template <typename T, bool kChannelsLast>
__global__ void max_forward(Pool2dParams p, const T* x, T* y, int32_t* indices) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.out_h * p.out_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const int64_t c = i % C, pixel = i / C;
    const int64_t ow = pixel % p.out_w, oh = (pixel / p.out_w) % p.out_h, b = pixel / (p.out_w * p.out_h);
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

template <typename T, bool kChannelsLast>
__global__ void max_backward(Pool2dParams p, const T* dy, const int32_t* indices, T* dx) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.in_h * p.in_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const int64_t c = i % C, pixel = i / C;
    const int64_t iw = pixel % p.in_w, ih = (pixel / p.in_w) % p.in_h, b = pixel / (p.in_w * p.in_h);
    const int64_t base = b * p.out_h * p.out_w * C + c;
    const int32_t self = static_cast<int32_t>(ih * p.in_w + iw);
    A total = A(0);
    covering_outputs(ih, p.out_h, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h, [&](int64_t oh) {
      covering_outputs(iw, p.out_w, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w, [&](int64_t ow) {
        const int64_t o = base + (oh * p.out_w + ow) * C;
        if (indices[o] == self) total += to_acc(dy[o]);
      });
    });
    dx[i] = from_acc<T>(total);
  }
}

template <typename T, bool kChannelsLast>
__global__ void avg_forward(Pool2dParams p, const T* x, T* y) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.out_h * p.out_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const int64_t c = i % C, pixel = i / C;
    const int64_t ow = pixel % p.out_w, oh = (pixel / p.out_w) % p.out_h, b = pixel / (p.out_w * p.out_h);
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

template <typename T, bool kChannelsLast>
__global__ void avg_backward(Pool2dParams p, const T* dy, T* dx) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.in_h * p.in_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const int64_t c = i % C, pixel = i / C;
    const int64_t iw = pixel % p.in_w, ih = (pixel / p.in_w) % p.in_h, b = pixel / (p.in_w * p.in_h);
    const int64_t base = b * p.out_h * p.out_w * C + c;
    A total = A(0);
    covering_outputs(ih, p.out_h, p.kernel_h, p.stride_h, p.pad_h, 1, [&](int64_t oh) {
      const AvgWindow wh = avg_window(oh, p.stride_h, p.pad_h, p.kernel_h, p.in_h);
      covering_outputs(iw, p.out_w, p.kernel_w, p.stride_w, p.pad_w, 1, [&](int64_t ow) {
        const AvgWindow ww = avg_window(ow, p.stride_w, p.pad_w, p.kernel_w, p.in_w);
        const int64_t count =
            p.count_include_pad ? wh.padded_size * ww.padded_size : (wh.end - wh.start) * (ww.end - ww.start);
        total += to_acc(dy[base + (oh * p.out_w + ow) * C]) / static_cast<A>(count);
      });
    });
    dx[i] = from_acc<T>(total);
  }
}

template <typename T, bool kChannelsLast>
__global__ void adaptive_forward(Pool2dParams p, const T* x, T* y) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.out_h * p.out_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const int64_t c = i % C, pixel = i / C;
    const int64_t ow = pixel % p.out_w, oh = (pixel / p.out_w) % p.out_h, b = pixel / (p.out_w * p.out_h);
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

template <typename T, bool kChannelsLast>
__global__ void adaptive_backward(Pool2dParams p, const T* dy, T* dx) {
  using A = typename Acc<T>::type;
  const int64_t n = p.planes * p.in_h * p.in_w, C = channels<kChannelsLast>(p);
  KILN_GRID_STRIDE(i, n) {
    const int64_t c = i % C, pixel = i / C;
    const int64_t iw = pixel % p.in_w, ih = (pixel / p.in_w) % p.in_h, b = pixel / (p.in_w * p.in_h);
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

// The launch sequence every entry point shares: nothing for no work (an empty
// grid is a CUDA error), the dtype's native type T and the layout, then
// launch.template operator()<T, kChannelsLast>(blocks, stream) and the launch check.
template <typename Launch>
void launch_pool(DType dtype, const Pool2dParams& p, int64_t n, const char* name, cuda::Stream stream,
                 Launch&& launch) {
  if (n == 0) return;
  dispatch_floating(dtype, name, [&]<typename T>() {
    using N = typename Native<T>::type;
    if (p.channels_last) {
      launch.template operator()<N, true>(blocks_for(n), static_cast<cudaStream_t>(stream));
    } else {
      launch.template operator()<N, false>(blocks_for(n), static_cast<cudaStream_t>(stream));
    }
    cuda::check_last_launch(name);
  });
}

}  // namespace

// Forward kernels: one thread per output element; backward: one per input element.
void max_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y, int32_t* indices,
                             cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.out_h * p.out_w, "max_pool2d forward (cuda)", stream,
              [&]<typename T, bool kChannelsLast>(int blocks, cudaStream_t s) {
                max_forward<T, kChannelsLast>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y), indices);
              });
}

void max_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, const int32_t* indices, void* dx,
                              cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.in_h * p.in_w, "max_pool2d backward (cuda)", stream,
              [&]<typename T, bool kChannelsLast>(int blocks, cudaStream_t s) {
                max_backward<T, kChannelsLast>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(dy), indices, static_cast<T*>(dx));
              });
}

void avg_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y, cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.out_h * p.out_w, "avg_pool2d forward (cuda)", stream,
              [&]<typename T, bool kChannelsLast>(int blocks, cudaStream_t s) {
                avg_forward<T, kChannelsLast>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y));
              });
}

void avg_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, void* dx, cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.in_h * p.in_w, "avg_pool2d backward (cuda)", stream,
              [&]<typename T, bool kChannelsLast>(int blocks, cudaStream_t s) {
                avg_backward<T, kChannelsLast>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(dy), static_cast<T*>(dx));
              });
}

void adaptive_avg_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y,
                                      cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.out_h * p.out_w, "adaptive_avg_pool2d forward (cuda)", stream,
              [&]<typename T, bool kChannelsLast>(int blocks, cudaStream_t s) {
                adaptive_forward<T, kChannelsLast>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y));
              });
}

void adaptive_avg_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, void* dx,
                                       cuda::Stream stream) {
  launch_pool(dtype, p, p.planes * p.in_h * p.in_w, "adaptive_avg_pool2d backward (cuda)", stream,
              [&]<typename T, bool kChannelsLast>(int blocks, cudaStream_t s) {
                adaptive_backward<T, kChannelsLast>
                    <<<blocks, kThreads, 0, s>>>(p, static_cast<const T*>(dy), static_cast<T*>(dx));
              });
}

}  // namespace kiln::kernels
