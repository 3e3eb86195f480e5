// Optimizers: SGD, Adam, AdamW, LAMB, LARS over lists of leaf tensors.
//
// Sync-free by design (see shared/DESIGN.md): the learning rate and momentum
// (beta1) of each group, the step counters, the found-inf flag and the clip
// coefficient live in 0-d tensors on the parameters' device (OptimizerStepState)
// and the kernels read them there, so step() never waits for the device and a
// whole training step can be captured as a CUDA graph. On the CPU the same
// tensors are in host memory and the CPU kernels read the same pointers.
//
// step() updates every parameter that has a gradient: one fused multi-tensor
// kernel launch per (group, dtype) on CUDA, an OpenMP loop over chunks on the
// CPU. A parameter without a gradient (or frozen: requires_grad false) is left
// alone, and its state and step count do not change, as in PyTorch. When a
// GradScaler found inf/NaN in the gradients the step is skipped on the device
// and no step counter advances. A bf16/f16 parameter keeps an fp32 master copy
// and fp32 state by default: the update runs on the master and writes the
// rounded value into the parameter. With set_master_weights(false) it keeps
// neither: its state is in its own dtype and the update (computed in float)
// is rounded into the parameter and the state, as torch does for 16-bit
// parameters (Lightning's "bf16-true"), for a quarter of the memory of Adam's state.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/optim.h"

namespace kiln::optim {

// Structure and hyperparameters as JSON; state as named tensors (the tensors
// alias the live state: clone them to keep a snapshot).
struct StateDict {
  nlohmann::json meta = nlohmann::json::object();
  std::map<std::string, Tensor> tensors;
};

// Parameters with their own hyperparameters; unset values take the optimizer's.
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<double> momentum;  // SGD/LARS momentum; Adam/LAMB beta1
  std::optional<double> beta2;     // Adam/LAMB
};

// The resolved hyperparameters of a group, as configured on the host. The
// current lr and momentum are the device values (Optimizer::lr()): schedules
// change those, not these, so these stay the initial values schedules start from.
struct GroupOptions {
  double lr = 0;
  double weight_decay = 0;
  double momentum = 0;
  double beta2 = 0;
};

// The device-resident values of a step, all 0-d on the parameters' device.
struct OptimizerStepState {
  std::vector<Tensor> lr;        // per group, float64
  std::vector<Tensor> momentum;  // per group, float64: SGD/LARS momentum, Adam/LAMB beta1
  Tensor step;                   // int64: steps taken (skipped steps not counted)
  Tensor found_inf;              // float32 0/1: this step's gradients hold inf/NaN (written by GradScaler)
  Tensor clip_coef;              // float32: gradient multiplier of the next step (from clip_grad_norm_)
};

// Total gradient norm and clip coefficient min(max_norm / (norm + 1e-6), 1),
// 0-d float32 tensors on the gradients' device.
struct ClipGradNormResult {
  Tensor total_norm;
  Tensor clip_coef;
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "SGD", "Adam", "AdamW", "LAMB", "LARS".
  virtual std::string name() const = 0;

  // One update of every parameter that has a gradient. Does not synchronize.
  // Throws kiln::Error naming the parameter for a gradient of another dtype.
  void step();
  // Sets every gradient to absent (set_to_none) or to zeros.
  void zero_grad(bool set_to_none = true);

  int64_t num_groups() const { return static_cast<int64_t>(groups_.size()); }
  const std::vector<Tensor>& params(int64_t group) const;
  const GroupOptions& group_options(int64_t group) const;
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  Device device() const { return device_; }

  // The current learning rate / momentum (beta1) of a group: a 0-d float64
  // tensor on the device (reading its value synchronizes).
  Tensor lr(int64_t group) const;
  Tensor momentum(int64_t group) const;
  // Sets the device value and the group's host option. Does not synchronize.
  void set_lr(int64_t group, double lr);
  void set_momentum(int64_t group, double momentum);

  OptimizerStepState& step_state() { return step_state_; }
  const OptimizerStepState& step_state() const { return step_state_; }

  // Norm of all gradients of this optimizer's parameters (as
  // clip_grad_norm_); the next step() multiplies the gradients by the clip
  // coefficient as it reads them, which saves clip_grad_norm_'s in-place pass.
  // The gradients themselves are left unclipped. Does not synchronize.
  ClipGradNormResult clip_grad_norm_(double max_norm, double norm_type = 2.0);

  // State tensor `name` ("step", "master", or a buffer such as "exp_avg") of
  // parameter `index` (over all groups, in order); undefined when absent.
  Tensor state(int64_t index, const std::string& name) const;
  // Names of the buffers kept per parameter of `group` ("exp_avg", ...).
  virtual std::vector<std::string> buffer_names(int64_t group) const = 0;

  // State as JSON + tensors (aliases; no synchronization). load_state_dict
  // copies the tensors in and takes the saved group hyperparameters; it
  // throws kiln::Error when the optimizer kind, groups, sizes or buffers differ.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

  // Copies the 16-bit parameters into their fp32 master copies (after the
  // parameters were written directly, e.g. by loading a checkpoint).
  void sync_master_weights();
  // Whether 16-bit parameters get an fp32 master copy and fp32 state (true,
  // the default) or neither (state in the parameter's dtype). Throws
  // kiln::Error once any state exists (after the first step or a loaded state).
  void set_master_weights(bool enabled);
  bool master_weights() const { return master_weights_; }

  // --- used by GradScaler and the schedules
  // The next step() is skipped on the device when step_state().found_inf != 0.
  void arm_found_inf() { found_inf_armed_ = true; }
  // The found-inf flag the last step() honoured; undefined when it had none.
  Tensor last_step_found_inf() const { return last_step_found_inf_; }
  // The parameters that currently have a gradient, over all groups, with
  // non-contiguous gradients replaced by contiguous copies.
  std::vector<Tensor> params_with_grad() const;

 protected:
  Optimizer(std::vector<ParamGroup> groups, const GroupOptions& defaults, const char* kind);

  // Runs the update kernel for the parameters of one group that share a dtype.
  virtual void update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
                      const kernels::OptimScalars& scalars) = 0;
  // The optimizer-wide options (saved as "defaults").
  virtual nlohmann::json options_json() const = 0;

  // The device made current and its stream, for one launch: `launch().stream`.
  cuda::DeviceScope launch() const;
  // Scratch of `count` float64 on the device (per-tensor norm partials).
  Tensor scratch(int64_t count) const;

 private:
  struct ParamState {
    Tensor step;    // 0-d int64
    Tensor master;  // fp32 copy of a 16-bit param
    std::vector<Tensor> buffers;
  };
  struct Group {
    std::vector<Tensor> params;
    std::vector<int64_t> indices;  // into params_
    GroupOptions options;
  };
  ParamState& ensure_state(int64_t index);

  std::vector<Group> groups_;
  std::vector<Tensor> params_;
  std::vector<int64_t> group_of_;  // param index -> group
  std::vector<ParamState> state_;
  OptimizerStepState step_state_;
  Device device_;
  bool found_inf_armed_ = false;
  bool clip_pending_ = false;
  bool master_weights_ = true;
  Tensor last_step_found_inf_;
};

// ---------------------------------------------------------------- SGD
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);
  std::string name() const override { return "SGD"; }
  std::vector<std::string> buffer_names(int64_t group) const override;
  const SGDOptions& options() const { return options_; }

 protected:
  void update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
              const kernels::OptimScalars& scalars) override;
  nlohmann::json options_json() const override;

 private:
  SGDOptions options_;
  std::vector<bool> has_buffer_;  // per group: configured with momentum != 0
};

// ---------------------------------------------------------------- Adam, AdamW
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // AdamW's default is 1e-2 (AdamWOptions)
  bool amsgrad = false;
  bool maximize = false;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options);
  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  std::vector<std::string> buffer_names(int64_t group) const override;
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled);
  void update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
              const kernels::OptimScalars& scalars) override;
  nlohmann::json options_json() const override;

 private:
  AdamOptions options_;
  bool decoupled_;
};

struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 1e-2; }
};

// Adam with decoupled weight decay (p *= 1 - lr * weight_decay).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options);
};

// ---------------------------------------------------------------- LAMB, LARS
struct LAMBOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  bool bias_correction = true;
};

// LAMB (You et al. 2019) with decoupled weight decay and the trust ratio
// |p| / |update| per tensor (see kernels/optim_math.h for the formula).
class LAMB : public Optimizer {
 public:
  LAMB(std::vector<Tensor> params, const LAMBOptions& options);
  LAMB(std::vector<ParamGroup> groups, const LAMBOptions& options);
  std::string name() const override { return "LAMB"; }
  std::vector<std::string> buffer_names(int64_t group) const override;
  const LAMBOptions& options() const { return options_; }

 protected:
  void update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
              const kernels::OptimScalars& scalars) override;
  nlohmann::json options_json() const override;

 private:
  LAMBOptions options_;
};

struct LARSOptions {
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 0;
  double trust_coefficient = 0.001;
  double eps = 1e-8;
};

// LARS (You et al. 2017) as apex's LARC in scale mode: SGD with momentum on
// (g + wd * p) * trust_coefficient * |p| / (|g| + wd * |p| + eps), per tensor.
class LARS : public Optimizer {
 public:
  LARS(std::vector<Tensor> params, const LARSOptions& options);
  LARS(std::vector<ParamGroup> groups, const LARSOptions& options);
  std::string name() const override { return "LARS"; }
  std::vector<std::string> buffer_names(int64_t group) const override;
  const LARSOptions& options() const { return options_; }

 protected:
  void update(int64_t group, DType dtype, const std::vector<kernels::OptimTensor>& tensors,
              const kernels::OptimScalars& scalars) override;
  nlohmann::json options_json() const override;

 private:
  LARSOptions options_;
  std::vector<bool> has_buffer_;  // per group: configured with momentum != 0
};

}  // namespace kiln::optim
