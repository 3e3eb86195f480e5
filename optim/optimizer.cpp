// The optimizer base: parameter groups, lazily created per-parameter state,
// the step driver (prologue + one update launch per group and dtype), state
// dictionaries. The update kernels are in kernels/{cpu,cuda}/optim.*.
#include "optim/optimizer.h"

#include <charconv>
#include <set>

#include "core/autograd.h"
#include "core/saved_json.h"
#include "kernels/cuda/graph.h"
#include "optim/detail.h"

namespace kiln::optim {

namespace {
constexpr DType kDTypeOrder[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

bool is_16bit(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// Optimizer state is kept in float, or double for double params.
DType state_dtype(DType param_dtype) { return param_dtype == DType::f64 ? DType::f64 : DType::f32; }

Tensor saved_tensor(const StateDict& dict, const std::string& name) {
  auto it = dict.tensors.find(name);
  return it == dict.tensors.end() ? Tensor() : it->second;
}

// A saved tensor fits the state tensor it is copied into: present, same
// shape, and a step count passes detail::saved_step_count.
void check_saved(const Tensor& source, const Shape& shape, bool step_count, const std::string& what) {
  KILN_CHECK(source.defined(), "load_state_dict: ", what, " is missing");
  KILN_CHECK(source.shape() == shape, "load_state_dict: ", what, " has shape ", shape_str(source.shape()),
             ", expected ", shape_str(shape));
  if (step_count) detail::saved_step_count(source, what);
}

// A saved state's key: a parameter index in decimal, as state_dict writes it.
int64_t parameter_index(const std::string& key, int64_t num_params) {
  int64_t index = -1;
  const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), index);
  KILN_CHECK(error == std::errc() && end == key.data() + key.size() && std::to_string(index) == key &&
                 index >= 0 && index < num_params,
             "load_state_dict: state for parameter '", key, "' (expected an index in [0, ", num_params, "))");
  return index;
}

// The constructor's rules for hyperparameters, also applied to loaded ones.
void check_group_options(const GroupOptions& o, const std::string& kind, size_t g) {
  KILN_CHECK(o.lr >= 0, kind, ": invalid learning rate ", o.lr, " in group ", g, " (expected >= 0)");
  KILN_CHECK(o.weight_decay >= 0, kind, ": invalid weight_decay ", o.weight_decay, " in group ", g,
             " (expected >= 0)");
  KILN_CHECK(o.momentum >= 0, kind, ": invalid momentum/beta1 ", o.momentum, " in group ", g, " (expected >= 0)");
  KILN_CHECK(o.beta2 >= 0 && o.beta2 < 1, kind, ": invalid beta2 ", o.beta2, " in group ", g,
             " (expected in [0, 1))");
}
}  // namespace

namespace detail {
int64_t saved_step_count(const Tensor& saved, const std::string& what) {
  KILN_CHECK(!is_floating(saved.dtype()), "load_state_dict: ", what, " has dtype ", dtype_name(saved.dtype()),
             ", expected an integer step count");
  const int64_t count = saved.to(DType::i64).reshape({}).item<int64_t>();
  KILN_CHECK(count >= 0 && count <= saved_json::kMaxCount, "load_state_dict: ", what, " is ", count,
             " (expected a step count in [0, 2^53])");
  return count;
}
}  // namespace detail

Optimizer::Optimizer(std::vector<ParamGroup> groups, const GroupOptions& defaults, const char* kind) {
  KILN_CHECK(!groups.empty(), kind, ": no parameter groups were given");

  std::set<const TensorImpl*> seen;
  bool have_device = false;
  for (size_t g = 0; g < groups.size(); ++g) {
    Group group;
    group.options.lr = groups[g].lr.value_or(defaults.lr);
    group.options.weight_decay = groups[g].weight_decay.value_or(defaults.weight_decay);
    group.options.momentum = groups[g].momentum.value_or(defaults.momentum);
    group.options.beta2 = groups[g].beta2.value_or(defaults.beta2);
    check_group_options(group.options, kind, g);
    for (const Tensor& p : groups[g].params) {
      const int64_t index = static_cast<int64_t>(params_.size());
      KILN_CHECK(p.defined(), kind, ": ", detail::param_label(p, index), " is undefined");
      KILN_CHECK(p.is_leaf(), kind, ": ", detail::param_label(p, index),
                 " is not a leaf tensor (it was computed by '", p.grad_fn()->name(), "'); optimize leaves");
      KILN_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64 || is_16bit(p.dtype()), kind, ": ",
                 detail::param_label(p, index), " has dtype ", dtype_name(p.dtype()),
                 " (expected float32, float64, float16 or bfloat16)");
      KILN_CHECK(p.is_contiguous(), kind, ": ", detail::param_label(p, index), " of shape ", shape_str(p.shape()),
                 " is not contiguous");
      KILN_CHECK(seen.insert(p.impl()).second, kind, ": ", detail::param_label(p, index),
                 " appears more than once");
      if (!have_device) {
        device_ = p.device();
        have_device = true;
      }
      KILN_CHECK(p.device() == device_, kind, ": ", detail::param_label(p, index), " is on ", p.device(),
                 " but earlier parameters are on ", device_, " (one optimizer per device)");
      group.indices.push_back(index);
      group.params.push_back(p);
      params_.push_back(p);
      group_of_.push_back(static_cast<int64_t>(g));
    }
    groups_.push_back(std::move(group));
  }
  KILN_CHECK(!params_.empty(), kind, ": got an empty parameter list");
  state_.resize(params_.size());
  const TensorOptions f64{.dtype = DType::f64, .device = device_};
  for (const Group& group : groups_) {
    step_state_.lr.push_back(full({}, group.options.lr, f64));
    step_state_.momentum.push_back(full({}, group.options.momentum, f64));
  }
  step_state_.step = zeros({}, {.dtype = DType::i64, .device = device_});
  step_state_.found_inf = zeros({}, {.dtype = DType::f32, .device = device_});
  step_state_.clip_coef = ones({}, {.dtype = DType::f32, .device = device_});
}

Optimizer::~Optimizer() = default;

const std::vector<Tensor>& Optimizer::params(int64_t group) const {
  KILN_CHECK(group >= 0 && group < num_groups(), name(), ": no parameter group ", group, " (", num_groups(),
             " groups)");
  return groups_[group].params;
}

const GroupOptions& Optimizer::group_options(int64_t group) const {
  params(group);  // checks the index
  return groups_[group].options;
}

Tensor Optimizer::lr(int64_t group) const {
  params(group);
  return step_state_.lr[group];
}

Tensor Optimizer::momentum(int64_t group) const {
  params(group);
  return step_state_.momentum[group];
}

void Optimizer::set_lr(int64_t group, double lr) {
  params(group);
  KILN_CHECK(lr >= 0, name(), ": invalid learning rate ", lr, " (expected >= 0)");
  groups_[group].options.lr = lr;
  step_state_.lr[group].fill_(lr);
}

void Optimizer::set_momentum(int64_t group, double momentum) {
  params(group);
  KILN_CHECK(momentum >= 0, name(), ": invalid momentum/beta1 ", momentum, " (expected >= 0)");
  groups_[group].options.momentum = momentum;
  step_state_.momentum[group].fill_(momentum);
}

cuda::DeviceScope Optimizer::launch() const { return launch_on(device_, "optimizer step"); }

Tensor Optimizer::scratch(int64_t count) const {
  return empty({std::max<int64_t>(count, 1)}, {.dtype = DType::f64, .device = device_});
}

Optimizer::ParamState& Optimizer::ensure_state(int64_t index) {
  ParamState& s = state_[index];
  if (s.step.defined()) return s;
  // Made inside a capture, the state's first values would be recorded and set
  // again at every replay (Adam's moments back to 0, the master copy back to
  // the 16-bit weights), and an abandoned capture would leave it never set.
  KILN_CHECK(!cuda::capturing(), name(), ": the state of parameter ", index, " would be created inside a CUDA "
             "graph's capture (its first gradient came there); take an eager step with it first");
  NoGradGuard no_grad;
  const Tensor& p = params_[index];
  s.step = zeros({}, {.dtype = DType::i64, .device = device_});
  // Without masters a 16-bit param's state is in its own dtype (the kernels
  // tell the two layouts apart by the master pointer).
  const bool narrow = is_16bit(p.dtype()) && !master_weights_;
  if (is_16bit(p.dtype()) && master_weights_) s.master = p.detach().to(DType::f32);
  for (size_t k = 0; k < buffer_names(group_of_[index]).size(); ++k) {
    s.buffers.push_back(zeros(p.shape(), {.dtype = narrow ? p.dtype() : state_dtype(p.dtype()), .device = device_}));
  }
  return s;
}

std::vector<Tensor> Optimizer::params_with_grad() const {
  std::vector<Tensor> with_grad;
  for (const Tensor& p : params_) {
    if (p.grad().defined()) with_grad.push_back(p);
  }
  detail::grads_of(with_grad, name().c_str());  // makes gradients contiguous
  return with_grad;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  const std::string op = name() + ".step";
  const float* found_inf = found_inf_armed_ ? step_state_.found_inf.data<float>() : nullptr;
  last_step_found_inf_ = found_inf_armed_ ? step_state_.found_inf : Tensor();
  const float* grad_scale = clip_pending_ ? step_state_.clip_coef.data<float>() : nullptr;
  found_inf_armed_ = false;
  clip_pending_ = false;

  // The params with a gradient, per group; their state; their step counters.
  std::vector<std::vector<int64_t>> active(groups_.size());
  std::vector<int64_t*> steps;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int64_t index : groups_[g].indices) {
      const Tensor& p = params_[index];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      KILN_CHECK(grad.dtype() == p.dtype(), op, ": the gradient of ", detail::param_label(p, index), " has dtype ",
                 dtype_name(grad.dtype()), ", expected the parameter's ", dtype_name(p.dtype()));
      KILN_CHECK(grad.device() == p.device() && grad.shape() == p.shape(), op, ": the gradient of ",
                 detail::param_label(p, index), " is ", shape_str(grad.shape()), " on ", grad.device(),
                 ", expected ", shape_str(p.shape()), " on ", p.device());
      if (!grad.is_contiguous()) p.set_grad(grad.contiguous());
      steps.push_back(ensure_state(index).step.data<int64_t>());
      active[g].push_back(index);
    }
  }
  int64_t* global_step = step_state_.step.data<int64_t>();
  const int64_t count = static_cast<int64_t>(steps.size());
  if (device_.is_cpu()) {
    kernels::optim_step_prologue_cpu(global_step, steps.data(), count, found_inf);
  } else {
    kernels::optim_step_prologue_cuda(global_step, steps.data(), count, found_inf, launch().stream);
  }

  for (size_t g = 0; g < groups_.size(); ++g) {
    if (active[g].empty()) continue;
    kernels::OptimScalars scalars;
    scalars.lr = step_state_.lr[g].data<double>();
    scalars.momentum = step_state_.momentum[g].data<double>();
    scalars.found_inf = found_inf;
    scalars.grad_scale = grad_scale;
    for (DType dtype : kDTypeOrder) {
      std::vector<kernels::OptimTensor> tensors;
      for (int64_t index : active[g]) {
        const Tensor& p = params_[index];
        if (p.dtype() != dtype) continue;
        ParamState& s = state_[index];
        kernels::OptimTensor t;
        t.param = p.data_ptr();
        t.grad = p.grad().data_ptr();
        t.master = s.master.defined() ? s.master.data<float>() : nullptr;
        for (size_t k = 0; k < s.buffers.size() && k < 3; ++k) t.state[k] = s.buffers[k].data_ptr();
        t.step = s.step.data<int64_t>();
        t.numel = p.numel();
        tensors.push_back(t);
        p.bump_version();
      }
      if (!tensors.empty()) update(static_cast<int64_t>(g), dtype, tensors, scalars);
    }
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) p.zero_grad_(set_to_none);
}

ClipGradNormResult Optimizer::clip_grad_norm_(double max_norm, double norm_type) {
  detail::check_norm_type(norm_type, "clip_grad_norm_");
  KILN_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : params_with_grad()) grads.push_back(p.grad());
  ClipGradNormResult result{empty({}, {.device = device_}), step_state_.clip_coef};
  detail::grad_norm_into(grads, device_, norm_type, max_norm, result.total_norm, result.clip_coef);
  clip_pending_ = true;
  return result;
}

Tensor Optimizer::state(int64_t index, const std::string& key) const {
  KILN_CHECK(index >= 0 && index < num_params(), name(), ".state: no parameter ", index, " (", num_params(),
             " parameters)");
  const ParamState& s = state_[index];
  if (key == "step") return s.step;
  if (key == "master") return s.master;
  const std::vector<std::string> names = buffer_names(group_of_[index]);
  for (size_t k = 0; k < names.size(); ++k) {
    if (names[k] == key) return k < s.buffers.size() ? s.buffers[k] : Tensor();
  }
  return Tensor();
}

void Optimizer::set_master_weights(bool enabled) {
  for (const ParamState& s : state_) {
    KILN_CHECK(!s.step.defined() || enabled == master_weights_, name(), ".set_master_weights(", enabled,
               "): the optimizer already holds state (set it before the first step or load_state_dict)");
  }
  master_weights_ = enabled;
}

void Optimizer::sync_master_weights() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (state_[i].master.defined()) state_[i].master.copy_(params_[i]);
  }
}

StateDict Optimizer::state_dict() const {
  StateDict dict;
  dict.meta["optimizer"] = name();
  dict.meta["defaults"] = options_json();
  nlohmann::json groups = nlohmann::json::array();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupOptions& o = groups_[g].options;
    groups.push_back({{"lr", o.lr},
                      {"weight_decay", o.weight_decay},
                      {"momentum", o.momentum},
                      {"beta2", o.beta2},
                      {"params", groups_[g].indices}});
    dict.tensors["group." + std::to_string(g) + ".lr"] = step_state_.lr[g];
    dict.tensors["group." + std::to_string(g) + ".momentum"] = step_state_.momentum[g];
  }
  dict.meta["param_groups"] = groups;
  nlohmann::json state = nlohmann::json::object();
  for (size_t i = 0; i < state_.size(); ++i) {
    const ParamState& s = state_[i];
    if (!s.step.defined()) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    const std::vector<std::string> names = buffer_names(group_of_[i]);
    state[std::to_string(i)] = {{"buffers", names}, {"master", s.master.defined()}};
    dict.tensors[prefix + "step"] = s.step;
    if (s.master.defined()) dict.tensors[prefix + "master"] = s.master;
    for (size_t k = 0; k < names.size(); ++k) dict.tensors[prefix + names[k]] = s.buffers[k];
  }
  dict.meta["state"] = state;
  dict.tensors["step"] = step_state_.step;
  return dict;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  NoGradGuard no_grad;
  // Everything is read and checked before anything changes; a malformed JSON
  // structure is a kiln::Error like any other mismatch.
  std::vector<GroupOptions> options(groups_.size());
  std::vector<std::pair<int64_t, std::string>> entries;  // (parameter index, key) of the saved states
  try {
    const nlohmann::json& meta = dict.meta;
    KILN_CHECK(meta.is_object() && meta.contains("optimizer") && meta.at("optimizer").is_string(),
               "load_state_dict: the state has no optimizer name");
    KILN_CHECK(meta.at("optimizer").get<std::string>() == name(), "load_state_dict: the state is of a ",
               meta.at("optimizer").get<std::string>(), " optimizer, this is ", name());
    const nlohmann::json& groups = meta.at("param_groups");
    KILN_CHECK(groups.is_array() && groups.size() == groups_.size(), "load_state_dict: the state has ",
               groups.is_array() ? std::to_string(groups.size()) : "no list of", " parameter groups, the optimizer ",
               groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      const nlohmann::json& group = groups.at(g);
      const nlohmann::json& indices = group.at("params");
      KILN_CHECK(indices.is_array() && indices.size() == groups_[g].indices.size(), "load_state_dict: group ", g,
                 " of the state has ", indices.is_array() ? std::to_string(indices.size()) : "no list of",
                 " parameters, the optimizer's ", groups_[g].indices.size());
      const std::string where = "load_state_dict: parameter group " + std::to_string(g);
      options[g] = {saved_json::finite_number_at(group, "lr", where),
                    saved_json::finite_number_at(group, "weight_decay", where),
                    saved_json::finite_number_at(group, "momentum", where),
                    saved_json::finite_number_at(group, "beta2", where)};
      check_group_options(options[g], "load_state_dict", g);
      const std::string prefix = "group." + std::to_string(g) + ".";
      check_saved(saved_tensor(dict, prefix + "lr"), {}, false, prefix + "lr");
      check_saved(saved_tensor(dict, prefix + "momentum"), {}, false, prefix + "momentum");
    }
    check_saved(saved_tensor(dict, "step"), {}, true, "step");
    const nlohmann::json& state = meta.at("state");
    KILN_CHECK(state.is_object(), "load_state_dict: the state's \"state\" is not an object");
    for (const auto& [key, entry] : state.items()) {
      const int64_t index = parameter_index(key, num_params());
      const auto names = entry.at("buffers").get<std::vector<std::string>>();
      KILN_CHECK(names == buffer_names(group_of_[index]), "load_state_dict: ",
                 detail::param_label(params_[index], index), " has ", names.size(),
                 " saved buffers that differ from this optimizer's (",
                 nlohmann::json(buffer_names(group_of_[index])).dump(), " expected, got ",
                 nlohmann::json(names).dump(), ")");
      const std::string prefix = "state." + key + ".";
      const Shape& shape = params_[index].shape();
      for (const std::string& name : names) check_saved(saved_tensor(dict, prefix + name), shape, false, prefix + name);
      check_saved(saved_tensor(dict, prefix + "step"), {}, true, prefix + "step");
      const Tensor master = saved_tensor(dict, prefix + "master");
      if (master.defined() && is_16bit(params_[index].dtype())) check_saved(master, shape, false, prefix + "master");
      entries.emplace_back(index, key);
    }
  } catch (const nlohmann::json::exception& error) {
    KILN_THROW("load_state_dict: malformed ", name(), " state: ", error.what());
  }

  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].options = options[g];
    const std::string prefix = "group." + std::to_string(g) + ".";
    step_state_.lr[g].copy_(saved_tensor(dict, prefix + "lr"));
    step_state_.momentum[g].copy_(saved_tensor(dict, prefix + "momentum"));
  }
  step_state_.step.copy_(saved_tensor(dict, "step"));
  for (auto& s : state_) s = ParamState();
  for (const auto& [index, key] : entries) {
    ParamState& s = ensure_state(index);
    const std::string prefix = "state." + key + ".";
    s.step.copy_(saved_tensor(dict, prefix + "step"));
    // A state saved without master weights (e.g. from fp32 params) starts from the parameter.
    const Tensor master = saved_tensor(dict, prefix + "master");
    if (s.master.defined() && master.defined()) s.master.copy_(master);
    const std::vector<std::string> names = buffer_names(group_of_[index]);
    for (size_t k = 0; k < names.size(); ++k) s.buffers[k].copy_(saved_tensor(dict, prefix + names[k]));
  }
}

}  // namespace kiln::optim
