// CPU pooling: one plane per task (planes split across threads), so
// backward scatters stay inside a plane and need no atomics. Channels-last
// (NHWC): one output row (n, oh) per task forward and one image per task
// backward, the innermost loop over the C contiguous channels (it vectorizes);
// each element sees the NCHW kernel's operations in the NCHW kernel's order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/float_convert.h"
#include "kernels/cpu/max_pool_plane.h"
#include "kernels/pool.h"

namespace kiln::kernels {

namespace {

constexpr int64_t kParallelThreshold = 1 << 15;  // output elements

// 2x2 windows with stride 2 and no padding: the common CNN case.
template <typename T>
void max_forward_2x2(const Pool2dParams& p, const T* x, T* y, int32_t* indices) {
  const int64_t H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w;
#pragma omp parallel if (p.planes * OH * OW > kParallelThreshold)
  {
    cpu::MaxPool2x2Rows rows;
#pragma omp for schedule(static)
    for (int64_t plane = 0; plane < p.planes; ++plane) {
      cpu::max_pool_plane_2x2(x + plane * H * W, W, OH, OW, y + plane * OH * OW, indices + plane * OH * OW, rows);
    }
  }
}

template <typename T>
void max_forward(const Pool2dParams& p, const T* x, T* y, int32_t* indices) {
  using A = compute_t<T>;
  const int64_t H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w;
  if (p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 0 && p.pad_w == 0 &&
      p.dilation_h == 1 && p.dilation_w == 1) {
    max_forward_2x2(p, x, y, indices);
    return;
  }
#pragma omp parallel for schedule(static) if (p.planes * OH * OW > kParallelThreshold)
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    const T* src = x + plane * H * W;
    T* dst = y + plane * OH * OW;
    int32_t* idx = indices + plane * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh) {
      int64_t h0 = oh * p.stride_h - p.pad_h;
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t w0 = ow * p.stride_w - p.pad_w;
        A best = -std::numeric_limits<A>::infinity();
        int64_t at = -1;
        for (int64_t ki = 0; ki < p.kernel_h; ++ki) {
          const int64_t ih = h0 + ki * p.dilation_h;
          if (ih < 0 || ih >= H) continue;
          for (int64_t kj = 0; kj < p.kernel_w; ++kj) {
            const int64_t iw = w0 + kj * p.dilation_w;
            if (iw < 0 || iw >= W) continue;
            const A v = static_cast<A>(src[ih * W + iw]);
            if (at < 0 || v > best || std::isnan(v)) {  // torch's rule: a later NaN wins
              best = v;
              at = ih * W + iw;
            }
          }
        }
        dst[oh * OW + ow] = static_cast<T>(best);
        idx[oh * OW + ow] = static_cast<int32_t>(at);
      }
    }
  }
}

template <typename T>
void max_backward(const Pool2dParams& p, const T* dy, const int32_t* indices, T* dx) {
  const int64_t HW = p.in_h * p.in_w, OHW = p.out_h * p.out_w;
#pragma omp parallel for schedule(static) if (p.planes * HW > kParallelThreshold)
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    cpu::max_pool_backward_plane(dy + plane * OHW, indices + plane * OHW, OHW, dx + plane * HW, HW);
  }
}

// Average pooling and adaptive average pooling differ only in their windows:
// output (oh, ow) averages input rows [rows.start, rows.end) and columns
// [cols.start, cols.end), divided by rows.divisor * cols.divisor.
struct AverageSpan {
  int64_t start, end, divisor;
};

struct AvgPoolSpans {
  const Pool2dParams& p;
  static AverageSpan span(const AvgWindow& w, bool count_include_pad) {
    return {w.start, w.end, count_include_pad ? w.padded_size : w.end - w.start};
  }
  AverageSpan rows(int64_t oh) const {
    return span(avg_window(oh, p.stride_h, p.pad_h, p.kernel_h, p.in_h), p.count_include_pad);
  }
  AverageSpan cols(int64_t ow) const {
    return span(avg_window(ow, p.stride_w, p.pad_w, p.kernel_w, p.in_w), p.count_include_pad);
  }
};

struct AdaptiveSpans {
  const Pool2dParams& p;
  static AverageSpan span(int64_t index, int64_t in_size, int64_t out_size) {
    const int64_t start = adaptive_start(index, in_size, out_size), end = adaptive_end(index, in_size, out_size);
    return {start, end, end - start};
  }
  AverageSpan rows(int64_t oh) const { return span(oh, p.in_h, p.out_h); }
  AverageSpan cols(int64_t ow) const { return span(ow, p.in_w, p.out_w); }
};

// `parallel_work` decides whether the planes go to several threads.
template <typename T, typename Spans>
void average_forward(const Pool2dParams& p, const Spans& spans, int64_t parallel_work, const T* x, T* y) {
  using A = compute_t<T>;
  const int64_t H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w;
#pragma omp parallel for schedule(static) if (parallel_work > kParallelThreshold)
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    const T* src = x + plane * H * W;
    T* dst = y + plane * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const AverageSpan wh = spans.rows(oh);
      for (int64_t ow = 0; ow < OW; ++ow) {
        const AverageSpan ww = spans.cols(ow);
        A total = 0;
        for (int64_t ih = wh.start; ih < wh.end; ++ih) {
          for (int64_t iw = ww.start; iw < ww.end; ++iw) total += static_cast<A>(src[ih * W + iw]);
        }
        dst[oh * OW + ow] = static_cast<T>(total / static_cast<A>(wh.divisor * ww.divisor));
      }
    }
  }
}

template <typename T, typename Spans>
void average_backward(const Pool2dParams& p, const Spans& spans, const T* dy, T* dx) {
  using A = compute_t<T>;
  const int64_t H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w;
#pragma omp parallel for schedule(static) if (p.planes * H * W > kParallelThreshold)
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    T* dst = dx + plane * H * W;
    const T* g = dy + plane * OH * OW;
    // 16-bit: sum the overlapping windows' shares in float and round once (as
    // the CUDA kernel does); rounding after every share loses the small sums
    // of shares that cancel.
    std::vector<A> sums;
    A* acc = nullptr;
    if constexpr (std::is_same_v<T, A>) {
      acc = dst;
    } else {
      sums.resize(static_cast<size_t>(H * W));
      acc = sums.data();
    }
    std::fill(acc, acc + H * W, A(0));
    for (int64_t oh = 0; oh < OH; ++oh) {
      const AverageSpan wh = spans.rows(oh);
      for (int64_t ow = 0; ow < OW; ++ow) {
        const AverageSpan ww = spans.cols(ow);
        const A share = static_cast<A>(g[oh * OW + ow]) / static_cast<A>(wh.divisor * ww.divisor);
        for (int64_t ih = wh.start; ih < wh.end; ++ih) {
          for (int64_t iw = ww.start; iw < ww.end; ++iw) acc[ih * W + iw] += share;
        }
      }
    }
    if constexpr (!std::is_same_v<T, A>) {
      for (int64_t i = 0; i < H * W; ++i) dst[i] = static_cast<T>(acc[i]);
    }
  }
}

// --- channels-last (NHWC): x (N, H, W, C), y and indices (N, OH, OW, C).

// Where a 16-bit T accumulates in float: the output row itself when T is its
// own compute type, else `scratch` (resized to `count`).
template <typename T>
compute_t<T>* accumulator(T* out, std::vector<compute_t<T>>& scratch, int64_t count) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    return out;
  } else {
    scratch.resize(static_cast<size_t>(count));
    return scratch.data();
  }
}

template <typename T>
void store(const compute_t<T>* acc, T* out, int64_t count) {
  if constexpr (!std::is_same_v<T, compute_t<T>>) {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(acc[i]);
  }
}

template <typename T>
void max_forward_nhwc(const Pool2dParams& p, const T* x, T* y, int32_t* indices) {
  using A = compute_t<T>;
  const int64_t C = p.channels, H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w, rows = p.planes / C * OH;
#pragma omp parallel for schedule(static) if (p.planes * OH * OW > kParallelThreshold)
  for (int64_t row = 0; row < rows; ++row) {  // (n, oh)
    const int64_t n = row / OH, oh = row % OH;
    std::vector<A> scratch;
    for (int64_t ow = 0; ow < OW; ++ow) {
      T* dst = y + (row * OW + ow) * C;
      int32_t* __restrict at = indices + (row * OW + ow) * C;
      A* __restrict best = accumulator(dst, scratch, C);
      bool first = true;  // the NCHW rule `at < 0 || v > best || isnan(v)`, the first test hoisted
      for (int64_t ki = 0; ki < p.kernel_h; ++ki) {
        const int64_t ih = oh * p.stride_h - p.pad_h + ki * p.dilation_h;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kj = 0; kj < p.kernel_w; ++kj) {
          const int64_t iw = ow * p.stride_w - p.pad_w + kj * p.dilation_w;
          if (iw < 0 || iw >= W) continue;
          const T* __restrict src = x + ((n * H + ih) * W + iw) * C;
          const int32_t offset = static_cast<int32_t>(ih * W + iw);
          if (first) {
            for (int64_t c = 0; c < C; ++c) {
              best[c] = static_cast<A>(src[c]);
              at[c] = offset;
            }
            first = false;
            continue;
          }
          for (int64_t c = 0; c < C; ++c) {
            const A v = static_cast<A>(src[c]);
            const bool take = (v > best[c]) | (v != v);  // greater, or NaN: branch-free so that it vectorizes
            best[c] = take ? v : best[c];
            at[c] = take ? offset : at[c];
          }
        }
      }
      if (first) {  // the window lay wholly in the padding (possible with dilation)
        std::fill(best, best + C, -std::numeric_limits<A>::infinity());
        std::fill(at, at + C, int32_t{-1});
      }
      store(best, dst, C);
    }
  }
}

// Zero the image, then scatter each channel's gradient: the NCHW plane's adds
// in the same (oh, ow) order, each rounded to T as there.
template <typename T>
void max_backward_nhwc(const Pool2dParams& p, const T* dy, const int32_t* indices, T* dx) {
  using A = compute_t<T>;
  const int64_t C = p.channels, HWC = p.in_h * p.in_w * C, OHW = p.out_h * p.out_w, images = p.planes / C;
#pragma omp parallel for schedule(static) if (p.planes * p.in_h * p.in_w > kParallelThreshold)
  for (int64_t n = 0; n < images; ++n) {
    T* dst = dx + n * HWC;
    std::fill(dst, dst + HWC, static_cast<T>(A(0)));
    for (int64_t o = 0; o < OHW; ++o) {
      const T* g = dy + (n * OHW + o) * C;
      const int32_t* idx = indices + (n * OHW + o) * C;
      for (int64_t c = 0; c < C; ++c) {
        if (idx[c] < 0) continue;  // a window wholly in the padding
        T& d = dst[idx[c] * C + c];
        d = static_cast<T>(static_cast<A>(d) + static_cast<A>(g[c]));
      }
    }
  }
}

template <typename T, typename Spans>
void average_forward_nhwc(const Pool2dParams& p, const Spans& spans, int64_t parallel_work, const T* x, T* y) {
  using A = compute_t<T>;
  const int64_t C = p.channels, H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w, rows = p.planes / C * OH;
#pragma omp parallel for schedule(static) if (parallel_work > kParallelThreshold)
  for (int64_t row = 0; row < rows; ++row) {  // (n, oh)
    const int64_t n = row / OH;
    const AverageSpan wh = spans.rows(row % OH);
    std::vector<A> scratch;
    for (int64_t ow = 0; ow < OW; ++ow) {
      const AverageSpan ww = spans.cols(ow);
      T* dst = y + (row * OW + ow) * C;
      A* __restrict total = accumulator(dst, scratch, C);
      std::fill(total, total + C, A(0));
      for (int64_t ih = wh.start; ih < wh.end; ++ih) {
        for (int64_t iw = ww.start; iw < ww.end; ++iw) {
          const T* __restrict src = x + ((n * H + ih) * W + iw) * C;
          for (int64_t c = 0; c < C; ++c) total[c] += static_cast<A>(src[c]);
        }
      }
      const A divisor = static_cast<A>(wh.divisor * ww.divisor);
      for (int64_t c = 0; c < C; ++c) total[c] = total[c] / divisor;
      store(total, dst, C);
    }
  }
}

template <typename T, typename Spans>
void average_backward_nhwc(const Pool2dParams& p, const Spans& spans, const T* dy, T* dx) {
  using A = compute_t<T>;
  const int64_t C = p.channels, H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w, images = p.planes / C;
#pragma omp parallel for schedule(static) if (p.planes * H * W > kParallelThreshold)
  for (int64_t n = 0; n < images; ++n) {
    T* dst = dx + n * H * W * C;
    std::vector<A> sums, shares(static_cast<size_t>(C));
    A* acc = accumulator(dst, sums, H * W * C);  // 16-bit: float sums rounded once, as NCHW
    std::fill(acc, acc + H * W * C, A(0));
    for (int64_t oh = 0; oh < OH; ++oh) {
      const AverageSpan wh = spans.rows(oh);
      for (int64_t ow = 0; ow < OW; ++ow) {
        const AverageSpan ww = spans.cols(ow);
        const T* g = dy + ((n * OH + oh) * OW + ow) * C;
        const A divisor = static_cast<A>(wh.divisor * ww.divisor);
        A* __restrict share = shares.data();
        for (int64_t c = 0; c < C; ++c) share[c] = static_cast<A>(g[c]) / divisor;
        for (int64_t ih = wh.start; ih < wh.end; ++ih) {
          for (int64_t iw = ww.start; iw < ww.end; ++iw) {
            A* __restrict a = acc + (ih * W + iw) * C;
            for (int64_t c = 0; c < C; ++c) a[c] += share[c];
          }
        }
      }
    }
    store(acc, dst, H * W * C);
  }
}

}  // namespace

void max_pool2d_forward_cpu(DType dtype, const Pool2dParams& p, const void* x, void* y, int32_t* indices) {
  dispatch_floating(dtype, "max_pool2d (cpu kernel)", [&]<typename T>() {
    if (p.channels_last) {
      max_forward_nhwc(p, static_cast<const T*>(x), static_cast<T*>(y), indices);
    } else {
      max_forward(p, static_cast<const T*>(x), static_cast<T*>(y), indices);
    }
  });
}
void max_pool2d_backward_cpu(DType dtype, const Pool2dParams& p, const void* dy, const int32_t* indices, void* dx) {
  dispatch_floating(dtype, "max_pool2d backward (cpu kernel)", [&]<typename T>() {
    if (p.channels_last) {
      max_backward_nhwc(p, static_cast<const T*>(dy), indices, static_cast<T*>(dx));
    } else {
      max_backward(p, static_cast<const T*>(dy), indices, static_cast<T*>(dx));
    }
  });
}
void avg_pool2d_forward_cpu(DType dtype, const Pool2dParams& p, const void* x, void* y) {
  dispatch_floating(dtype, "avg_pool2d (cpu kernel)", [&]<typename T>() {
    const int64_t work = p.planes * p.out_h * p.out_w;
    if (p.channels_last) {
      average_forward_nhwc(p, AvgPoolSpans{p}, work, static_cast<const T*>(x), static_cast<T*>(y));
    } else {
      average_forward(p, AvgPoolSpans{p}, work, static_cast<const T*>(x), static_cast<T*>(y));
    }
  });
}
void avg_pool2d_backward_cpu(DType dtype, const Pool2dParams& p, const void* dy, void* dx) {
  dispatch_floating(dtype, "avg_pool2d backward (cpu kernel)", [&]<typename T>() {
    if (p.channels_last) {
      average_backward_nhwc(p, AvgPoolSpans{p}, static_cast<const T*>(dy), static_cast<T*>(dx));
    } else {
      average_backward(p, AvgPoolSpans{p}, static_cast<const T*>(dy), static_cast<T*>(dx));
    }
  });
}
void adaptive_avg_pool2d_forward_cpu(DType dtype, const Pool2dParams& p, const void* x, void* y) {
  dispatch_floating(dtype, "adaptive_avg_pool2d (cpu kernel)", [&]<typename T>() {
    const int64_t work = p.planes * p.in_h * p.in_w;
    if (p.channels_last) {
      average_forward_nhwc(p, AdaptiveSpans{p}, work, static_cast<const T*>(x), static_cast<T*>(y));
    } else {
      average_forward(p, AdaptiveSpans{p}, work, static_cast<const T*>(x), static_cast<T*>(y));
    }
  });
}
void adaptive_avg_pool2d_backward_cpu(DType dtype, const Pool2dParams& p, const void* dy, void* dx) {
  dispatch_floating(dtype, "adaptive_avg_pool2d backward (cpu kernel)", [&]<typename T>() {
    if (p.channels_last) {
      average_backward_nhwc(p, AdaptiveSpans{p}, static_cast<const T*>(dy), static_cast<T*>(dx));
    } else {
      average_backward(p, AdaptiveSpans{p}, static_cast<const T*>(dy), static_cast<T*>(dx));
    }
  });
}

}  // namespace kiln::kernels
