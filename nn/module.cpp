#include "nn/module.h"

#include <iomanip>
#include <set>
#include <sstream>

#include "core/autograd.h"

namespace kiln::nn {

namespace {
void check_name(const std::string& name, const char* what) {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos, what, ": invalid name '", name,
             "' (must be non-empty and contain no '.')");
}
template <typename List>
bool has_name(const List& list, const std::string& name) {
  for (const auto& [existing, value] : list) {
    if (existing == name) return true;
  }
  return false;
}
}  // namespace

Tensor Module::forward(const Tensor&) {
  KILN_THROW(type_name(), ": this module has no single-input forward(Tensor)");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_name(name, "register_parameter");
  KILN_CHECK(!has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
             "register_parameter: '", name, "' is already registered in ", type_name());
  KILN_CHECK(tensor.defined(), "register_parameter: '", name, "' is undefined");
  tensor.set_name(name);
  if (requires_grad && !tensor.requires_grad()) tensor.requires_grad_(true);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_name(name, "register_buffer");
  KILN_CHECK(!has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
             "register_buffer: '", name, "' is already registered in ", type_name());
  buffers_.emplace_back(name, tensor);
  return tensor;
}

bool Module::remove_parameter(const std::string& name) {
  for (auto it = parameters_.begin(); it != parameters_.end(); ++it) {
    if (it->first == name) {
      parameters_.erase(it);
      return true;
    }
  }
  return false;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name(name, "register_module");
  KILN_CHECK(module != nullptr, "register_module: '", name, "' is null");
  KILN_CHECK(!has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
             "register_module: '", name, "' is already registered in ", type_name());
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool recurse, bool parameters, NamedTensors& out) const {
  for (const auto& [name, tensor] : parameters ? parameters_ : buffers_) {
    if (tensor.defined()) out.emplace_back(prefix + name, tensor);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", true, parameters, out);
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_parameters(recurse)) out.push_back(tensor);
  return out;
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors all, out;
  collect("", recurse, true, all);
  // A parameter registered under two names (a weight tied between an
  // embedding and an output layer) is listed once, under its first name, as
  // torch's named_parameters does: an optimizer must update it once.
  std::set<const TensorImpl*> seen;
  for (auto& entry : all) {
    if (seen.insert(entry.second.impl()).second) out.push_back(std::move(entry));
  }
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", recurse, false, out);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  out.emplace_back("", shared_from_this());
  for (const auto& [name, child] : children_) {
    for (auto& [sub, module] : child->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, module);
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

namespace {
// Replaces the tensor's storage and dtype in place so that every handle to it
// sees the moved data; gradients are dropped (they belong to the old layout).
void move_in_place(const Tensor& tensor, std::optional<Device> device, std::optional<DType> dtype) {
  const Device target_device = device.value_or(tensor.device());
  const DType target_dtype = dtype && is_floating(tensor.dtype()) ? *dtype : tensor.dtype();
  if (target_device == tensor.device() && target_dtype == tensor.dtype()) return;
  Tensor moved;
  {
    NoGradGuard no_grad;
    moved = tensor.detach().to(target_device, target_dtype).contiguous();
  }
  TensorImpl* impl = tensor.impl();
  impl->storage = moved.storage();
  impl->shape = moved.shape();
  impl->strides = moved.strides();
  impl->offset = moved.offset();
  impl->dtype = moved.dtype();
  tensor.set_grad(Tensor());
}
}  // namespace

void Module::to_impl(std::optional<Device> device, std::optional<DType> dtype) {
  for (auto& [name, tensor] : named_parameters()) move_in_place(tensor, device, dtype);
  for (auto& [name, tensor] : named_buffers()) move_in_place(tensor, device, dtype);
}

void Module::to(Device device) { to_impl(device, std::nullopt); }
void Module::to(DType dtype) {
  KILN_CHECK(is_floating(dtype), "Module::to: expected a floating dtype, got ", dtype_name(dtype));
  to_impl(std::nullopt, dtype);
}
void Module::to(Device device, DType dtype) {
  KILN_CHECK(is_floating(dtype), "Module::to: expected a floating dtype, got ", dtype_name(dtype));
  to_impl(device, dtype);
}

void Module::to(MemoryFormat format) {
  for (auto& [name, module] : named_modules()) module->set_memory_format(format);
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& parameter : parameters()) parameter.zero_grad_(set_to_none);
}

int64_t Module::parameter_count(bool trainable_only) const {
  int64_t count = 0;
  for (const Tensor& parameter : parameters()) {
    if (!trainable_only || parameter.requires_grad()) count += parameter.numel();
  }
  return count;
}

std::string Module::summary() {
  std::ostringstream out;
  out << std::left << std::setw(28) << "name" << std::setw(22) << "type" << std::setw(32) << "parameter shapes"
      << std::right << std::setw(12) << "parameters" << "\n";
  for (auto& [name, module] : named_modules()) {
    std::string shapes;
    int64_t count = 0;
    for (auto& [pname, tensor] : module->named_parameters(false)) {
      shapes += (shapes.empty() ? "" : " ") + shape_str(tensor.shape());
      count += tensor.numel();
    }
    out << std::left << std::setw(28) << (name.empty() ? "(root)" : name) << std::setw(22) << module->type_name()
        << std::setw(32) << shapes << std::right << std::setw(12) << count << "\n";
  }
  out << "total parameters: " << parameter_count() << " (trainable " << parameter_count(true) << ")\n";
  return out.str();
}

std::string Module::to_string_indented(int indent) const {
  std::ostringstream out;
  out << type_name() << "(" << extra_repr();
  if (!children_.empty()) {
    out << "\n";
    for (const auto& [name, child] : children_) {
      out << std::string(indent + 2, ' ') << "(" << name << "): " << child->to_string_indented(indent + 2) << "\n";
    }
    out << std::string(indent, ' ');
  }
  out << ")";
  return out.str();
}

std::string Module::to_string() const { return to_string_indented(0); }

StateDict Module::state_dict() const {
  // Every name, tied ones included (torch's state_dict keeps both keys).
  StateDict state;
  collect("", true, true, state);
  for (auto& entry : named_buffers()) state.push_back(entry);
  return state;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  StateDict own = state_dict();
  std::set<std::string> seen;
  std::vector<std::string> unexpected, mismatched, mistyped;
  for (const auto& [name, value] : state) {
    auto it = std::find_if(own.begin(), own.end(), [&name = name](const auto& entry) { return entry.first == name; });
    if (it == own.end()) {
      unexpected.push_back(name);
      continue;
    }
    seen.insert(name);
    if (!value.defined()) {
      mismatched.push_back(name + " (checkpoint undefined, model " + shape_str(it->second.shape()) + ")");
    } else if (value.shape() != it->second.shape()) {
      mismatched.push_back(name + " (checkpoint " + shape_str(value.shape()) + ", model " +
                           shape_str(it->second.shape()) + ")");
    } else if (is_floating(value.dtype()) && !is_floating(it->second.dtype())) {
      // Floats into an integer buffer (num_batches_tracked): a NaN or huge value converts with undefined behaviour.
      mistyped.push_back(name + " (checkpoint " + std::string(dtype_name(value.dtype())) + ", model " +
                         std::string(dtype_name(it->second.dtype())) + ")");
    }
  }
  std::vector<std::string> missing;
  for (const auto& [name, tensor] : own) {
    if (!seen.count(name)) missing.push_back(name);
  }
  auto join = [](const std::vector<std::string>& names) {
    std::string text;
    for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
    return text;
  };
  const bool key_errors = strict && (!missing.empty() || !unexpected.empty());
  KILN_CHECK(!key_errors && mismatched.empty() && mistyped.empty(), "load_state_dict for ", type_name(), ": ",
             missing.empty() || !strict ? "" : "missing keys: " + join(missing) + "; ",
             unexpected.empty() || !strict ? "" : "unexpected keys: " + join(unexpected) + "; ",
             mismatched.empty() ? "" : "shape mismatch: " + join(mismatched) + "; ",
             mistyped.empty() ? "" : "floating values for an integer tensor: " + join(mistyped));
  // Nothing is written until every key has been checked.
  NoGradGuard no_grad;
  for (const auto& [name, value] : state) {
    auto it = std::find_if(own.begin(), own.end(), [&name = name](const auto& entry) { return entry.first == name; });
    if (it != own.end()) it->second.copy_(value);
  }
}

}  // namespace kiln::nn
