// The Trainer's optimizer steps (automatic and manual optimization, with the
// GradScaler, clipping and the step-interval schedules) and its optimizer
// accessors. Split from trainer.cpp to keep it small.
#include "trainer/trainer.h"

#include <algorithm>

#include "optim/clip_grad.h"

namespace kiln {

void Trainer::finish_pending_gradient_sync() {
  nn::DistributedDataParallel* ddp = strategy_.ddp();
  if (ddp != nullptr && ddp->gradient_sync_pending()) ddp->finish_gradient_sync();
}

std::optional<AutocastGuard> Trainer::autocast_region() const {
  if (!autocast_dtype_) return std::nullopt;
  return std::optional<AutocastGuard>(std::in_place, device_.type, *autocast_dtype_);
}

void Trainer::apply_precision(optim::Optimizer& optimizer) const {
  // Lightning's bf16-true: the optimizer state in bfloat16 too, no float32 copy
  // (torch's optimizers keep the state in the parameters' dtype).
  if (options_.precision == "bf16-true") optimizer.set_master_weights(false);
}

void Trainer::unscale_gradients(optim::Optimizer& optimizer) {
  if (!scaler_ || std::find(unscaled_.begin(), unscaled_.end(), &optimizer) != unscaled_.end()) return;
  scaler_->unscale_(optimizer);
  unscaled_.push_back(&optimizer);
}

void Trainer::step_optimizer(optim::Optimizer& optimizer) {
  if (!scaler_) {
    optimizer.step();
    return;
  }
  scaler_->step(optimizer);  // skipped on the device when the gradients hold inf/NaN
  scaler_->update();         // the new scale, on the device
  unscaled_.clear();
}

void Trainer::optimizer_step(TrainModule& module) {
  optim::Optimizer& optimizer = *optimizers_.front().optimizer;
  // Averaged gradients before the callbacks and clipping see them.
  if (nn::DistributedDataParallel* ddp = strategy_.ddp()) ddp->finish_gradient_sync();
  // As Lightning's MixedPrecision plugin: unscale once, then callbacks and
  // clipping see the true gradients, then the scaler steps and updates.
  unscale_gradients(optimizer);
  call_callbacks("on_before_optimizer_step",
                 [&](Callback& c) { c.on_before_optimizer_step(*this, module, optimizer); });
  {
    // Unlike Lightning's, whose closure runs training_step and backward inside optimizer_step.
    auto step_scope = profiler_->profile(module_action("optimizer_step"));
    optim::clip_gradients(optimizer, options_.gradient_clip_val, options_.gradient_clip_algorithm);
    step_optimizer(optimizer);
  }
  {
    auto zero_grad_scope = profiler_->profile(module_action("optimizer_zero_grad"));
    if (graph_step_ && graph_step_->keeps_gradients()) {
      // The accumulation graphs add into these very tensors (cuda_graph_step.h).
      for (int64_t g = 0; g < optimizer.num_groups(); ++g) CudaGraphStep::clear_gradients(optimizer.params(g));
    } else {
      optimizer.zero_grad(true);
    }
  }
  const OptimizerConfig& config = optimizers_.front();
  // A step the scaler skipped (inf/NaN) does not advance the schedule: step()
  // reads the optimizer's found-inf flag on the device.
  if (config.scheduler && config.interval == "step") {
    auto scheduler_scope = profiler_->profile(module_action("lr_scheduler_step"));
    config.scheduler->step();
  }
  ++global_step_;
}

void Trainer::manual_optimizer_step(size_t index) {
  optim::Optimizer& opt = optimizer(index);
  finish_pending_gradient_sync();
  unscale_gradients(opt);
  call_callbacks("on_before_optimizer_step", [&](Callback& c) { c.on_before_optimizer_step(*this, *module_, opt); });
  {
    auto step_scope = profiler_->profile(strategy_action("optimizer_step"));
    step_optimizer(opt);
  }
  ++global_step_;
}

void Trainer::log_to_loggers(const std::map<std::string, double>& metrics, int64_t step) {
  for (auto& logger : loggers_) logger->log_metrics(metrics, step, epoch_);
  if (loggers_.empty()) return;
  curves_.record(metrics, step);
  // The learning rates for the curves, read only when a row is logged (a host
  // read of the device values), named as LearningRateMonitor names them.
  std::map<std::string, double> rates;
  std::map<std::string, int64_t> seen;
  for (const OptimizerConfig& config : optimizers_) {
    const optim::Optimizer& optimizer = *config.optimizer;
    const int64_t earlier = seen[optimizer.name()]++;
    const std::string base = "lr-" + optimizer.name() + (earlier > 0 ? "-" + std::to_string(earlier) : "");
    for (int64_t g = 0; g < optimizer.num_groups(); ++g) {
      const std::string key = optimizer.num_groups() == 1 ? base : base + "/pg" + std::to_string(g + 1);
      if (metrics.count(key) == 0) rates[key] = optimizer.lr(g).item<double>();
    }
  }
  curves_.record(rates, step);
}

std::string Trainer::training_curves_path() const {
  return loggers_.empty() ? std::string() : log_dir_ + "/training_curves.svg";
}

void Trainer::write_training_curves() {
  if (loggers_.empty() || curves_.empty()) return;
  curves_.write(training_curves_path());
}

void Trainer::save_loggers() {
  for (auto& logger : loggers_) logger->save();
}

optim::Optimizer& Trainer::optimizer(size_t index) {
  KILN_CHECK(!optimizers_.empty(), "Trainer::optimizer(): no optimizer before fit() configured one");
  KILN_CHECK(index < optimizers_.size(), "Trainer::optimizer(", index, "): configure_optimizers returned ",
             optimizers_.size());
  return *optimizers_[index].optimizer;
}

optim::LRScheduler* Trainer::lr_scheduler(size_t index) {
  return index < optimizers_.size() ? optimizers_[index].scheduler.get() : nullptr;
}

const std::string& Trainer::lr_scheduler_interval(size_t index) const {
  KILN_CHECK(index < optimizers_.size(), "Trainer::lr_scheduler_interval(", index, "): configure_optimizers returned ",
             optimizers_.size(), " optimizer(s)", optimizers_.empty() ? " (none before fit())" : "");
  return optimizers_[index].interval;
}

void Trainer::set_lr_scheduler(std::unique_ptr<optim::LRScheduler> scheduler, const std::string& interval) {
  KILN_CHECK(interval == "step" || interval == "epoch", "set_lr_scheduler: interval must be \"step\" or \"epoch\", got '",
             interval, "'");
  KILN_CHECK(!optimizers_.empty(), "set_lr_scheduler: no optimizer before fit() configured one");
  if (graph_step_ && graph_step_->captured(MicroBatchKind::step)) {
    // Graph B steps the old schedule (whose memory goes now) at the old interval.
    graph_step_->give_up("the LR schedule was replaced during fit (set_lr_scheduler, e.g. by "
                         "StochasticWeightAveraging) after the step was captured", is_global_zero());
  }
  optimizers_.front().scheduler = std::move(scheduler);
  optimizers_.front().interval = interval;
}

}  // namespace kiln
