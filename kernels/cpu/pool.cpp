// CPU pooling: one plane per task (planes split across threads), so
// backward scatters stay inside a plane and need no atomics. Channels-last
// (NHWC): one output row (n, oh) per task forward and one image per task
// backward, the innermost loop over the C contiguous channels (it vectorizes);
// each element sees the NCHW kernel's operations in the NCHW kernel's order.
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/float_convert.h"
#include "kernels/pool.h"

namespace kiln::kernels {

namespace {

constexpr int64_t kParallelThreshold = 1 << 15;  // output elements

// One output row of a 2x2, stride-2 max pool: OW outputs from input
// rows r0 and r1 (base0 and base1: their offsets in the plane, for the
// indices). Each window's elements in max_forward's order, with its rule: a
// greater value, or a NaN, takes the place.
template <typename A>
void max_row_2x2_scalar(const A* __restrict__ r0, const A* __restrict__ r1, int32_t base0, int32_t base1,
                        A* __restrict__ d, int32_t* __restrict__ q, int64_t OW) {
  for (int64_t ow = 0; ow < OW; ++ow) {
    const int32_t c = 2 * static_cast<int32_t>(ow);
    A best = r0[2 * ow];
    int32_t at = base0 + c;
    A v = r0[2 * ow + 1];
    bool take = (v > best) | (v != v);
    best = take ? v : best;
    at = take ? base0 + c + 1 : at;
    v = r1[2 * ow];
    take = (v > best) | (v != v);
    best = take ? v : best;
    at = take ? base1 + c : at;
    v = r1[2 * ow + 1];
    take = (v > best) | (v != v);
    best = take ? v : best;
    at = take ? base1 + c + 1 : at;
    d[ow] = best;
    q[ow] = at;
  }
}

#if defined(__AVX2__)
// The same rule on 8 (or 4) windows at once: the loop above does not vectorize
// (its loads are stride 2), and FashionCNN's rows are 14 and 7 outputs long,
// too short for a vector loop with a scalar tail anyway. The last vector of a
// row overlaps the one before when OW is not a multiple of its width: those
// outputs are computed twice, to the same values.
struct Lanes8 {
  using Values = __m256;
  using Indices = __m256i;
  static constexpr int kWidth = 8;
  // x[0], x[2], ..., x[14] and x[1], ..., x[15]: shuffle_ps works within 128-bit
  // halves (giving 0 2 8 10 | 4 6 12 14), permute4x64 orders the 64-bit pairs.
  static void deinterleave(const float* x, Values& even, Values& odd) {
    const __m256 lo = _mm256_loadu_ps(x), hi = _mm256_loadu_ps(x + 8);
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xd8));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xdd)), 0xd8));
  }
  static Indices columns(int32_t first) {  // first, first + 2, ..., first + 14
    return _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
  }
  static Indices add(Indices a, int32_t b) { return _mm256_add_epi32(a, _mm256_set1_epi32(b)); }
  static void take(Values v, Indices v_at, Values& best, Indices& at) {
    const __m256 mask = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    best = _mm256_blendv_ps(best, v, mask);
    at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(v_at), mask));
  }
  static void store(float* d, int32_t* q, Values best, Indices at) {
    _mm256_storeu_ps(d, best);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), at);
  }
};

struct Lanes4 {
  using Values = __m128;
  using Indices = __m128i;
  static constexpr int kWidth = 4;
  static void deinterleave(const float* x, Values& even, Values& odd) {
    const __m128 lo = _mm_loadu_ps(x), hi = _mm_loadu_ps(x + 4);
    even = _mm_shuffle_ps(lo, hi, 0x88);
    odd = _mm_shuffle_ps(lo, hi, 0xdd);
  }
  static Indices columns(int32_t first) { return _mm_add_epi32(_mm_set1_epi32(first), _mm_setr_epi32(0, 2, 4, 6)); }
  static Indices add(Indices a, int32_t b) { return _mm_add_epi32(a, _mm_set1_epi32(b)); }
  static void take(Values v, Indices v_at, Values& best, Indices& at) {
    const __m128 mask = _mm_or_ps(_mm_cmpgt_ps(v, best), _mm_cmpunord_ps(v, v));
    best = _mm_blendv_ps(best, v, mask);
    at = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(at), _mm_castsi128_ps(v_at), mask));
  }
  static void store(float* d, int32_t* q, Values best, Indices at) {
    _mm_storeu_ps(d, best);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), at);
  }
};

// OW >= L::kWidth.
template <typename L>
void max_row_2x2_vectors(const float* r0, const float* r1, int32_t base0, int32_t base1, float* d, int32_t* q,
                         int64_t OW) {
  for (int64_t start = 0;; start += L::kWidth) {
    const int64_t ow = std::min(start, OW - L::kWidth);
    typename L::Values a0, a1, b0, b1;
    L::deinterleave(r0 + 2 * ow, a0, a1);
    L::deinterleave(r1 + 2 * ow, b0, b1);
    const typename L::Indices columns = L::columns(2 * static_cast<int32_t>(ow));
    typename L::Values best = a0;
    typename L::Indices at = L::add(columns, base0);
    L::take(a1, L::add(columns, base0 + 1), best, at);
    L::take(b0, L::add(columns, base1), best, at);
    L::take(b1, L::add(columns, base1 + 1), best, at);
    L::store(d + ow, q + ow, best, at);
    if (ow + L::kWidth >= OW) break;
  }
}
#endif

template <typename A>
void max_row_2x2(const A* r0, const A* r1, int32_t base0, int32_t base1, A* d, int32_t* q, int64_t OW) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<A, float>) {
    if (OW >= 8) return max_row_2x2_vectors<Lanes8>(r0, r1, base0, base1, d, q, OW);
    if (OW >= 4) return max_row_2x2_vectors<Lanes4>(r0, r1, base0, base1, d, q, OW);
  }
#endif
  max_row_2x2_scalar(r0, r1, base0, base1, d, q, OW);
}

// 2x2 windows with stride 2 and no padding: the common CNN case. 16-bit rows
// are widened (and the output row narrowed) once with the vectorized
// conversions: element by element, the 2-byte types' conversions stay scalar
// (bfloat16 ran at 8% of memcpy).
template <typename T>
void max_forward_2x2(const Pool2dParams& p, const T* x, T* y, int32_t* indices) {
  using A = compute_t<T>;
  const int64_t H = p.in_h, W = p.in_w, OH = p.out_h, OW = p.out_w;
#pragma omp parallel if (p.planes * OH * OW > kParallelThreshold)
  {
    std::vector<float> row0_buffer, row1_buffer, out_buffer;
#pragma omp for schedule(static)
    for (int64_t plane = 0; plane < p.planes; ++plane) {
      const T* src = x + plane * H * W;
      T* dst = y + plane * OH * OW;
      int32_t* idx = indices + plane * OH * OW;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const A* __restrict__ r0 = cpu::compute_row(src + 2 * oh * W, 2 * OW, row0_buffer);
        const A* __restrict__ r1 = cpu::compute_row(src + (2 * oh + 1) * W, 2 * OW, row1_buffer);
        const int32_t base0 = static_cast<int32_t>(2 * oh * W), base1 = static_cast<int32_t>((2 * oh + 1) * W);
        A* __restrict__ d = cpu::result_row(dst + oh * OW, OW, out_buffer);
        int32_t* __restrict__ q = idx + oh * OW;
        max_row_2x2(r0, r1, base0, base1, d, q, OW);
        cpu::store_result_row(d, dst + oh * OW, OW);
      }
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

// Zero the plane, then scatter: measured faster than a gather that writes each
// element once, even for 2x2 tiles (memset streams; the scatter touches only
// one element per window).
template <typename T>
void max_backward(const Pool2dParams& p, const T* dy, const int32_t* indices, T* dx) {
  using A = compute_t<T>;
  const int64_t HW = p.in_h * p.in_w, OHW = p.out_h * p.out_w;
#pragma omp parallel for schedule(static) if (p.planes * HW > kParallelThreshold)
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    T* dst = dx + plane * HW;
    const T* g = dy + plane * OHW;
    const int32_t* idx = indices + plane * OHW;
    std::fill(dst, dst + HW, static_cast<T>(A(0)));
    for (int64_t i = 0; i < OHW; ++i) {
      // Index -1: the window lay wholly in the padding (possible with dilation); nothing flows back.
      if (idx[i] < 0) continue;
      dst[idx[i]] = static_cast<T>(static_cast<A>(dst[idx[i]]) + static_cast<A>(g[i]));
    }
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
