// What the learning-rate and batch-size finders share: a snapshot that puts a
// run back exactly as it was, and a small training loop that takes optimizer
// steps the way Trainer::fit does (accumulation, autocast, loss scaling,
// clipping) without callbacks, logging or checkpoints, as Lightning's tuners
// run fit with those disabled.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/generator.h"
#include "data/dataloader.h"
#include "data/host_batch_holder.h"
#include "optim/grad_scaler.h"
#include "trainer/train_module.h"

namespace kiln {

class Trainer;

namespace detail {

// Everything the finders' trial steps change: parameters and buffers, their
// gradients and the training mode, the optimizer's state (buffers, step
// counts, lrs and momenta on the device, group options on the host), the
// loader's position and the default random generators (as Lightning's
// isolate_rng). restore() copies the saved values back into the same
// tensors, so the run continues bit-identically.
class TrainingSnapshot {
 public:
  // `loader` may be null (the batch-size finder makes its own loaders).
  TrainingSnapshot(nn::Module& model, optim::Optimizer& optimizer, DataLoader* loader);
  void restore();

 private:
  nn::Module& model_;
  optim::Optimizer& optimizer_;
  DataLoader* loader_;
  bool training_;
  nn::StateDict model_state_;
  std::vector<Tensor> gradients_;  // per parameter of the optimizer; undefined where absent
  optim::StateDict optimizer_state_;
  nlohmann::json loader_state_;
  std::vector<std::pair<Device, GeneratorState>> generators_;
};

// How the trainer takes a step, from its options.
struct StepSettings {
  int64_t accumulate_grad_batches = 1;
  double gradient_clip_val = 0;
  std::string gradient_clip_algorithm = "norm";
  // The mixed precisions' autocast dtype: training_step runs in the same
  // autocast region as in fit (nullopt: none).
  std::optional<DType> autocast_dtype;
  // "16-mixed": the loop's own GradScaler starts from these options, with the
  // trainer scaler's current scale as init_scale (nullopt: no loss scaling).
  // The trainer's scaler is never stepped, so its scale and growth tracker
  // need no restoring and fit's first step sees them as they were.
  std::optional<optim::GradScalerOptions> loss_scaling;
};
// Throws kiln::Error naming `finder` when it cannot run here: manual optimization
// (training_step steps through the trainer) or more than one process (the
// trials would not synchronize gradients; Lightning's tuners do not support DDP either).
void check_supported(const Trainer& trainer, const TrainModule& module, const char* finder);
// The settings of `trainer` for its current epoch (accumulation schedule
// included). With a loss scaler it reads the scale (synchronizes the device).
StepSettings step_settings(const Trainer& trainer);
// Batches per epoch of `loader` under the trainer's limit_train_batches.
int64_t limited_train_batches(const Trainer& trainer, const DataLoader& loader);

// Takes optimizer steps on batches of `loader`, continuing from its position
// and going on into the next epoch when an epoch of `batches_per_epoch` ends.
class FinderLoop {
 public:
  FinderLoop(TrainModule& module, optim::Optimizer& optimizer, DataLoader& loader, int64_t batches_per_epoch,
             const StepSettings& settings);
  // Runs training_step and backward on micro-batches until one optimizer
  // step is taken (with loss scaling: skipped on the device when the
  // gradients hold inf/NaN, as in fit), and returns the unscaled loss of the
  // last micro-batch (on the device; not synchronized). Exceptions from
  // training_step propagate.
  Tensor step();

 private:
  Batch next_batch();

  TrainModule& module_;
  optim::Optimizer& optimizer_;
  DataLoader& loader_;
  int64_t batches_per_epoch_;
  StepSettings settings_;
  uint64_t epoch_;
  int64_t batch_in_epoch_;
  Device device_;
  DType param_dtype_ = DType::f32;
  std::optional<optim::GradScaler> scaler_;
  HostBatchHolder host_batches_;  // pinned batches until their copies to the GPU have run (as the Trainer's)
};

}  // namespace detail
}  // namespace kiln
