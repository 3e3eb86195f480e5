// TensorBoardHistograms: histograms of the weights and gradients in
// TensorBoard every n optimizer steps, opt-in (torch users call
// SummaryWriter.add_histogram from on_before_optimizer_step for this; Lightning
// has no built-in callback). Tags "weights/<parameter name>" and
// "grads/<parameter name>", names as Module::named_parameters gives them.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "trainer/callbacks.h"

namespace kiln {

class TensorBoardLogger;

// Writes in on_before_optimizer_step, where the gradients are complete:
// accumulated, averaged over DDP ranks and unscaled under "16-mixed", before
// clipping. Each optimizer's parameters are logged at its first step in every
// window [k * n, (k + 1) * n) of global steps, at that step (steps 0, n, 2n,
// ... with one optimizer; with two that alternate, as train_gan's, each at its
// own first step of the window). A gradient holding NaN or inf (a step the
// grad scaler skips) is left out, said once on stderr. Only rank 0 writes (the
// only rank with loggers); without a TensorBoardLogger among the Trainer's
// loggers it writes nothing and says so once on stderr. Reads every logged
// tensor to the host: synchronizes the device at the steps it logs.
class TensorBoardHistograms : public Callback {
 public:
  // Throws kiln::Error for every_n_steps < 1.
  explicit TensorBoardHistograms(int64_t every_n_steps);
  std::string name() const override { return "TensorBoardHistograms"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override;
  void on_before_optimizer_step(Trainer& trainer, TrainModule& module, optim::Optimizer& optimizer) override;
  // It reads the parameters and gradients to the host every every_n_steps steps.
  bool host_work_before_optimizer_step() const override { return true; }

  int64_t every_n_steps() const { return every_n_steps_; }

 private:
  int64_t every_n_steps_;
  TensorBoardLogger* logger_ = nullptr;  // of the current fit; null: nothing to write to
  bool said_no_logger_ = false, said_non_finite_ = false;
  std::map<const optim::Optimizer*, int64_t> logged_window_;  // the last window each optimizer was logged in
};

}  // namespace kiln
