#include <doctest/doctest.h>

#include <algorithm>

#include "core/allocator.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "tests/support/test_util.h"
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

// Runs out of "memory" above a batch size, as a model on a small GPU would.
struct MemoryHungry : TrainModule {
  explicit MemoryHungry(int64_t fits_up_to) : fits_up_to(fits_up_to) {
    manual_seed(3);
    net = std::make_shared<nn::Linear>(4, 1);
  }
  nn::Module& model() override { return *net; }
  Tensor training_step(const Batch& batch, int64_t) override {
    randn({1});  // consumes the default generator, as dropout would
    ++steps[batch.size()];
    if (batch.size() > fails_otherwise_above) KILN_THROW("not a memory problem: batch of ", batch.size());
    if (batch.size() > fits_up_to) throw OutOfMemoryError("out of memory (simulated)", __FILE__, __LINE__);
    Tensor difference = sub(net->forward(batch.input), batch.target);
    return mean(mul(difference, difference));
  }
  OptimizerConfigs configure_optimizers() override {
    OptimizerConfig config;
    optim::SGDOptions sgd;
    sgd.lr = 0.05;
    sgd.momentum = 0.9;
    config.optimizer = std::make_unique<optim::SGD>(net->parameters(), sgd);
    return config;
  }
  std::shared_ptr<nn::Linear> net;
  int64_t fits_up_to;
  int64_t fails_otherwise_above = 1 << 30;
  std::map<int64_t, int> steps;  // training_step calls per batch size
};

TrainerOptions quiet_options() {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.logger = false;
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

TEST_CASE("scale_batch_size on the GPU: a real out-of-memory error ends the doubling") {
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
