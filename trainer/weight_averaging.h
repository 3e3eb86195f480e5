// Weight averaging in the Trainer, after Lightning's WeightAveraging and
// EMAWeightAveraging callbacks: an AveragedModel (optim/swa.h) of the module's
// parameters (and, by default, buffers) is updated after optimizer steps (or
// epochs) that should_update() selects; every validation during fit runs on
// the averaged weights, and when training ends the averaged weights are
// copied into the model (so test(), predict() and an export after fit use them).
//
// EMA updates run on the averages' device, in one fused multi-tensor kernel per
// dtype (avg = lerp(avg, param, 1 - decay), torch's get_ema_multi_avg_fn);
// nothing synchronizes the device.
//
// Differences from Lightning, and why:
// - Lightning swaps the averaged and current values around a validation; here
//   the current weights are set aside and written back, because the averages are
//   float32 (float64) where the model may be bfloat16, and a swap would round them.
// - Lightning's checkpoint holds the averaged weights as its state_dict and the
//   current ones under current_model_state; a kiln checkpoint holds the current
//   (training) weights as the model's and the average in this callback's state,
//   exactly (bytes), so a resumed run continues bit for bit either way. The
//   averaged weights leave through the model after fit (--export-weights).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/swa.h"
#include "trainer/callbacks.h"

namespace kiln {

struct WeightAveragingOptions {
  std::optional<Device> device;  // where the average lives; nullopt: the model's device
  bool use_buffers = true;       // average floating buffers too (Lightning's default; BatchNorm statistics)
  optim::AvgFn avg_fn;           // neither avg_fn nor ema_decay: the equal-weight mean (SWA)
  std::optional<double> ema_decay;  // the fused EMA (see AveragedModelOptions)
};

class WeightAveraging : public Callback {
 public:
  // Throws kiln::Error for an ema_decay outside [0, 1] or given with avg_fn.
  explicit WeightAveraging(WeightAveragingOptions options = {});
  std::string name() const override { return "WeightAveraging"; }

  // Whether to update the average after the optimizer step with 0-based index
  // step_idx (global_step - 1), or after the epoch epoch_idx; exactly one is
  // set. The default: after every step (Lightning's).
  virtual bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const;

  // Makes the average from the module's current weights (Lightning's setup("fit")),
  // or from the state a checkpoint restored.
  void on_fit_start(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  // During fit: the model holds the averaged weights from on_validation_start to on_validation_end.
  void on_validation_start(Trainer& trainer, TrainModule& module) override;
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  void on_load_checkpoint(Trainer& trainer, TrainModule& module, const nlohmann::json& own_state) override;
  // {"latest_update_step", "latest_update_epoch", "average_model_state"}
  // (averaged_model_state.h; null before the average exists).
  nlohmann::json state_dict() const override;
  void check_state_dict(const nlohmann::json& state) const override;
  void load_state_dict(const nlohmann::json& state) override;

  // The running average (null before fit starts).
  const optim::AveragedModel* averaged_model() const { return average_.get(); }
  // Updates so far (the first one copies the weights).
  int64_t n_averaged() const;
  // The global_step of the latest update (0: none yet).
  int64_t latest_update_step() const { return latest_update_step_; }

 private:
  WeightAveragingOptions options_;
  std::unique_ptr<optim::AveragedModel> average_;
  std::optional<optim::StateDict> restored_average_;  // read by load_state_dict, applied in on_fit_start
  std::vector<Tensor> set_aside_;                     // the current weights during a validation
  int64_t latest_update_step_ = 0;
  int64_t latest_update_epoch_ = -1;
};

struct EMAWeightAveragingOptions {
  double decay = 0.999;               // in [0, 1]
  int64_t update_every_n_steps = 1;   // >= 1: after the steps whose 0-based index is a multiple
  std::optional<int64_t> update_starting_at_step;   // no update before this 0-based step index
  std::optional<int64_t> update_starting_at_epoch;  // also update after every epoch from this one
  std::optional<Device> device;
  bool use_buffers = true;
};

// Lightning's EMAWeightAveraging: the exponential moving average of the
// weights, updated every update_every_n_steps optimizer steps.
class EMAWeightAveraging : public WeightAveraging {
 public:
  // Throws kiln::Error naming the option for a decay outside [0, 1],
  // update_every_n_steps < 1 or a negative starting step or epoch.
  explicit EMAWeightAveraging(EMAWeightAveragingOptions options = {});
  std::string name() const override { return "EMAWeightAveraging"; }
  bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const override;
  const EMAWeightAveragingOptions& options() const { return ema_options_; }

 private:
  EMAWeightAveragingOptions ema_options_;
};

}  // namespace kiln
