// CPU binary elementwise ops (arithmetic, comparisons, fused activation
// backwards). The formulas live in kernels/elementwise_math.h, shared with CUDA.
// The backwards of the transcendental activations take Eigen's vectorized
// packet math on dense float32 operands (as the forwards do in
// elementwise.cpp): libm's erf/exp/tanh calls do not vectorize, and GELU's
// backward was a sixth of a ViT's backward pass.
#include <algorithm>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "kernels/cpu/dense_block.h"
#include "kernels/cpu/elementwise_loop.h"
#include "kernels/elementwise.h"
#include "kernels/elementwise_math.h"

namespace kiln::kernels {

namespace {

bool has_dense_f32_path(BinaryOp op) {
  switch (op) {
    case BinaryOp::gelu_backward:
    case BinaryOp::gelu_tanh_backward:
    case BinaryOp::silu_backward:
    case BinaryOp::tanh_backward:
    case BinaryOp::sigmoid_backward: return true;
    default: return false;
  }
}

// o = op(dout, x) in float32 (op has a dense path); dout is the gradient, x
// the saved input or output, as in elementwise_math.h.
void apply_binary_f32(BinaryOp op, const Eigen::Map<const Eigen::ArrayXf>& dout,
                      const Eigen::Map<const Eigen::ArrayXf>& x, Eigen::Map<Eigen::ArrayXf>& o) {
  // o holds an intermediate first (exp or tanh of x), then the result: every
  // read of o precedes its write coefficient by coefficient, and no block-sized
  // temporary is allocated.
  switch (op) {
    case BinaryOp::gelu_backward:
      cpu::assign_flushed_exp(o, -0.5f * x * x);
      o = dout * (0.5f * (1.0f + (x * 0.70710678118654752440f).erf()) + x * (0.39894228040143267794f * o));
      break;
    case BinaryOp::gelu_tanh_backward:
      o = (0.79788456080286535588f * (x + 0.044715f * x.cube())).tanh();
      o = dout * (0.5f * (1.0f + o) +
                  0.5f * x * (1.0f - o.square()) * (0.79788456080286535588f * (1.0f + 3.0f * 0.044715f * x.square())));
      break;
    case BinaryOp::silu_backward:
      cpu::assign_flushed_exp(o, -x);
      o = 1.0f / (1.0f + o);  // sigmoid(x)
      o = dout * o * (1.0f + x * (1.0f - o));
      break;
    case BinaryOp::tanh_backward: o = dout * (1.0f - x.square()); break;      // x is the output
    case BinaryOp::sigmoid_backward: o = dout * x * (1.0f - x); break;  // x is the output
    default: break;
  }
}

// out = op(a, b) over n dense elements of T (float, Half or BFloat16), in
// blocks; 16-bit blocks are widened to float and rounded once (elementwise.cpp).
template <typename T>
void binary_dense(BinaryOp op, T* out, const T* a, const T* b, int64_t n) {
  constexpr int64_t kBlock = cpu::kDenseBlock;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n > cpu::kParallelGrain) schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kBlock;
    const int64_t length = std::min(kBlock, n - begin);
    cpu::DenseBlock<T, 2> dense(out + begin, {a + begin, b + begin}, length);
    apply_binary_f32(op, dense.input(0), dense.input(1), dense.output());
  }
}

}  // namespace

void binary_cpu(BinaryOp op, const IterShape& shape, const Operand& out, const Operand& a, const Operand& b,
                double s0, double s1) {
  if (is_mixed_add(op, out.dtype, a.dtype, b.dtype)) {
    const Operand operands[3] = {out, a, b};
    math::dispatch_mixed_add(a.dtype, b.dtype, s0, [&]<typename Out, typename A, typename B>(auto f) {
      cpu::elementwise_loop<Out, A, B>(shape, operands, f);
    });
    return;
  }
  math::check_operands(binary_op_name(op), is_predicate(op), out, a, &b);
  if ((a.dtype == DType::f32 || a.dtype == DType::bf16 || a.dtype == DType::f16) && b.dtype == a.dtype &&
      out.dtype == a.dtype && has_dense_f32_path(op)) {
    IterShape dense_shape = shape;
    Operand dense[3] = {out, a, b};
    coalesce(dense_shape, dense, 3);
    if (all_contiguous(dense_shape, dense, 3)) {
      cpu::dispatch_dense_float(a.dtype, [&]<typename T>() {
        binary_dense<T>(op, static_cast<T*>(dense[0].data), static_cast<const T*>(dense[1].data),
                        static_cast<const T*>(dense[2].data), dense_shape.numel());
      });
      return;
    }
  }
  const Operand operands[3] = {out, a, b};
  math::dispatch_binary(op, a.dtype, s0, s1, [&]<typename Out, typename A, typename B>(auto f) {
    cpu::elementwise_loop<Out, A, B>(shape, operands, f);
  });
}

}  // namespace kiln::kernels
