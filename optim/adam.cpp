// Adam and AdamW (torch.optim.Adam / AdamW), with amsgrad and maximize.
#include "kernels/optim.h"
#include "optim/optimizer.h"

namespace kiln::optim {

namespace {
std::vector<ParamGroup> single_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

GroupOptions adam_defaults(const AdamOptions& o, const char* kind) {
  KILN_CHECK(o.eps >= 0, kind, ": invalid eps ", o.eps, " (expected >= 0)");
  return {.lr = o.lr, .weight_decay = o.weight_decay, .momentum = o.beta1, .beta2 = o.beta2};
}
}  // namespace

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options) : Adam(single_group(std::move(params)), options) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options) : Adam(std::move(groups), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled)
    : Optimizer(std::move(groups), adam_defaults(options, decoupled ? "AdamW" : "Adam"), decoupled ? "AdamW" : "Adam"),
      options_(options),
      decoupled_(decoupled) {
  for (int64_t g = 0; g < num_groups(); ++g) {
    KILN_CHECK(group_options(g).momentum < 1, name(), ": invalid beta1 ", group_options(g).momentum, " in group ", g,
               " (expected in [0, 1))");
  }
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(single_group(std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options) : Adam(std::move(groups), options, true) {}

std::vector<std::string> Adam::buffer_names(int64_t) const {
  if (options_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

void Adam::update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
                  const kernels::OptimScalars& scalars) {
  kernels::AdamConfig config;
  config.beta2 = group_options(group).beta2;
  config.eps = options_.eps;
  config.weight_decay = group_options(group).weight_decay;
  config.decoupled_weight_decay = decoupled_;
  config.amsgrad = options_.amsgrad;
  config.maximize = options_.maximize;
  const int64_t count = static_cast<int64_t>(tensors.size());
  if (device().is_cpu()) {
    kernels::adam_step_cpu(dtype, tensors.data(), count, scalars, config);
  } else {
    kernels::adam_step_cuda(dtype, tensors.data(), count, scalars, config, launch().stream);
  }
}

nlohmann::json Adam::options_json() const {
  return {{"lr", options_.lr},         {"betas", {options_.beta1, options_.beta2}},
          {"eps", options_.eps},       {"weight_decay", options_.weight_decay},
          {"amsgrad", options_.amsgrad}, {"maximize", options_.maximize}};
}

}  // namespace kiln::optim
