// Learning-rate schedules, as torch.optim.lr_scheduler.
//
// A schedule is a closed-form function of its step counter (formulas in
// kernels/schedule_formulas.h, shared by the CPU code and the CUDA kernel).
// The counter is a 0-d int64 tensor on the optimizer's device, and step()
// runs one tiny kernel that advances it and writes the optimizer's lr (and
// momentum/beta1 for the cycling schedules) in device memory: no host sync.
// When the optimizer's last step was skipped because a GradScaler found
// inf/NaN, step() does not advance: schedules count optimizer steps that
// happened. Construction evaluates the schedule at step 0, as PyTorch's
// initial step does. Values match PyTorch step for step; where PyTorch's
// step() is recursive the closed form is used (equal up to rounding).
//
// Base learning rates are the groups' configured lrs (Optimizer::group_options,
// PyTorch's initial_lr); OneCycleLR and CyclicLR take theirs from their options.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/schedule_formulas.h"
#include "optim/optimizer.h"

namespace kiln::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step (unless the optimizer's last step was skipped) and writes
  // the new values into the optimizer. Does not synchronize.
  void step();
  // Advances even if the optimizer's last step was skipped (a schedule stepped
  // per epoch, not per optimizer step).
  void step_unconditionally();

  const std::string& name() const { return name_; }
  // The step counter: a 0-d int64 tensor on the optimizer's device.
  Tensor last_epoch() const { return last_epoch_; }
  // The learning rates the schedule last wrote (reads the device: synchronizes).
  std::vector<double> get_last_lr() const;
  const kernels::ScheduleProgram& program() const { return program_; }
  Optimizer& optimizer() const { return optimizer_; }

  // {"scheduler": name} + the step counter (and SWALR's start lrs). Loading
  // checks the name and group count, copies the counter and rewrites the
  // optimizer's lr for it.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 protected:
  LRScheduler(Optimizer& optimizer, const kernels::ScheduleProgram& program, std::string name,
              bool base_from_device = false);

 private:
  void apply(bool advance, bool honour_skip);

  Optimizer& optimizer_;
  kernels::ScheduleProgram program_;
  std::string name_;
  Tensor last_epoch_;
  std::vector<Tensor> base_lr_;  // SWALR: the lrs found at construction (device snapshot)
};

// base_lr * gamma^(step / step_size)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
};

// base_lr * gamma^(number of milestones <= step)
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
};

// base_lr * gamma^step
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);
};

// Linear warmup: base_lr * (start + (end - start) * min(step, total_iters) / total_iters)
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3.0, double end_factor = 1.0, int64_t total_iters = 5);
};

// eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
};

// Cosine annealing restarted after T_0, T_0 * T_mult, T_0 * T_mult^2, ... steps.
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t t_0, int64_t t_mult = 1, double eta_min = 0.0);
};

enum class AnnealStrategy { cos, linear };

struct OneCycleLROptions {
  std::vector<double> max_lr;  // one value, or one per group
  int64_t total_steps = 0;
  double pct_start = 0.3;
  AnnealStrategy anneal_strategy = AnnealStrategy::cos;
  bool cycle_momentum = true;  // momentum (SGD) or beta1 (Adam) cycles between these
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;         // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;    // final lr = initial lr / final_div_factor
  bool three_phase = false;
};

// The 1cycle policy. Past total_steps the value holds (PyTorch raises there).
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, const OneCycleLROptions& options);
};

enum class CyclicLRMode { triangular, triangular2, exp_range };

struct CyclicLROptions {
  std::vector<double> base_lr;  // one value, or one per group
  std::vector<double> max_lr;
  int64_t step_size_up = 2000;
  std::optional<int64_t> step_size_down;  // default: step_size_up; 0 (allowed, as torch): a sawtooth
  CyclicLRMode mode = CyclicLRMode::triangular;
  double gamma = 1.0;  // exp_range
  bool cycle_momentum = true;
  double base_momentum = 0.8;
  double max_momentum = 0.9;
};

class CyclicLR : public LRScheduler {
 public:
  CyclicLR(Optimizer& optimizer, const CyclicLROptions& options);
};

// Anneals each group's lr from its value at construction to swa_lr over
// anneal_epochs steps, then holds swa_lr (torch.optim.swa_utils.SWALR).
class SWALR : public LRScheduler {
 public:
  SWALR(Optimizer& optimizer, std::vector<double> swa_lr, int64_t anneal_epochs = 10,
        AnnealStrategy anneal_strategy = AnnealStrategy::cos);
};

// Runs schedulers one after another: schedulers[k] from milestones[k-1] on,
// counting from 0 there (torch's SequentialLR). Copies their programs; the
// given schedulers are not stepped afterwards.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, const std::vector<const LRScheduler*>& schedulers,
               std::vector<int64_t> milestones);
};

// ---------------------------------------------------------------- ReduceLROnPlateau
struct ReduceLROnPlateauOptions {
  bool mode_max = false;  // false: "min" (lower metric is better)
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;
  bool threshold_mode_abs = false;  // false: "rel"
  int64_t cooldown = 0;
  std::vector<double> min_lr = {0.0};  // one value, or one per group
  double eps = 1e-8;
};

// Multiplies the lrs by `factor` when the metric has not improved for
// `patience` epochs. The logic runs on the host from the metric value. When
// it reduces, it reads the groups' current lrs from the device (a sync, as
// torch reduces whatever lr the group has now) and writes the new ones.
// get_last_lr() is the lrs as of the last reduction (at first, the groups'
// configured lrs).
class ReduceLROnPlateau {
 public:
  ReduceLROnPlateau(Optimizer& optimizer, const ReduceLROnPlateauOptions& options = {});
  void step(double metric);
  // Reads a 0-d metric tensor (synchronizes the device).
  void step(const Tensor& metric);
  const std::vector<double>& get_last_lr() const { return lrs_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  double best() const { return best_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  bool is_better(double value) const;

  Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_;
  std::vector<double> lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
  int64_t last_epoch_ = 0;
};

}  // namespace kiln::optim
