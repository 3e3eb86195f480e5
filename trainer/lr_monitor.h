// LearningRateMonitor: logs the optimizers' learning rates (and optionally
// momentum and weight decay) through the Trainer's loggers and into its
// callback_metrics, with Lightning's keys: "lr-<Optimizer>" (e.g. "lr-AdamW"),
// "lr-<Optimizer>-<N>" for the N-th further optimizer of a type,
// "lr-<Optimizer>/pg<N>" for several parameter groups, and
// "<key>-momentum" / "<key>-weight_decay".
#pragma once

#include <map>
#include <optional>
#include <string>

#include "trainer/callbacks.h"

namespace kiln {

struct LearningRateMonitorOptions {
  // "step": every log_every_n_steps optimizer steps; "epoch": at each epoch's
  // start; unset (Lightning's None): an optimizer with a schedule at the
  // schedule's interval, one without at both.
  std::optional<std::string> logging_interval;
  bool log_momentum = false;  // SGD/LARS momentum, Adam/LAMB beta1
  bool log_weight_decay = false;
};

// Reads the learning rate from the device only when it logs (every
// log_every_n_steps steps, or once an epoch), so the steps between stay sync-free.
class LearningRateMonitor : public Callback {
 public:
  explicit LearningRateMonitor(LearningRateMonitorOptions options = {});
  std::string name() const override { return "LearningRateMonitor"; }
  // Throws kiln::Error when the Trainer has no logger (as Lightning). Ranks
  // other than 0 have none under "ddp" by design: they decide from the flags.
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_start(Trainer& trainer, TrainModule& module, int64_t batch_idx) override;
  void on_train_epoch_start(Trainer& trainer, TrainModule& module) override;

  // The values it logged last (key -> value).
  const std::map<std::string, double>& last_logged() const { return last_logged_; }

 private:
  // The values of the optimizers due at `interval` ("step" or "epoch").
  std::map<std::string, double> current_values(Trainer& trainer, const std::string& interval) const;
  void log(Trainer& trainer, const std::string& interval);

  LearningRateMonitorOptions options_;
  std::map<std::string, double> last_logged_;
  int64_t last_logged_step_ = -1;
};

}  // namespace kiln
