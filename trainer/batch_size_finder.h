// The batch-size finder, as Lightning's BatchSizeFinder callback and
// Tuner.scale_batch_size: run steps_per_trial optimizer steps at growing batch
// sizes until one runs out of memory (kiln::OutOfMemoryError, which the
// caching allocator throws after emptying its cache and retrying), then settle
// on the largest size that fit, and put the model, optimizer and random
// generators back exactly as they were. Any other exception propagates (after
// the state is restored).
//
// Lightning's algorithms (2.5), with three deliberate differences:
//   - the search never tries more than the loader's samples per epoch or
//     max_val (Lightning stops only after a size at or above the data set's
//     size succeeded, so it can return up to twice that);
//   - "power" returns the last size that fit when max_trials runs out (Lightning
//     returns the next, untried, doubling);
//   - when even batch size 1 runs out of memory the OutOfMemoryError is
//     rethrown (Lightning returns an untried size, or 0).
// batch_arg_name has no counterpart: scale_batch_size returns the size for the
// caller to build its loader with, and the callback sets it on the loader fit
// trains on (Trainer::set_train_batch_size). max_val is Lightning 2.6's (a
// bound for devices that never run out, such as the CPU); 2.6's margin
// (binsearch returns 5% less than it found) is not adopted: the search returns
// what it measured.
//
// The callback searches in on_fit_start, which runs after configure_optimizers
// (in kiln as in Lightning): a schedule sized there from
// estimated_stepping_batches (OneCycleLR's total_steps) keeps the old batch
// size's total. Where that matters, call scale_batch_size first and build the
// loader and the module with its result.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "trainer/callbacks.h"
#include "trainer/train_module.h"

namespace kiln {

class Trainer;

struct BatchSizeFinderOptions {
  // "power": double until a size fails, keep the last that fit. "binsearch":
  // double until a size fails, then bisect between the last success and it.
  std::string mode = "power";
  int64_t steps_per_trial = 3;  // optimizer steps per tried size
  int64_t init_val = 2;         // the first size tried
  int64_t max_trials = 25;      // power: sizes tried; binsearch: successes before stopping
  int64_t max_val = 8192;       // the largest size tried
};

struct BatchSizeTrial {
  int64_t batch_size;
  bool fits;  // false: it ran out of memory
};

struct BatchSizeFinderResult {
  int64_t batch_size = 0;              // the largest size that fit
  std::vector<BatchSizeTrial> trials;  // in the order they ran
};

// Moves the model to the trainer's device, builds its optimizer with
// configure_optimizers and searches with loaders like `train_loader` (same
// data set and options, batch_size changed; the sizes are capped at its
// samples per epoch and max_val), with the trainer's accumulation and clipping. On the
// GPU the caching allocator's cache is emptied after each failed size.
// Under fast_dev_run the search is skipped (as Lightning) and the loader's
// batch size is returned with no trials. Throws kiln::Error for invalid
// options, manual optimization or more than one process, and
// OutOfMemoryError when not even batch size 1 fits.
BatchSizeFinderResult scale_batch_size(Trainer& trainer, TrainModule& module, const DataLoader& train_loader,
                                       const BatchSizeFinderOptions& options = {});

// The callback (Lightning's BatchSizeFinder, for fit): in on_fit_start,
// searches with the trainer's optimizer, settings and training loader (as
// scale_batch_size; skipped under fast_dev_run), restores the model and
// optimizer, and makes fit train with the size found: the loader's batches,
// num_training_batches, limit_train_batches, val_check_interval and the
// progress bar follow it. The trainer's global_step does not move. The size is
// kept in checkpoints: fit(ckpt_path) applies it before the loader's position
// loads and does not search again. Throws kiln::Error for invalid options and,
// in on_fit_start, for manual optimization, more than one process or a loader
// already inside an epoch.
class BatchSizeFinder : public Callback {
 public:
  explicit BatchSizeFinder(BatchSizeFinderOptions options = {});
  std::string name() const override { return "BatchSizeFinder"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override;
  void on_load_checkpoint(Trainer& trainer, TrainModule& module, const nlohmann::json& own_state) override;
  nlohmann::json state_dict() const override;  // {"optimal_batch_size": n} once found
  void check_state_dict(const nlohmann::json& state) const override;
  void load_state_dict(const nlohmann::json& state) override;

  // The size fit trains with (Lightning's optimal_batch_size); nullopt before a
  // search ran, and under fast_dev_run (Lightning's None).
  std::optional<int64_t> optimal_batch_size() const {
    return result_ ? std::optional<int64_t>(result_->batch_size) : std::nullopt;
  }
  // The last search's result (no trials when the size came from a checkpoint); null before.
  const BatchSizeFinderResult* result() const { return result_ ? &*result_ : nullptr; }

 private:
  BatchSizeFinderOptions options_;
  std::optional<BatchSizeFinderResult> result_;
  bool resumed_ = false;  // on_load_checkpoint ran: on_fit_start keeps the saved size
};

}  // namespace kiln
