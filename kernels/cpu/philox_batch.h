// Philox4x32-10 for kPhiloxBatch consecutive counters at once (CPU): the same
// words as philox::philox4x32 (kernels/philox.h). With AVX2 the eight
// counters' rounds run in the lanes of one register per word (vpmuludq makes
// the 32 x 32 -> 64-bit products; GCC 12 does not vectorize the plain loop),
// which is what makes a dropout mask cheap next to reading its input.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstdint>

#include "kernels/philox.h"

namespace kiln::kernels::cpu {

constexpr int kPhiloxBatch = 16;  // counters per batch: two AVX2 registers of 32-bit lanes per word

// words[4 c + l] = lane l of philox4x32(seed, first + c), c < kPhiloxBatch:
// element order, as kernels/random.h reads the words of a draw.
inline void philox4x32_batch(uint64_t seed, uint64_t first, uint32_t (&words)[4 * kPhiloxBatch]) {
#if defined(__AVX2__)
  // Two independent groups of eight counters, lane c of group g holding
  // counter first + 8 g + c: the rounds are a chain of dependent multiplies,
  // and two chains in flight keep the multiplier busy while each waits.
  constexpr int G = kPhiloxBatch / 8;
  static_assert(kPhiloxBatch % 8 == 0);
  __m256i x[G], y[G], z[G], w[G];
  for (int g = 0; g < G; ++g) {
    // The counters' low and high 32-bit words in counter order.
    const uint64_t base = first + 8 * static_cast<uint64_t>(g);
    alignas(32) uint32_t low[8], high[8];
    for (int c = 0; c < 8; ++c) {
      low[c] = static_cast<uint32_t>(base + c);
      high[c] = static_cast<uint32_t>((base + c) >> 32);
    }
    x[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(low));
    y[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(high));
    z[g] = _mm256_setzero_si256();  // the counter's high 64 bits (philox4x32's counter_high) are 0 in every draw
    w[g] = _mm256_setzero_si256();
  }
  const __m256i multiplier0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i multiplier1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  // a * m for the eight lanes: low and high 32 bits of each 64-bit product.
  // Shuffles (port 5) rather than 64-bit shifts move the halves: the shifts
  // would compete with the multiplies for ports 0 and 1.
  auto multiply = [](__m256i a, __m256i m, __m256i& low, __m256i& high) {
    const __m256i even_products = _mm256_mul_epu32(a, m);  // lanes 0, 2, 4, 6: (low, high) pairs
    const __m256i odd_products = _mm256_mul_epu32(_mm256_shuffle_epi32(a, 0xF5), m);  // lanes 1, 3, 5, 7
    low = _mm256_blend_epi32(even_products, _mm256_shuffle_epi32(odd_products, 0xA0), 0xAA);
    high = _mm256_blend_epi32(_mm256_shuffle_epi32(even_products, 0xF5), odd_products, 0xAA);
  };
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
    const __m256i k0 = _mm256_set1_epi32(static_cast<int>(key0)), k1 = _mm256_set1_epi32(static_cast<int>(key1));
    for (int g = 0; g < G; ++g) {
      __m256i low0, high0, low1, high1;
      multiply(x[g], multiplier0, low0, high0);
      multiply(z[g], multiplier1, low1, high1);
      x[g] = _mm256_xor_si256(_mm256_xor_si256(high1, y[g]), k0);
      z[g] = _mm256_xor_si256(_mm256_xor_si256(high0, w[g]), k1);
      y[g] = low1;
      w[g] = low0;
    }
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
  // Transpose to element order: (x, y, z, w) of counter 0, then of counter 1, ...
  auto* out = reinterpret_cast<__m256i*>(words);
  for (int g = 0; g < G; ++g) {
    const __m256i xy_low = _mm256_unpacklo_epi32(x[g], y[g]), zw_low = _mm256_unpacklo_epi32(z[g], w[g]);  // 0 1 | 4 5
    const __m256i xy_high = _mm256_unpackhi_epi32(x[g], y[g]), zw_high = _mm256_unpackhi_epi32(z[g], w[g]);  // 2 3 | 6 7
    const __m256i c04 = _mm256_unpacklo_epi64(xy_low, zw_low), c15 = _mm256_unpackhi_epi64(xy_low, zw_low);
    const __m256i c26 = _mm256_unpacklo_epi64(xy_high, zw_high), c37 = _mm256_unpackhi_epi64(xy_high, zw_high);
    _mm256_storeu_si256(out + 4 * g, _mm256_permute2x128_si256(c04, c15, 0x20));      // counters 0, 1
    _mm256_storeu_si256(out + 4 * g + 1, _mm256_permute2x128_si256(c26, c37, 0x20));  // 2, 3
    _mm256_storeu_si256(out + 4 * g + 2, _mm256_permute2x128_si256(c04, c15, 0x31));  // 4, 5
    _mm256_storeu_si256(out + 4 * g + 3, _mm256_permute2x128_si256(c26, c37, 0x31));  // 6, 7
  }
#else
  constexpr int N = kPhiloxBatch;
  uint32_t x[N], y[N], z[N], w[N];
  for (int c = 0; c < N; ++c) {
    const uint64_t counter = first + static_cast<uint64_t>(c);
    x[c] = static_cast<uint32_t>(counter);
    y[c] = static_cast<uint32_t>(counter >> 32);
    z[c] = 0;  // the counter's high 64 bits (philox4x32's counter_high) are 0 in every draw
    w[c] = 0;
  }
  uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int c = 0; c < N; ++c) {
      const uint64_t product0 = uint64_t{0xD2511F53u} * x[c];
      const uint64_t product1 = uint64_t{0xCD9E8D57u} * z[c];
      const uint32_t next_x = static_cast<uint32_t>(product1 >> 32) ^ y[c] ^ key0;
      const uint32_t next_z = static_cast<uint32_t>(product0 >> 32) ^ w[c] ^ key1;
      y[c] = static_cast<uint32_t>(product1);
      w[c] = static_cast<uint32_t>(product0);
      x[c] = next_x;
      z[c] = next_z;
    }
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
  for (int c = 0; c < N; ++c) {
    words[4 * c] = x[c];
    words[4 * c + 1] = y[c];
    words[4 * c + 2] = z[c];
    words[4 * c + 3] = w[c];
  }
#endif
}

}  // namespace kiln::kernels::cpu
