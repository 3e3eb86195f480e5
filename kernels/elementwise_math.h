// The math of the elementwise ops, shared by the CPU and CUDA kernels so that
// both backends compute the same formula: one functor per op (host and
// device), and the dispatch from (op, dtype) to (functor, C++ types).
//
// A functor is called with the inputs in their compute type C (float for the
// 16-bit floats) followed by the op's two scalars of type S, and returns C (or
// bool for predicates). Internal to kernels/: included by kernels/cpu and
// kernels/cuda sources only.
#pragma once

#include <math.h>

#include <limits>
#include <string_view>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/elementwise.h"

namespace kiln::kernels::math {

// ---------------------------------------------------------------- scalar math
// Overloads on float and double that work in host and device code.
KILN_HOST_DEVICE inline float exp(float x) { return ::expf(x); }
KILN_HOST_DEVICE inline double exp(double x) { return ::exp(x); }
KILN_HOST_DEVICE inline float log(float x) { return ::logf(x); }
KILN_HOST_DEVICE inline double log(double x) { return ::log(x); }
KILN_HOST_DEVICE inline float sqrt(float x) { return ::sqrtf(x); }
KILN_HOST_DEVICE inline double sqrt(double x) { return ::sqrt(x); }
KILN_HOST_DEVICE inline float pow(float x, float y) { return ::powf(x, y); }
KILN_HOST_DEVICE inline double pow(double x, double y) { return ::pow(x, y); }
KILN_HOST_DEVICE inline float erf(float x) { return ::erff(x); }
KILN_HOST_DEVICE inline double erf(double x) { return ::erf(x); }
KILN_HOST_DEVICE inline float tanh(float x) { return ::tanhf(x); }
KILN_HOST_DEVICE inline double tanh(double x) { return ::tanh(x); }
KILN_HOST_DEVICE inline float sin(float x) { return ::sinf(x); }
KILN_HOST_DEVICE inline double sin(double x) { return ::sin(x); }
KILN_HOST_DEVICE inline float cos(float x) { return ::cosf(x); }
KILN_HOST_DEVICE inline double cos(double x) { return ::cos(x); }
#if defined(__CUDA_ARCH__)
__device__ inline float rsqrt(float x) { return ::rsqrtf(x); }
__device__ inline double rsqrt(double x) { return ::rsqrt(x); }
#else
inline float rsqrt(float x) { return 1.0f / ::sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / ::sqrt(x); }
#endif

template <typename C>
KILN_HOST_DEVICE inline bool is_nan(C x) {
  if constexpr (std::is_floating_point_v<C>) {
    return x != x;
  } else {
    return false;
  }
}

// A double scalar in type S: integer types saturate to their range (NaN -> 0),
// so that clamp(int_tensor, -inf, 5) means "no lower bound".
template <typename S>
inline S scalar_as(double value) {
  if constexpr (std::is_integral_v<S> && !std::is_same_v<S, bool>) {
    if (value != value) return S(0);
    if (value <= static_cast<double>(std::numeric_limits<S>::lowest())) return std::numeric_limits<S>::lowest();
    if (value >= static_cast<double>(std::numeric_limits<S>::max())) return std::numeric_limits<S>::max();
    return static_cast<S>(value);
  } else if constexpr (std::is_same_v<S, bool>) {
    return value != 0;
  } else {
    return static_cast<S>(value);
  }
}

// ---------------------------------------------------------------- unary functors
// (C x, S s0, S s1) -> C or bool

struct Neg {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return static_cast<C>(-x); }
};
struct Abs {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const {
    if constexpr (std::is_unsigned_v<C>) {
      return x;
    } else {
      return x < C(0) ? static_cast<C>(-x) : x;  // -0.0 stays -0.0 like torch; NaN stays NaN
    }
  }
};
struct Affine {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S s0, S s1) const {
    return static_cast<C>(x * s0 + s1);
  }
};
struct Clamp {
  // min(max(x, lo), hi) as torch: lo > hi gives hi everywhere.
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S lo, S hi) const {
    const C low = x < lo ? static_cast<C>(lo) : x;
    return low > hi ? static_cast<C>(hi) : low;
  }
};
struct Relu {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const {
    if constexpr (std::is_unsigned_v<C>) {
      return x;
    } else {
      return x < C(0) ? C(0) : x;  // NaN stays NaN
    }
  }
};
struct DivScalar {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S s0, S) const { return x / s0; }
};
struct Exp {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return math::exp(x); }
};
struct Log {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return math::log(x); }
};
struct Sqrt {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return math::sqrt(x); }
};
struct Rsqrt {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return math::rsqrt(x); }
};
struct PowScalar {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S s0, S) const {
    if (s0 == S(2)) return x * x;  // exact and fast for the common square
    return math::pow(x, s0);
  }
};
struct Gelu {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const {
    return C(0.5) * x * (C(1) + math::erf(x * C(0.70710678118654752440)));
  }
};
struct GeluTanh {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const {
    const C inner = C(0.79788456080286535588) * (x + C(0.044715) * x * x * x);
    return C(0.5) * x * (C(1) + math::tanh(inner));
  }
};
struct Silu {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const {
    return x / (C(1) + math::exp(-x));
  }
};
struct Sigmoid {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const {
    return C(1) / (C(1) + math::exp(-x));
  }
};
struct Tanh {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return math::tanh(x); }
};
struct Sin {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return math::sin(x); }
};
struct Cos {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C x, S, S) const { return math::cos(x); }
};
struct IsFinite {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C x, S, S) const {
    if constexpr (std::is_floating_point_v<C>) {
      return (x - x) == C(0);  // inf - inf and NaN - NaN are NaN
    } else {
      return true;
    }
  }
};
// Scalar comparisons (S is double for integer inputs).
struct EqScalar {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C x, S s0, S) const {
    return static_cast<S>(x) == s0;
  }
};
struct GtScalar {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C x, S s0, S) const {
    return static_cast<S>(x) > s0;
  }
};
struct LtScalar {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C x, S s0, S) const {
    return static_cast<S>(x) < s0;
  }
};

// ---------------------------------------------------------------- binary functors
// (C a, C b, S s0, S s1) -> C or bool

struct Add {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C a, C b, S alpha, S) const {
    return static_cast<C>(a + alpha * b);
  }
};
struct Mul {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C a, C b, S, S) const {
    return static_cast<C>(a * b);
  }
};
struct Maximum {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C a, C b, S, S) const {
    if (is_nan(a)) return a;
    if (is_nan(b)) return b;
    return a > b ? a : b;
  }
};
struct Minimum {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C a, C b, S, S) const {
    if (is_nan(a)) return a;
    if (is_nan(b)) return b;
    return a < b ? a : b;
  }
};
struct Div {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C a, C b, S, S) const { return a / b; }
};
struct Pow {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C a, C b, S, S) const { return math::pow(a, b); }
};
struct Eq {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C a, C b, S, S) const { return a == b; }
};
struct Ne {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C a, C b, S, S) const { return a != b; }
};
struct Lt {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C a, C b, S, S) const { return a < b; }
};
struct Le {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C a, C b, S, S) const { return a <= b; }
};
struct Gt {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C a, C b, S, S) const { return a > b; }
};
struct Ge {
  template <typename C, typename S> KILN_HOST_DEVICE bool operator()(C a, C b, S, S) const { return a >= b; }
};

// Backward functors: (dout, saved, s0, s1) -> dinp.
struct ReluBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C y, S, S) const {
    return y > C(0) ? dout : C(0);
  }
};
struct GeluBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C x, S, S) const {
    const C cdf = C(0.5) * (C(1) + math::erf(x * C(0.70710678118654752440)));
    const C pdf = C(0.39894228040143267794) * math::exp(C(-0.5) * x * x);  // 1/sqrt(2 pi)
    return dout * (cdf + x * pdf);
  }
};
struct GeluTanhBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C x, S, S) const {
    const C k = C(0.79788456080286535588);  // sqrt(2/pi)
    const C x2 = x * x;
    const C t = math::tanh(k * (x + C(0.044715) * x2 * x));
    const C dinner = k * (C(1) + C(3 * 0.044715) * x2);
    return dout * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * dinner);
  }
};
struct SiluBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C x, S, S) const {
    const C s = C(1) / (C(1) + math::exp(-x));
    return dout * s * (C(1) + x * (C(1) - s));
  }
};
struct SigmoidBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C y, S, S) const {
    return dout * y * (C(1) - y);
  }
};
struct TanhBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C y, S, S) const {
    return dout * (C(1) - y * y);
  }
};
struct PowBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C x, S p, S) const {
    if (p == S(0)) return C(0);
    if (p == S(2)) return dout * C(2) * x;
    return dout * p * math::pow(x, p - S(1));
  }
};
struct ClampBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C x, S lo, S hi) const {
    return (x >= lo && x <= hi) ? dout : C(0);
  }
};
struct AbsBackward {
  template <typename C, typename S> KILN_HOST_DEVICE C operator()(C dout, C x, S, S) const {
    return x > C(0) ? dout : (x < C(0) ? -dout : C(0));
  }
};

struct Where {
  template <typename C> KILN_HOST_DEVICE C operator()(bool condition, C a, C b, int, int) const {
    return condition ? a : b;
  }
};

// A functor with its two scalars bound: f(inputs...) = F{}(inputs..., s0, s1).
template <typename F, typename S>
struct Bound {
  S s0;
  S s1;
  template <typename... A>
  KILN_HOST_DEVICE auto operator()(A... inputs) const {
    return F{}(inputs..., s0, s1);
  }
};

// ---------------------------------------------------------------- dispatch

enum class Kind { numeric, floating, all };

// Calls fn.template operator()<T>() for every dtype but bool.
template <typename Fn>
void dispatch_numeric(DType dtype, std::string_view op, Fn&& fn) {
  KILN_CHECK(dtype != DType::b8, op, ": expected a numeric dtype, got bool");
  dispatch_all(dtype, op, [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) fn.template operator()<T>();
  });
}

template <Kind kind, typename Fn>
void dispatch_kind(DType dtype, std::string_view op, Fn&& fn) {
  if constexpr (kind == Kind::numeric) {
    dispatch_numeric(dtype, op, fn);
  } else if constexpr (kind == Kind::floating) {
    dispatch_floating(dtype, op, fn);
  } else {
    dispatch_all(dtype, op, fn);
  }
}

// The type of an op's scalars for compute type C: C for floats; for integer
// inputs int64 (so alpha = -1 works on uint8) or, for predicates, double (so
// that an int tensor compares exactly with 0.5).
template <typename C, bool predicate>
using scalar_type =
    std::conditional_t<std::is_integral_v<C>, std::conditional_t<predicate, double, int64_t>, C>;

// Unary: launch.template operator()<Out, In>(bound_functor).
template <typename F, Kind kind, bool predicate, typename Launch>
void unary_with(DType dtype, std::string_view name, double s0, double s1, Launch& launch) {
  dispatch_kind<kind>(dtype, name, [&]<typename T>() {
    using C = compute_t<T>;
    using S = scalar_type<C, predicate>;
    using Out = std::conditional_t<predicate, bool, T>;
    launch.template operator()<Out, T>(Bound<F, S>{scalar_as<S>(s0), scalar_as<S>(s1)});
  });
}

template <typename Launch>
void dispatch_unary(UnaryOp op, DType dtype, double s0, double s1, Launch&& launch) {
  const std::string_view name = unary_op_name(op);
  using K = Kind;
  switch (op) {
    case UnaryOp::neg: return unary_with<Neg, K::numeric, false>(dtype, name, s0, s1, launch);
    case UnaryOp::abs: return unary_with<Abs, K::numeric, false>(dtype, name, s0, s1, launch);
    case UnaryOp::affine: return unary_with<Affine, K::numeric, false>(dtype, name, s0, s1, launch);
    case UnaryOp::clamp: return unary_with<Clamp, K::numeric, false>(dtype, name, s0, s1, launch);
    case UnaryOp::relu: return unary_with<Relu, K::numeric, false>(dtype, name, s0, s1, launch);
    case UnaryOp::div_scalar: return unary_with<DivScalar, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::exp: return unary_with<Exp, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::log: return unary_with<Log, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::sqrt: return unary_with<Sqrt, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::rsqrt: return unary_with<Rsqrt, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::pow: return unary_with<PowScalar, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::gelu: return unary_with<Gelu, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::gelu_tanh: return unary_with<GeluTanh, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::silu: return unary_with<Silu, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::sigmoid: return unary_with<Sigmoid, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::tanh: return unary_with<Tanh, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::sin: return unary_with<Sin, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::cos: return unary_with<Cos, K::floating, false>(dtype, name, s0, s1, launch);
    case UnaryOp::isfinite: return unary_with<IsFinite, K::all, true>(dtype, name, s0, s1, launch);
    case UnaryOp::eq_scalar: return unary_with<EqScalar, K::all, true>(dtype, name, s0, s1, launch);
    case UnaryOp::gt_scalar: return unary_with<GtScalar, K::all, true>(dtype, name, s0, s1, launch);
    case UnaryOp::lt_scalar: return unary_with<LtScalar, K::all, true>(dtype, name, s0, s1, launch);
  }
  KILN_ASSERT(false, "unknown UnaryOp ", static_cast<int>(op));
}

// Binary: launch.template operator()<Out, In, In>(bound_functor).
template <typename F, Kind kind, bool predicate, typename Launch>
void binary_with(DType dtype, std::string_view name, double s0, double s1, Launch& launch) {
  dispatch_kind<kind>(dtype, name, [&]<typename T>() {
    using S = scalar_type<compute_t<T>, predicate>;
    using Out = std::conditional_t<predicate, bool, T>;
    launch.template operator()<Out, T, T>(Bound<F, S>{scalar_as<S>(s0), scalar_as<S>(s1)});
  });
}

template <typename Launch>
void dispatch_binary(BinaryOp op, DType dtype, double s0, double s1, Launch&& launch) {
  const std::string_view name = binary_op_name(op);
  using K = Kind;
  switch (op) {
    case BinaryOp::add: return binary_with<Add, K::numeric, false>(dtype, name, s0, s1, launch);
    case BinaryOp::mul: return binary_with<Mul, K::numeric, false>(dtype, name, s0, s1, launch);
    case BinaryOp::maximum: return binary_with<Maximum, K::numeric, false>(dtype, name, s0, s1, launch);
    case BinaryOp::minimum: return binary_with<Minimum, K::numeric, false>(dtype, name, s0, s1, launch);
    case BinaryOp::div: return binary_with<Div, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::pow: return binary_with<Pow, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::eq: return binary_with<Eq, K::all, true>(dtype, name, s0, s1, launch);
    case BinaryOp::ne: return binary_with<Ne, K::all, true>(dtype, name, s0, s1, launch);
    case BinaryOp::lt: return binary_with<Lt, K::all, true>(dtype, name, s0, s1, launch);
    case BinaryOp::le: return binary_with<Le, K::all, true>(dtype, name, s0, s1, launch);
    case BinaryOp::gt: return binary_with<Gt, K::all, true>(dtype, name, s0, s1, launch);
    case BinaryOp::ge: return binary_with<Ge, K::all, true>(dtype, name, s0, s1, launch);
    case BinaryOp::relu_backward: return binary_with<ReluBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::gelu_backward: return binary_with<GeluBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::gelu_tanh_backward:
      return binary_with<GeluTanhBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::silu_backward: return binary_with<SiluBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::sigmoid_backward:
      return binary_with<SigmoidBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::tanh_backward: return binary_with<TanhBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::pow_backward: return binary_with<PowBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::clamp_backward:
      return binary_with<ClampBackward, K::floating, false>(dtype, name, s0, s1, launch);
    case BinaryOp::abs_backward: return binary_with<AbsBackward, K::floating, false>(dtype, name, s0, s1, launch);
  }
  KILN_ASSERT(false, "unknown BinaryOp ", static_cast<int>(op));
}

// where: launch.template operator()<T, bool, T, T>(functor).
template <typename Launch>
void dispatch_where(DType dtype, Launch&& launch) {
  dispatch_all(dtype, "where", [&]<typename T>() { launch.template operator()<T, bool, T, T>(Bound<Where, int>{0, 0}); });
}

// launch.template operator()<float, A, B>(bound Add) for operands that
// is_mixed_add (kernels/elementwise.h) takes.
template <typename Launch>
void dispatch_mixed_add(DType a, DType b, double alpha, Launch&& launch) {
  const Bound<Add, float> add{scalar_as<float>(alpha), 0.0f};
  if (a == DType::f32 && b == DType::bf16) return launch.template operator()<float, float, BFloat16>(add);
  if (a == DType::f32 && b == DType::f16) return launch.template operator()<float, float, Half>(add);
  if (a == DType::bf16 && b == DType::f32) return launch.template operator()<float, BFloat16, float>(add);
  if (a == DType::f16 && b == DType::f32) return launch.template operator()<float, Half, float>(add);
  KILN_ASSERT(false, "dispatch_mixed_add: ", dtype_name(a), " and ", dtype_name(b));
}

// Checks the operand dtypes of an elementwise call (a bug in the front end, or
// a misuse of the kernels from a benchmark) and names the op.
inline void check_operands(std::string_view name, bool predicate, const Operand& out, const Operand& a,
                           const Operand* b) {
  KILN_CHECK(b == nullptr || a.dtype == b->dtype, name, ": inputs have different dtypes ", dtype_name(a.dtype),
             " and ", dtype_name(b->dtype));
  const DType expected = predicate ? DType::b8 : a.dtype;
  KILN_CHECK(out.dtype == expected, name, ": output dtype ", dtype_name(out.dtype), " but expected ",
             dtype_name(expected));
}

}  // namespace kiln::kernels::math
