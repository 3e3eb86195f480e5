// Max pooling of one NCHW plane, shared by pool.cpp (max_pool2d) and
// batch_norm.cpp (the fused batch_norm_relu_max_pool2d), so that the two give
// the same values and indices: the 2x2, stride-2 forward without padding, and
// the backward of any window shape (zero, then scatter to the argmax).
// Indices are flat offsets in the plane (ih * W + iw), as kernels/pool.h says.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/float_convert.h"
#include "kernels/dtype.h"

namespace kiln::kernels::cpu {

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

// One thread's buffers for 16-bit rows, widened (and the output row narrowed)
// once with the vectorized conversions: element by element, the 2-byte types'
// conversions stay scalar (bfloat16 ran at 8% of memcpy).
struct MaxPool2x2Rows {
  std::vector<float> row0, row1, out;
};

// A (2 * OH or more, W) plane `src` pooled into (OH, OW) `dst` and `idx`, OW = W / 2.
template <typename T>
void max_pool_plane_2x2(const T* src, int64_t W, int64_t OH, int64_t OW, T* dst, int32_t* idx,
                        MaxPool2x2Rows& rows) {
  using A = compute_t<T>;
  for (int64_t oh = 0; oh < OH; ++oh) {
    const A* __restrict__ r0 = compute_row(src + 2 * oh * W, 2 * OW, rows.row0);
    const A* __restrict__ r1 = compute_row(src + (2 * oh + 1) * W, 2 * OW, rows.row1);
    const int32_t base0 = static_cast<int32_t>(2 * oh * W), base1 = static_cast<int32_t>((2 * oh + 1) * W);
    A* __restrict__ d = result_row(dst + oh * OW, OW, rows.out);
    max_row_2x2(r0, r1, base0, base1, d, idx + oh * OW, OW);
    store_result_row(d, dst + oh * OW, OW);
  }
}

// dx of one plane (HW elements) from its OHW gradients and argmax indices:
// zero the plane, then scatter. Measured faster than a gather that writes each
// element once, even for 2x2 tiles (memset streams; the scatter touches only
// one element per window).
template <typename T>
void max_pool_backward_plane(const T* dy, const int32_t* idx, int64_t OHW, T* dx, int64_t HW) {
  using A = compute_t<T>;
  std::fill(dx, dx + HW, static_cast<T>(A(0)));
  for (int64_t i = 0; i < OHW; ++i) {
    // Index -1: the window lay wholly in the padding (possible with dilation); nothing flows back.
    if (idx[i] < 0) continue;
    dx[idx[i]] = static_cast<T>(static_cast<A>(dx[idx[i]]) + static_cast<A>(dy[i]));
  }
}

}  // namespace kiln::kernels::cpu
