// LAMB and LARS: layer-wise adaptive optimizers. Each needs per-tensor norms,
// so its kernel runs in two stages over a scratch buffer of per-chunk partials.
#include "kernels/optim.h"
#include "optim/optimizer.h"

namespace kiln::optim {

namespace {
std::vector<ParamGroup> single_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

int64_t total_chunks(const std::vector<kernels::OptimTensor>& tensors) {
  int64_t chunks = 0;
  for (const auto& t : tensors) chunks += kernels::optim_chunks(t.numel);
  return chunks;
}

GroupOptions lamb_defaults(const LAMBOptions& o) {
  KILN_CHECK(o.eps >= 0, "LAMB: invalid eps ", o.eps, " (expected >= 0)");
  return {.lr = o.lr, .weight_decay = o.weight_decay, .momentum = o.beta1, .beta2 = o.beta2};
}

GroupOptions lars_defaults(const LARSOptions& o) {
  KILN_CHECK(o.eps >= 0, "LARS: invalid eps ", o.eps, " (expected >= 0)");
  KILN_CHECK(o.trust_coefficient > 0, "LARS: invalid trust_coefficient ", o.trust_coefficient, " (expected > 0)");
  return {.lr = o.lr, .weight_decay = o.weight_decay, .momentum = o.momentum, .beta2 = 0};
}
}  // namespace

// ---------------------------------------------------------------- LAMB
LAMB::LAMB(std::vector<Tensor> params, const LAMBOptions& options) : LAMB(single_group(std::move(params)), options) {}

LAMB::LAMB(std::vector<ParamGroup> groups, const LAMBOptions& options)
    : Optimizer(std::move(groups), lamb_defaults(options), "LAMB"), options_(options) {
  for (int64_t g = 0; g < num_groups(); ++g) {
    KILN_CHECK(group_options(g).momentum < 1, "LAMB: invalid beta1 ", group_options(g).momentum, " in group ", g,
               " (expected in [0, 1))");
  }
}

std::vector<std::string> LAMB::buffer_names(int64_t) const { return {"exp_avg", "exp_avg_sq"}; }

void LAMB::update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
                  const kernels::OptimScalars& scalars) {
  kernels::LambConfig config;
  config.beta2 = group_options(group).beta2;
  config.eps = options_.eps;
  config.weight_decay = group_options(group).weight_decay;
  config.bias_correction = options_.bias_correction;
  const int64_t count = static_cast<int64_t>(tensors.size());
  Tensor partials = scratch(2 * total_chunks(tensors));
  if (device().is_cpu()) {
    kernels::lamb_step_cpu(dtype, tensors.data(), count, scalars, config, partials.data<double>());
  } else {
    kernels::lamb_step_cuda(dtype, tensors.data(), count, scalars, config, partials.data<double>(), launch().stream);
  }
}

nlohmann::json LAMB::options_json() const {
  return {{"lr", options_.lr},
          {"betas", {options_.beta1, options_.beta2}},
          {"eps", options_.eps},
          {"weight_decay", options_.weight_decay},
          {"bias_correction", options_.bias_correction}};
}

// ---------------------------------------------------------------- LARS
LARS::LARS(std::vector<Tensor> params, const LARSOptions& options) : LARS(single_group(std::move(params)), options) {}

LARS::LARS(std::vector<ParamGroup> groups, const LARSOptions& options)
    : Optimizer(std::move(groups), lars_defaults(options), "LARS"), options_(options) {
  for (int64_t g = 0; g < num_groups(); ++g) has_buffer_.push_back(group_options(g).momentum != 0);
}

std::vector<std::string> LARS::buffer_names(int64_t group) const {
  if (!has_buffer_.at(static_cast<size_t>(group))) return {};
  return {"momentum_buffer"};
}

void LARS::update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
                  const kernels::OptimScalars& scalars) {
  kernels::LarsConfig config;
  config.weight_decay = group_options(group).weight_decay;
  config.trust_coefficient = options_.trust_coefficient;
  config.eps = options_.eps;
  config.has_momentum = has_buffer_[static_cast<size_t>(group)];
  const int64_t count = static_cast<int64_t>(tensors.size());
  Tensor partials = scratch(2 * total_chunks(tensors));
  if (device().is_cpu()) {
    kernels::lars_step_cpu(dtype, tensors.data(), count, scalars, config, partials.data<double>());
  } else {
    kernels::lars_step_cuda(dtype, tensors.data(), count, scalars, config, partials.data<double>(), launch().stream);
  }
}

nlohmann::json LARS::options_json() const {
  return {{"lr", options_.lr},
          {"momentum", options_.momentum},
          {"weight_decay", options_.weight_decay},
          {"trust_coefficient", options_.trust_coefficient},
          {"eps", options_.eps}};
}

}  // namespace kiln::optim
