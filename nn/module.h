// nn::Module: named parameters, buffers and children, train/eval, device and
// dtype moves, parameter counts, a printed summary, and state_dict with
// PyTorch's dotted names ("features.0.weight", "bn1.running_mean") so weights
// move between kiln and the equivalent torch.nn model.
//
// Tensors are handles: a layer keeps `Tensor weight` and the module registry
// holds the same handle. Module::to() rewrites each tensor's storage in place
// (like torch's `param.data = ...`), so every handle — the layer's, an
// optimizer's — sees the moved tensor.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using StateDict = NamedTensors;

class Module : public std::enable_shared_from_this<Module> {
 public:
  virtual ~Module() = default;

  // The single-input forward most layers have; modules with other signatures
  // add their own methods. Throws when a module does not define it.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Type name for printing, e.g. "Conv2d".
  virtual std::string type_name() const = 0;
  // Constructor arguments for printing, e.g. "1, 32, kernel_size=3".
  virtual std::string extra_repr() const { return ""; }
  // True for BatchNorm layers: a bias right before one is redundant.
  virtual bool is_batch_norm() const { return false; }
  // Drops this layer's bias if it has one (Linear, Conv2d); returns whether it did.
  virtual bool drop_bias() { return false; }
  // The memory format this layer computes in (Module::to(MemoryFormat)); only
  // convolutions have one.
  virtual void set_memory_format(MemoryFormat) {}

  // --- registration (names must be unique within this module)
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Removes a parameter (e.g. a bias dropped before BatchNorm); returns whether it existed.
  bool remove_parameter(const std::string& name);

  // --- traversal, in registration order; a parameter registered under two
  // names (tied weights) is listed once, under its first name; state_dict()
  // keeps every name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  // This module ("") and every descendant with its dotted name.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();

  // --- mode and placement
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters and buffers; floating ones also take `dtype` when given.
  void to(Device device);
  void to(DType dtype);
  void to(Device device, DType dtype);
  // torch's model.to(memory_format=torch.channels_last): every convolution
  // below computes in that layout. kiln keeps parameters contiguous (the fused
  // optimizers step dense contiguous tensors); a channels-last convolution on a
  // GPU takes a channels-last copy of its weight at each call instead (small
  // next to its activations), so that cuDNN runs NHWC, its output is
  // channels-last, and elementwise ops, batch norm and pooling carry the
  // layout to the next layer. On the CPU convolutions stay NCHW.
  void to(MemoryFormat format);
  void zero_grad(bool set_to_none = true);

  int64_t parameter_count(bool trainable_only = false) const;
  // A table: name, type, output-independent shapes of parameters, count per layer, total.
  std::string summary();
  std::string to_string() const;

  // --- state: parameters and buffers with dotted names
  StateDict state_dict() const;
  // strict: every key must match; a missing, unexpected or mis-shaped key gives
  // an error that lists them all. Non-strict ignores missing/unexpected keys
  // (shape mismatches still throw). Values are copied into the existing tensors.
  void load_state_dict(const StateDict& state, bool strict = true);

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  void collect(const std::string& prefix, bool recurse, bool parameters, NamedTensors& out) const;
  void to_impl(std::optional<Device> device, std::optional<DType> dtype);
  std::string to_string_indented(int indent) const;

  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

using ModulePtr = std::shared_ptr<Module>;

}  // namespace kiln::nn
