// CPU unary elementwise ops and where(); binary ops are in elementwise_binary.cpp.
// The formulas live in kernels/elementwise_math.h, shared with CUDA. Dense
// float32 transcendental ops take a fast path through Eigen's vectorized packet
// math instead (libm calls do not vectorize): 3-10x faster, within a few ulp of
// libm (far inside the float32 parity tolerance), same inf/NaN results.
#include <algorithm>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "kernels/cpu/dense_block.h"
#include "kernels/cpu/elementwise_loop.h"
#include "kernels/elementwise.h"
#include "kernels/elementwise_math.h"

namespace kiln::kernels {

std::string_view unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::abs: return "abs";
    case UnaryOp::affine: return "affine";
    case UnaryOp::clamp: return "clamp";
    case UnaryOp::relu: return "relu";
    case UnaryOp::div_scalar: return "div";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::pow: return "pow";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::gelu_tanh: return "gelu";
    case UnaryOp::silu: return "silu";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sin: return "sin";
    case UnaryOp::cos: return "cos";
    case UnaryOp::isfinite: return "isfinite";
    case UnaryOp::eq_scalar: return "eq";
    case UnaryOp::gt_scalar: return "gt";
    case UnaryOp::lt_scalar: return "lt";
  }
  return "unary op";
}

std::string_view binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::mul: return "mul";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
    case BinaryOp::div: return "div";
    case BinaryOp::pow: return "pow";
    case BinaryOp::eq: return "eq";
    case BinaryOp::ne: return "ne";
    case BinaryOp::lt: return "lt";
    case BinaryOp::le: return "le";
    case BinaryOp::gt: return "gt";
    case BinaryOp::ge: return "ge";
    case BinaryOp::relu_backward: return "relu_backward";
    case BinaryOp::gelu_backward: return "gelu_backward";
    case BinaryOp::gelu_tanh_backward: return "gelu_tanh_backward";
    case BinaryOp::silu_backward: return "silu_backward";
    case BinaryOp::sigmoid_backward: return "sigmoid_backward";
    case BinaryOp::tanh_backward: return "tanh_backward";
    case BinaryOp::pow_backward: return "pow_backward";
    case BinaryOp::clamp_backward: return "clamp_backward";
    case BinaryOp::abs_backward: return "abs_backward";
  }
  return "binary op";
}

bool is_predicate(UnaryOp op) {
  return op == UnaryOp::isfinite || op == UnaryOp::eq_scalar || op == UnaryOp::gt_scalar ||
         op == UnaryOp::lt_scalar;
}

bool is_predicate(BinaryOp op) {
  switch (op) {
    case BinaryOp::eq:
    case BinaryOp::ne:
    case BinaryOp::lt:
    case BinaryOp::le:
    case BinaryOp::gt:
    case BinaryOp::ge: return true;
    default: return false;
  }
}

namespace {

bool has_dense_f32_path(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp:
    case UnaryOp::log:
    case UnaryOp::tanh:
    case UnaryOp::sin:
    case UnaryOp::cos:
    case UnaryOp::sigmoid:
    case UnaryOp::silu:
    case UnaryOp::gelu:
    case UnaryOp::gelu_tanh: return true;
    default: return false;
  }
}

// o = op(v) in float32 (op has a dense path).
void apply_unary_f32(UnaryOp op, const Eigen::Map<const Eigen::ArrayXf>& v, Eigen::Map<Eigen::ArrayXf>& o) {
  // exp, sigmoid and silu through cpu::assign_flushed_exp (dense_block.h).
  switch (op) {
    case UnaryOp::exp: cpu::assign_flushed_exp(o, v); break;
    case UnaryOp::log: o = v.log(); break;
    case UnaryOp::tanh: o = v.tanh(); break;
    case UnaryOp::sin: o = v.sin(); break;
    case UnaryOp::cos: o = v.cos(); break;
    case UnaryOp::sigmoid:
      cpu::assign_flushed_exp(o, -v);
      o = 1.0f / (1.0f + o);
      break;
    case UnaryOp::silu:
      cpu::assign_flushed_exp(o, -v);
      o = v / (1.0f + o);
      break;
    case UnaryOp::gelu: o = 0.5f * v * (1.0f + (v * 0.70710678118654752440f).erf()); break;
    case UnaryOp::gelu_tanh:
      o = 0.5f * v * (1.0f + (0.79788456080286535588f * (v + 0.044715f * v.cube())).tanh());
      break;
    default: break;
  }
}

// out = op(x) over n dense elements of T (float, Half or BFloat16; op has a
// dense path), in blocks that stay in L1/L2. 16-bit blocks are widened to
// float, computed with the same packet math and rounded once, as the scalar
// loop computes them in float (libm's erf/exp there do not vectorize: bf16
// GELU ran at 2% of the copy bandwidth).
template <typename T>
void unary_dense(UnaryOp op, T* out, const T* x, int64_t n) {
  constexpr int64_t kBlock = cpu::kDenseBlock;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n > cpu::kParallelGrain) schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kBlock;
    const int64_t length = std::min(kBlock, n - begin);
    cpu::DenseBlock<T, 1> dense(out + begin, {x + begin}, length);
    apply_unary_f32(op, dense.input(0), dense.output());
  }
}

}  // namespace

void unary_cpu(UnaryOp op, const IterShape& shape, const Operand& out, const Operand& x, double s0, double s1) {
  math::check_operands(unary_op_name(op), is_predicate(op), out, x, nullptr);
  if ((x.dtype == DType::f32 || x.dtype == DType::bf16 || x.dtype == DType::f16) && out.dtype == x.dtype &&
      has_dense_f32_path(op)) {
    IterShape dense_shape = shape;
    Operand dense[2] = {out, x};
    coalesce(dense_shape, dense, 2);
    if (all_contiguous(dense_shape, dense, 2)) {
      cpu::dispatch_dense_float(x.dtype, [&]<typename T>() {
        unary_dense<T>(op, static_cast<T*>(dense[0].data), static_cast<const T*>(dense[1].data),
                       dense_shape.numel());
      });
      return;
    }
  }
  const Operand operands[2] = {out, x};
  math::dispatch_unary(op, x.dtype, s0, s1, [&]<typename Out, typename In>(auto f) {
    cpu::elementwise_loop<Out, In>(shape, operands, f);
  });
}

void where_cpu(const IterShape& shape, const Operand& out, const Operand& condition, const Operand& a,
               const Operand& b) {
  KILN_CHECK(condition.dtype == DType::b8, "where: expected a bool condition, got ", dtype_name(condition.dtype));
  math::check_operands("where", false, out, a, &b);
  const Operand operands[4] = {out, condition, a, b};
  math::dispatch_where(a.dtype, [&]<typename Out, typename... In>(auto f) {
    cpu::elementwise_loop<Out, In...>(shape, operands, f);
  });
}

}  // namespace kiln::kernels
