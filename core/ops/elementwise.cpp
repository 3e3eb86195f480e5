// Elementwise ops: front ends, autograd nodes and backwards, side by side.
//
// Every op checks its inputs (defined, same device, same dtype, broadcastable
// shapes, a dtype the op supports) and throws naming the op, then runs one
// kernel of kernels/elementwise.h on the device of its inputs. Backwards save
// only what they read, skip inputs that need no gradient, undo broadcasting
// with sum_to, and use the fused backward kernels for the activations.
// In-place methods (add_, mul_, ...) write through the same kernels with the
// output aliasing self; they bump the version counter and are refused on a
// tensor that requires grad while grad mode is on (as Tensor::copy_).
#include <cmath>
#include <limits>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/cuda/runtime.h"
#include "kernels/elementwise.h"

namespace kiln {

namespace {

using autograd::SavedTensor;
using autograd::TensorList;
using kernels::BinaryOp;
using kernels::UnaryOp;

void check_floating_input(const Tensor& x, const char* op) {
  check_defined(x, op);
  KILN_CHECK(is_floating(x.dtype()), op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ",
             shape_str(x.shape()), " ", dtype_name(x.dtype()), " on ", x.device(), "; cast it first");
}

void check_numeric_input(const Tensor& x, const char* op) {
  check_defined(x, op);
  KILN_CHECK(x.dtype() != DType::b8, op, ": expected a numeric tensor, got ", shape_str(x.shape()),
             " bool on ", x.device());
}

// An integer tensor cannot represent the result of a non-integral scalar.
void check_scalar_fits(const Tensor& x, double value, const char* op, const char* what) {
  KILN_CHECK(is_floating(x.dtype()) || (std::isfinite(value) && std::trunc(value) == value), op, ": ", what, " ",
             value, " is not an integer but the tensor (", shape_str(x.shape()), ") is ", dtype_name(x.dtype()),
             "; cast the tensor to a floating dtype first");
}

// ---------------------------------------------------------------- kernel calls

void run_unary(const char* name, UnaryOp op, const Tensor& out, const Tensor& x, double s0, double s1) {
  if (out.numel() == 0) return;
  const Shape& shape = out.shape();
  kernels::IterShape iter = iter_shape(shape);
  kernels::Operand ops[2] = {operand(out, shape, name), operand(x, shape, name)};
  iterate_in_memory_order(iter, ops, 2);
  if (out.is_cpu()) {
    kernels::unary_cpu(op, iter, ops[0], ops[1], s0, s1);
  } else {
    kernels::unary_cuda(op, iter, ops[0], ops[1], s0, s1, launch_on(out, "unary op").stream);
  }
}

void run_binary(const char* name, BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double s0,
                double s1) {
  if (out.numel() == 0) return;
  const Shape& shape = out.shape();
  kernels::IterShape iter = iter_shape(shape);
  kernels::Operand ops[3] = {operand(out, shape, name), operand(a, shape, name), operand(b, shape, name)};
  iterate_in_memory_order(iter, ops, 3);
  if (out.is_cpu()) {
    kernels::binary_cpu(op, iter, ops[0], ops[1], ops[2], s0, s1);
  } else {
    kernels::binary_cuda(op, iter, ops[0], ops[1], ops[2], s0, s1, launch_on(out, "binary op").stream);
  }
}

// A new tensor f(x), without autograd.
Tensor unary_kernel(const char* name, UnaryOp op, const Tensor& x, double s0 = 0, double s1 = 0) {
  check_defined(x, name);
  const DType dtype = kernels::is_predicate(op) ? DType::b8 : x.dtype();
  Tensor out = empty_in_layout_of(x, x.shape(), {.dtype = dtype, .device = x.device()});
  run_unary(name, op, out, x, s0, s1);
  return out;
}

// A new tensor f(a, b) of the broadcast shape, without autograd. The inputs
// share a dtype, except that with allow_mixed_add an add of a float32 and a
// 16-bit input (kernels::is_mixed_add: autocast's promote in one pass) gives
// a float32 output.
Tensor binary_kernel(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, double s0 = 0,
                     double s1 = 0, bool allow_mixed_add = false) {
  check_defined(a, name, "the first operand");
  check_defined(b, name, "the second operand");
  check_same_device(a, b, name);
  const bool mixed = allow_mixed_add && kernels::is_mixed_add(op, DType::f32, a.dtype(), b.dtype());
  if (!mixed) check_same_dtype(a, b, name);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType dtype = kernels::is_predicate(op) ? DType::b8 : mixed ? DType::f32 : a.dtype();
  // The layout of the first operand that has the result's shape (torch's rule).
  const Tensor& like = a.shape() == shape ? a : b;
  Tensor out = empty_in_layout_of(like, shape, {.dtype = dtype, .device = a.device()});
  run_binary(name, op, out, a, b, s0, s1);
  return out;
}

// ---------------------------------------------------------------- recording

// Records out = f(x) with backward dinp = backward(dout).
void record_unary(const char* name, const Tensor& x, const Tensor& out, std::function<Tensor(const Tensor&)> backward) {
  if (!autograd::any_requires_grad({&x})) return;
  autograd::record(name, {x}, {out}, [backward = std::move(backward)](const TensorList& grads) -> TensorList {
    return {backward(grads[0])};
  });
}

// Records out = f(x) whose backward is the fused kernel backward_op(dout, saved; s0, s1).
void record_fused(const char* name, const Tensor& x, const Tensor& out, const Tensor& saved, BinaryOp backward_op,
                  double s0 = 0, double s1 = 0) {
  if (!autograd::any_requires_grad({&x})) return;
  autograd::record(name, {x}, {out},
                   [name, saved = SavedTensor(saved, name), backward_op, s0, s1](const TensorList& grads) -> TensorList {
                     return {binary_kernel(name, backward_op, grads[0], saved.unpack(), s0, s1)};
                   });
}

// A floating activation (or math function) with a fused backward kernel that
// reads the input (save_output false) or the output (save_output true).
Tensor fused_unary(const char* name, UnaryOp op, const Tensor& x, BinaryOp backward_op, bool save_output,
                   double s0 = 0, double s1 = 0) {
  check_floating_input(x, name);
  Tensor out = unary_kernel(name, op, x, s0, s1);
  record_fused(name, x, out, save_output ? out : x, backward_op, s0, s1);
  return out;
}

// ---------------------------------------------------------------- add / sub

// Under autocast, a float32 and a 16-bit input add in one kernel (the kernels
// widen the 16-bit one exactly, so the result is the promote's, bit for bit,
// without its cast pass); each input's gradient comes back in its dtype (the
// 16-bit one rounded once, as the cast's backward would).
Tensor add_impl(const char* name, const Tensor& a, const Tensor& b, double alpha) {
  bool mixed = false;
  if (const autocast::Cast to = autocast::plan(autocast::Policy::promote, {&a, &b})) {
    mixed = a.defined() && b.defined() && kernels::is_mixed_add(BinaryOp::add, DType::f32, a.dtype(), b.dtype());
    if (!mixed) return add_impl(name, to(a), to(b), alpha);
  }
  check_defined(a, name, "the first operand");
  check_numeric_input(a, name);
  check_scalar_fits(a, alpha, name, "alpha");
  Tensor out = binary_kernel(name, BinaryOp::add, a, b, alpha, 0.0, /*allow_mixed_add=*/mixed);
  if (autograd::any_requires_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record(name, {a, b}, {out},
                     [need_a, need_b, alpha, shape_a = a.shape(), shape_b = b.shape(), dtype_a = a.dtype(),
                      dtype_b = b.dtype()](const TensorList& grads) {
                       const Tensor& dout = grads[0];
                       Tensor da = need_a ? sum_to(dout, shape_a).to(dtype_a) : Tensor();
                       Tensor db =
                           need_b ? sum_to(alpha == 1.0 ? dout : mul(dout, alpha), shape_b).to(dtype_b) : Tensor();
                       return TensorList{da, db};
                     });
  }
  return out;
}

// The share of the gradient of maximum/minimum that goes to `self`: all of it
// where self wins, half on ties (as torch), none elsewhere.
Tensor selection_grad(const Tensor& dout, const Tensor& self, const Tensor& other, bool is_max) {
  const Tensor zero = scalar_tensor(0.0, {.dtype = dout.dtype(), .device = dout.device()});
  const Tensor wins = is_max ? gt(self, other) : lt(self, other);
  return where(wins, dout, where(eq(self, other), mul(dout, 0.5), zero));
}

Tensor max_min_impl(const char* name, const Tensor& a, const Tensor& b, bool is_max) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::promote, {&a, &b})) {
    return max_min_impl(name, to(a), to(b), is_max);
  }
  check_numeric_input(a, name);
  Tensor out = binary_kernel(name, is_max ? BinaryOp::maximum : BinaryOp::minimum, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record(name, {a, b}, {out},
                     [need_a, need_b, is_max, saved_a = SavedTensor(a, name), saved_b = SavedTensor(b, name),
                      shape_a = a.shape(), shape_b = b.shape()](const TensorList& grads) {
                       const Tensor va = saved_a.unpack(), vb = saved_b.unpack();
                       Tensor da = need_a ? sum_to(selection_grad(grads[0], va, vb, is_max), shape_a) : Tensor();
                       Tensor db = need_b ? sum_to(selection_grad(grads[0], vb, va, is_max), shape_b) : Tensor();
                       return TensorList{da, db};
                     });
  }
  return out;
}

// The in-place form of a binary op: self = op(self, other), other broadcast into self.
Tensor& inplace_binary(const char* name, BinaryOp op, Tensor& self, const Tensor& other_in, double s0 = 0) {
  check_inplace_target(self, name);
  check_defined(other_in, name, "other");
  check_same_device(self, other_in, name);
  KILN_CHECK(!(grad_mode_enabled() && other_in.requires_grad()), name,
             ": other requires grad, but in-place ops are not recorded by autograd; use the out-of-place op, or "
             "NoGradGuard for updates outside autograd");
  const Shape shape = broadcast_shapes(self.shape(), other_in.shape(), name);
  KILN_CHECK(shape == self.shape(), name, ": cannot broadcast other of shape ", shape_str(other_in.shape()),
             " into self of shape ", shape_str(self.shape()), " (the result would have shape ", shape_str(shape), ")");
  Tensor other = other_in;
  if (other.dtype() != self.dtype()) {
    // Like torch, the other operand is converted to self's dtype, but a floating
    // result is never written into an integer tensor.
    KILN_CHECK(is_floating(self.dtype()) || !is_floating(other.dtype()), name, ": cannot write the ",
               dtype_name(other.dtype()), " result into self of dtype ", dtype_name(self.dtype()));
    other = cast(other, self.dtype());
  }
  self.bump_version();
  run_binary(name, op, self, self, other, s0, 0);
  return self;
}

Tensor& inplace_unary(const char* name, UnaryOp op, Tensor& self, double s0 = 0, double s1 = 0) {
  check_inplace_target(self, name);
  self.bump_version();
  run_unary(name, op, self, self, s0, s1);
  return self;
}

// Integer tensors: the bounds that select the same integers as [lo, hi].
std::pair<double, double> clamp_bounds(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  double lo = min.value_or(-std::numeric_limits<double>::infinity());
  double hi = max.value_or(std::numeric_limits<double>::infinity());
  if (!is_floating(x.dtype())) {
    lo = std::ceil(lo);
    hi = std::floor(hi);
  }
  return {lo, hi};
}

}  // namespace

// ---------------------------------------------------------------- arithmetic

Tensor add(const Tensor& a, const Tensor& b, double alpha) { return add_impl("add", a, b, alpha); }
Tensor sub(const Tensor& a, const Tensor& b, double alpha) { return add_impl("sub", a, b, -alpha); }

Tensor mul(const Tensor& a, const Tensor& b) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::promote, {&a, &b})) return mul(to(a), to(b));
  check_numeric_input(a, "mul");
  Tensor out = binary_kernel("mul", BinaryOp::mul, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    // d(a*b)/da = b: save b only when a needs a gradient, and a only when b does.
    autograd::record("mul", {a, b}, {out},
                     [need_a, need_b, saved_a = need_b ? SavedTensor(a, "mul") : SavedTensor(),
                      saved_b = need_a ? SavedTensor(b, "mul") : SavedTensor(), shape_a = a.shape(),
                      shape_b = b.shape()](const TensorList& grads) {
                       const Tensor& dout = grads[0];
                       Tensor da = need_a ? sum_to(mul(dout, saved_b.unpack()), shape_a) : Tensor();
                       Tensor db = need_b ? sum_to(mul(dout, saved_a.unpack()), shape_b) : Tensor();
                       return TensorList{da, db};
                     });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::promote, {&a, &b})) return div(to(a), to(b));
  check_floating_input(a, "div");
  Tensor out = binary_kernel("div", BinaryOp::div, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    // da = dout / b; db = -dout * a / b^2 = -(da * a) / b.
    autograd::record("div", {a, b}, {out},
                     [need_a, need_b, saved_a = need_b ? SavedTensor(a, "div") : SavedTensor(),
                      saved_b = SavedTensor(b, "div"), shape_a = a.shape(), shape_b = b.shape()](const TensorList& grads) {
                       const Tensor vb = saved_b.unpack();
                       const Tensor quotient = div(grads[0], vb);
                       Tensor da = need_a ? sum_to(quotient, shape_a) : Tensor();
                       Tensor db = need_b ? sum_to(neg(div(mul(quotient, saved_a.unpack()), vb)), shape_b) : Tensor();
                       return TensorList{da, db};
                     });
  }
  return out;
}

Tensor add(const Tensor& a, double b) {
  check_numeric_input(a, "add");
  check_scalar_fits(a, b, "add", "scalar");
  Tensor out = unary_kernel("add", UnaryOp::affine, a, 1.0, b);
  record_unary("add", a, out, [](const Tensor& dout) { return dout; });
  return out;
}

Tensor mul(const Tensor& a, double b) {
  check_numeric_input(a, "mul");
  check_scalar_fits(a, b, "mul", "scalar");
  Tensor out = unary_kernel("mul", UnaryOp::affine, a, b, 0.0);
  record_unary("mul", a, out, [b](const Tensor& dout) { return mul(dout, b); });
  return out;
}

Tensor div(const Tensor& a, double b) {
  check_floating_input(a, "div");
  Tensor out = unary_kernel("div", UnaryOp::div_scalar, a, b);
  record_unary("div", a, out, [b](const Tensor& dout) { return div(dout, b); });
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) { return max_min_impl("maximum", a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return max_min_impl("minimum", a, b, false); }

Tensor neg(const Tensor& x) {
  check_numeric_input(x, "neg");
  Tensor out = unary_kernel("neg", UnaryOp::neg, x);
  record_unary("neg", x, out, [](const Tensor& dout) { return neg(dout); });
  return out;
}

Tensor abs(const Tensor& x) {
  check_numeric_input(x, "abs");
  Tensor out = unary_kernel("abs", UnaryOp::abs, x);
  record_fused("abs", x, out, x, BinaryOp::abs_backward);
  return out;
}

// ---------------------------------------------------------------- math functions

Tensor exp(const Tensor& x) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return exp(to(x));
  check_floating_input(x, "exp");
  Tensor out = unary_kernel("exp", UnaryOp::exp, x);
  if (autograd::any_requires_grad({&x})) {
    record_unary("exp", x, out, [saved = SavedTensor(out, "exp")](const Tensor& dout) {
      return mul(dout, saved.unpack());
    });
  }
  return out;
}

Tensor sin(const Tensor& x) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return sin(to(x));
  check_floating_input(x, "sin");
  Tensor out = unary_kernel("sin", UnaryOp::sin, x);
  if (autograd::any_requires_grad({&x})) {
    record_unary("sin", x, out, [saved = SavedTensor(x, "sin")](const Tensor& dout) { return mul(dout, cos(saved.unpack())); });
  }
  return out;
}

Tensor cos(const Tensor& x) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return cos(to(x));
  check_floating_input(x, "cos");
  Tensor out = unary_kernel("cos", UnaryOp::cos, x);
  if (autograd::any_requires_grad({&x})) {
    record_unary("cos", x, out, [saved = SavedTensor(x, "cos")](const Tensor& dout) { return neg(mul(dout, sin(saved.unpack()))); });
  }
  return out;
}

Tensor log(const Tensor& x) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return log(to(x));
  check_floating_input(x, "log");
  Tensor out = unary_kernel("log", UnaryOp::log, x);
  if (autograd::any_requires_grad({&x})) {
    record_unary("log", x, out, [saved = SavedTensor(x, "log")](const Tensor& dout) {
      return div(dout, saved.unpack());
    });
  }
  return out;
}

// d/dx x^p = p x^(p-1): sqrt and rsqrt use the fused pow backward.
Tensor sqrt(const Tensor& x) { return fused_unary("sqrt", UnaryOp::sqrt, x, BinaryOp::pow_backward, false, 0.5); }

Tensor rsqrt(const Tensor& x) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return rsqrt(to(x));
  check_floating_input(x, "rsqrt");
  Tensor out = unary_kernel("rsqrt", UnaryOp::rsqrt, x);
  record_fused("rsqrt", x, out, x, BinaryOp::pow_backward, -0.5);
  return out;
}

Tensor pow(const Tensor& x, double exponent) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return pow(to(x), exponent);
  return fused_unary("pow", UnaryOp::pow, x, BinaryOp::pow_backward, false, exponent);
}

Tensor pow(const Tensor& x, const Tensor& exponent) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x, &exponent})) {
    return pow(to(x), to(exponent));
  }
  check_floating_input(x, "pow");
  Tensor out = binary_kernel("pow", BinaryOp::pow, x, exponent);
  if (autograd::any_requires_grad({&x, &exponent})) {
    const bool need_x = x.requires_grad(), need_e = exponent.requires_grad();
    // dx = dout * e * x^(e-1); de = dout * x^e * log(x), taken as 0 where x == 0 (as torch).
    autograd::record(
        "pow", {x, exponent}, {out},
        [need_x, need_e, saved_x = SavedTensor(x, "pow"), saved_e = need_x ? SavedTensor(exponent, "pow") : SavedTensor(),
         saved_out = need_e ? SavedTensor(out, "pow") : SavedTensor(), shape_x = x.shape(),
         shape_e = exponent.shape()](const TensorList& grads) {
          const Tensor& dout = grads[0];
          const Tensor vx = saved_x.unpack();
          Tensor dx, de;
          if (need_x) {
            const Tensor ve = saved_e.unpack();
            dx = sum_to(mul(mul(dout, ve), pow(vx, add(ve, -1.0))), shape_x);
          }
          if (need_e) {
            const Tensor zero = scalar_tensor(0.0, {.dtype = dout.dtype(), .device = dout.device()});
            de = sum_to(where(eq(vx, 0.0), zero, mul(mul(dout, saved_out.unpack()), log(vx))), shape_e);
          }
          return TensorList{dx, de};
        });
  }
  return out;
}

// ---------------------------------------------------------------- activations

Tensor relu(const Tensor& x) {
  check_numeric_input(x, "relu");
  Tensor out = unary_kernel("relu", UnaryOp::relu, x);
  record_fused("relu", x, out, out, BinaryOp::relu_backward);
  return out;
}

Tensor gelu(const Tensor& x, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"",
             approximate, "\"");
  if (approximate == "tanh") {
    return fused_unary("gelu", UnaryOp::gelu_tanh, x, BinaryOp::gelu_tanh_backward, false);
  }
  return fused_unary("gelu", UnaryOp::gelu, x, BinaryOp::gelu_backward, false);
}

Tensor silu(const Tensor& x) { return fused_unary("silu", UnaryOp::silu, x, BinaryOp::silu_backward, false); }
Tensor sigmoid(const Tensor& x) {
  return fused_unary("sigmoid", UnaryOp::sigmoid, x, BinaryOp::sigmoid_backward, true);
}
Tensor tanh(const Tensor& x) { return fused_unary("tanh", UnaryOp::tanh, x, BinaryOp::tanh_backward, true); }

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  check_numeric_input(x, "clamp");
  KILN_CHECK(min.has_value() || max.has_value(), "clamp: at least one of min and max must be given");
  const auto [lo, hi] = clamp_bounds(x, min, max);
  Tensor out = unary_kernel("clamp", UnaryOp::clamp, x, lo, hi);
  record_fused("clamp", x, out, x, BinaryOp::clamp_backward, lo, hi);
  return out;
}

// ---------------------------------------------------------------- where

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  check_defined(condition, "where", "the condition");
  check_defined(a, "where", "the first operand");
  check_defined(b, "where", "the second operand");
  if (const autocast::Cast to = autocast::plan(autocast::Policy::promote, {&a, &b})) {
    return where(condition, to(a), to(b));
  }
  KILN_CHECK(condition.dtype() == DType::b8, "where: expected a bool condition, got ",
             shape_str(condition.shape()), " ", dtype_name(condition.dtype()));
  check_same_device(condition, a, "where");
  check_same_device(a, b, "where");
  check_same_dtype(a, b, "where");
  const Shape shape = broadcast_shapes(broadcast_shapes(condition.shape(), a.shape(), "where"), b.shape(), "where");
  const Tensor& like = a.shape() == shape ? a : b.shape() == shape ? b : condition;
  Tensor out = empty_in_layout_of(like, shape, {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() > 0) {
    kernels::IterShape iter = iter_shape(shape);
    kernels::Operand ops[4] = {operand(out, shape, "where"), operand(condition, shape, "where"),
                               operand(a, shape, "where"), operand(b, shape, "where")};
    iterate_in_memory_order(iter, ops, 4);
    if (out.is_cpu()) {
      kernels::where_cpu(iter, ops[0], ops[1], ops[2], ops[3]);
    } else {
      kernels::where_cuda(iter, ops[0], ops[1], ops[2], ops[3], launch_on(out, "where").stream);
    }
  }
  if (autograd::any_requires_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record("where", {a, b}, {out},
                     [need_a, need_b, saved_condition = SavedTensor(condition, "where"), shape_a = a.shape(),
                      shape_b = b.shape()](const TensorList& grads) {
                       const Tensor& dout = grads[0];
                       const Tensor vc = saved_condition.unpack();
                       const Tensor zero = scalar_tensor(0.0, {.dtype = dout.dtype(), .device = dout.device()});
                       Tensor da = need_a ? sum_to(where(vc, dout, zero), shape_a) : Tensor();
                       Tensor db = need_b ? sum_to(where(vc, zero, dout), shape_b) : Tensor();
                       return TensorList{da, db};
                     });
  }
  return out;
}

// ---------------------------------------------------------------- comparisons (no gradient)

Tensor eq(const Tensor& a, const Tensor& b) { return binary_kernel("eq", BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_kernel("ne", BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_kernel("lt", BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_kernel("le", BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_kernel("gt", BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_kernel("ge", BinaryOp::ge, a, b); }
Tensor eq(const Tensor& a, double b) { return unary_kernel("eq", UnaryOp::eq_scalar, a, b); }
Tensor gt(const Tensor& a, double b) { return unary_kernel("gt", UnaryOp::gt_scalar, a, b); }
Tensor lt(const Tensor& a, double b) { return unary_kernel("lt", UnaryOp::lt_scalar, a, b); }
Tensor isfinite(const Tensor& x) { return unary_kernel("isfinite", UnaryOp::isfinite, x); }

// ---------------------------------------------------------------- cast

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "cast");
  if (x.dtype() == dtype) return x;
  Tensor out = empty_in_layout_of(x, x.shape(), {.dtype = dtype, .device = x.device()});
  {
    NoGradGuard no_grad;
    out.copy_(x);
  }
  if (is_floating(dtype) && autograd::any_requires_grad({&x})) {
    const DType source = x.dtype();
    record_unary("cast", x, out, [source](const Tensor& dout) { return cast(dout, source); });
  }
  return out;
}

// ---------------------------------------------------------------- operators

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }

// ---------------------------------------------------------------- in-place methods

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_defined(*this, "add_", "self");
  check_numeric_input(*this, "add_");
  check_scalar_fits(*this, alpha, "add_", "alpha");
  return inplace_binary("add_", BinaryOp::add, *this, other, alpha);
}

Tensor& Tensor::sub_(const Tensor& other) {
  check_defined(*this, "sub_", "self");
  check_numeric_input(*this, "sub_");
  return inplace_binary("sub_", BinaryOp::add, *this, other, -1.0);
}

Tensor& Tensor::mul_(const Tensor& other) {
  check_defined(*this, "mul_", "self");
  check_numeric_input(*this, "mul_");
  return inplace_binary("mul_", BinaryOp::mul, *this, other);
}

Tensor& Tensor::mul_(double value) {
  check_defined(*this, "mul_", "self");
  check_numeric_input(*this, "mul_");
  check_scalar_fits(*this, value, "mul_", "scalar");
  return inplace_unary("mul_", UnaryOp::affine, *this, value, 0.0);
}

Tensor& Tensor::div_(const Tensor& other) {
  check_defined(*this, "div_", "self");
  check_floating_input(*this, "div_");
  return inplace_binary("div_", BinaryOp::div, *this, other);
}

Tensor& Tensor::clamp_(double min, double max) {
  check_defined(*this, "clamp_", "self");
  check_numeric_input(*this, "clamp_");
  const auto [lo, hi] = clamp_bounds(*this, min, max);
  return inplace_unary("clamp_", UnaryOp::clamp, *this, lo, hi);
}

Tensor& Tensor::relu_() {
  check_defined(*this, "relu_", "self");
  check_numeric_input(*this, "relu_");
  return inplace_unary("relu_", UnaryOp::relu, *this);
}

}  // namespace kiln

namespace kiln {

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined(x, "masked_fill");
  check_defined(mask, "masked_fill", "the mask");
  KILN_CHECK(mask.dtype() == DType::b8, "masked_fill: the mask must be bool, got ", dtype_name(mask.dtype()),
             " of shape ", shape_str(mask.shape()));
  check_same_device(x, mask, "masked_fill");
  KILN_CHECK(broadcast_shapes(mask.shape(), x.shape(), "masked_fill") == x.shape(), "masked_fill: a mask of shape ",
             shape_str(mask.shape()), " does not broadcast to the input's shape ", shape_str(x.shape()));
  return where(mask, scalar_tensor(value, {.dtype = x.dtype(), .device = x.device()}), x);
}

}  // namespace kiln
