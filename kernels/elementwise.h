// Elementwise kernels: a closed set of unary and binary ops plus where(), each
// run by one strided kernel per arity with a contiguous fast path.
//
// Operands share one iteration shape (broadcast dims have stride 0); the
// output may alias an input element for element (in-place ops). Inputs of one
// call share a dtype (where: the condition is bool; add: a float32 output may
// take one float32 and one 16-bit input, autocast's promote in one pass); the
// output has the input dtype, or bool for predicates and comparisons. 16-bit
// floats are computed in float. Dtype rules (kiln::Error naming the op otherwise):
//   arithmetic ops   every dtype but bool
//   floating ops     float32, float64, float16, bfloat16
//   predicates       every dtype, bool output
// CPU entry points run on the calling thread (OpenMP for large n); CUDA entry
// points are asynchronous on `stream` and never synchronize.
#pragma once

#include <string_view>

#include "kernels/cuda/runtime.h"
#include "kernels/strided.h"

namespace kiln::kernels {

// out = f(x; s0, s1)
enum class UnaryOp : uint8_t {
  // arithmetic
  neg,
  abs,
  affine,  // x * s0 + s1
  clamp,   // min(max(x, s0), s1); NaN stays NaN. Integer bounds saturate to the dtype's range.
  relu,
  // floating
  div_scalar,  // x / s0
  exp,
  log,
  sqrt,
  rsqrt,
  pow,        // x ^ s0
  gelu,       // exact: 0.5 x (1 + erf(x / sqrt 2))
  gelu_tanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  silu,
  sigmoid,
  tanh,
  sin,
  cos,
  // predicates (bool output); integer inputs compare with s0 in float64
  isfinite,
  eq_scalar,
  gt_scalar,
  lt_scalar,
};

// out = f(a, b; s0, s1)
enum class BinaryOp : uint8_t {
  // arithmetic
  add,  // a + s0 * b (s0 is alpha)
  mul,
  maximum,  // NaN propagates
  minimum,
  // floating
  div,
  pow,
  // predicates (bool output)
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  // fused backward kernels (floating): a is the output gradient, b the saved
  // forward input x or output y as named
  relu_backward,       // y > 0 ? a : 0
  gelu_backward,       // a * d/dx gelu(x)
  gelu_tanh_backward,  // a * d/dx gelu_tanh(x)
  silu_backward,       // a * s (1 + x (1 - s)), s = sigmoid(x)
  sigmoid_backward,    // a * y (1 - y)
  tanh_backward,       // a * (1 - y^2)
  pow_backward,        // a * s0 * x^(s0 - 1); 0 when s0 == 0
  clamp_backward,      // s0 <= x <= s1 ? a : 0
  abs_backward,        // a * sign(x)
};

std::string_view unary_op_name(UnaryOp op);
std::string_view binary_op_name(BinaryOp op);
// True for the ops whose output is bool.
bool is_predicate(UnaryOp op);
bool is_predicate(BinaryOp op);
// Whether binary_* takes add (a + s0 * b) of these dtypes in one pass: a
// float32 output from one float32 and one 16-bit input (autocast's promote of
// a float32 residual and a 16-bit branch). The 16-bit input is widened
// exactly, so the result equals that of casting it first, without the cast.
inline bool is_mixed_add(BinaryOp op, DType out, DType a, DType b) {
  const auto is_16bit = [](DType t) { return t == DType::f16 || t == DType::bf16; };
  return op == BinaryOp::add && out == DType::f32 &&
         ((a == DType::f32 && is_16bit(b)) || (is_16bit(a) && b == DType::f32));
}

void unary_cpu(UnaryOp op, const IterShape& shape, const Operand& out, const Operand& x, double s0 = 0,
               double s1 = 0);
void unary_cuda(UnaryOp op, const IterShape& shape, const Operand& out, const Operand& x, double s0, double s1,
                cuda::Stream stream);

void binary_cpu(BinaryOp op, const IterShape& shape, const Operand& out, const Operand& a, const Operand& b,
                double s0 = 0, double s1 = 0);
void binary_cuda(BinaryOp op, const IterShape& shape, const Operand& out, const Operand& a, const Operand& b,
                 double s0, double s1, cuda::Stream stream);

// out = condition ? a : b; condition is bool, a, b and out share a dtype.
void where_cpu(const IterShape& shape, const Operand& out, const Operand& condition, const Operand& a,
               const Operand& b);
void where_cuda(const IterShape& shape, const Operand& out, const Operand& condition, const Operand& a,
                const Operand& b, cuda::Stream stream);

}  // namespace kiln::kernels
