// Fixed-order float sums for the CPU normalization kernels (batch norm in
// batch_norm.cpp, layer norm in norm.cpp): kLanes accumulators, folded in a
// fixed tree, so a sum does not depend on the thread count.
#pragma once

#include <cstdint>

namespace kiln::kernels::cpu {

constexpr int kLanes = 16;
constexpr int64_t kRowChunks = 16;  // fixed blocking of row reductions

// Sum of f(i) for i in [0, n), with kLanes accumulators of type A.
template <typename A, typename F>
inline double lane_sum(int64_t n, F f) {
  A acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += f(i + k);
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += f(i);
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  return static_cast<double>(acc[0]);
}

// Two sums of (f(i).first, f(i).second) in one pass, same blocking as lane_sum.
template <typename A, typename F>
inline void lane_sum2(int64_t n, F f, double* first, double* second) {
  A acc0[kLanes] = {}, acc1[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const auto [a, b] = f(i + k);
      acc0[k] += a;
      acc1[k] += b;
    }
  }
  for (int k = 0; i < n; ++i, ++k) {
    const auto [a, b] = f(i);
    acc0[k] += a;
    acc1[k] += b;
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) {
      acc0[k] += acc0[k + width];
      acc1[k] += acc1[k + width];
    }
  }
  *first += static_cast<double>(acc0[0]);
  *second += static_cast<double>(acc1[0]);
}

}  // namespace kiln::kernels::cpu
