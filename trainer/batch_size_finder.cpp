#include "trainer/batch_size_finder.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "core/allocator.h"
#include "core/saved_json.h"
#include "trainer/finder_support.h"
#include "trainer/trainer.h"

namespace kiln {

namespace {

void check_options(const BatchSizeFinderOptions& options) {
  KILN_CHECK(options.mode == "power" || options.mode == "binsearch",
             "BatchSizeFinder: mode must be \"power\" or \"binsearch\", got '", options.mode, "'");
  KILN_CHECK(options.steps_per_trial >= 1, "BatchSizeFinder: steps_per_trial must be >= 1, got ",
             options.steps_per_trial);
  KILN_CHECK(options.init_val >= 1, "BatchSizeFinder: init_val must be >= 1, got ", options.init_val);
  KILN_CHECK(options.max_trials >= 1, "BatchSizeFinder: max_trials must be >= 1, got ", options.max_trials);
  KILN_CHECK(options.max_val >= options.init_val, "BatchSizeFinder: max_val (", options.max_val,
             ") must be at least init_val (", options.init_val, ")");
}

// Runs trials at given sizes and remembers how they went.
class TrialRunner {
 public:
  TrialRunner(TrainModule& module, optim::Optimizer& optimizer, const DataLoader& prototype,
              const detail::StepSettings& settings, int64_t steps_per_trial)
      : module_(module),
        optimizer_(optimizer),
        // Trial loaders read the prototype's data set, which outlives them: no ownership needed.
        dataset_(std::shared_ptr<const Dataset>(), &prototype.dataset()),
        loader_options_(prototype.options()),
        settings_(settings),
        steps_per_trial_(steps_per_trial) {}

  bool fits(int64_t batch_size) {
    bool out_of_memory = false;
    try {
      DataLoaderOptions options = loader_options_;
      options.batch_size = batch_size;
      DataLoader loader(dataset_, options);
      detail::FinderLoop loop(module_, optimizer_, loader, loader.size(), settings_);
      for (int64_t step = 0; step < steps_per_trial_; ++step) loop.step();
    } catch (const OutOfMemoryError&) {
      out_of_memory = true;  // the trial's tensors and loader are gone by now
    }
    if (out_of_memory) {
      optimizer_.zero_grad(/*set_to_none=*/true);
      module_.model().zero_grad(/*set_to_none=*/true);
      release_cached_memory();
    }
    trials.push_back({batch_size, !out_of_memory});
    return !out_of_memory;
  }

  // Hands the failed trial's cached blocks back (Lightning's garbage_collection_cuda;
  // on the CPU, the cache of large blocks of core/allocator.h).
  void release_cached_memory() { empty_cache(optimizer_.device()); }

  std::vector<BatchSizeTrial> trials;

 private:
  TrainModule& module_;
  optim::Optimizer& optimizer_;
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions loader_options_;
  detail::StepSettings settings_;
  int64_t steps_per_trial_;
};

// Lightning's _run_power_scaling: double while sizes fit; after the first
// failure keep the last size that fit (halving first if nothing fit yet).
std::optional<int64_t> power_scaling(TrialRunner& runner, int64_t size, int64_t largest, int64_t max_trials) {
  std::optional<int64_t> last_fit;
  for (int64_t trial = 0; trial < max_trials; ++trial) {
    if (runner.fits(size)) {
      last_fit = size;
      if (size >= largest) break;
      size = std::min(size * 2, largest);
    } else {
      if (last_fit || size == 1) break;
      size /= 2;
    }
  }
  return last_fit;
}

// Lightning's _run_binary_scaling: double until a size fails, then bisect
// between the last success (low) and the failure (high); max_trials counts successes.
std::optional<int64_t> binary_scaling(TrialRunner& runner, int64_t size, int64_t largest, int64_t max_trials) {
  std::optional<int64_t> last_fit;
  int64_t low = 1, high = 0, successes = 0;
  while (true) {
    if (runner.fits(size)) {
      last_fit = size;
      if (++successes > max_trials) break;
      low = size;
      if (high > 0) {
        if (high - low <= 1) break;
        size = (high + low) / 2;
      } else {
        if (size >= largest) break;
        size = std::min(size * 2, largest);
      }
    } else {
      high = size;
      if (high - low <= 1) break;
      size = (high + low) / 2;
    }
  }
  // Lightning returns 1 here without trying it; try it.
  if (!last_fit && high > 1 && runner.fits(1)) last_fit = 1;
  return last_fit;
}

// Searches with trial loaders like `prototype`, training `optimizer`; everything
// the trials change is restored before returning or rethrowing.
BatchSizeFinderResult search(TrainModule& module, optim::Optimizer& optimizer, const DataLoader& prototype,
                             const detail::StepSettings& settings, const BatchSizeFinderOptions& options,
                             const char* finder) {
  const int64_t samples = prototype.state_dict().at("num_samples").get<int64_t>();
  KILN_CHECK(samples > 0, finder, ": the training loader has no samples");
  detail::TrainingSnapshot snapshot(module.model(), optimizer, nullptr);
  TrialRunner runner(module, optimizer, prototype, settings, options.steps_per_trial);
  std::optional<int64_t> found;
  try {
    const int64_t largest = std::min(samples, options.max_val);
    const int64_t first = std::min(options.init_val, largest);
    found = options.mode == "power" ? power_scaling(runner, first, largest, options.max_trials)
                                    : binary_scaling(runner, first, largest, options.max_trials);
  } catch (...) {
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  runner.release_cached_memory();
  BatchSizeFinderResult result;
  result.trials = std::move(runner.trials);
  if (!found) {
    throw OutOfMemoryError(
        detail::concat(finder, ": out of memory at every batch size tried, down to ", result.trials.back().batch_size),
        __FILE__, __LINE__);
  }
  result.batch_size = *found;
  return result;
}

}  // namespace

BatchSizeFinderResult scale_batch_size(Trainer& trainer, TrainModule& module, const DataLoader& train_loader,
                                       const BatchSizeFinderOptions& options) {
  check_options(options);
  if (trainer.options().fast_dev_run > 0) {
    BatchSizeFinderResult result;
    result.batch_size = train_loader.options().batch_size;
    return result;
  }
  detail::check_supported(trainer, module, "scale_batch_size");
  module.model().to(trainer.device(), trainer.param_dtype());  // as fit's setup: bf16-true trials in bfloat16
  OptimizerConfig config = module.configure_optimizers();
  KILN_CHECK(config.optimizer != nullptr, "scale_batch_size: configure_optimizers returned no optimizer");
  return search(module, *config.optimizer, train_loader, detail::step_settings(trainer), options, "scale_batch_size");
}

BatchSizeFinder::BatchSizeFinder(BatchSizeFinderOptions options) : options_(std::move(options)) {
  check_options(options_);
}

void BatchSizeFinder::on_fit_start(Trainer& trainer, TrainModule& module) {
  // The flag alone could outlive a resume that failed after on_load_checkpoint.
  const bool resumed = std::exchange(resumed_, false) && !trainer.ckpt_path().empty();
  // Lightning skips the search under fast_dev_run. A resumed run keeps the
  // size its checkpoint was written with (on_load_checkpoint set it): a new
  // search could change the batches of the epoch in progress.
  if (trainer.options().fast_dev_run > 0 || resumed) return;
  detail::check_supported(trainer, module, "BatchSizeFinder");
  DataLoader* loader = trainer.train_loader();
  KILN_CHECK(loader != nullptr, "BatchSizeFinder: the trainer has no training loader");
  KILN_CHECK(loader->position() == 0, "BatchSizeFinder: the training loader is inside an epoch (",
             loader->position(), " batches read); the search must run before the first batch");
  result_ = search(module, trainer.optimizer(), *loader, detail::step_settings(trainer), options_, "BatchSizeFinder");
  trainer.set_train_batch_size(result_->batch_size);
}

void BatchSizeFinder::on_load_checkpoint(Trainer& trainer, TrainModule&, const nlohmann::json& own_state) {
  resumed_ = true;
  load_state_dict(own_state);
  // Before the checkpoint's loader position loads, which must match the batch size.
  if (result_) trainer.set_train_batch_size(result_->batch_size);
}

nlohmann::json BatchSizeFinder::state_dict() const {
  nlohmann::json state = nlohmann::json::object();
  if (result_) state["optimal_batch_size"] = result_->batch_size;
  return state;
}

namespace {
// The saved size, checked; nullopt for a state saved before a search (Lightning's None).
std::optional<int64_t> saved_batch_size(const nlohmann::json& state) {
  constexpr std::string_view where = "BatchSizeFinder.load_state_dict";
  if (!saved_json::object(state, "state", where).contains("optimal_batch_size")) return std::nullopt;
  return saved_json::integer_at(state, "optimal_batch_size", where, 1);
}
}  // namespace

void BatchSizeFinder::check_state_dict(const nlohmann::json& state) const { saved_batch_size(state); }

void BatchSizeFinder::load_state_dict(const nlohmann::json& state) {
  const std::optional<int64_t> batch_size = saved_batch_size(state);
  if (batch_size) {
    result_ = BatchSizeFinderResult{*batch_size, {}};
  } else {
    result_.reset();
  }
}

}  // namespace kiln
