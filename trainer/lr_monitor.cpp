#include "trainer/lr_monitor.h"

#include "trainer/trainer.h"

namespace kiln {

LearningRateMonitor::LearningRateMonitor(LearningRateMonitorOptions options) : options_(std::move(options)) {
  KILN_CHECK(!options_.logging_interval || *options_.logging_interval == "step" ||
                 *options_.logging_interval == "epoch",
             "LearningRateMonitor: logging_interval must be \"step\", \"epoch\" or unset, got '",
             options_.logging_interval.value_or(""), "'");
}

void LearningRateMonitor::on_train_start(Trainer& trainer, TrainModule&) {
  KILN_CHECK(!trainer.loggers().empty(),
             "Cannot use LearningRateMonitor callback with a Trainer that has no logger (logger=false or fast_dev_run)");
  last_logged_step_ = -1;
}

// Lightning's names: "lr-SGD", a second SGD "lr-SGD-1", groups "lr-SGD/pg1", ...
std::map<std::string, double> LearningRateMonitor::current_values(Trainer& trainer) const {
  std::map<std::string, double> values;
  std::map<std::string, int64_t> seen;  // optimizers of each type so far
  for (int64_t index = 0; index < trainer.num_optimizers(); ++index) {
    const optim::Optimizer& optimizer = trainer.optimizer(static_cast<size_t>(index));
    const int64_t earlier = seen[optimizer.name()]++;
    const std::string base = "lr-" + optimizer.name() + (earlier > 0 ? "-" + std::to_string(earlier) : "");
    for (int64_t g = 0; g < optimizer.num_groups(); ++g) {
      const std::string key = optimizer.num_groups() == 1 ? base : base + "/pg" + std::to_string(g + 1);
      values[key] = optimizer.lr(g).item<double>();
      if (options_.log_momentum) values[key + "-momentum"] = optimizer.momentum(g).item<double>();
      if (options_.log_weight_decay) values[key + "-weight_decay"] = optimizer.group_options(g).weight_decay;
    }
  }
  return values;
}

void LearningRateMonitor::log(Trainer& trainer) {
  last_logged_ = current_values(trainer);
  for (const auto& logger : trainer.loggers()) {
    logger->log_metrics(last_logged_, trainer.global_step(), trainer.current_epoch());
  }
}

// Lightning's logging_interval=None logs a schedule at its own interval and an
// optimizer without one at both. The Trainer does not expose the schedule's
// interval yet, so a schedule is taken as stepped per optimizer step there.
void LearningRateMonitor::on_train_batch_start(Trainer& trainer, TrainModule&, int64_t) {
  if (options_.logging_interval == "epoch") return;
  // Once per optimizer step (micro-batches of one step share it), on
  // Lightning's cadence: when the step about to run completes a log_every_n_steps period.
  const int64_t step = trainer.global_step();
  const bool due = (step + 1) % trainer.options().log_every_n_steps == 0 || trainer.should_stop;
  if (!due || step == last_logged_step_) return;
  last_logged_step_ = step;
  log(trainer);
}

void LearningRateMonitor::on_train_epoch_start(Trainer& trainer, TrainModule&) {
  if (options_.logging_interval == "step") return;
  if (!options_.logging_interval && trainer.lr_scheduler() != nullptr) return;  // logged per step (see above)
  log(trainer);
}

}  // namespace kiln
