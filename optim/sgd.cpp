// SGD with momentum, dampening, Nesterov momentum and weight decay (torch.optim.SGD).
#include "kernels/optim.h"
#include "optim/optimizer.h"

namespace kiln::optim {

namespace {
std::vector<ParamGroup> single_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

GroupOptions sgd_defaults(const SGDOptions& o) {
  KILN_CHECK(o.dampening >= 0 && o.dampening <= 1, "SGD: invalid dampening ", o.dampening, " (expected in [0, 1])");
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
             "SGD: Nesterov momentum requires a momentum > 0 and zero dampening, got momentum ", o.momentum,
             " and dampening ", o.dampening);
  return {.lr = o.lr, .weight_decay = o.weight_decay, .momentum = o.momentum, .beta2 = 0};
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options) : SGD(single_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : Optimizer(std::move(groups), sgd_defaults(options), "SGD"), options_(options) {
  for (int64_t g = 0; g < num_groups(); ++g) {
    has_buffer_.push_back(group_options(g).momentum != 0);
    KILN_CHECK(!options_.nesterov || group_options(g).momentum > 0, "SGD: Nesterov momentum requires a momentum > 0",
               " (group ", g, " has ", group_options(g).momentum, ")");
  }
}

std::vector<std::string> SGD::buffer_names(int64_t group) const {
  // Fixed at construction: a group configured without momentum keeps no buffer.
  if (!has_buffer_.at(static_cast<size_t>(group))) return {};
  return {"momentum_buffer"};
}

void SGD::update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
                 const kernels::OptimScalars& scalars) {
  kernels::SgdConfig config;
  config.dampening = options_.dampening;
  config.weight_decay = group_options(group).weight_decay;
  config.nesterov = options_.nesterov;
  config.maximize = options_.maximize;
  config.has_momentum = has_buffer_[static_cast<size_t>(group)];
  const int64_t count = static_cast<int64_t>(tensors.size());
  if (device().is_cpu()) {
    kernels::sgd_step_cpu(dtype, tensors.data(), count, scalars, config);
  } else {
    kernels::sgd_step_cuda(dtype, tensors.data(), count, scalars, config, launch().stream);
  }
}

nlohmann::json SGD::options_json() const {
  return {{"lr", options_.lr},
          {"momentum", options_.momentum},
          {"dampening", options_.dampening},
          {"weight_decay", options_.weight_decay},
          {"nesterov", options_.nesterov},
          {"maximize", options_.maximize}};
}

}  // namespace kiln::optim
