#include "trainer/finder_support.h"

#include <cmath>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "optim/clip_grad.h"
#include "trainer/trainer.h"

namespace kiln::detail {

TrainingSnapshot::TrainingSnapshot(nn::Module& model, optim::Optimizer& optimizer, DataLoader* loader)
    : model_(model), optimizer_(optimizer), loader_(loader), training_(model.is_training()) {
  NoGradGuard no_grad;
  // state_dict() tensors alias the live ones: clone to keep the values.
  for (auto& [name, tensor] : model.state_dict()) model_state_.emplace_back(name, tensor.clone());
  for (const Tensor& parameter : model.parameters()) {
    gradients_.push_back(parameter.grad().defined() ? parameter.grad().clone() : Tensor());
  }
  optimizer_state_ = optimizer.state_dict();
  for (auto& [name, tensor] : optimizer_state_.tensors) tensor = tensor.clone();
  if (loader) loader_state_ = loader->state_dict();
  generators_.emplace_back(Device::cpu(), default_generator(Device::cpu()).state());
  if (optimizer.device().is_cuda()) {
    generators_.emplace_back(optimizer.device(), default_generator(optimizer.device()).state());
  }
}

void TrainingSnapshot::restore() {
  NoGradGuard no_grad;
  model_.load_state_dict(model_state_, /*strict=*/true);
  const std::vector<Tensor> parameters = model_.parameters();
  for (size_t i = 0; i < parameters.size() && i < gradients_.size(); ++i) {
    if (gradients_[i].defined()) {
      parameters[i].set_grad(gradients_[i].clone());
    } else {
      parameters[i].zero_grad_(/*set_to_none=*/true);
    }
  }
  model_.train(training_);
  optimizer_.load_state_dict(optimizer_state_);
  if (loader_) loader_->load_state_dict(loader_state_);
  for (const auto& [device, state] : generators_) default_generator(device).set_state(state);
}

void check_supported(const Trainer& trainer, const TrainModule& module, const char* finder) {
  KILN_CHECK(module.automatic_optimization, finder,
             " needs automatic optimization (training_step returning the loss); this module optimizes manually");
  KILN_CHECK(trainer.world_size() == 1, finder, " runs in a single process; this run has ", trainer.world_size(),
             " (find the value in a single-process run and pass it to the distributed one)");
}

StepSettings step_settings(const Trainer& trainer) {
  const TrainerOptions& options = trainer.options();
  StepSettings settings;
  settings.accumulate_grad_batches = options.accumulate_grad_batches;
  for (const auto& [from, k] : options.accumulation_schedule) {
    if (trainer.current_epoch() >= from) settings.accumulate_grad_batches = k;
  }
  settings.gradient_clip_val = options.gradient_clip_val;
  settings.gradient_clip_algorithm = options.gradient_clip_algorithm;
  settings.autocast_dtype = trainer.autocast_dtype();
  if (const optim::GradScaler* scaler = trainer.scaler()) {
    settings.loss_scaling = scaler->options();
    settings.loss_scaling->init_scale = scaler->get_scale();  // a resumed run's scale, not the initial one
  }
  return settings;
}

int64_t limited_train_batches(const Trainer& trainer, const DataLoader& loader) {
  return trainer.options().limit_train_batches.of(loader.size(), "limit_train_batches");
}

FinderLoop::FinderLoop(TrainModule& module, optim::Optimizer& optimizer, DataLoader& loader, int64_t batches_per_epoch,
                       const StepSettings& settings)
    : module_(module),
      optimizer_(optimizer),
      loader_(loader),
      batches_per_epoch_(batches_per_epoch),
      settings_(settings),
      epoch_(loader.epoch()),
      batch_in_epoch_(loader.position()),
      device_(optimizer.device()) {
  KILN_CHECK(batches_per_epoch_ > 0, "the training loader has no batches (", loader.size(),
             " per epoch, limit_train_batches leaves ", batches_per_epoch_, ")");
  KILN_CHECK(settings_.accumulate_grad_batches >= 1, "accumulate_grad_batches must be >= 1");
  if (settings_.loss_scaling) scaler_.emplace(*settings_.loss_scaling);
  for (const Tensor& parameter : module.model().parameters()) {
    if (is_floating(parameter.dtype())) {
      param_dtype_ = parameter.dtype();
      break;
    }
  }
}

Batch FinderLoop::next_batch() {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (batch_in_epoch_ >= batches_per_epoch_) {
      loader_.set_epoch(++epoch_);
      batch_in_epoch_ = 0;
    }
    if (std::optional<Batch> batch = loader_.next()) return std::move(*batch);
    batch_in_epoch_ = batches_per_epoch_;  // the loader's epoch ended early: start the next one
  }
  KILN_THROW("the training loader yields no batches (epoch ", epoch_, ")");
}

Tensor FinderLoop::step() {
  const int64_t accumulate = settings_.accumulate_grad_batches;
  module_.model().train();
  while (true) {
    Batch batch = next_batch();
    const int64_t batch_idx = batch_in_epoch_++;
    const Batch moved = batch_to_module(batch, device_, param_dtype_);  // as the Trainer's
    if (device_.is_cuda()) host_batches_.hold_until_done(std::move(batch), device_.index, cuda::current_stream(device_.index));
    Tensor loss;
    {
      std::optional<AutocastGuard> autocast;  // as Trainer::autocast_region(); backward runs outside it
      if (settings_.autocast_dtype) autocast.emplace(device_.type, *settings_.autocast_dtype);
      loss = module_.training_step(moved, batch_idx);
    }
    KILN_CHECK(loss.defined() && loss.numel() == 1, "training_step must return a one-element loss tensor");
    // As Trainer::fit: the micro-batch's share of the loss, scaled so that small
    // float16 gradients survive; unscaled once before clipping sees them.
    const Tensor micro_batch_loss = accumulate > 1 ? div(loss, static_cast<double>(accumulate)) : loss;
    (scaler_ ? scaler_->scale(micro_batch_loss) : micro_batch_loss).backward();
    const bool last_batch = batch_in_epoch_ == batches_per_epoch_;
    if ((batch_idx + 1) % accumulate != 0 && !last_batch) continue;
    if (scaler_) scaler_->unscale_(optimizer_);
    optim::clip_gradients(optimizer_, settings_.gradient_clip_val, settings_.gradient_clip_algorithm);
    if (scaler_) {
      scaler_->step(optimizer_);  // skipped on the device when the gradients hold inf/NaN
      scaler_->update();
    } else {
      optimizer_.step();
    }
    optimizer_.zero_grad(/*set_to_none=*/true);
    return loss;
  }
}

}  // namespace kiln::detail
