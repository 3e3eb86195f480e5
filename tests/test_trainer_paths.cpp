// Trainer paths a Lightning user relies on, each against an independent
// reference: gradient clipping in automatic optimization (both algorithms,
// fp32, bf16-mixed, and 16-mixed on a GPU, where clipping must see unscaled
// gradients), gradients off in validation_step and test_step, the epochs
// check_val_every_n_epoch validates in, and worker threads that persist.
#include <doctest/doctest.h>

#include <sys/types.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;
using testing::Regression;

namespace {

using testing::max_difference;

struct ClipRun {
  std::string precision = "32-true";
  double clip_val = 0;
  std::string algorithm = "norm";
  std::string accelerator = "cpu";
};

constexpr int64_t kClipEpochs = 2;  // of 4 batches of 16

// Trainer.fit with Lightning's gradient_clip_val / gradient_clip_algorithm.
std::vector<double> fit_clipped(const ClipRun& run) {
  TrainerOptions options = testing::quiet_trainer_options();
  options.accelerator = run.accelerator;
  options.logger = false;
  options.enable_checkpointing = false;
  options.max_epochs = kClipEpochs;
  options.precision = run.precision;
  options.gradient_clip_val = run.clip_val;
  options.gradient_clip_algorithm = run.algorithm;
  Regression module;
  DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));
  Trainer(options).fit(module, loader);
  return testing::parameter_values(module.model());
}

// The same training written out by hand, with torch's recipe: forward under
// autocast (if any), backward, clip the true (never loss-scaled) gradients with
// optim::clip_grad_norm_ / clip_grad_value_, step, zero_grad. In float16 torch's
// AMP recipe: a GradScaler scales the loss, unscale_ before clipping, and its
// step skips the steps whose gradients overflowed (as the Trainer's does).
std::vector<double> reference_clipped(const ClipRun& run, Device device, std::optional<DType> autocast) {
  Regression module;  // the same initial weights as fit_clipped's
  module.model().to(device);
  DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));
  OptimizerConfig config = module.configure_optimizers();
  optim::Optimizer& optimizer = *config.optimizer;
  std::optional<optim::GradScaler> scaler;
  if (autocast == DType::f16) scaler.emplace();
  for (int64_t epoch = 0; epoch < kClipEpochs; ++epoch) {
    loader.set_epoch(static_cast<uint64_t>(epoch));
    while (std::optional<Batch> batch = loader.next()) {
      Batch moved{batch->input.to(device), batch->target.to(device)};
      Tensor loss;
      {
        std::optional<AutocastGuard> guard;
        if (autocast) guard.emplace(device.type, *autocast);
        loss = module.mean_squared_error(moved);
      }
      if (scaler) {
        scaler->scale(loss).backward();
        scaler->unscale_(optimizer);
      } else {
        loss.backward();
      }
      if (run.algorithm == "norm") {
        optim::clip_grad_norm_(module.model().parameters(), run.clip_val);
      } else {
        optim::clip_grad_value_(module.model().parameters(), run.clip_val);
      }
      if (scaler) {
        scaler->step(optimizer);
        scaler->update();
      } else {
        optimizer.step();
      }
      optimizer.zero_grad();
    }
  }
  return testing::parameter_values(module.model());
}

// fit with clipping equals the hand-written loop, and differs from fit
// without clipping (so the clip bound binds and a Trainer that skipped it fails).
void check_clipping(ClipRun run, Device device, std::optional<DType> autocast, double tolerance) {
  for (const auto& [algorithm, clip_val] : {std::pair<std::string, double>{"norm", 0.5}, {"value", 0.05}}) {
    CAPTURE(run.precision);
    CAPTURE(algorithm);
    run.algorithm = algorithm;
    run.clip_val = clip_val;
    const std::vector<double> fitted = fit_clipped(run);
    const std::vector<double> expected = reference_clipped(run, device, autocast);
    CHECK(max_difference(fitted, expected) <= tolerance);
    ClipRun unclipped = run;
    unclipped.clip_val = 0;
    CHECK(max_difference(fit_clipped(unclipped), expected) > 100 * tolerance + 1e-3);
  }
}

}  // namespace

TEST_CASE("Trainer: gradient_clip_val clips by norm and by value in automatic optimization, fp32 and bf16-mixed") {
  check_clipping({.precision = "32-true"}, Device::cpu(), std::nullopt, 1e-6);
  check_clipping({.precision = "bf16-mixed"}, Device::cpu(), DType::bf16, 1e-6);
}

TEST_CASE("Trainer: 16-mixed clips the unscaled gradients, by norm and by value [gpu]") {
  KILN_REQUIRE_GPU();
  // The GradScaler multiplies the loss by 65536: a clip applied before
  // unscaling would cut the step by that factor, far beyond the tolerance.
  check_clipping({.precision = "16-mixed", .accelerator = "gpu"}, Device::cuda(), DType::f16, 1e-4);
}

namespace {

// Records the grad mode and the model's mode in every step it sees.
struct GradModeRecorder : Regression {
  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    train_grad_modes.insert(grad_mode_enabled());
    train_modes.insert(model().is_training());
    return Regression::training_step(batch, batch_idx);
  }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    record(batch);
    Regression::validation_step(batch, batch_idx);
  }
  void test_step(const Batch& batch, int64_t) override { record(batch); }
  void record(const Batch& batch) {
    eval_grad_modes.insert(grad_mode_enabled());
    eval_modes.insert(model().is_training());
    // An output built from parameters that require grad records no graph.
    outputs_requiring_grad.insert(model().forward(batch.input).requires_grad());
    ++eval_steps;
  }
  std::set<bool> train_grad_modes, train_modes, eval_grad_modes, eval_modes, outputs_requiring_grad;
  int eval_steps = 0;
};

}  // namespace

TEST_CASE("Trainer: gradients are off in validation_step and test_step (sanity check, fit, validate, test)") {
  const fs::path root = testing::fresh_folder("paths", "grad_mode");
  GradModeRecorder module;
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.max_epochs = 2;
  options.num_sanity_val_steps = 1;
  options.val_check_interval = 0.5;  // mid-epoch validations too: training resumes with gradients
  options.logger = false;
  options.enable_checkpointing = false;
  DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));
  DataLoader val(testing::regression_data(32, 0.01), testing::seeded_loader_options(16));
  Trainer trainer(options);
  trainer.fit(module, loader, &val);
  trainer.validate(module, val);
  trainer.test(module, val);
  CHECK(module.eval_steps == 1 + 2 * 2 * 2 + 2 + 2);  // sanity, 2 epochs x 2 validations x 2 batches, validate, test
  CHECK(module.eval_grad_modes == std::set<bool>{false});
  CHECK(module.outputs_requiring_grad == std::set<bool>{false});
  CHECK(module.eval_modes == std::set<bool>{false});  // eval mode too
  CHECK(module.train_grad_modes == std::set<bool>{true});
  CHECK(module.train_modes == std::set<bool>{true});
  CHECK(grad_mode_enabled());  // restored after test()
  fs::remove_all(root);
}

namespace {

struct EpochsAtValidation : Callback {
  std::string name() const override { return "EpochsAtValidation"; }
  void on_validation_end(Trainer& trainer, TrainModule&) override {
    epochs.push_back(trainer.current_epoch());
    steps.push_back(trainer.global_step());
  }
  std::vector<int64_t> epochs, steps;
};

}  // namespace

TEST_CASE("Trainer: check_val_every_n_epoch=N validates in epochs N-1, 2N-1, ... only, and as often as val_check_interval says") {
  const fs::path root = testing::fresh_folder("paths", "every_n_epoch");
  auto run = [&](int64_t every_n, int64_t max_epochs, BatchesOrFraction interval) {
    auto recorder = std::make_shared<EpochsAtValidation>();
    TrainerOptions options = testing::quiet_trainer_options(root);
    options.logger = false;
    options.enable_checkpointing = false;
    options.callbacks = {recorder};
    options.max_epochs = max_epochs;
    options.check_val_every_n_epoch = every_n;
    options.val_check_interval = interval;
    Regression module;
    DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));  // 4 batches
    DataLoader val(testing::regression_data(32, 0.01), testing::seeded_loader_options(16));
    Trainer(options).fit(module, loader, &val);
    CHECK(module.validations == static_cast<int>(recorder->epochs.size()));
    return std::make_pair(recorder->epochs, recorder->steps);
  };
  // 7 epochs, every 3rd: after epochs 2 and 5 (0-based), not at the last epoch (Lightning does not force one).
  auto [epochs, steps] = run(3, 7, 1.0);
  CHECK(epochs == std::vector<int64_t>{2, 5});
  CHECK(steps == std::vector<int64_t>{12, 24});
  // Every 2nd epoch, twice within it.
  std::tie(epochs, steps) = run(2, 4, 0.5);
  CHECK(epochs == std::vector<int64_t>{1, 1, 3, 3});
  CHECK(steps == std::vector<int64_t>{6, 8, 14, 16});
  // N larger than the run: no validation at all.
  std::tie(epochs, steps) = run(5, 4, 1.0);
  CHECK(epochs.empty());
  fs::remove_all(root);
}

namespace {

// A TensorDataset that notes the kernel thread id (gettid) of every thread
// that writes an example: thread ids are not reused soon, unlike std::thread::id.
class ThreadRecordingDataset : public Dataset {
 public:
  explicit ThreadRecordingDataset(std::shared_ptr<TensorDataset> data) : data_(std::move(data)) {}
  int64_t size() const override { return data_->size(); }
  Example get(int64_t index) const override { return data_->get(index); }
  ExampleLayout layout() const override { return data_->layout(); }
  void get_into(int64_t index, void* input, void* target) const override {
    {
      std::lock_guard lock(mutex_);
      threads_.insert(::gettid());
    }
    data_->get_into(index, input, target);
  }
  std::set<pid_t> threads() const {
    std::lock_guard lock(mutex_);
    return threads_;
  }

 private:
  std::shared_ptr<TensorDataset> data_;
  mutable std::mutex mutex_;
  mutable std::set<pid_t> threads_;
};

}  // namespace

TEST_CASE("Trainer: persistent_workers keeps the same worker threads across epochs; without it each epoch starts new ones") {
  const fs::path root = testing::fresh_folder("paths", "persistent_workers");
  constexpr int kWorkers = 2;
  constexpr int64_t kEpochs = 3;
  for (const bool persistent : {true, false}) {
    CAPTURE(persistent);
    auto train_data = std::make_shared<ThreadRecordingDataset>(testing::regression_data(64, 0.01));
    auto val_data = std::make_shared<ThreadRecordingDataset>(testing::regression_data(32, 0.01));
    DataLoaderOptions loader_options = testing::seeded_loader_options(8);
    loader_options.num_workers = kWorkers;
    loader_options.persistent_workers = persistent;
    DataLoader loader(train_data, loader_options);
    DataLoader val(val_data, loader_options);
    TrainerOptions options = testing::quiet_trainer_options(root);
    options.max_epochs = kEpochs;
    options.logger = false;
    options.enable_checkpointing = false;
    Regression module;
    Trainer(options).fit(module, loader, &val);
    CHECK(module.validations == kEpochs);
    const std::set<pid_t> train_threads = train_data->threads(), val_threads = val_data->threads();
    CHECK(train_threads.count(::gettid()) == 0);  // the workers made every batch
    if (persistent) {
      // The threads of the first epoch made every batch of every epoch.
      CHECK(train_threads.size() <= kWorkers);
      CHECK(val_threads.size() <= kWorkers);
    } else {
      // torch's semantics: each epoch's (and each validation's) pass starts its workers.
      CHECK(train_threads.size() >= kEpochs);
      CHECK(val_threads.size() >= kEpochs);
    }
  }
  fs::remove_all(root);
}
