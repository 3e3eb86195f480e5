#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/allocator.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/batch_size_finder.h"
#include "trainer/trainer.h"

using namespace kiln;

namespace {

std::shared_ptr<TensorDataset> regression_data(int64_t count) {
  manual_seed(11);
  Tensor x = randn({count, 4});
  Tensor y = matmul(x, tensor<float>({1, -2, 0.5, 3}, {4, 1}));
  return std::make_shared<TensorDataset>(x, y);
}

// testing::Regression, logging nothing, that runs out of "memory" above a
// batch size, as a model on a small GPU would.
struct MemoryHungry : testing::Regression {
  explicit MemoryHungry(int64_t fits_up_to) : testing::Regression({.log_losses = false}), fits_up_to(fits_up_to) {}
  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    randn({1});  // consumes the default generator, as dropout would
    ++steps[batch.size()];
    if (training) fit_batch_sizes.push_back(batch.size());
    if (batch.size() > fails_otherwise_above) KILN_THROW("not a memory problem: batch of ", batch.size());
    if (batch.size() > fits_up_to) throw OutOfMemoryError("out of memory (simulated)", __FILE__, __LINE__);
    return testing::Regression::training_step(batch, batch_idx);
  }
  void validation_step(const Batch& batch, int64_t) override { val_batch_sizes.push_back(batch.size()); }
  int64_t fits_up_to;
  int64_t fails_otherwise_above = 1 << 30;
  std::map<int64_t, int> steps;  // training_step calls per batch size
  bool training = false;         // set from on_train_start: fit's own steps, not the finder's trials
  std::vector<int64_t> fit_batch_sizes, val_batch_sizes;
};

TrainerOptions quiet_options() {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.logger = false;
  options.enable_checkpointing = false;  // no default ModelCheckpoint writing into the working folder
  options.enable_progress_bar = false;
  return options;
}

DataLoader make_loader(std::shared_ptr<TensorDataset> data) {
  DataLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  options.seed = 5;
  return DataLoader(std::move(data), options);
}

std::vector<int64_t> sizes(const BatchSizeFinderResult& result) {
  std::vector<int64_t> tried;
  for (const BatchSizeTrial& trial : result.trials) tried.push_back(trial.batch_size);
  return tried;
}

std::vector<bool> fits(const BatchSizeFinderResult& result) {
  std::vector<bool> outcome;
  for (const BatchSizeTrial& trial : result.trials) outcome.push_back(trial.fits);
  return outcome;
}

// Runs the finder and checks that the model and the random generator are exactly as before.
BatchSizeFinderResult run_and_check_restored(MemoryHungry& module, const BatchSizeFinderOptions& options,
                                             int64_t samples = 200) {
  auto data = regression_data(samples);
  DataLoader loader = make_loader(data);
  Trainer trainer(quiet_options());
  const Tensor weight = module.net->weight.clone(), bias = module.net->bias.clone();
  const GeneratorState generator = default_generator(Device::cpu()).state();
  BatchSizeFinderResult result = scale_batch_size(trainer, module, loader, options);
  KILN_CHECK_CLOSE(module.net->weight, weight, 0.0, 0.0);
  KILN_CHECK_CLOSE(module.net->bias, bias, 0.0, 0.0);
  CHECK_FALSE(module.net->weight.grad().defined());
  CHECK(default_generator(Device::cpu()).state().offset == generator.offset);
  CHECK(loader.position() == 0);  // the caller's loader is not used
  return result;
}

}  // namespace

TEST_CASE("scale_batch_size power: doubles until out of memory and keeps the last size that fit") {
  MemoryHungry module(/*fits_up_to=*/48);
  const BatchSizeFinderResult result = run_and_check_restored(module, {});
  CHECK(result.batch_size == 32);
  CHECK(sizes(result) == std::vector<int64_t>{2, 4, 8, 16, 32, 64});
  CHECK(fits(result) == std::vector<bool>{true, true, true, true, true, false});
  // steps_per_trial=3 optimizer steps at each size that fit; the failing size stops at its first step.
  CHECK(module.steps == std::map<int64_t, int>{{2, 3}, {4, 3}, {8, 3}, {16, 3}, {32, 3}, {64, 1}});
}

TEST_CASE("scale_batch_size binsearch: bisects between the last success and the failure") {
  MemoryHungry module(48);
  BatchSizeFinderOptions options;
  options.mode = "binsearch";
  options.steps_per_trial = 2;
  const BatchSizeFinderResult result = run_and_check_restored(module, options);
  CHECK(result.batch_size == 48);
  CHECK(sizes(result) == std::vector<int64_t>{2, 4, 8, 16, 32, 64, 48, 56, 52, 50, 49});
  CHECK(module.steps.at(48) == 2);

  MemoryHungry odd(37);
  const BatchSizeFinderResult odd_result = run_and_check_restored(odd, options);
  CHECK(odd_result.batch_size == 37);
}

TEST_CASE("scale_batch_size: init_val, max_trials and the data set's size bound the search") {
  SUBCASE("a first size that does not fit is halved, as Lightning") {
    MemoryHungry module(48);
    BatchSizeFinderOptions options;
    options.init_val = 64;
    const BatchSizeFinderResult result = run_and_check_restored(module, options);
    CHECK(sizes(result) == std::vector<int64_t>{64, 32, 64});
    CHECK(result.batch_size == 32);
  }
  SUBCASE("power stops after max_trials sizes") {
    MemoryHungry module(1 << 20);
    BatchSizeFinderOptions options;
    options.max_trials = 3;
    const BatchSizeFinderResult result = run_and_check_restored(module, options);
    CHECK(sizes(result) == std::vector<int64_t>{2, 4, 8});
    CHECK(result.batch_size == 8);
  }
  SUBCASE("binsearch stops after max_trials successes") {
    MemoryHungry module(1 << 20);
    BatchSizeFinderOptions options;
    options.mode = "binsearch";
    options.max_trials = 3;
    const BatchSizeFinderResult result = run_and_check_restored(module, options);
    CHECK(sizes(result) == std::vector<int64_t>{2, 4, 8, 16});
    CHECK(result.batch_size == 16);
  }
  SUBCASE("the search stops at max_val") {
    MemoryHungry module(1 << 20);
    BatchSizeFinderOptions options;
    options.max_val = 50;
    const BatchSizeFinderResult result = run_and_check_restored(module, options);
    CHECK(sizes(result) == std::vector<int64_t>{2, 4, 8, 16, 32, 50});
    CHECK(result.batch_size == 50);
  }
  SUBCASE("the search stops at the data set's size") {
    for (const std::string mode : {"power", "binsearch"}) {
      CAPTURE(mode);
      MemoryHungry module(1 << 20);
      BatchSizeFinderOptions options;
      options.mode = mode;
      const BatchSizeFinderResult result = run_and_check_restored(module, options, /*samples=*/100);
      CHECK(sizes(result) == std::vector<int64_t>{2, 4, 8, 16, 32, 64, 100});
      CHECK(result.batch_size == 100);
    }
  }
}

TEST_CASE("scale_batch_size: other errors propagate, state restored; nothing fitting is an OutOfMemoryError") {
  MemoryHungry module(48);
  module.fails_otherwise_above = 16;
  auto data = regression_data(200);
  DataLoader loader = make_loader(data);
  Trainer trainer(quiet_options());
  const Tensor weight = module.net->weight.clone();
  bool out_of_memory = false, other_error = false;
  try {
    scale_batch_size(trainer, module, loader);
  } catch (const OutOfMemoryError&) {
    out_of_memory = true;
  } catch (const Error& error) {
    other_error = std::string(error.what()).find("not a memory problem: batch of 32") != std::string::npos;
  }
  CHECK_FALSE(out_of_memory);
  CHECK(other_error);
  KILN_CHECK_CLOSE(module.net->weight, weight, 0.0, 0.0);  // the trials at 2..16 trained it; restored

  for (const std::string mode : {"power", "binsearch"}) {
    CAPTURE(mode);
    MemoryHungry nothing_fits(0);
    BatchSizeFinderOptions options;
    options.mode = mode;
    CHECK_THROWS_AS(scale_batch_size(trainer, nothing_fits, loader, options), OutOfMemoryError);
    CHECK(nothing_fits.steps.count(1) == 1);  // it got down to batch size 1
  }

  BatchSizeFinderOptions bad;
  bad.mode = "linear";
  CHECK_THROWS_AS(scale_batch_size(trainer, module, loader, bad), Error);
  bad = BatchSizeFinderOptions{};
  bad.init_val = 0;
  CHECK_THROWS_AS(scale_batch_size(trainer, module, loader, bad), Error);
}

TEST_CASE("scale_batch_size on the GPU: a real out-of-memory error ends the doubling [gpu] [alone]") {
  KILN_REQUIRE_GPU();
  // Each example holds 1 GiB on the device during its step: the search must stop
  // where the allocator runs out, and the cache must be handed back afterwards.
  struct GiantActivations : MemoryHungry {
    GiantActivations() : MemoryHungry(1 << 30) {}
    Tensor training_step(const Batch& batch, int64_t index) override {
      Tensor activations = empty({batch.size(), 1 << 28}, {.dtype = DType::f32, .device = batch.input.device()});
      activations.fill_(1.0);
      return MemoryHungry::training_step(batch, index);
    }
  } module;
  auto data = regression_data(1024);
  DataLoader loader = make_loader(data);
  TrainerOptions options = quiet_options();
  options.accelerator = "gpu";
  Trainer trainer(options);
  const BatchSizeFinderResult result = scale_batch_size(trainer, module, loader);
  MESSAGE("largest batch of 1 GiB examples that fits: " << result.batch_size);
  CHECK(result.batch_size >= 2);
  REQUIRE_FALSE(result.trials.empty());
  CHECK_FALSE(result.trials.back().fits);
  CHECK(result.trials.back().batch_size == 2 * result.batch_size);
  CHECK(cuda_allocator(0).stats().reserved_bytes < (size_t{1} << 30));  // the cache was emptied
}

namespace {

// What a search changes and must put back: the model, the optimizer's state
// (momentum buffers, step counts, lrs) and the default generator.
struct RunState {
  nn::StateDict model;
  optim::StateDict optimizer;
  GeneratorState generator;
  int64_t global_step = -1;
};

RunState capture(Trainer& trainer, TrainModule& module) {
  RunState state;
  for (const auto& [name, tensor] : module.model().state_dict()) state.model.emplace_back(name, tensor.clone());
  state.optimizer = trainer.optimizer().state_dict();
  for (auto& [name, tensor] : state.optimizer.tensors) tensor = tensor.clone();
  state.generator = default_generator(Device::cpu()).state();
  state.global_step = trainer.global_step();
  return state;
}

void check_same(const RunState& actual, const RunState& expected) {
  REQUIRE(actual.model.size() == expected.model.size());
  for (size_t i = 0; i < actual.model.size(); ++i) {
    CAPTURE(expected.model[i].first);
    KILN_CHECK_CLOSE(actual.model[i].second, expected.model[i].second, 0.0, 0.0);
  }
  CHECK(actual.optimizer.meta == expected.optimizer.meta);
  REQUIRE(actual.optimizer.tensors.size() == expected.optimizer.tensors.size());
  for (const auto& [name, tensor] : expected.optimizer.tensors) {
    CAPTURE(name);
    REQUIRE(actual.optimizer.tensors.count(name) == 1);
    KILN_CHECK_CLOSE(actual.optimizer.tensors.at(name), tensor, 0.0, 0.0);
  }
  CHECK(actual.generator.seed == expected.generator.seed);
  CHECK(actual.generator.offset == expected.generator.offset);
  CHECK(actual.global_step == expected.global_step);
}

// Listed before the finder: the state its search starts from.
struct BeforeSearch : Callback {
  std::string name() const override { return "BeforeSearch"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override { state = capture(trainer, module); }
  RunState state;
};

// Listed after it: marks fit's own training steps and captures the state
// fit's first real step starts from.
struct FirstTrainingBatch : Callback {
  std::string name() const override { return "FirstTrainingBatch"; }
  void on_train_start(Trainer&, TrainModule& module) override { static_cast<MemoryHungry&>(module).training = true; }
  void on_train_batch_start(Trainer& trainer, TrainModule& module, int64_t) override {
    if (!state) state = capture(trainer, module);
  }
  std::optional<RunState> state;
};

BatchSizeFinderOptions bounded(int64_t max_val) {
  BatchSizeFinderOptions options;
  options.max_val = max_val;
  return options;
}

}  // namespace

TEST_CASE("BatchSizeFinder callback: fit trains with the size found, from the state the search started from") {
  auto data = regression_data(200);
  DataLoader loader = make_loader(data);  // batch_size 8: 25 batches per epoch
  DataLoader val_loader = make_loader(regression_data(40));
  MemoryHungry module(/*fits_up_to=*/1 << 20);  // the CPU never runs out: max_val bounds the search
  auto before = std::make_shared<BeforeSearch>();
  auto finder = std::make_shared<BatchSizeFinder>(bounded(50));
  auto first_batch = std::make_shared<FirstTrainingBatch>();
  TrainerOptions options = quiet_options();
  options.max_epochs = 2;
  options.num_sanity_val_steps = 0;
  // Both follow the new 4 batches per epoch: 2 batches, validated after each.
  // From the old 25 they would be 12 batches, validated every 6.
  options.limit_train_batches = 0.5;
  options.val_check_interval = 0.5;
  options.callbacks = {before, finder, first_batch};
  Trainer trainer(options);
  trainer.fit(module, loader, &val_loader);

  CHECK(finder->optimal_batch_size() == std::optional<int64_t>(50));
  REQUIRE(finder->result() != nullptr);
  CHECK(sizes(*finder->result()) == std::vector<int64_t>{2, 4, 8, 16, 32, 50});
  CHECK(module.steps.at(2) == 3);  // steps_per_trial at each size
  CHECK(loader.options().batch_size == 50);  // fit trained on the caller's loader itself
  CHECK(trainer.num_training_batches() == 2);
  CHECK(module.fit_batch_sizes == std::vector<int64_t>{50, 50, 50, 50});
  CHECK(trainer.global_step() == 4);
  CHECK(trainer.estimated_stepping_batches(loader) == 4);
  CHECK(module.val_batch_sizes.size() == 4 * 5);  // 2 validations per epoch of 40 / 8 batches
  // The trials trained the model and made momentum buffers; fit's first step sees none of it.
  REQUIRE(first_batch->state.has_value());
  CHECK(before->state.global_step == 0);
  CHECK(before->state.optimizer.tensors.count("state.0.momentum_buffer") == 0);
  check_same(*first_batch->state, before->state);
}

TEST_CASE("BatchSizeFinder callback with overfit_batches: the trainer's copies take the size, the caller's keeps its own") {
  auto data = regression_data(200);
  DataLoader loader = make_loader(data);
  DataLoader val_loader = make_loader(regression_data(40));
  MemoryHungry module(1 << 20);
  auto finder = std::make_shared<BatchSizeFinder>(bounded(50));
  TrainerOptions options = quiet_options();
  options.max_epochs = 1;
  options.num_sanity_val_steps = 0;
  options.overfit_batches = 2;
  options.callbacks = {finder, std::make_shared<FirstTrainingBatch>()};
  Trainer trainer(options);
  trainer.fit(module, loader, &val_loader);
  CHECK(module.fit_batch_sizes == std::vector<int64_t>{50, 50});
  CHECK(module.val_batch_sizes == std::vector<int64_t>{50, 50});  // validates on the very batches it trains on
  CHECK(loader.options().batch_size == 8);
}

TEST_CASE("BatchSizeFinder callback: nothing is searched under fast_dev_run; invalid options are refused") {
  auto data = regression_data(200);
  DataLoader loader = make_loader(data);
  MemoryHungry module(1 << 20);
  auto finder = std::make_shared<BatchSizeFinder>(bounded(50));
  TrainerOptions options = quiet_options();
  options.fast_dev_run = 2;
  options.callbacks = {finder};
  Trainer trainer(options);
  trainer.fit(module, loader);
  CHECK_FALSE(finder->optimal_batch_size().has_value());
  CHECK(module.steps == std::map<int64_t, int>{{8, 2}});  // fast_dev_run's two batches and no trial
  CHECK(loader.options().batch_size == 8);

  BatchSizeFinderOptions bad;
  bad.mode = "linear";
  CHECK_THROWS_AS(BatchSizeFinder{bad}, Error);
  CHECK_THROWS_AS(BatchSizeFinder{bounded(1)}, Error);  // max_val below init_val
}

TEST_CASE("BatchSizeFinder callback: a resumed fit takes the size from its checkpoint and matches an unbroken run") {
  const std::filesystem::path checkpoint = std::filesystem::temp_directory_path() /
                                           ("kiln_batch_size_finder_" + std::to_string(::getpid()) + ".safetensors");
  auto data = regression_data(200);
  // Fits `module` up to max_steps (4 batches of 50 per epoch) and returns the number of sizes tried.
  auto fit = [&](MemoryHungry& module, int64_t max_steps, const std::string& ckpt_path, bool save) {
    DataLoader loader = make_loader(data);  // batch_size 8, as the first run's
    auto finder = std::make_shared<BatchSizeFinder>(bounded(50));
    TrainerOptions options = quiet_options();
    options.max_steps = max_steps;
    options.deterministic = true;
    options.callbacks = {finder};
    Trainer trainer(options);
    trainer.fit(module, loader, nullptr, ckpt_path);
    if (save) trainer.save_checkpoint(checkpoint.string());  // mid-epoch: after batch 3 of 4
    CHECK(loader.options().batch_size == 50);
    CHECK(finder->optimal_batch_size() == std::optional<int64_t>(50));
    CHECK(trainer.global_step() == max_steps);
    return finder->result()->trials.size();
  };
  MemoryHungry unbroken(1 << 20), first_part(1 << 20), resumed(1 << 20);
  CHECK(fit(unbroken, 6, "", false) == 6);
  CHECK(fit(first_part, 3, "", true) == 6);
  CHECK(fit(resumed, 6, checkpoint.string(), false) == 0);  // no search: the checkpoint's size
  CHECK(resumed.steps == std::map<int64_t, int>{{50, 3}});
  KILN_CHECK_CLOSE(resumed.net->weight, unbroken.net->weight, 0.0, 0.0);
  KILN_CHECK_CLOSE(resumed.net->bias, unbroken.net->bias, 0.0, 0.0);
  std::filesystem::remove(checkpoint);
}

TEST_CASE("DataLoader::set_batch_size between epochs; refused inside one, as Trainer::set_train_batch_size outside fit") {
  auto data = regression_data(200);
  for (const int workers : {0, 2}) {
    CAPTURE(workers);
    DataLoaderOptions options;
    options.batch_size = 8;
    options.num_workers = workers;
    DataLoader loader(data, options);
    const Batch first = *loader.next();  // workers now prefetch batches of 8
    CHECK_THROWS_AS(loader.set_batch_size(50), Error);
    loader.set_epoch(0);
    loader.set_batch_size(50);
    CHECK(loader.size() == 4);
    std::vector<int64_t> seen;
    while (std::optional<Batch> batch = loader.next()) seen.push_back(batch->size());
    CHECK(seen == std::vector<int64_t>{50, 50, 50, 50});
    CHECK(first.size() == 8);  // a batch handed out before keeps its buffer
    CHECK(loader.state_dict().at("batch_size").get<int64_t>() == 50);
    CHECK_THROWS_AS(loader.set_batch_size(0), Error);
  }
  Trainer trainer(quiet_options());
  CHECK_THROWS_AS(trainer.set_train_batch_size(16), Error);
}
