// Element types. Half and BFloat16 are storage types with float arithmetic on
// the host; CUDA code reinterprets them as __half / __nv_bfloat16 (same layout).
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <string_view>

#include "kernels/error.h"

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, b8 };

KILN_HOST_DEVICE inline uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  return bits;
}
KILN_HOST_DEVICE inline float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

// IEEE 754 binary16, round to nearest even.
struct alignas(2) Half {
  uint16_t bits = 0;
  Half() = default;
  KILN_HOST_DEVICE Half(float value) : bits(from_float(value)) {}
  KILN_HOST_DEVICE operator float() const { return to_float(bits); }

  KILN_HOST_DEVICE static uint16_t from_float(float value) {
    uint32_t x = float_bits(value);
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflows to inf
    if (x < 0x38800000u) {                                              // subnormal or zero
      float magnitude = bits_float(x) + 0.5f;  // aligns the subnormal bits at the bottom
      return static_cast<uint16_t>(sign | (float_bits(magnitude) - 0x3f000000u));
    }
    uint32_t mantissa_odd = (x >> 13) & 1u;
    x += 0xc8000fffu + mantissa_odd;  // rebias exponent (-112 << 23) and round
    return static_cast<uint16_t>(sign | (x >> 13));
  }
  KILN_HOST_DEVICE static float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
      float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
      return sign ? -magnitude : magnitude;
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
};

// bfloat16: the top half of a float, round to nearest even; NaN stays NaN.
struct alignas(2) BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  KILN_HOST_DEVICE BFloat16(float value) : bits(from_float(value)) {}
  KILN_HOST_DEVICE operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }

  KILN_HOST_DEVICE static uint16_t from_float(float value) {
    uint32_t x = float_bits(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
  }
};

inline constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8:
    case DType::b8: return 1;
  }
  return 0;
}

inline constexpr bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

inline constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
    case DType::b8: return "bool";
  }
  return "?";
}

// Parses "float32"/"f32"/"fp32", "bfloat16"/"bf16", ...; throws kiln::Error otherwise.
DType parse_dtype(std::string_view name);

inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };

// Calls fn.template operator()<T>() for the C++ type T of `dtype`:
//   dispatch_all(dtype, "add", [&]<typename T>() { ... });
// The variants restrict the set and throw kiln::Error naming `op` otherwise.
template <typename Fn>
decltype(auto) dispatch_all(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::i64: return fn.template operator()<int64_t>();
    case DType::u8: return fn.template operator()<uint8_t>();
    case DType::b8: return fn.template operator()<bool>();
  }
  KILN_THROW(op, ": unknown dtype");
}

template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    default: break;
  }
  KILN_THROW(op, ": expected a floating dtype (float32, float64, float16, bfloat16), got ", dtype_name(dtype));
}

// float and double only: the CPU kernels that compute in the input's type
// (their front ends convert 16-bit inputs to float32 first).
template <typename Fn>
decltype(auto) dispatch_f32_f64(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    default: break;
  }
  KILN_THROW(op, ": expected float32 or float64, got ", dtype_name(dtype));
}

// Integer index types for gather/index_select/embedding.
template <typename Fn>
decltype(auto) dispatch_index(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::i64: return fn.template operator()<int64_t>();
    default: break;
  }
  KILN_THROW(op, ": expected an index dtype (int32 or int64), got ", dtype_name(dtype));
}

// The type arithmetic on T is carried out in (float for the 16-bit floats).
template <typename T> struct compute_type { using type = T; };
template <> struct compute_type<Half> { using type = float; };
template <> struct compute_type<BFloat16> { using type = float; };
template <typename T> using compute_t = typename compute_type<T>::type;

}  // namespace kiln
