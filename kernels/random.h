// Random numbers from seeded Philox4x32-10 (kernels/philox.h) on CPU and CUDA.
//
// A draw of `count` elements reads the counters [offset, offset + counters)
// of `seed`, and element i's words depend on (seed, offset, i) alone, so the
// same seed gives the same numbers on CPU and CUDA whatever the launch
// configuration, and both backends advance the generator alike:
//   uniform  float32/16-bit  word i (lane i % 4 of counter i / 4)   ceil(n / 4) counters
//   uniform  float64         words 2i, 2i+1                         ceil(n / 2)
//   normal   float32/16-bit  counter i / 2, lanes 2(i%2), 2(i%2)+1  ceil(n / 2)
//   normal   float64         counter i, all four lanes              n
//   randint, randperm keys   counter i / 2, lanes 2(i%2), 2(i%2)+1  ceil(n / 2)
//   dropout mask             word i                                 ceil(n / 4)
// The value transforms below are shared by both backends (host and device).
// All buffers are dense; nothing here synchronizes.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"
#include "kernels/philox.h"

namespace kiln::kernels {

// ---------------------------------------------------------------- counters
uint64_t uniform_counters(DType dtype, int64_t count);
uint64_t normal_counters(DType dtype, int64_t count);
uint64_t randint_counters(int64_t count);  // also randperm's keys
uint64_t dropout_counters(int64_t count);

// ---------------------------------------------------------------- transforms
// Uniform in [0, 1) with as many random bits as T has significand bits (24,
// 53, 11, 8), so that rounding to T can never reach 1.
template <typename T>
KILN_HOST_DEVICE inline T uniform_value(uint32_t word) {
  if constexpr (std::is_same_v<T, Half>) {
    return T(static_cast<float>(word >> 21) * (1.0f / 2048.0f));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(word >> 24) * (1.0f / 256.0f));
  } else {
    return static_cast<T>(philox::uniform_float(word));
  }
}

// Box-Muller, cosine branch: u1 in (0, 1], u2 in [0, 1). Computed in double
// on both backends so that float results agree to the last bit (barring a
// double result within an ulp or two of a float rounding boundary).
KILN_HOST_DEVICE inline double box_muller(double u1, double u2) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(kTwoPi * u2);
}

template <typename T>
KILN_HOST_DEVICE inline T normal_value(uint32_t word1, uint32_t word2) {
  const double u1 = 1.0 - static_cast<double>(philox::uniform_float(word1));
  const double u2 = static_cast<double>(philox::uniform_float(word2));
  return T(static_cast<float>(box_muller(u1, u2)));
}

KILN_HOST_DEVICE inline double normal_double(const philox::Uint4& words) {
  return box_muller(1.0 - philox::uniform_double(words.x, words.y), philox::uniform_double(words.z, words.w));
}

// High 64 bits of the 128-bit product a * b.
KILN_HOST_DEVICE inline uint64_t mulhi64(uint64_t a, uint64_t b) {
  const uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32, b_lo = b & 0xffffffffu, b_hi = b >> 32;
  const uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  const uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
  return (hi_lo >> 32) + (cross >> 32) + hi_hi;
}

// low + floor(bits * range / 2^64): the multiply-shift map of 64 random bits
// onto [low, low + range); its bias is below range / 2^64.
KILN_HOST_DEVICE inline int64_t randint_value(uint32_t high_word, uint32_t low_word, int64_t low, uint64_t range) {
  const uint64_t bits = (static_cast<uint64_t>(high_word) << 32) | low_word;
  return static_cast<int64_t>(static_cast<uint64_t>(low) + mulhi64(bits, range));
}

// Dropout keeps an element when its uniform float is >= p.
KILN_HOST_DEVICE inline bool dropout_keep(uint32_t word, float p) { return philox::uniform_float(word) >= p; }

// ---------------------------------------------------------------- kernels
// out: `count` elements of a floating dtype.
void uniform_cpu(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset);
// The CUDA draws take the seed and offset from `replay` when it is set (a
// kernel recorded in a CUDA graph; philox.h), `offset` then being relative.
void uniform_cuda(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset, cuda::Stream stream,
                  const philox::ReplayState* replay = nullptr);
void normal_cpu(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset);
void normal_cuda(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset, cuda::Stream stream,
                 const philox::ReplayState* replay = nullptr);
// Integers in [low, low + range) (range > 0) as any dtype but bool.
void randint_cpu(void* out, DType dtype, int64_t count, int64_t low, uint64_t range, uint64_t seed, uint64_t offset);
void randint_cuda(void* out, DType dtype, int64_t count, int64_t low, uint64_t range, uint64_t seed,
                  uint64_t offset, cuda::Stream stream, const philox::ReplayState* replay = nullptr);
// A permutation of [0, n): indices sorted by their 64-bit random keys (ties
// by index). Host only; the front end copies it to the device.
void randperm_cpu(int64_t* out, int64_t n, uint64_t seed, uint64_t offset);
// out[i] = keep(i) ? x[i] * scale : 0 with keep(i) = dropout_keep(word i, p);
// mask[i] = keep(i) (0/1) unless mask is null. x and out may alias.
void dropout_cpu(const void* x, void* out, uint8_t* mask, DType dtype, int64_t count, float p, double scale,
                 uint64_t seed, uint64_t offset);
void dropout_cuda(const void* x, void* out, uint8_t* mask, DType dtype, int64_t count, float p, double scale,
                  uint64_t seed, uint64_t offset, cuda::Stream stream, const philox::ReplayState* replay = nullptr);
// dx[i] = mask[i] ? dout[i] * scale : 0.
void dropout_backward_cpu(const void* dout, const uint8_t* mask, void* dx, DType dtype, int64_t count, double scale);
void dropout_backward_cuda(const void* dout, const uint8_t* mask, void* dx, DType dtype, int64_t count, double scale,
                           cuda::Stream stream);

}  // namespace kiln::kernels
