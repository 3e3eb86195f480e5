// Gradient clipping and the helpers shared by optim/ (optim/detail.h).
#include "optim/clip_grad.h"

#include <cmath>
#include <optional>

#include "core/autograd.h"
#include "optim/detail.h"

namespace kiln::optim {

namespace detail {

std::string param_label(const Tensor& param, int64_t index) {
  std::string label = "parameter " + std::to_string(index);
  if (param.defined() && !param.name().empty()) label += " ('" + param.name() + "')";
  return label;
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    KILN_CHECK(params[i].defined(), op, ": ", param_label(params[i], static_cast<int64_t>(i)), " is undefined");
    Tensor grad = params[i].grad();
    if (!grad.defined()) continue;
    KILN_CHECK(is_floating(grad.dtype()), op, ": the gradient of ", param_label(params[i], static_cast<int64_t>(i)),
               " has dtype ", dtype_name(grad.dtype()), " (expected a floating dtype)");
    KILN_CHECK(grads.empty() || grad.device() == grads.front().device(), op, ": gradients on ",
               grads.front().device(), " and ", grad.device(), " (", param_label(params[i], static_cast<int64_t>(i)),
               "); expected all on one device");
    if (!grad.is_contiguous()) {
      NoGradGuard no_grad;
      grad = grad.contiguous();
      params[i].set_grad(grad);
    }
    grads.push_back(grad);
  }
  return grads;
}

std::vector<DTypeList> lists_by_dtype(const std::vector<Tensor>& tensors) {
  std::vector<DTypeList> lists;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    DTypeList list{dtype, {}};
    for (const Tensor& t : tensors) {
      if (t.dtype() == dtype) list.tensors.push_back({t.data_ptr(), t.numel()});
    }
    if (!list.tensors.empty()) lists.push_back(std::move(list));
  }
  return lists;
}

void check_norm_type(double norm_type, const char* op) {
  KILN_CHECK(norm_type > 0 && !std::isnan(norm_type), op, ": norm_type must be positive or infinity, got ",
             norm_type);
}

void grad_norm_into(const std::vector<Tensor>& grads, Device device, double norm_type, double max_norm,
                    const Tensor& total_norm, const Tensor& clip_coef) {
  int64_t chunks = 0;
  for (const Tensor& g : grads) chunks += kernels::optim_chunks(g.numel());
  Tensor partials = empty({std::max<int64_t>(chunks, 1)}, {.dtype = DType::f64, .device = device});
  double* base = partials.data<double>();
  float* total = total_norm.data<float>();
  float* coef = clip_coef.defined() ? clip_coef.data<float>() : nullptr;
  std::optional<cuda::DeviceScope> scope;
  if (device.is_cuda()) scope.emplace(device.index, "grad_norm");
  int64_t offset = 0;
  for (const DTypeList& list : lists_by_dtype(grads)) {
    const int64_t count = static_cast<int64_t>(list.tensors.size());
    if (device.is_cpu()) {
      kernels::grad_norm_partials_cpu(list.dtype, list.tensors.data(), count, norm_type, base + offset);
    } else {
      kernels::grad_norm_partials_cuda(list.dtype, list.tensors.data(), count, norm_type, base + offset, scope->stream);
    }
    for (const auto& t : list.tensors) offset += kernels::optim_chunks(t.numel);
  }
  if (device.is_cpu()) {
    kernels::grad_norm_finish_cpu(base, chunks, norm_type, max_norm, total, coef);
  } else {
    kernels::grad_norm_finish_cuda(base, chunks, norm_type, max_norm, total, coef, scope->stream);
  }
}

}  // namespace detail

ClipGradNormResult grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  detail::check_norm_type(norm_type, "grad_norm");
  KILN_CHECK(max_norm >= 0, "grad_norm: max_norm must be >= 0, got ", max_norm);
  const std::vector<Tensor> grads = detail::grads_of(params, "grad_norm");
  if (grads.empty()) {
    return {zeros({}), full({}, max_norm / 1e-6 < 1.0 ? max_norm / 1e-6 : 1.0)};
  }
  const Device device = grads.front().device();
  ClipGradNormResult result{empty({}, {.device = device}), empty({}, {.device = device})};
  detail::grad_norm_into(grads, device, norm_type, max_norm, result.total_norm, result.clip_coef);
  return result;
}

ClipGradNormResult clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                                   bool error_if_nonfinite) {
  detail::check_norm_type(norm_type, "clip_grad_norm_");
  KILN_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  const std::vector<Tensor> grads = detail::grads_of(params, "clip_grad_norm_");
  if (grads.empty()) {
    return {zeros({}), full({}, max_norm / 1e-6 < 1.0 ? max_norm / 1e-6 : 1.0)};
  }
  const Device device = grads.front().device();
  ClipGradNormResult result{empty({}, {.device = device}), empty({}, {.device = device})};
  detail::grad_norm_into(grads, device, norm_type, max_norm, result.total_norm, result.clip_coef);
  if (error_if_nonfinite) {
    const float total = result.total_norm.item<float>();  // synchronizes
    KILN_CHECK(std::isfinite(total), "clip_grad_norm_: the total norm of order ", norm_type,
               " of the gradients is non-finite (", total,
               "), so it cannot be clipped; pass error_if_nonfinite = false to scale the gradients by it anyway");
  }
  const float* coef = result.clip_coef.data<float>();
  for (const detail::DTypeList& list : detail::lists_by_dtype(grads)) {
    const int64_t count = static_cast<int64_t>(list.tensors.size());
    if (device.is_cpu()) {
      kernels::grad_scale_cpu(list.dtype, list.tensors.data(), count, coef);
    } else {
      kernels::grad_scale_cuda(list.dtype, list.tensors.data(), count, coef, launch_on(device, "clipping").stream);
    }
  }
  for (const Tensor& g : grads) g.bump_version();
  return result;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  KILN_CHECK(clip_value >= 0, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  const std::vector<Tensor> grads = detail::grads_of(params, "clip_grad_value_");
  if (grads.empty()) return;
  const Device device = grads.front().device();
  for (const detail::DTypeList& list : detail::lists_by_dtype(grads)) {
    const int64_t count = static_cast<int64_t>(list.tensors.size());
    if (device.is_cpu()) {
      kernels::grad_clamp_cpu(list.dtype, list.tensors.data(), count, clip_value);
    } else {
      kernels::grad_clamp_cuda(list.dtype, list.tensors.data(), count, clip_value, launch_on(device, "clipping").stream);
    }
  }
  for (const Tensor& g : grads) g.bump_version();
}

void clip_gradients(Optimizer& optimizer, double clip_val, const std::string& algorithm) {
  KILN_CHECK(algorithm == "norm" || algorithm == "value",
             "clip_gradients: gradient_clip_algorithm must be \"norm\" or \"value\", got '", algorithm, "'");
  if (clip_val == 0) return;
  if (algorithm == "norm") {
    optimizer.clip_grad_norm_(clip_val);
  } else {
    clip_grad_value_(optimizer.params_with_grad(), clip_val);
  }
}

}  // namespace kiln::optim
