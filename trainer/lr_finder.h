// The learning-rate range test, as Lightning's LearningRateFinder callback and
// Tuner.lr_find: train num_training steps while the learning rate grows from
// min_lr to max_lr (exponentially or linearly), record the smoothed loss,
// stop early when it diverges, suggest the lr where the loss falls fastest,
// and put the model, optimizer, loader and random generators back exactly as
// they were. Each step reads the loss on the host (a device sync per step,
// as Lightning's .item()); the finder is a tool run once before training.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "trainer/callbacks.h"
#include "trainer/train_module.h"

namespace kiln {

class Trainer;

struct LRFinderOptions {
  double min_lr = 1e-8;
  double max_lr = 1.0;
  int64_t num_training = 100;        // optimizer steps (Lightning's num_training / num_training_steps)
  std::string mode = "exponential";  // or "linear"
  // Stop when the smoothed loss exceeds threshold * the best smoothed loss; nullopt: never.
  std::optional<double> early_stop_threshold = 4.0;
  // Apply the suggestion: the callback sets it as every group's lr of the
  // running optimizer (a schedule that computes lrs from its own options,
  // such as OneCycleLR, overrides it at its next step, as in Lightning) and
  // both forms pass it to lr_attr.
  bool update_attr = true;
  // Where update_attr writes the suggestion (Lightning's attr_name), e.g.
  // [&](double lr) { module.lr = lr; } for a configure_optimizers that reads it.
  std::function<void(double)> lr_attr;
  double beta = 0.98;  // loss smoothing (Lightning's _LRCallback)
};

// The learning rate of step `step` (0-based) of the sweep, as Lightning's
// _ExponentialLR / _LinearLR: min_lr at step 0, then with r = (step + 1) /
// num_training, min_lr * (max_lr / min_lr)^r or min_lr + r * (max_lr - min_lr).
double lr_finder_lr(const LRFinderOptions& options, int64_t step);

// The results of one sweep (Lightning's _LRFinder).
class LRFinder {
 public:
  explicit LRFinder(LRFinderOptions options = {}) : options_(std::move(options)) {}

  // Per optimizer step: the lr it used and the smoothed loss after it
  // (avg = beta * avg + (1 - beta) * loss; smoothed = avg / (1 - beta^k) at
  // step k = 1, 2, ...: an exponential average with bias correction).
  std::vector<double> lrs;
  std::vector<double> losses;
  bool stopped_early = false;  // the loss diverged before num_training steps

  // The lr at the steepest descent of the smoothed loss: the most negative
  // gradient (torch.gradient) of the loss over log10(lr) in exponential mode,
  // over lr in linear mode, among the points left after skipping skip_begin
  // at the start and skip_end at the end, non-finite losses dropped. nullopt
  // when fewer than two points remain.
  std::optional<double> suggestion(int64_t skip_begin = 10, int64_t skip_end = 1) const;
  std::optional<size_t> suggestion_index(int64_t skip_begin = 10, int64_t skip_end = 1) const;

  // Writes an SVG of loss against lr (log lr axis in exponential mode), the
  // suggestion marked by a red point when `suggest`. Throws kiln::Error when
  // the file cannot be written.
  void plot(const std::string& path, bool suggest = true) const;

  const LRFinderOptions& options() const { return options_; }

 private:
  LRFinderOptions options_;
};

// Tuner.lr_find: moves the model to the trainer's device, builds its
// optimizer with configure_optimizers (its schedule is not used), sweeps on
// `train_loader` with the trainer's accumulation, clipping and
// limit_train_batches, restores everything, and applies update_attr through
// lr_attr. Skipped under fast_dev_run (no points, no suggestion), as
// Lightning. Throws kiln::Error for invalid options, manual optimization or
// more than one process; exceptions from training_step propagate after the
// state is restored.
LRFinder lr_find(Trainer& trainer, TrainModule& module, DataLoader& train_loader, const LRFinderOptions& options = {});

// The callback: runs the sweep in on_fit_start on the trainer's optimizer and
// training loader, then applies update_attr. The results stay available.
class LearningRateFinder : public Callback {
 public:
  explicit LearningRateFinder(LRFinderOptions options = {});
  std::string name() const override { return "LearningRateFinder"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override;

  // The last sweep's results; null before one ran (or under fast_dev_run).
  const LRFinder* lr_finder() const { return result_ ? &*result_ : nullptr; }

 private:
  LRFinderOptions options_;
  std::optional<LRFinder> result_;
};

}  // namespace kiln
