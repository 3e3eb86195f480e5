// softmax, log_softmax, cross_entropy (fused log-softmax + NLL) and nll_loss,
// forward and backward side by side.
//
// The kernels work on dense rows: softmax moves its dim last and cross_entropy
// moves the class dim last ((N, C, d...) -> (N, d..., C)), each with one copy
// when the tensor is not already laid out so. Outputs and input gradients are
// returned as permuted views of those dense buffers (no copy back).
//
// Losses: the kernel writes a per-element loss and weight (w[target], 0 where
// ignored) in Acc (float, or double for float64); reduction "sum" and "mean"
// use the deterministic sum of core/ops/reduction.cpp, and "mean" divides by
// the summed weights exactly as torch's weighted mean does. With label
// smoothing the smoothing term is divided by that same weight sum (torch's
// cross_entropy_loss_label_smoothing). Nothing here synchronizes the device.
//
// Target validation: on the CPU an out-of-range target (other than
// ignore_index) throws kiln::Error naming the value. On CUDA the kernel writes
// NaN for that element's loss (and reads nothing out of bounds); only in
// anomaly mode (set_detect_anomaly(true)) is the value read back and thrown,
// because that check synchronizes the device.
#include <limits>
#include <numeric>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "kernels/reduction.h"
#include "kernels/softmax.h"

namespace kiln {

namespace {

// The permutation that moves `dim` last, and its inverse.
std::vector<int64_t> move_last(int64_t ndim, int64_t dim) {
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < ndim; ++d) {
    if (d != dim) perm.push_back(d);
  }
  perm.push_back(dim);
  return perm;
}

std::vector<int64_t> inverse_of(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return inverse;
}

// x with `perm` applied, dense (a 0-d tensor becomes shape [1]).
Tensor dense_permuted(const Tensor& x, const std::vector<int64_t>& perm) {
  if (x.dim() == 0) return x.expand({1}).contiguous();
  return x.permute(perm).contiguous();
}

// The inverse of dense_permuted for a result of `ndim` dims.
Tensor undo_permute(const Tensor& dense, const std::vector<int64_t>& perm, int64_t ndim) {
  if (ndim == 0) return dense.reshape({});
  return dense.permute(inverse_of(perm));
}

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  KILN_CHECK(x.defined(), op, ": the input tensor is undefined");
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return softmax_impl(to(x), dim, log);
  KILN_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", dtype_name(x.dtype()), " of shape ",
             shape_str(x.shape()));
  const int64_t ndim = x.dim();
  const int64_t d = wrap_dim(dim, ndim, op);
  const std::vector<int64_t> perm = move_last(ndim, d);
  Tensor dense_x, dense_y;
  int64_t rows = 0, cols = 0;
  {
    NoGradGuard no_grad;
    dense_x = dense_permuted(x, perm);
    dense_y = empty(dense_x.shape(), {.dtype = x.dtype(), .device = x.device()});
    cols = ndim == 0 ? 1 : x.shape()[d];
    rows = cols == 0 ? 0 : x.numel() / cols;
    kernels::SoftmaxArgs args{x.dtype(), dense_x.data_ptr(), dense_y.data_ptr(), rows, cols, log};
    if (x.is_cpu()) {
      kernels::softmax_cpu(args);
    } else {
      kernels::softmax_cuda(args, launch_on(x, "softmax/loss").stream);
    }
  }
  Tensor y;
  {
    NoGradGuard no_grad;
    y = undo_permute(dense_y, perm, ndim);
  }
  if (autograd::any_requires_grad({&x})) {
    autograd::record(op, {x}, {y},
                     [perm, ndim, rows, cols, log, sy = autograd::SavedTensor(dense_y, op)](
                         const autograd::TensorList& g) -> autograd::TensorList {
                       Tensor dense_out = sy.unpack();
                       Tensor dense_grad = dense_permuted(g[0], perm);
                       Tensor dense_dx = empty(dense_out.shape(), {.dtype = dense_out.dtype(), .device = dense_out.device()});
                       kernels::SoftmaxGradArgs args{dense_out.dtype(), dense_out.data_ptr(), dense_grad.data_ptr(),
                                                     dense_dx.data_ptr(), rows, cols, log};
                       if (dense_out.is_cpu()) {
                         kernels::softmax_grad_cpu(args);
                       } else {
                         kernels::softmax_grad_cuda(args, launch_on(dense_out, "softmax/loss").stream);
                       }
                       return {undo_permute(dense_dx, perm, ndim)};
                     });
  }
  return y;
}

// ---------------------------------------------------------------- losses

struct LossShape {
  int64_t n = 1;
  int64_t classes = 0;
  int64_t inner = 1;  // product of the d... dims
};

LossShape check_loss_inputs(const char* op, const char* input_name, const Tensor& input, const Tensor& target,
                            const Tensor& weight) {
  KILN_CHECK(input.defined() && target.defined(), op, ": the ", input_name, " or the target is undefined");
  KILN_CHECK(is_floating(input.dtype()), op, ": expected floating ", input_name, ", got ", dtype_name(input.dtype()),
             " of shape ", shape_str(input.shape()));
  KILN_CHECK(target.dtype() == DType::i64, op, ": expected int64 targets (class indices), got ",
             dtype_name(target.dtype()), " of shape ", shape_str(target.shape()));
  KILN_CHECK(input.device() == target.device(), op, ": ", input_name, " on ", input.device(), " but target on ",
             target.device());
  KILN_CHECK(input.dim() >= 1, op, ": expected ", input_name, " of shape (N, C), (N, C, d...) or (C), got shape ",
             shape_str(input.shape()));
  Shape expected;
  if (input.dim() > 1) {
    expected = input.shape();
    expected.erase(expected.begin() + 1);
  }
  KILN_CHECK(target.shape() == expected, op, ": target shape ", shape_str(target.shape()), " does not match ",
             input_name, " shape ", shape_str(input.shape()), " (expected target shape ", shape_str(expected), ")");
  LossShape shape;
  shape.classes = input.dim() == 1 ? input.shape()[0] : input.shape()[1];
  shape.n = input.dim() == 1 ? 1 : input.shape()[0];
  for (int64_t d = 2; d < input.dim(); ++d) shape.inner *= input.shape()[d];
  if (weight.defined()) {
    KILN_CHECK(weight.dim() == 1 && weight.shape()[0] == shape.classes, op, ": weight of shape ",
               shape_str(weight.shape()), " for ", shape.classes, " classes (expected shape [", shape.classes, "])");
    KILN_CHECK(weight.dtype() == input.dtype() && weight.device() == input.device(), op, ": weight is ",
               dtype_name(weight.dtype()), " on ", weight.device(), ", expected ", dtype_name(input.dtype()), " on ",
               input.device(), " like the ", input_name);
  }
  return shape;
}

// A device slot for the first bad target (CUDA in anomaly mode only), else undefined.
Tensor bad_target_slot(const Tensor& input) {
  if (!input.is_cuda() || !anomaly_mode_enabled()) return Tensor();
  return full({1}, static_cast<double>(std::numeric_limits<int64_t>::min()), {.dtype = DType::i64, .device = input.device()});
}

void check_bad_target_slot(const Tensor& slot, const char* op, int64_t classes, int64_t ignore_index) {
  if (!slot.defined()) return;
  const int64_t value = slot.item<int64_t>();  // synchronizes: anomaly mode only
  KILN_CHECK(value == std::numeric_limits<int64_t>::min(), op, ": target ", value, " is out of range for ", classes,
             " classes (expected a class index in [0, ", classes, ") or ignore_index ", ignore_index, ")");
}

struct ReducedLoss {
  Tensor out;           // in the dtype asked for
  Tensor total_weight;  // Acc scalar (mean only)
};

// Applies `reduction` to the per-element Acc losses (shape `shape`) and weights.
ReducedLoss reduce_loss(const Tensor& loss, const Tensor& row_weight, const Shape& shape, Reduction reduction,
                        DType dtype) {
  ReducedLoss result;
  switch (reduction) {
    case Reduction::none: result.out = loss.reshape(shape).to(dtype); break;
    case Reduction::sum: result.out = sum(loss).to(dtype); break;
    case Reduction::mean:
      result.total_weight = sum(row_weight);
      result.out = div(sum(loss), result.total_weight).to(dtype);
      break;
  }
  return result;
}

// The incoming gradient of a loss as a dense buffer (per element for none).
Tensor dense_loss_grad(const Tensor& grad) { return grad.contiguous(); }

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

// ---------------------------------------------------------------- cross_entropy

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                     double label_smoothing, Reduction reduction) {
  DType out_dtype = logits.defined() ? logits.dtype() : DType::f32;
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&logits, &weight})) {
    // 16-bit logits without class weights are read as they are: the kernels
    // compute in float, so the loss (float32) and the 16-bit gradient equal
    // those of the cast, bit for bit on the CPU, without the float32 copy of
    // the logits (3.3 GB for GPT-2's 16 x 1024 x 50257) or the cast back of
    // its gradient. Class weights keep the cast: the kernels read logits and
    // weights in one dtype, and a weight rounded to 16 bits would change the loss.
    if (weight.defined() || (logits.dtype() != DType::f16 && logits.dtype() != DType::bf16)) {
      return cross_entropy(to(logits), target, to(weight), ignore_index, label_smoothing, reduction);
    }
    out_dtype = DType::f32;
  }
  const char* op = "cross_entropy";
  const LossShape shape = check_loss_inputs(op, "logits", logits, target, weight);
  KILN_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], got ",
             label_smoothing);
  const DType dtype = logits.dtype(), acc = kernels::reduce_acc_dtype(dtype);
  const int64_t rows = shape.n * shape.inner;
  // (N, C, d...) -> (N, d..., C): classes last, one dense row per element.
  const std::vector<int64_t> perm = move_last(logits.dim(), logits.dim() == 1 ? 0 : 1);
  Tensor dense_logits, dense_target, dense_weight, lse, weight_sum;
  ReducedLoss reduced;
  {
    NoGradGuard no_grad;
    dense_logits = logits.permute(perm).contiguous();
    dense_target = target.contiguous();
    if (weight.defined()) {
      dense_weight = weight.contiguous();
      if (label_smoothing > 0) weight_sum = sum(dense_weight.to(acc));
    }
    const TensorOptions acc_options{.dtype = acc, .device = logits.device()};
    Tensor loss = empty({rows}, acc_options), row_weight = empty({rows}, acc_options);
    lse = empty({rows}, acc_options);
    Tensor bad = bad_target_slot(logits);
    kernels::CrossEntropyArgs args;
    args.dtype = dtype;
    args.logits = dense_logits.data_ptr();
    args.target = static_cast<const int64_t*>(dense_target.data_ptr());
    args.weight = dense_weight.defined() ? dense_weight.data_ptr() : nullptr;
    args.rows = rows;
    args.classes = shape.classes;
    args.ignore_index = ignore_index;
    args.label_smoothing = label_smoothing;
    args.loss = loss.data_ptr();
    args.row_weight = row_weight.data_ptr();
    args.lse = lse.data_ptr();
    args.bad_target = bad.defined() ? static_cast<int64_t*>(bad.data_ptr()) : nullptr;
    if (logits.is_cpu()) {
      kernels::cross_entropy_cpu(args);
    } else {
      kernels::cross_entropy_cuda(args, launch_on(logits, "softmax/loss").stream);
      check_bad_target_slot(bad, op, shape.classes, ignore_index);
    }
    reduced = reduce_loss(loss, row_weight, target.shape(), reduction, out_dtype);
  }
  if (autograd::any_requires_grad({&logits})) {
    autograd::record(
        op, {logits}, {reduced.out},
        [perm, rows, classes = shape.classes, ignore_index, label_smoothing, reduction, ndim = logits.dim(),
         sl = autograd::SavedTensor(dense_logits, op), st = autograd::SavedTensor(dense_target, op),
         sw = autograd::SavedTensor(dense_weight, op), slse = autograd::SavedTensor(lse, op),
         stotal = autograd::SavedTensor(reduced.total_weight, op),
         swsum = autograd::SavedTensor(weight_sum, op)](const autograd::TensorList& g) -> autograd::TensorList {
          Tensor logits = sl.unpack(), target = st.unpack(), weight = sw.unpack(), lse = slse.unpack();
          Tensor total = stotal.unpack(), wsum = swsum.unpack();
          // In Acc, as the kernels read it (the loss is 16-bit outside autocast: exact).
          Tensor grad = dense_loss_grad(g[0]).to(kernels::reduce_acc_dtype(logits.dtype()));
          Tensor dlogits = empty(logits.shape(), {.dtype = logits.dtype(), .device = logits.device()});
          kernels::CrossEntropyGradArgs args;
          args.dtype = logits.dtype();
          args.logits = logits.data_ptr();
          args.target = static_cast<const int64_t*>(target.data_ptr());
          args.weight = weight.defined() ? weight.data_ptr() : nullptr;
          args.lse = lse.data_ptr();
          args.grad = grad.data_ptr();
          args.per_row_grad = reduction == Reduction::none;
          args.total_weight = total.defined() ? total.data_ptr() : nullptr;
          args.weight_sum = wsum.defined() ? wsum.data_ptr() : nullptr;
          args.rows = rows;
          args.classes = classes;
          args.ignore_index = ignore_index;
          args.label_smoothing = label_smoothing;
          args.dlogits = dlogits.data_ptr();
          if (logits.is_cpu()) {
            kernels::cross_entropy_grad_cpu(args);
          } else {
            kernels::cross_entropy_grad_cuda(args, launch_on(logits, "softmax/loss").stream);
          }
          return {ndim == 1 ? dlogits : dlogits.permute(inverse_of(perm))};
        });
  }
  return reduced.out;
}

// ---------------------------------------------------------------- nll_loss

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                Reduction reduction) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&log_probs, &weight})) {
    return nll_loss(to(log_probs), target, to(weight), ignore_index, reduction);
  }
  const char* op = "nll_loss";
  const LossShape shape = check_loss_inputs(op, "log_probs", log_probs, target, weight);
  const DType dtype = log_probs.dtype(), acc = kernels::reduce_acc_dtype(dtype);
  Tensor dense_input, dense_target, dense_weight;
  ReducedLoss reduced;
  {
    NoGradGuard no_grad;
    dense_input = log_probs.contiguous();
    dense_target = target.contiguous();
    if (weight.defined()) dense_weight = weight.contiguous();
    const TensorOptions acc_options{.dtype = acc, .device = log_probs.device()};
    Tensor loss = empty({shape.n * shape.inner}, acc_options), row_weight = empty({shape.n * shape.inner}, acc_options);
    Tensor bad = bad_target_slot(log_probs);
    kernels::NllLossArgs args;
    args.dtype = dtype;
    args.log_probs = dense_input.data_ptr();
    args.target = static_cast<const int64_t*>(dense_target.data_ptr());
    args.weight = dense_weight.defined() ? dense_weight.data_ptr() : nullptr;
    args.n = shape.n;
    args.classes = shape.classes;
    args.inner = shape.inner;
    args.ignore_index = ignore_index;
    args.loss = loss.data_ptr();
    args.row_weight = row_weight.data_ptr();
    args.bad_target = bad.defined() ? static_cast<int64_t*>(bad.data_ptr()) : nullptr;
    if (log_probs.is_cpu()) {
      kernels::nll_loss_cpu(args);
    } else {
      kernels::nll_loss_cuda(args, launch_on(log_probs, "softmax/loss").stream);
      check_bad_target_slot(bad, op, shape.classes, ignore_index);
    }
    reduced = reduce_loss(loss, row_weight, target.shape(), reduction, dtype);
  }
  if (autograd::any_requires_grad({&log_probs})) {
    autograd::record(op, {log_probs}, {reduced.out},
                     [shape, ignore_index, reduction, input_shape = log_probs.shape(), dtype,
                      st = autograd::SavedTensor(dense_target, op), sw = autograd::SavedTensor(dense_weight, op),
                      stotal = autograd::SavedTensor(reduced.total_weight, op)](
                         const autograd::TensorList& g) -> autograd::TensorList {
                       Tensor target = st.unpack(), weight = sw.unpack(), total = stotal.unpack();
                       Tensor grad = dense_loss_grad(g[0]);
                       Tensor dinput = empty(input_shape, {.dtype = dtype, .device = grad.device()});
                       kernels::NllLossGradArgs args;
                       args.dtype = dtype;
                       args.target = static_cast<const int64_t*>(target.data_ptr());
                       args.weight = weight.defined() ? weight.data_ptr() : nullptr;
                       args.grad = grad.data_ptr();
                       args.per_row_grad = reduction == Reduction::none;
                       args.total_weight = total.defined() ? total.data_ptr() : nullptr;
                       args.n = shape.n;
                       args.classes = shape.classes;
                       args.inner = shape.inner;
                       args.ignore_index = ignore_index;
                       args.dlog_probs = dinput.data_ptr();
                       if (grad.is_cpu()) {
                         kernels::nll_loss_grad_cpu(args);
                       } else {
                         kernels::nll_loss_grad_cuda(args, launch_on(grad, "softmax/loss").stream);
                       }
                       return {dinput};
                     });
  }
  return reduced.out;
}

}  // namespace kiln
