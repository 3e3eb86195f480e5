// EMA and SWA running means over tensor lists (one multi-tensor kernel per dtype).
#include "optim/ema.h"

#include <algorithm>

#include "core/autograd.h"
#include "kernels/optim.h"
#include "optim/detail.h"

namespace kiln::optim {

namespace {
DType average_dtype(DType param_dtype) { return param_dtype == DType::f64 ? DType::f64 : DType::f32; }

std::vector<Tensor> make_averages(const std::vector<Tensor>& params, const char* what) {
  NoGradGuard no_grad;
  std::vector<Tensor> averages;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    KILN_CHECK(p.defined() && is_floating(p.dtype()), what, ": ", detail::param_label(p, static_cast<int64_t>(i)),
               " must be a floating tensor");
    KILN_CHECK(p.is_contiguous(), what, ": ", detail::param_label(p, static_cast<int64_t>(i)), " is not contiguous");
    KILN_CHECK(p.device() == params.front().device(), what, ": tensors on ", params.front().device(), " and ",
               p.device(), "; expected one device");
    averages.push_back(p.detach().to(average_dtype(p.dtype())).clone());
  }
  return averages;
}

void copy_into(const std::vector<Tensor>& sources, const std::vector<Tensor>& targets, const char* what) {
  KILN_CHECK(sources.size() == targets.size(), what, ": ", targets.size(), " tensors given, ", sources.size(),
             " averaged");
  NoGradGuard no_grad;
  for (size_t i = 0; i < sources.size(); ++i) {
    KILN_CHECK(targets[i].shape() == sources[i].shape(), what, ": tensor ", i, " has shape ",
               shape_str(targets[i].shape()), ", the average ", shape_str(sources[i].shape()));
    Tensor target = targets[i];
    target.copy_(sources[i]);
  }
}

StateDict averages_state(const char* kind, const std::vector<Tensor>& averages, int64_t count) {
  StateDict dict;
  dict.meta = {{"averager", kind}, {"count", count}, {"tensors", averages.size()}};
  for (size_t i = 0; i < averages.size(); ++i) dict.tensors["average." + std::to_string(i)] = averages[i];
  return dict;
}

int64_t load_averages(const char* kind, const StateDict& dict, std::vector<Tensor>& averages) {
  NoGradGuard no_grad;
  KILN_CHECK(dict.meta.value("averager", std::string()) == kind, "load_state_dict: the state is not a ", kind, "'s");
  KILN_CHECK(dict.meta.value("tensors", size_t{0}) == averages.size(), "load_state_dict: the state has ",
             dict.meta.value("tensors", size_t{0}), " tensors, this ", kind, " ", averages.size());
  for (size_t i = 0; i < averages.size(); ++i) {
    auto it = dict.tensors.find("average." + std::to_string(i));
    KILN_CHECK(it != dict.tensors.end() && it->second.shape() == averages[i].shape(), "load_state_dict: average.",
               i, " is missing or has another shape");
    averages[i].copy_(it->second);
  }
  return dict.meta.at("count").get<int64_t>();
}
}  // namespace

namespace detail {

void average_update(const std::vector<Tensor>& params, const std::vector<Tensor>& averages,
                    const kernels::AverageConfig& config, const Tensor& skip_flag) {
  if (params.empty()) return;
  const Device device = params.front().device();
  const float* skip = nullptr;
  if (skip_flag.defined()) {
    KILN_CHECK(skip_flag.dtype() == DType::f32 && skip_flag.numel() == 1 && skip_flag.device() == device,
               "average update: skip_flag must be a one-element float32 tensor on ", device);
    skip = skip_flag.data<float>();
  }
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    std::vector<kernels::ListTensor> avg, par;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].dtype() != dtype) continue;
      avg.push_back({averages[i].data_ptr(), averages[i].numel()});
      par.push_back({params[i].data_ptr(), params[i].numel()});
      averages[i].bump_version();
    }
    if (avg.empty()) continue;
    const int64_t count = static_cast<int64_t>(avg.size());
    if (device.is_cpu()) {
      kernels::average_update_cpu(dtype, avg.data(), par.data(), count, config, skip);
    } else {
      kernels::average_update_cuda(dtype, avg.data(), par.data(), count, config, skip, launch_on(device, "average_update").stream);
    }
  }
}

}  // namespace detail

// ---------------------------------------------------------------- EMA
ExponentialMovingAverage::ExponentialMovingAverage(std::vector<Tensor> params, double decay, bool use_num_updates)
    : params_(std::move(params)), decay_(decay), use_num_updates_(use_num_updates) {
  KILN_CHECK(decay >= 0 && decay <= 1, "ExponentialMovingAverage: decay must be in [0, 1], got ", decay);
  averages_ = make_averages(params_, "ExponentialMovingAverage");
}

void ExponentialMovingAverage::update(const Tensor& skip_flag) {
  double decay = decay_;
  if (use_num_updates_) {
    const double n = static_cast<double>(num_updates_ + 1);
    decay = std::min(decay, (1.0 + n) / (10.0 + n));
  }
  kernels::AverageConfig config;
  config.weight = 1.0 - decay;
  detail::average_update(params_, averages_, config, skip_flag);
  ++num_updates_;
}

void ExponentialMovingAverage::copy_to(const std::vector<Tensor>& params) const {
  copy_into(averages_, params, "ExponentialMovingAverage.copy_to");
}

void ExponentialMovingAverage::store() {
  NoGradGuard no_grad;
  stored_.clear();
  for (const Tensor& p : params_) stored_.push_back(p.detach().clone());
}

void ExponentialMovingAverage::restore() {
  KILN_CHECK(!stored_.empty() || params_.empty(), "ExponentialMovingAverage.restore: nothing was stored");
  copy_into(stored_, params_, "ExponentialMovingAverage.restore");
  stored_.clear();
}

StateDict ExponentialMovingAverage::state_dict() const {
  StateDict dict = averages_state("ExponentialMovingAverage", averages_, num_updates_);
  dict.meta["decay"] = decay_;
  return dict;
}

void ExponentialMovingAverage::load_state_dict(const StateDict& dict) {
  num_updates_ = load_averages("ExponentialMovingAverage", dict, averages_);
  decay_ = dict.meta.value("decay", decay_);
}

// ---------------------------------------------------------------- SWA running mean
WeightAverage::WeightAverage(std::vector<Tensor> params) : params_(std::move(params)) {
  averages_ = make_averages(params_, "WeightAverage");
}

void WeightAverage::update() {
  kernels::AverageConfig config;
  config.divide = true;
  config.divisor = static_cast<double>(n_averaged_ + 1);
  detail::average_update(params_, averages_, config, Tensor());
  ++n_averaged_;
}

void WeightAverage::copy_to(const std::vector<Tensor>& params) const {
  copy_into(averages_, params, "WeightAverage.copy_to");
}

StateDict WeightAverage::state_dict() const { return averages_state("WeightAverage", averages_, n_averaged_); }

void WeightAverage::load_state_dict(const StateDict& dict) {
  n_averaged_ = load_averages("WeightAverage", dict, averages_);
}

}  // namespace kiln::optim
