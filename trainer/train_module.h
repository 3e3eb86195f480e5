// TrainModule: what a user subclasses to train with kiln's Trainer, after
// Lightning's LightningModule. training_step returns the loss; validation_step
// and test_step log metrics; configure_optimizers returns the optimizer and an
// optional schedule with its interval ("step" or "epoch").
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "nn/module.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace kiln {

class Trainer;

struct OptimizerConfig {
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LRScheduler> scheduler;  // may be null
  std::string interval = "step";                   // "step" or "epoch"
};

// A value logged during a stage, kept on the device until it is read.
struct LoggedValue {
  Tensor sum;        // running sum over the epoch (0-d, float64, on the value's device)
  int64_t count = 0; // number of logged values (weighted by batch size)
  Tensor last;       // the latest value (for on_step)
  bool on_step = false, on_epoch = false, prog_bar = false;
};

class TrainModule {
 public:
  virtual ~TrainModule() = default;

  // The model whose parameters are trained, moved and saved.
  virtual nn::Module& model() = 0;
  virtual Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  virtual void validation_step(const Batch&, int64_t) {}
  virtual void test_step(const Batch&, int64_t) {}
  // Returns predictions for a batch (Trainer::predict).
  virtual Tensor predict_step(const Batch& batch, int64_t) { return model().forward(batch.input); }
  virtual OptimizerConfig configure_optimizers() = 0;

  // Optional hooks with Lightning's names.
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_validation_epoch_end() {}

  // Records a metric of the current stage. Defaults as Lightning: in training
  // on_step=true, on_epoch=false; in validation and test on_step=false,
  // on_epoch=true. `value` stays on its device; epoch values are averaged
  // (weighted by batch_size) when the epoch ends.
  void log(const std::string& name, const Tensor& value, std::optional<bool> on_step = std::nullopt,
           std::optional<bool> on_epoch = std::nullopt, bool prog_bar = false, int64_t batch_size = 1);

  // The trainer running this module (null outside fit/validate/test).
  Trainer* trainer() const { return trainer_; }

 private:
  friend class Trainer;
  Trainer* trainer_ = nullptr;
  std::string stage_ = "train";  // "train", "validate", "test"
  std::map<std::string, LoggedValue> logged_;
  std::vector<std::string> order_;
};

}  // namespace kiln
