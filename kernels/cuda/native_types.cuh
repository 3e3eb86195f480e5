// CUDA's own 16-bit types for kiln's Half/BFloat16 (same layout), and the
// float accumulation type of each, shared by the .cu kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/dtype.h"

namespace kiln::kernels {

template <typename T> struct Native { using type = T; };
template <> struct Native<Half> { using type = __half; };
template <> struct Native<BFloat16> { using type = __nv_bfloat16; };

// fn.template operator()<N>() with N the native type of a floating dtype
// (kiln::dispatch_floating, which throws naming `op` for another dtype).
template <typename Fn>
void dispatch_floating_as_native(DType dtype, const char* op, Fn&& fn) {
  dispatch_floating(dtype, op, [&]<typename T>() { fn.template operator()<typename Native<T>::type>(); });
}

template <typename T> struct Acc { using type = T; };
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };

template <typename T>
__device__ __forceinline__ typename Acc<T>::type to_acc(T value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(value);
  } else {
    return value;
  }
}

template <typename T>
__device__ __forceinline__ T from_acc(typename Acc<T>::type value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(value);
  } else {
    return static_cast<T>(value);
  }
}

// +infinity and a quiet NaN of float or double, built from their bit patterns.
template <typename A>
__device__ __forceinline__ A infinity() {
  if constexpr (std::is_same_v<A, double>) {
    return __longlong_as_double(0x7ff0000000000000LL);
  } else {
    return __int_as_float(0x7f800000);
  }
}

template <typename A>
__device__ __forceinline__ A quiet_nan() {
  if constexpr (std::is_same_v<A, double>) {
    return __longlong_as_double(0x7ff8000000000000LL);
  } else {
    return __int_as_float(0x7fc00000);
  }
}

// 1 / sqrt(value), correctly rounded division and square root (no rsqrt approximation).
template <typename A>
__device__ __forceinline__ A reciprocal_sqrt(A value) {
  if constexpr (std::is_same_v<A, double>) {
    return 1.0 / sqrt(value);
  } else {
    return 1.0f / sqrtf(value);
  }
}

}  // namespace kiln::kernels
