// Runs of 16-bit values widened to float and float rounded back, fast enough
// that a bfloat16 or float16 kernel on the CPU is bound by memory, not by the
// conversions: Half and BFloat16's constructors (kernels/dtype.h) branch on
// NaN and subnormals, which keeps GCC from vectorizing a loop over them.
//  - BFloat16: the same bits as BFloat16(float) / float(BFloat16), written
//    branch-free so that the loops vectorize (round to nearest even; a NaN
//    stays NaN, quieted).
//  - Half: F16C's vcvtph2ps / vcvtps2ph (x86-64-v3 has them), round to
//    nearest even as Half(float): the same bits for every non-NaN value; a NaN
//    stays NaN (the hardware keeps the payload's top bits, Half(float) gives
//    the canonical 0x7e00).
#pragma once

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/dtype.h"

namespace kiln::kernels::cpu {

#if defined(__AVX2__)
namespace detail {
// Eight floats rounded to bfloat16 bit patterns (in the low 16 bits of each
// 32-bit lane), exactly as narrow_from_float's scalar loop: round to nearest
// even by adding 0x7fff plus the kept part's lowest bit; a NaN keeps its top
// bits with the quiet bit set.
inline __m256i round_to_bfloat16_bits(__m256 values) {
  const __m256i x = _mm256_castps_si256(values);
  const __m256i upper = _mm256_srli_epi32(x, 16);
  const __m256i lowest_kept = _mm256_and_si256(upper, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lowest_kept), 16);
  const __m256i quiet_nan = _mm256_or_si256(upper, _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(values, values, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}
}  // namespace detail
#endif

// out[i] = float(in[i]) for i < n.
template <typename T>
inline void widen_to_float(const T* in, float* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    const auto* bits = reinterpret_cast<const uint16_t*>(in);
    auto* wide = reinterpret_cast<uint32_t*>(out);
    for (int64_t i = 0; i < n; ++i) wide[i] = static_cast<uint32_t>(bits[i]) << 16;
  } else {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
    }
#endif
    for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
  }
}

// out[i] = T(in[i]) for i < n, rounded to nearest even.
template <typename T>
inline void narrow_from_float(const float* in, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    const auto* wide = reinterpret_cast<const uint32_t*>(in);
    auto* bits = reinterpret_cast<uint16_t*>(out);
    int64_t i = 0;
#if defined(__AVX2__)
    // The loop below, 16 floats at a time by hand: GCC's own vectorization of
    // it took 1.5x the time (96 vs 62 ns per 768 floats on one core), which was
    // 30% of a bfloat16 LayerNorm forward on this 2-core machine.
    for (; i + 16 <= n; i += 16) {
      const __m256i low = detail::round_to_bfloat16_bits(_mm256_loadu_ps(in + i));
      const __m256i high = detail::round_to_bfloat16_bits(_mm256_loadu_ps(in + i + 8));
      // packus keeps each lane's 16 bits (all in [0, 0xffff]); the permute undoes its 128-bit interleave.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, high), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i), packed);
    }
#endif
    for (; i < n; ++i) {
      const uint32_t x = wide[i];
      const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
      const uint32_t quiet_nan = (x >> 16) | 0x40u;
      bits[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    }
  } else {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), half);
    }
#endif
    for (; i < n; ++i) out[i] = T(in[i]);
  }
}

// Rows of a row-wise kernel (softmax, layer norm) in its compute type
// compute_t<T>: float and double rows are used in place; 16-bit rows go
// through a float buffer (resized to the row on first use).

// The row as compute-type values: the row itself, or widened into `buffer`.
template <typename T>
const compute_t<T>* compute_row(const T* row, int64_t n, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    return row;
  } else {
    buffer.resize(static_cast<size_t>(n));
    widen_to_float(row, buffer.data(), n);
    return buffer.data();
  }
}

// Where to compute a row of results: the output row itself, or `buffer`
// (store_result_row then rounds it into the output row).
template <typename T>
compute_t<T>* result_row(T* row, int64_t n, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    return row;
  } else {
    buffer.resize(static_cast<size_t>(n));
    return buffer.data();
  }
}

// Rounds a row computed in result_row's buffer into `row` (nothing when it was computed in place).
template <typename T>
void store_result_row(const compute_t<T>* values, T* row, int64_t n) {
  if constexpr (!std::is_same_v<T, compute_t<T>>) narrow_from_float(values, row, n);
}

}  // namespace kiln::kernels::cpu
