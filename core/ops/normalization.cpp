// batch_norm (optionally fused with ReLU, or with ReLU and 2x2 max pooling)
// and layer_norm: checks, layout, dispatch to kernels/norm.h, and the backward.
//
// Batch norm keeps x's layout: a contiguous x is (N, C, inner); a 4-D
// channels-last x is (N*H*W, C, 1) and the output keeps its strides; anything
// else is made contiguous first. Per-channel vectors run in the compute type
// (float32, or float64 for float64 x); others are converted for the kernel and
// the running stats written back.
#include <utility>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/norm.h"
#include "kernels/pool.h"

namespace kiln {

namespace {

DType compute_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// A per-channel tensor in the compute dtype (itself when it already is).
Tensor as_compute(const Tensor& t, DType dtype) {
  if (!t.defined()) return t;
  NoGradGuard no_grad;
  return t.contiguous().to(dtype);
}

void check_channel_vector(const Tensor& t, const char* what, const Tensor& x, int64_t C, const char* op) {
  if (!t.defined()) return;
  KILN_CHECK(t.dim() == 1 && t.size(0) == C, op, ": expected ", what, " of shape [", C, "] for input ",
             shape_str(x.shape()), ", got ", shape_str(t.shape()));
  KILN_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device(), " but the input is on ", x.device());
  KILN_CHECK(t.dtype() == x.dtype() || t.dtype() == compute_dtype(x.dtype()), op, ": ", what, " is ",
             dtype_name(t.dtype()), ", expected ", dtype_name(x.dtype()),
             x.dtype() == compute_dtype(x.dtype()) ? "" : " or float32", " for a ", dtype_name(x.dtype()), " input");
}

// With `pool`, relu(bn(x)) goes through max_pool2d's 2x2 windows with stride
// 2 (floor): y and the saved argmax indices are (N, C, H/2, W/2). CUDA's
// kernels and the CPU's NCHW kernels never store the full-size activation or
// its gradient; a channels-last CPU input runs the batch-norm and pooling
// kernels one after the other, through a full-size buffer that lives only
// inside the call.
Tensor batch_norm_impl(const char* op, const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                       bool relu, bool pool) {
  KILN_CHECK(x_in.defined(), op, ": input is undefined");
  KILN_CHECK(x_in.dim() >= 2, op, ": expected input (N, C) or (N, C, d...), got shape ", shape_str(x_in.shape()));
  if (pool) {
    KILN_CHECK(x_in.dim() == 4 && x_in.size(2) >= 2 && x_in.size(3) >= 2, op,
               ": expected input (N, C, H, W) with H and W at least 2 (the 2x2 pooling window), got shape ",
               shape_str(x_in.shape()));
  }
  KILN_CHECK(is_floating(x_in.dtype()), op, ": expected a floating input, got ", dtype_name(x_in.dtype()));
  const int64_t C = x_in.size(1);
  check_channel_vector(running_mean, "running_mean", x_in, C, op);
  check_channel_vector(running_var, "running_var", x_in, C, op);
  check_channel_vector(weight, "weight", x_in, C, op);
  check_channel_vector(bias, "bias", x_in, C, op);
  KILN_CHECK(running_mean.defined() == running_var.defined(), op,
             ": running_mean and running_var must be both defined or both undefined");
  KILN_CHECK(training || running_mean.defined(), op,
             ": eval mode (training=false) needs running_mean and running_var");
  KILN_CHECK(eps > 0, op, ": eps must be positive, got ", eps);

  kernels::BatchNormArgs args;
  args.dtype = x_in.dtype();
  args.training = training;
  args.relu = relu;
  args.momentum = momentum;
  args.eps = eps;
  const bool channels_last = is_channels_last(x_in);
  Tensor x;
  {
    NoGradGuard no_grad;  // the layout copy is not part of the graph
    x = channels_last ? x_in : x_in.contiguous();
  }
  if (channels_last) {
    args.shape = {x.numel() / std::max<int64_t>(C, 1), C, 1};
  } else {
    args.shape = {x.size(0), C, C == 0 || x.size(0) == 0 ? 0 : x.numel() / (x.size(0) * C)};
  }
  KILN_CHECK(!training || args.shape.reduced() > 1 || x.numel() == 0, op,
             ": expected more than 1 value per channel when training, got input ", shape_str(x_in.shape()));

  const DType cdtype = compute_dtype(x.dtype());
  const TensorOptions channel_options{.dtype = cdtype, .device = x.device()};
  const Tensor w = as_compute(weight, cdtype), b = as_compute(bias, cdtype);
  Tensor rm = as_compute(running_mean, cdtype), rv = as_compute(running_var, cdtype);
  const bool update_running = training && running_mean.defined();
  if (update_running) {
    KILN_CHECK(!(grad_mode_enabled() && (running_mean.requires_grad() || running_var.requires_grad())), op,
               ": running_mean/running_var are updated in place and must not require grad");
  }
  // Tensors in x's layout: channels-last stays channels-last.
  const auto empty_in_layout = [&](const Shape& shape, DType dtype) {
    const TensorOptions options{.dtype = dtype, .device = x.device()};
    return channels_last ? empty_strided(shape, channels_last_strides(shape), options) : empty(shape, options);
  };
  kernels::Pool2dParams pooling;  // with `pool`: max_pool2d's 2x2, stride-2 windows
  Shape y_shape = x.shape();
  if (pool) {
    pooling.planes = x.size(0) * C;
    pooling.in_h = x.size(2);
    pooling.in_w = x.size(3);
    pooling.out_h = pooling.in_h / 2;
    pooling.out_w = pooling.in_w / 2;
    pooling.kernel_h = pooling.kernel_w = pooling.stride_h = pooling.stride_w = 2;
    pooling.channels_last = channels_last;
    pooling.channels = C;
    y_shape = {x.size(0), C, pooling.out_h, pooling.out_w};
  }
  // The CPU's NCHW kernels pool as they go, both ways (CUDA's kernels always do).
  const bool fused_pool = pool && !x.is_cuda() && !channels_last;
  Tensor mean = empty({C}, channel_options), invstd = empty({C}, channel_options);
  Tensor y = empty_in_layout(y_shape, x.dtype());
  Tensor indices = pool ? empty_in_layout(y_shape, DType::i32) : Tensor();
  void* rm_ptr = rm.defined() ? rm.data_ptr() : nullptr;
  void* rv_ptr = rv.defined() ? rv.data_ptr() : nullptr;
  if (training && !update_running) rm_ptr = rv_ptr = nullptr;
  const void* w_ptr = w.defined() ? w.data_ptr() : nullptr;
  const void* b_ptr = b.defined() ? b.data_ptr() : nullptr;
  if (x.numel() == 0) {
    // Nothing to compute (the statistics of an empty batch are not defined).
  } else if (fused_pool) {
    kernels::batch_norm_relu_max_pool2d_forward_cpu(args, pooling.in_h, pooling.in_w, x.data_ptr(), w_ptr, b_ptr,
                                                    rm_ptr, rv_ptr, y.data_ptr(), indices.data<int32_t>(),
                                                    mean.data_ptr(), invstd.data_ptr());
  } else if (x.is_cuda()) {
    const cuda::DeviceScope scope(x.device().index, op);
    const cuda::Stream stream = scope.stream;
    auto workspace = allocate_cuda(kernels::batch_norm_workspace_bytes(args), x.device().index, stream);
    if (pool) {
      kernels::batch_norm_relu_max_pool2d_forward_cuda(args, pooling.in_h, pooling.in_w, x.data_ptr(), w_ptr, b_ptr,
                                                       rm_ptr, rv_ptr, y.data_ptr(), indices.data<int32_t>(),
                                                       mean.data_ptr(), invstd.data_ptr(), workspace.get(), stream);
    } else {
      kernels::batch_norm_forward_cuda(args, x.data_ptr(), w_ptr, b_ptr, rm_ptr, rv_ptr, y.data_ptr(),
                                       mean.data_ptr(), invstd.data_ptr(), workspace.get(), stream);
    }
  } else {
    // A channels-last CPU input with the pool: batch norm into a full-size buffer, then the pooling kernel.
    Tensor full = pool ? empty_in_layout(x.shape(), x.dtype()) : y;
    kernels::batch_norm_forward_cpu(args, x.data_ptr(), w_ptr, b_ptr, rm_ptr, rv_ptr, full.data_ptr(),
                                    mean.data_ptr(), invstd.data_ptr());
    if (pool) {
      kernels::max_pool2d_forward_cpu(args.dtype, pooling, full.data_ptr(), y.data_ptr(), indices.data<int32_t>());
    }
  }
  if (update_running) {
    // The kernel wrote the buffers in place (or converted copies, written back here).
    NoGradGuard no_grad;
    for (auto [target, written] : {std::pair{running_mean, rm}, std::pair{running_var, rv}}) {
      if (written.same(target)) {
        target.bump_version();
      } else {
        target.copy_(written);
      }
    }
  }

  if (autograd::any_requires_grad({&x_in, &weight, &bias})) {
    const bool need_dx = x_in.requires_grad();
    const bool need_dw = weight.defined() && weight.requires_grad();
    const bool need_db = bias.defined() && bias.requires_grad();
    const DType weight_dtype = weight.defined() ? weight.dtype() : cdtype;
    const DType bias_dtype = bias.defined() ? bias.dtype() : cdtype;
    autograd::SavedTensor saved_x(x, op), saved_w(w, op), saved_b(relu ? b : Tensor(), op);
    autograd::SavedTensor saved_mean(mean, op), saved_invstd(invstd, op), saved_indices(indices, op);
    autograd::record(op, {x_in, weight, bias}, {y}, [=](const autograd::TensorList& grads) -> autograd::TensorList {
      const Tensor x = saved_x.unpack(), w = saved_w.unpack(), b = saved_b.unpack();
      const Tensor mean = saved_mean.unpack(), invstd = saved_invstd.unpack(), indices = saved_indices.unpack();
      // The gradient in y's layout (x's).
      Tensor g = grads[0];
      if (channels_last) {
        const Shape strides = channels_last_strides(y_shape);
        if (!is_channels_last(g) || g.strides() != strides) {
          Tensor dense = empty_strided(y_shape, strides, {.dtype = g.dtype(), .device = g.device()});
          dense.copy_(g);
          g = dense;
        }
      } else {
        g = g.contiguous();
      }
      const TensorOptions channel_options{.dtype = mean.dtype(), .device = x.device()};
      const auto empty_in_layout = [&](DType dtype) {
        const TensorOptions options{.dtype = dtype, .device = x.device()};
        return channels_last ? empty_strided(x.shape(), x.strides(), options) : empty(x.shape(), options);
      };
      Tensor dx = need_dx ? empty_in_layout(x.dtype()) : Tensor();
      Tensor dw = need_dw ? empty({C}, channel_options) : Tensor();
      Tensor db = need_db ? empty({C}, channel_options) : Tensor();
      const void* w_ptr = w.defined() ? w.data_ptr() : nullptr;
      const void* b_ptr = b.defined() ? b.data_ptr() : nullptr;
      void* dx_ptr = need_dx ? dx.data_ptr() : nullptr;
      void* dw_ptr = need_dw ? dw.data_ptr() : nullptr;
      void* db_ptr = need_db ? db.data_ptr() : nullptr;
      if (x.numel() == 0) {
        for (Tensor* t : {&dw, &db}) {
          if (t->defined()) t->zero_();
        }
      } else if (fused_pool) {
        kernels::batch_norm_relu_max_pool2d_backward_cpu(args, pooling.in_h, pooling.in_w, x.data_ptr(), g.data_ptr(),
                                                         indices.data<int32_t>(), w_ptr, b_ptr, mean.data_ptr(),
                                                         invstd.data_ptr(), dx_ptr, dw_ptr, db_ptr);
      } else if (x.is_cuda()) {
        const cuda::DeviceScope scope(x.device().index, "batch_norm backward");
        const cuda::Stream stream = scope.stream;
        auto workspace = allocate_cuda(kernels::batch_norm_workspace_bytes(args), x.device().index, stream);
        if (pool) {
          kernels::batch_norm_relu_max_pool2d_backward_cuda(args, pooling.in_h, pooling.in_w, x.data_ptr(),
                                                            g.data_ptr(), indices.data<int32_t>(), w_ptr, b_ptr,
                                                            mean.data_ptr(), invstd.data_ptr(), dx_ptr, dw_ptr, db_ptr,
                                                            workspace.get(), stream);
        } else {
          kernels::batch_norm_backward_cuda(args, x.data_ptr(), g.data_ptr(), w_ptr, b_ptr, mean.data_ptr(),
                                            invstd.data_ptr(), dx_ptr, dw_ptr, db_ptr, workspace.get(), stream);
        }
      } else {
        if (pool) {
          Tensor full = empty_in_layout(x.dtype());
          kernels::max_pool2d_backward_cpu(args.dtype, pooling, g.data_ptr(), indices.data<int32_t>(),
                                           full.data_ptr());
          g = full;
        }
        kernels::batch_norm_backward_cpu(args, x.data_ptr(), g.data_ptr(), w_ptr, b_ptr, mean.data_ptr(),
                                         invstd.data_ptr(), dx_ptr, dw_ptr, db_ptr);
      }
      if (dw.defined() && dw.dtype() != weight_dtype) dw = dw.to(weight_dtype);
      if (db.defined() && db.dtype() != bias_dtype) db = db.to(bias_dtype);
      return {dx, dw, db};
    });
  }
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl("batch_norm", x, running_mean, running_var, weight, bias, training, momentum, eps, false,
                         false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl("batch_norm_relu", x, running_mean, running_var, weight, bias, training, momentum, eps,
                         true, false);
}

Tensor batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                                  double eps) {
  return batch_norm_impl("batch_norm_relu_max_pool2d", x, running_mean, running_var, weight, bias, training,
                         momentum, eps, true, true);
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  const char* op = "layer_norm";
  KILN_CHECK(x_in.defined(), op, ": input is undefined");
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x_in, &weight, &bias})) {
    return layer_norm(to(x_in), normalized_shape, to(weight), to(bias), eps);
  }
  KILN_CHECK(is_floating(x_in.dtype()), op, ": expected a floating input, got ", dtype_name(x_in.dtype()));
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(k >= 1 && k <= x_in.dim() &&
                 Shape(x_in.shape().end() - k, x_in.shape().end()) == normalized_shape,
             op, ": normalized_shape ", shape_str(normalized_shape), " must be the trailing dims of the input ",
             shape_str(x_in.shape()));
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    const char* what = t == &weight ? "weight" : "bias";
    KILN_CHECK(t->shape() == normalized_shape, op, ": expected ", what, " of shape ", shape_str(normalized_shape),
               ", got ", shape_str(t->shape()));
    KILN_CHECK(t->dtype() == x_in.dtype() && t->device() == x_in.device(), op, ": ", what, " is ",
               dtype_name(t->dtype()), " on ", t->device(), ", expected ", dtype_name(x_in.dtype()), " on ",
               x_in.device());
  }
  KILN_CHECK(eps > 0, op, ": eps must be positive, got ", eps);
  kernels::LayerNormArgs args;
  args.cols = shape_numel(normalized_shape);
  args.rows = args.cols == 0 ? 0 : x_in.numel() / args.cols;
  args.dtype = x_in.dtype();
  args.eps = eps;

  Tensor x, w, b;
  {
    NoGradGuard no_grad;  // layout copies are not part of the graph
    x = x_in.contiguous();
    w = weight.defined() ? weight.contiguous() : Tensor();
    b = bias.defined() ? bias.contiguous() : Tensor();
  }
  const TensorOptions row_options{.dtype = compute_dtype(x.dtype()), .device = x.device()};
  Tensor mean = empty({args.rows}, row_options), rstd = empty({args.rows}, row_options);
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (x.numel() > 0) {
    if (x.is_cuda()) {
      kernels::layer_norm_forward_cuda(args, x.data_ptr(), w.defined() ? w.data_ptr() : nullptr,
                                       b.defined() ? b.data_ptr() : nullptr, y.data_ptr(), mean.data_ptr(),
                                       rstd.data_ptr(), launch_on(x, "layer_norm").stream);
    } else {
      kernels::layer_norm_forward_cpu(args, x.data_ptr(), w.defined() ? w.data_ptr() : nullptr,
                                      b.defined() ? b.data_ptr() : nullptr, y.data_ptr(), mean.data_ptr(),
                                      rstd.data_ptr());
    }
  }

  if (autograd::any_requires_grad({&x_in, &weight, &bias})) {
    const bool need_dx = x_in.requires_grad();
    const bool need_dw = weight.defined() && weight.requires_grad();
    const bool need_db = bias.defined() && bias.requires_grad();
    autograd::SavedTensor saved_x(x, op), saved_w(need_dx ? w : Tensor(), op);
    autograd::SavedTensor saved_mean(mean, op), saved_rstd(rstd, op);
    autograd::record(op, {x_in, weight, bias}, {y}, [=](const autograd::TensorList& grads) -> autograd::TensorList {
      const Tensor x = saved_x.unpack(), w = saved_w.unpack(), mean = saved_mean.unpack(), rstd = saved_rstd.unpack();
      const Tensor g = grads[0].contiguous();
      const TensorOptions options{.dtype = x.dtype(), .device = x.device()};
      Tensor dx = need_dx ? empty(x.shape(), options) : Tensor();
      Tensor dw = need_dw ? empty(normalized_shape, options) : Tensor();
      Tensor db = need_db ? empty(normalized_shape, options) : Tensor();
      if (x.numel() == 0) {
        for (Tensor* t : {&dw, &db}) {
          if (t->defined()) t->zero_();
        }
      } else if (x.is_cuda()) {
        const cuda::DeviceScope scope(x.device().index, "layer_norm backward");
        const cuda::Stream stream = scope.stream;
        auto workspace = allocate_cuda(kernels::layer_norm_workspace_bytes(args), x.device().index, stream);
        kernels::layer_norm_backward_cuda(args, x.data_ptr(), g.data_ptr(), w.defined() ? w.data_ptr() : nullptr,
                                          mean.data_ptr(), rstd.data_ptr(), need_dx ? dx.data_ptr() : nullptr,
                                          need_dw ? dw.data_ptr() : nullptr, need_db ? db.data_ptr() : nullptr,
                                          workspace.get(), stream);
      } else {
        kernels::layer_norm_backward_cpu(args, x.data_ptr(), g.data_ptr(), w.defined() ? w.data_ptr() : nullptr,
                                         mean.data_ptr(), rstd.data_ptr(), need_dx ? dx.data_ptr() : nullptr,
                                         need_dw ? dw.data_ptr() : nullptr, need_db ? db.data_ptr() : nullptr);
      }
      return {dx, dw, db};
    });
  }
  return y;
}

}  // namespace kiln

namespace kiln {

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  KILN_CHECK(x.defined(), "rms_norm: the input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "rms_norm: expected a floating input, got ", dtype_name(x.dtype()));
  const auto n = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(n >= 1 && n <= x.dim() && Shape(x.shape().end() - n, x.shape().end()) == normalized_shape,
             "rms_norm: normalized_shape ", shape_str(normalized_shape), " is not the end of the input's shape ",
             shape_str(x.shape()));
  if (weight.defined()) {
    KILN_CHECK(weight.shape() == normalized_shape, "rms_norm: weight of shape ", shape_str(weight.shape()),
               ", expected ", shape_str(normalized_shape));
    KILN_CHECK(weight.device() == x.device(), "rms_norm: weight is on ", weight.device(), ", the input on ",
               x.device());
  }
  // torch's eps = None: the machine epsilon of the input's dtype.
  const double machine_eps = x.dtype() == DType::f64   ? 2.220446049250313e-16
                             : x.dtype() == DType::f16 ? 0.0009765625
                             : x.dtype() == DType::bf16 ? 0.0078125
                                                        : 1.1920928955078125e-07;
  const bool half = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  const Tensor xf = half ? cast(x, DType::f32) : x;
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - n; d < x.dim(); ++d) dims.push_back(d);
  Tensor y = mul(xf, rsqrt(add(mean(mul(xf, xf), dims, /*keepdim=*/true), eps.value_or(machine_eps))));
  if (half) y = cast(y, x.dtype());
  return weight.defined() ? mul(y, weight) : y;
}

}  // namespace kiln
