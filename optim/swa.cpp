// AveragedModel and update_bn over nn::Module (the tensor-level running mean
// is the averaging kernel that optim/ema.cpp uses too).
#include "optim/swa.h"

#include "core/autograd.h"
#include "core/ops.h"
#include "kernels/optim.h"
#include "nn/conv.h"
#include "optim/detail.h"

namespace kiln::optim {

AvgFn get_ema_avg_fn(double decay) {
  KILN_CHECK(decay >= 0 && decay <= 1, "get_ema_avg_fn: decay must be in [0, 1], got ", decay);
  return [decay](const Tensor& averaged, const Tensor& current, int64_t) {
    return add(mul(averaged, decay), mul(current, 1.0 - decay));
  };
}

AvgFn get_swa_avg_fn() {
  return [](const Tensor& averaged, const Tensor& current, int64_t num_averaged) {
    return add(averaged, div(sub(current, averaged), static_cast<double>(num_averaged + 1)));
  };
}

namespace {
DType average_dtype(DType dtype) {
  if (!is_floating(dtype)) return dtype;
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}

nn::NamedTensors copy_named(const nn::NamedTensors& source, Device device) {
  NoGradGuard no_grad;
  nn::NamedTensors copies;
  for (const auto& [name, tensor] : source) {
    copies.emplace_back(name, tensor.detach().to(device, average_dtype(tensor.dtype())).clone());
  }
  return copies;
}

void check_same_names(const nn::NamedTensors& averages, const nn::NamedTensors& current, const char* kind) {
  KILN_CHECK(averages.size() == current.size(), "AveragedModel: the model has ", current.size(), " ", kind,
             "s, the average ", averages.size());
  for (size_t i = 0; i < averages.size(); ++i) {
    KILN_CHECK(averages[i].first == current[i].first && averages[i].second.shape() == current[i].second.shape(),
               "AveragedModel: ", kind, " ", i, " is '", current[i].first, "' ", shape_str(current[i].second.shape()),
               " in the model but '", averages[i].first, "' ", shape_str(averages[i].second.shape()),
               " in the average (another architecture?)");
  }
}


// Calls fn on the root and every descendant BatchNorm that tracks running
// statistics (a walk over named_children(), so the root need not be owned by
// a shared_ptr).
void for_each_batch_norm(nn::Module& module, const std::function<void(nn::BatchNorm&)>& fn) {
  if (auto* bn = dynamic_cast<nn::BatchNorm*>(&module); bn != nullptr && bn->running_mean.defined()) fn(*bn);
  for (const auto& [name, child] : module.named_children()) for_each_batch_norm(*child, fn);
}
}  // namespace

// ---------------------------------------------------------------- AveragedModel
AveragedModel::AveragedModel(const nn::Module& model, AveragedModelOptions options)
    : options_(std::move(options)), device_(Device::cpu()) {
  if (options_.ema_decay) {
    KILN_CHECK(*options_.ema_decay >= 0 && *options_.ema_decay <= 1, "AveragedModel: ema_decay must be in [0, 1], got ",
               *options_.ema_decay);
    KILN_CHECK(!options_.avg_fn, "AveragedModel: give either avg_fn or ema_decay, not both");
  }
  const nn::NamedTensors params = model.named_parameters();
  const nn::NamedTensors buffers = model.named_buffers();
  if (!params.empty()) device_ = params.front().second.device();
  if (options_.device) device_ = *options_.device;
  parameters_ = copy_named(params, device_);
  buffers_ = copy_named(buffers, device_);
}

void AveragedModel::average(const nn::NamedTensors& averages, const nn::NamedTensors& current, const char* kind) {
  NoGradGuard no_grad;
  std::vector<Tensor> fused_averages, fused_params;
  for (size_t i = 0; i < averages.size(); ++i) {
    Tensor average = averages[i].second;
    const Tensor& value = current[i].second;
    if (n_averaged_ == 0 || !is_floating(value.dtype())) {
      average.copy_(value.detach());  // the first model, and counters, are copied
    } else if (options_.avg_fn) {
      Tensor next = options_.avg_fn(average, value.detach().to(device_, average.dtype()), n_averaged_);
      KILN_CHECK(next.defined() && next.shape() == average.shape(), "AveragedModel: avg_fn returned shape ",
                 next.defined() ? shape_str(next.shape()) : std::string("(undefined)"), " for ", kind, " '",
                 averages[i].first, "' of shape ", shape_str(average.shape()));
      average.copy_(next);
    } else {
      fused_averages.push_back(average);
      fused_params.push_back(value.detach().to(device_).contiguous());
    }
  }
  // One kernel per param dtype for all tensors: the running mean
  // avg += (param - avg) / (n + 1), or the EMA avg = lerp(avg, param, 1 - decay).
  kernels::AverageConfig config;
  if (options_.ema_decay) {
    config.weight = 1.0 - *options_.ema_decay;
  } else {
    config.divide = true;
    config.divisor = static_cast<double>(n_averaged_ + 1);
  }
  detail::average_update(fused_params, fused_averages, config);
}

void AveragedModel::update_parameters(const nn::Module& model) {
  const nn::NamedTensors params = model.named_parameters();
  const nn::NamedTensors buffers = model.named_buffers();
  check_same_names(parameters_, params, "parameter");
  check_same_names(buffers_, buffers, "buffer");
  average(parameters_, params, "parameter");
  if (options_.use_buffers) {
    average(buffers_, buffers, "buffer");
  } else {
    NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].second.copy_(buffers[i].second.detach());
  }
  ++n_averaged_;
}

void AveragedModel::copy_to(nn::Module& model) const {
  const nn::NamedTensors params = model.named_parameters();
  const nn::NamedTensors buffers = model.named_buffers();
  check_same_names(parameters_, params, "parameter");
  check_same_names(buffers_, buffers, "buffer");
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor target = params[i].second;
    target.copy_(parameters_[i].second);
  }
  if (!options_.use_buffers) return;
  for (size_t i = 0; i < buffers.size(); ++i) {
    Tensor target = buffers[i].second;
    target.copy_(buffers_[i].second);
  }
}

StateDict AveragedModel::state_dict() const {
  StateDict state;
  state.meta = {{"averager", "AveragedModel"}, {"n_averaged", n_averaged_}};
  for (const auto& [name, tensor] : parameters_) state.tensors["param." + name] = tensor;
  for (const auto& [name, tensor] : buffers_) state.tensors["buffer." + name] = tensor;
  return state;
}

void AveragedModel::load_state_dict(const StateDict& state) {
  KILN_CHECK(state.meta.value("averager", std::string()) == "AveragedModel",
             "AveragedModel::load_state_dict: the state is not an AveragedModel's");
  KILN_CHECK(state.tensors.size() == parameters_.size() + buffers_.size(), "AveragedModel::load_state_dict: ",
             state.tensors.size(), " tensors in the state, ", parameters_.size() + buffers_.size(), " averaged");
  std::vector<std::pair<Tensor, Tensor>> copies;  // (target, source), checked before anything is written
  for (const auto& [prefix, named] : {std::pair{"param.", &parameters_}, std::pair{"buffer.", &buffers_}}) {
    for (const auto& [name, tensor] : *named) {
      auto it = state.tensors.find(prefix + name);
      KILN_CHECK(it != state.tensors.end() && it->second.shape() == tensor.shape(),
                 "AveragedModel::load_state_dict: '", prefix, name, "' is missing or has another shape");
      copies.emplace_back(tensor, it->second);
    }
  }
  NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
  n_averaged_ = state.meta.at("n_averaged").get<int64_t>();
}

// ---------------------------------------------------------------- update_bn
bool contains_batch_norm(nn::Module& model) {
  bool found = false;
  for_each_batch_norm(model, [&](nn::BatchNorm&) { found = true; });
  return found;
}

void update_bn(const std::function<Tensor()>& next_input, nn::Module& model, std::optional<Device> device) {
  std::vector<std::pair<nn::BatchNorm*, std::optional<double>>> momenta;
  for_each_batch_norm(model, [&](nn::BatchNorm& bn) { momenta.emplace_back(&bn, bn.momentum); });
  if (momenta.empty()) return;
  std::optional<DType> float_dtype;
  for (const auto& [name, tensor] : model.named_parameters()) {
    if (!device) device = tensor.device();
    if (!float_dtype && is_floating(tensor.dtype())) float_dtype = tensor.dtype();
  }
  NoGradGuard no_grad;
  for (auto& [bn, momentum] : momenta) {  // reset_running_stats, then the cumulative average
    bn->running_mean.zero_();
    bn->running_var.fill_(1.0);
    bn->num_batches_tracked.zero_();
    bn->momentum = std::nullopt;
  }
  const bool was_training = model.is_training();
  // Restores momenta and mode however the pass ends.
  struct Restore {
    decltype(momenta)& saved;
    nn::Module& model;
    bool training;
    ~Restore() {
      for (auto& [bn, momentum] : saved) bn->momentum = momentum;
      model.train(training);
    }
  } restore{momenta, model, was_training};
  model.train();
  for (Tensor input = next_input(); input.defined(); input = next_input()) {
    const DType dtype = float_dtype && is_floating(input.dtype()) ? *float_dtype : input.dtype();
    model.forward(input.to(device.value_or(input.device()), dtype));
  }
}

}  // namespace kiln::optim
