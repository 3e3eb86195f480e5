// Helpers of the emulated kernel tests (test_*.cpp): element conversions and
// a comparison against a float64 reference that reports the largest error.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "emu_cuda.h"
#include "kernels/dtype.h"
#include "kernels/strided.h"

namespace emu_test {

template <typename T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(value);
  } else {
    return static_cast<double>(value);
  }
}

template <typename T>
T from_double(double value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

// Unit roundoff of T (half an ulp at 1).
template <typename T>
double roundoff() {
  if constexpr (std::is_same_v<T, __half>) return std::ldexp(1.0, -11);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, -53);
}

template <typename T>
const char* name_of() {
  if constexpr (std::is_same_v<T, __half>) return "f16";
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return "bf16";
  if constexpr (std::is_same_v<T, float>) return "f32";
  return "f64";
}

template <typename T>
kiln::DType emu_dtype() {
  if constexpr (std::is_same_v<T, __half>) return kiln::DType::f16;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return kiln::DType::bf16;
  if constexpr (std::is_same_v<T, float>) return kiln::DType::f32;
  return kiln::DType::f64;
}

// Runs `body` under each index path of the kernels that split their flat
// index by FastDivmod below a size limit: that path, then their 64-bit-division
// path (force_64bit_index_for_testing), which is off again afterwards.
template <typename Body>
void for_each_index_path(Body&& body) {
  for (const bool force_64bit : {false, true}) {
    kiln::kernels::force_64bit_index_for_testing(force_64bit);
    body();
  }
  kiln::kernels::force_64bit_index_for_testing(false);
}

inline int failures = 0;
inline int checks = 0;

// got vs want, elementwise: |got - want| <= rtol |want| + atol * max|want| (max over
// the finite expected values; an infinite or NaN expected value must be met exactly).
// Returns the largest |got - want| / max(max|want|, tiny) (relative to the scale of the output)
// and prints a FAIL line naming the worst element when any is off or not finite.
inline double compare(const std::string& label, const char* what, const std::vector<double>& got,
                      const std::vector<double>& want, double rtol, double atol) {
  ++checks;
  double scale = 0;
  // The scale of the finite expected values (an expected infinity or NaN must
  // match exactly, and would otherwise make every tolerance NaN).
  for (double w : want) {
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  }
  if (scale == 0) scale = 1;
  double worst_error = 0;
  long bad = 0, worst = -1;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = std::abs(got[i] - want[i]);
    const bool same_special = !std::isfinite(want[i]) && (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
    if (same_special) continue;
    if (std::isfinite(error)) worst_error = std::max(worst_error, error / scale);
    const double allowed = rtol * std::abs(want[i]) + atol * scale;
    if (!(error <= allowed)) {
      ++bad;
      const double excess = std::isfinite(error - allowed) ? error - allowed : INFINITY;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = static_cast<long>(i);
      }
    }
  }
  if (bad > 0) {
    ++failures;
    std::printf("FAIL %s %s: %ld of %zu differ; worst at %ld: %.9g vs %.9g\n", label.c_str(), what, bad, got.size(),
                worst, got[worst], want[worst]);
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  return worst_error;
}

}  // namespace emu_test
