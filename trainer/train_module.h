// TrainModule: what a user subclasses to train with kiln's Trainer, after
// Lightning's LightningModule. training_step returns the loss; validation_step
// and test_step log metrics; configure_optimizers returns one optimizer (or
// several, for manual optimization), each with an optional schedule and its
// interval ("step" or "epoch").
//
// Manual optimization (automatic_optimization = false), as Lightning: the
// trainer never calls backward, step or zero_grad; training_step does, through
// optimizers() (handles that count global steps and synchronize DDP
// gradients), manual_backward and toggle_model:
//
//   auto [g_opt, d_opt] = optimizers<2>();
//   const bool last = (batch_idx + 1) % 2 == 0 || trainer()->is_last_batch();
//   {
//     auto toggled = d_opt.toggle_model(/*sync_grad=*/last);  // G-only parameters frozen
//     manual_backward(d_loss);
//     if (last) { d_opt.step(); d_opt.zero_grad(); }
//   }
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "nn/module.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace kiln {

// The dtypes a host batch takes on its way to training_step, as Lightning's
// precision plugins (convert_input): floating tensors take the parameters'
// dtype (a float32 regression target meets bfloat16 outputs under
// "bf16-true"); integer targets become int64, other integer inputs stay.
DType module_input_dtype(const Batch& batch, DType param_dtype);
DType module_target_dtype(const Batch& batch, DType param_dtype);
// The batch on `device` in those dtypes, copied with non_blocking: hold a
// pinned host batch until its copies ran (HostBatchHolder).
Batch batch_to_module(const Batch& batch, Device device, DType param_dtype);

class Trainer;
class TrainModule;

struct OptimizerConfig {
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LRScheduler> scheduler;  // may be null
  std::string interval = "step";                   // "step" or "epoch"
};

// What configure_optimizers returns: one OptimizerConfig (`return config;`) or
// several (`return {std::move(g), std::move(d)};`, or a vector). Several
// optimizers need manual optimization, as in Lightning.
struct OptimizerConfigs {
  std::vector<OptimizerConfig> configs;

  OptimizerConfigs() = default;
  OptimizerConfigs(OptimizerConfig config) { configs.push_back(std::move(config)); }  // NOLINT: implicit on purpose
  OptimizerConfigs(std::vector<OptimizerConfig> several) : configs(std::move(several)) {}  // NOLINT
  template <typename... Rest>
  OptimizerConfigs(OptimizerConfig first, OptimizerConfig second, Rest... rest) {
    configs.push_back(std::move(first));
    configs.push_back(std::move(second));
    (configs.push_back(std::move(rest)), ...);
  }
  // The only optimizer, for code that handles one (`OptimizerConfig config =
  // module.configure_optimizers();`); throws kiln::Error when there are several.
  operator OptimizerConfig() &&;  // NOLINT: implicit on purpose
};

// A value logged during a stage, kept on the device until it is read.
struct LoggedValue {
  Tensor sum;        // running sum over the epoch (0-d, float64, on the value's device)
  int64_t count = 0; // number of logged values (weighted by batch size)
  Tensor last;       // the latest value (for on_step)
  bool on_step = false, on_epoch = false, prog_bar = false;
};

// One TrainModule::log call as made, kept by a LogRecording.
struct RecordedLog {
  std::string name;
  Tensor value;  // as passed (detached): for a CUDA graph, memory that every replay rewrites
  std::optional<bool> on_step, on_epoch;
  bool prog_bar = false;
  int64_t batch_size = 1;
};

// While alive, the module's log() calls are kept instead of taking effect;
// apply() makes them take effect, as often as it is called. The Trainer's
// cuda_graph step records the calls training_step makes during the capture
// (where the work is recorded, not run) and applies them after every replay,
// so each step's values are logged as an eager step logs them.
class LogRecording {
 public:
  explicit LogRecording(TrainModule& module);
  ~LogRecording();
  LogRecording(const LogRecording&) = delete;
  LogRecording& operator=(const LogRecording&) = delete;
  const std::vector<RecordedLog>& calls() const { return calls_; }
  // Stops recording (the destructor does too); calls stay for apply().
  void stop();
  // log(call...) for each call, in order (recording must have stopped).
  void apply() const;

 private:
  TrainModule& module_;
  std::vector<RecordedLog> calls_;
  bool recording_ = true;
};

// Lightning's toggle_model context: while alive, the parameters that belong
// only to the other optimizers have requires_grad false (so backward computes
// no gradient for them), and with sync_grad false a DDP backward does not
// synchronize gradients. The destructor restores both.
class ToggledModel {
 public:
  ToggledModel(ToggledModel&& other) noexcept;
  ~ToggledModel();
  ToggledModel(const ToggledModel&) = delete;
  ToggledModel& operator=(const ToggledModel&) = delete;
  ToggledModel& operator=(ToggledModel&&) = delete;

 private:
  friend class OptimizerHandle;
  ToggledModel() = default;
  std::vector<std::pair<Tensor, bool>> saved_;  // frozen parameters and their requires_grad before
  Trainer* trainer_ = nullptr;                  // set when the DDP sync flag was changed
  bool previous_sync_ = true;
  bool active_ = false;
};

// One optimizer of configure_optimizers as training_step sees it (Lightning's
// LightningOptimizer). Cheap to copy; valid while the trainer's fit runs.
class OptimizerHandle {
 public:
  OptimizerHandle(TrainModule& module, size_t index) : module_(&module), index_(index) {}
  optim::Optimizer& optimizer() const;
  size_t index() const { return index_; }
  // One optimizer step: finishes the DDP gradient synchronization a backward
  // started, calls the callbacks' on_before_optimizer_step, steps, and counts
  // one global step (Lightning's manual-optimization global_step). Schedules
  // are not stepped: in manual optimization that is the user's call
  // (lr_schedulers()). Does not synchronize the device.
  void step();
  void zero_grad(bool set_to_none = true);
  // See ToggledModel. Keep the result alive for the scope: `auto toggled = opt.toggle_model(sync);`.
  [[nodiscard]] ToggledModel toggle_model(bool sync_grad = true);

 private:
  TrainModule* module_;
  size_t index_;
};

class TrainModule {
 public:
  virtual ~TrainModule() = default;

  // The model whose parameters are trained, moved and saved.
  virtual nn::Module& model() = 0;
  // Automatic optimization: returns the loss, which the trainer backpropagates.
  // Manual optimization: optimizes itself; the return value (may be undefined) is ignored.
  virtual Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  virtual void validation_step(const Batch&, int64_t) {}
  virtual void test_step(const Batch&, int64_t) {}
  // Returns predictions for a batch (Trainer::predict).
  virtual Tensor predict_step(const Batch& batch, int64_t) { return model().forward(batch.input); }
  virtual OptimizerConfigs configure_optimizers() = 0;

  // Optional hooks with Lightning's names.
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_validation_epoch_end() {}

  // Records a metric of the current stage. Defaults as Lightning: in training
  // on_step=true, on_epoch=false; in validation and test, and in
  // on_train_epoch_end, on_step=false, on_epoch=true. `value` stays on its device; epoch values are averaged
  // (weighted by batch_size) when the epoch ends (and over the ranks with DDP).
  void log(const std::string& name, const Tensor& value, std::optional<bool> on_step = std::nullopt,
           std::optional<bool> on_epoch = std::nullopt, bool prog_bar = false, int64_t batch_size = 1);

  // The trainer running this module (null outside fit/validate/test).
  Trainer* trainer() const { return trainer_; }

  // --- manual optimization (Lightning's names)
  // false: training_step optimizes itself (set it in the constructor).
  bool automatic_optimization = true;
  // Handles of the configured optimizers, in order. Throws kiln::Error outside fit.
  std::vector<OptimizerHandle> optimizers();
  // The same as an array for structured bindings: `auto [g_opt, d_opt] = optimizers<2>();`.
  // Throws kiln::Error unless exactly N optimizers are configured.
  template <size_t N>
  std::array<OptimizerHandle, N> optimizers() {
    check_optimizer_count(N);
    return handles(std::make_index_sequence<N>{});
  }
  // The configured schedules (the optimizers' that have one), in order.
  std::vector<optim::LRScheduler*> lr_schedulers();
  // loss.backward(), for manual optimization (throws kiln::Error in automatic
  // mode); with precision "16-mixed" the backward of the scaled loss.
  void manual_backward(const Tensor& loss);
  // Freezes the parameters that belong only to the other optimizers (Lightning's
  // toggle_optimizer); untoggle_optimizer restores them. Prefer toggle_model's guard.
  void toggle_optimizer(const OptimizerHandle& optimizer);
  void untoggle_optimizer(const OptimizerHandle& optimizer);
  // Clips the gradients of `optimizer`'s parameters (after finishing a pending
  // DDP synchronization; with "16-mixed" after unscaling them, once per step):
  // "norm" takes effect in its next step(), "value" at once.
  void clip_gradients(const OptimizerHandle& optimizer, double gradient_clip_val,
                      const std::string& gradient_clip_algorithm = "norm");

 private:
  friend class Trainer;
  friend class OptimizerHandle;
  friend class LogRecording;
  Trainer& attached_trainer(const char* what) const;
  void check_optimizer_count(size_t expected) const;
  template <size_t... I>
  std::array<OptimizerHandle, sizeof...(I)> handles(std::index_sequence<I...>) {
    return {OptimizerHandle(*this, I)...};
  }
  // Freezes the parameters that belong only to optimizers other than `index`; returns what it changed.
  std::vector<std::pair<Tensor, bool>> freeze_other_optimizers(size_t index);

  Trainer* trainer_ = nullptr;
  std::string stage_ = "train";  // "train", "train_epoch_end", "validate", "test"
  std::map<std::string, LoggedValue> logged_;
  std::vector<std::string> order_;
  std::vector<RecordedLog>* log_recording_ = nullptr;  // set by a LogRecording
  std::vector<std::pair<Tensor, bool>> toggled_state_;  // toggle_optimizer's saved flags
};

}  // namespace kiln
