// GradScaler: loss scaling with the scale, the growth tracker and the
// found-inf flags on the device (see grad_scaler.h for the semantics).
#include "optim/grad_scaler.h"

#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/saved_json.h"
#include "kernels/optim.h"
#include "optim/detail.h"

namespace kiln::optim {

namespace {
// The constructor's rules, for loaded options as well.
void check_options(const GradScalerOptions& options, const char* who) {
  KILN_CHECK(options.init_scale > 0, who, ": init_scale must be positive, got ", options.init_scale);
  KILN_CHECK(options.growth_factor > 1.0, who, ": growth_factor must be > 1, got ", options.growth_factor);
  KILN_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1.0, who,
             ": backoff_factor must be in (0, 1), got ", options.backoff_factor);
  // The growth tracker that counts up to it is an int32 (as torch's).
  KILN_CHECK(options.growth_interval > 0 && options.growth_interval <= INT32_MAX, who,
             ": growth_interval must be in [1, 2^31 - 1], got ", options.growth_interval);
}
}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options) : options_(options) { check_options(options, "GradScaler"); }

void GradScaler::lazy_init(Device device) {
  if (scale_.defined()) {
    KILN_CHECK(scale_.device() == device, "GradScaler: the scale lives on ", scale_.device(), " but was used with ",
               device, " (one scaler per device)");
    return;
  }
  NoGradGuard no_grad;
  const Tensor loaded_scale = scale_loaded_, loaded_tracker = tracker_loaded_;
  scale_ = full({}, options_.init_scale, {.dtype = DType::f32, .device = device});
  growth_tracker_ = zeros({}, {.dtype = DType::i32, .device = device});
  if (loaded_scale.defined()) scale_.copy_(loaded_scale);
  if (loaded_tracker.defined()) growth_tracker_.copy_(loaded_tracker);
  scale_loaded_ = Tensor();
  tracker_loaded_ = Tensor();
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  KILN_CHECK(loss.defined() && is_floating(loss.dtype()), "GradScaler.scale: expected a floating loss tensor");
  lazy_init(loss.device());
  return mul(loss, loss.dtype() == DType::f32 ? scale_ : scale_.to(loss.dtype()));
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled) return;
  Stage& stage = stages_[&optimizer];
  KILN_CHECK(stage != Stage::unscaled,
             "GradScaler.unscale_: unscale_() has already been called on this optimizer since the last update()");
  KILN_CHECK(stage != Stage::stepped, "GradScaler.unscale_: unscale_() is being called after step()");
  KILN_CHECK(stages_.size() <= static_cast<size_t>(kernels::kGradScalerMaxFoundInf), "GradScaler: more than ",
             kernels::kGradScalerMaxFoundInf, " optimizers between updates");
  lazy_init(optimizer.device());
  NoGradGuard no_grad;
  Tensor found_inf = optimizer.step_state().found_inf;
  found_inf.fill_(0.0);
  std::vector<Tensor> grads;
  for (const Tensor& p : optimizer.params_with_grad()) grads.push_back(p.grad());
  const float* scale = scale_.data<float>();
  float* found = found_inf.data<float>();
  for (const detail::DTypeList& list : detail::lists_by_dtype(grads)) {
    const int64_t count = static_cast<int64_t>(list.tensors.size());
    if (optimizer.device().is_cpu()) {
      kernels::grad_scaler_unscale_cpu(list.dtype, list.tensors.data(), count, scale, found);
    } else {
      kernels::grad_scaler_unscale_cuda(list.dtype, list.tensors.data(), count, scale, found,
                                        launch_on(optimizer.device(), "GradScaler.unscale_").stream);
    }
  }
  for (const Tensor& g : grads) g.bump_version();
  found_inf.bump_version();
  optimizer.arm_found_inf();
  stage = Stage::unscaled;
}

void GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return;
  }
  KILN_CHECK(stages_[&optimizer] != Stage::stepped,
             "GradScaler.step: step() has already been called since the last update()");
  if (stages_[&optimizer] == Stage::ready) unscale_(optimizer);
  optimizer.arm_found_inf();
  optimizer.step();
  stages_[&optimizer] = Stage::stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  std::vector<const float*> found_infs;
  for (const auto& [optimizer, stage] : stages_) {
    if (stage != Stage::ready) found_infs.push_back(optimizer->step_state().found_inf.data<float>());
  }
  KILN_CHECK(!found_infs.empty() && scale_.defined(),
             "GradScaler.update: no inf checks were recorded prior to update() (call step() or unscale_() first)");
  const int count = static_cast<int>(found_infs.size());
  if (scale_.is_cpu()) {
    kernels::grad_scaler_update_cpu(scale_.data<float>(), growth_tracker_.data<int32_t>(), found_infs.data(), count,
                                    options_.growth_factor, options_.backoff_factor, options_.growth_interval);
  } else {
    kernels::grad_scaler_update_cuda(scale_.data<float>(), growth_tracker_.data<int32_t>(), found_infs.data(), count,
                                     options_.growth_factor, options_.backoff_factor, options_.growth_interval,
                                     launch_on(scale_.device(), "GradScaler.update").stream);
  }
  scale_.bump_version();
  growth_tracker_.bump_version();
  stages_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  KILN_CHECK(scale_.defined(), "GradScaler.update: the scaler has not been used yet");
  KILN_CHECK(new_scale > 0, "GradScaler.update: new_scale must be positive, got ", new_scale);
  NoGradGuard no_grad;
  scale_.fill_(new_scale);
  stages_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  if (scale_.defined()) return scale_.item<double>();
  return scale_loaded_.defined() ? scale_loaded_.item<double>() : options_.init_scale;
}

StateDict GradScaler::state_dict() const {
  StateDict dict;
  dict.meta = {{"scaler", "GradScaler"},
               {"init_scale", options_.init_scale},
               {"growth_factor", options_.growth_factor},
               {"backoff_factor", options_.backoff_factor},
               {"growth_interval", options_.growth_interval},
               {"enabled", options_.enabled}};
  // torch's key names ("_growth_tracker" included).
  if (scale_.defined()) {
    dict.tensors["scale"] = scale_;
    dict.tensors["_growth_tracker"] = growth_tracker_;
  } else if (scale_loaded_.defined()) {  // loaded, not used yet: saved as loaded (torch keeps them as _init_scale)
    dict.tensors["scale"] = scale_loaded_;
    dict.tensors["_growth_tracker"] = tracker_loaded_;
  }
  return dict;
}

void GradScaler::load_state_dict(const StateDict& dict) {
  // As torch: a disabled scaler ignores the state, and an enabled one refuses a disabled one's (loading it
  // would silently turn loss scaling off); `enabled` itself is never loaded.
  if (!options_.enabled) return;
  NoGradGuard no_grad;
  // Everything is checked before anything changes.
  const nlohmann::json& meta = dict.meta;
  KILN_CHECK(meta.is_object() && meta.contains("scaler") && meta.at("scaler") == "GradScaler",
             "GradScaler.load_state_dict: the state is not a GradScaler's");
  KILN_CHECK(!meta.contains("enabled") || meta.at("enabled").is_boolean(),
             "GradScaler.load_state_dict: enabled is ", meta.at("enabled").dump(), " (expected true or false)");
  KILN_CHECK(meta.value("enabled", true),
             "GradScaler.load_state_dict: the source state was saved from a disabled instance of GradScaler");
  GradScalerOptions options = options_;
  constexpr std::string_view where = "GradScaler.load_state_dict";
  options.init_scale = saved_json::finite_number_at(meta, "init_scale", where);
  options.growth_factor = saved_json::finite_number_at(meta, "growth_factor", where);
  options.backoff_factor = saved_json::finite_number_at(meta, "backoff_factor", where);
  options.growth_interval = saved_json::integer_at(meta, "growth_interval", where);
  check_options(options, "GradScaler.load_state_dict");
  auto scale = dict.tensors.find("scale");
  auto tracker = dict.tensors.find("_growth_tracker");
  if (tracker == dict.tensors.end()) tracker = dict.tensors.find("growth_tracker");  // kiln's older name
  KILN_CHECK((scale == dict.tensors.end()) == (tracker == dict.tensors.end()),
             "GradScaler.load_state_dict: expected both scale and _growth_tracker, or neither");
  if (scale == dict.tensors.end()) {
    options_ = options;
    return;
  }
  KILN_CHECK(scale->second.numel() == 1 && tracker->second.numel() == 1,
             "GradScaler.load_state_dict: scale and _growth_tracker must have one element");
  // The tracker counts steps (a float's NaN would convert with undefined behaviour) up to growth_interval.
  KILN_CHECK(!is_floating(tracker->second.dtype()), "GradScaler.load_state_dict: _growth_tracker has dtype ",
             dtype_name(tracker->second.dtype()), " (expected an integer)");
  const double saved_scale = scale->second.to(DType::f64).item<double>();
  const int64_t saved_tracker = tracker->second.to(DType::i64).item<int64_t>();
  KILN_CHECK(std::isfinite(saved_scale) && saved_scale > 0, "GradScaler.load_state_dict: scale is ", saved_scale,
             " (expected a positive finite number)");
  KILN_CHECK(saved_tracker >= 0 && saved_tracker < options.growth_interval, "GradScaler.load_state_dict: ",
             "_growth_tracker is ", saved_tracker, " (expected in [0, growth_interval = ", options.growth_interval,
             "))");
  options_ = options;
  if (scale_.defined()) {
    scale_.copy_(scale->second.reshape({}));
    growth_tracker_.copy_(tracker->second.reshape({}));
  } else {
    // Kept until the scaler learns its device.
    scale_loaded_ = scale->second.reshape({}).to(DType::f32).clone();
    tracker_loaded_ = tracker->second.reshape({}).to(DType::i32).clone();
  }
  stages_.clear();
}

}  // namespace kiln::optim
