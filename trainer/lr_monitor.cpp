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
  // Only rank 0 holds loggers under "ddp"; the other ranks read the flags that
  // give rank 0 its loggers, so that every rank throws alike. fast_dev_run
  // passes: Lightning swaps the loggers for a DummyLogger there (kiln for none).
  const TrainerOptions& options = trainer.options();
  const bool has_logger = trainer.is_global_zero() && options.fast_dev_run == 0 ? !trainer.loggers().empty()
                                                                                : options.logger;
  KILN_CHECK(has_logger, "Cannot use LearningRateMonitor callback with a Trainer that has no logger (logger=false)");
  last_logged_step_ = -1;
}

// Lightning's names: "lr-SGD", a second SGD "lr-SGD-1", groups "lr-SGD/pg1", ...
std::map<std::string, double> LearningRateMonitor::current_values(Trainer& trainer, const std::string& interval) const {
  std::map<std::string, double> values;
  std::map<std::string, int64_t> seen;  // optimizers of each type so far (the names count all of them)
  for (int64_t index = 0; index < trainer.num_optimizers(); ++index) {
    const auto i = static_cast<size_t>(index);
    const optim::Optimizer& optimizer = trainer.optimizer(i);
    const int64_t earlier = seen[optimizer.name()]++;
    // Unset interval: a schedule's optimizer only at the schedule's own interval.
    const bool scheduled = trainer.lr_scheduler(i) != nullptr;
    if (!options_.logging_interval && scheduled && trainer.lr_scheduler_interval(i) != interval) continue;
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

void LearningRateMonitor::log(Trainer& trainer, const std::string& interval) {
  std::map<std::string, double> values = current_values(trainer, interval);
  if (values.empty()) return;
  for (const auto& [key, value] : values) trainer.set_callback_metric(key, value);
  for (const auto& logger : trainer.loggers()) {
    logger->log_metrics(values, trainer.global_step(), trainer.current_epoch());
  }
  last_logged_ = std::move(values);
}

void LearningRateMonitor::on_train_batch_start(Trainer& trainer, TrainModule&, int64_t) {
  if (options_.logging_interval == "epoch") return;
  // Once per optimizer step (micro-batches of one step share it), on
  // Lightning's cadence: when the step about to run completes a log_every_n_steps period.
  const int64_t step = trainer.global_step();
  const bool due = (step + 1) % trainer.options().log_every_n_steps == 0 || trainer.should_stop;
  if (!due || step == last_logged_step_) return;
  last_logged_step_ = step;
  log(trainer, "step");
}

void LearningRateMonitor::on_train_epoch_start(Trainer& trainer, TrainModule&) {
  if (options_.logging_interval == "step") return;
  log(trainer, "epoch");
}

}  // namespace kiln
