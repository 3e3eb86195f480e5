// WeightAveraging / EMAWeightAveraging (trainer/weight_averaging.h): the EMA
// of the trajectory a plain run takes, updated every n-th step; validations
// on the averaged weights without disturbing training; exact resume from a
// checkpoint; clear errors; and train_fashion's --ema.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/serialization.h"
#include "tests/support/run_binary.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/trainer.h"
#include "trainer/weight_averaging.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using testing::max_difference;

// The weights after every optimizer step (global_step -> weights).
struct TrajectoryRecorder : Callback {
  std::string name() const override { return "TrajectoryRecorder"; }
  void on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t) override {
    after_step[trainer.global_step()] = testing::parameter_values(module.model());
  }
  std::map<int64_t, std::vector<double>> after_step;
};

// Notes the weights its first validation batch sees, by global step.
struct ValidationWeights : testing::Regression {
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    if (batch_idx == 0) seen[trainer()->global_step()] = testing::parameter_values(model());
    testing::Regression::validation_step(batch, batch_idx);
  }
  std::map<int64_t, std::vector<double>> seen;
};

struct Run {
  std::vector<double> final_weights;
  std::map<int64_t, std::vector<double>> trajectory, validated;
};

Run fit(const fs::path& root, std::shared_ptr<Callback> averaging, std::vector<std::shared_ptr<Callback>> extra = {},
        const std::string& ckpt_path = "") {
  auto recorder = std::make_shared<TrajectoryRecorder>();
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.max_epochs = 3;
  options.val_check_interval = 0.5;  // validations after steps 2, 4, ..., 12
  options.logger = false;
  options.enable_checkpointing = false;
  options.callbacks = {recorder};
  if (averaging) options.callbacks.push_back(averaging);
  for (auto& callback : extra) options.callbacks.push_back(callback);
  ValidationWeights module;
  DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));  // 4 batches
  DataLoader val(testing::regression_data(32, 0.01), testing::seeded_loader_options(16));
  Trainer(options).fit(module, loader, &val, ckpt_path);
  return {testing::parameter_values(module.model()), recorder->after_step, module.seen};
}

// avg = the weights after step `first`, then lerp(avg, weights, 1 - decay) after each later update step.
std::vector<double> ema_of(const std::map<int64_t, std::vector<double>>& trajectory, const std::vector<int64_t>& steps,
                           double decay) {
  std::vector<double> average = trajectory.at(steps.front());
  for (size_t k = 1; k < steps.size(); ++k) {
    const std::vector<double>& weights = trajectory.at(steps[k]);
    for (size_t i = 0; i < average.size(); ++i) average[i] += (weights[i] - average[i]) * (1 - decay);
  }
  return average;
}

}  // namespace

TEST_CASE("EMAWeightAveraging: the model ends as the EMA of every 3rd step's weights; validations see the average; training is untouched") {
  const fs::path root = testing::fresh_folder("ema", "trajectory");
  const Run plain = fit(root, nullptr);
  EMAWeightAveragingOptions options;
  options.decay = 0.8;
  options.update_every_n_steps = 3;
  auto ema = std::make_shared<EMAWeightAveraging>(options);
  const Run averaged = fit(root, ema);
  // Training follows the same trajectory bit for bit: the weights set aside for each validation came back exactly.
  REQUIRE(plain.trajectory.size() == 12);
  CHECK(averaged.trajectory == plain.trajectory);
  // Updates after the steps with 0-based index 0, 3, 6, 9: global steps 1, 4, 7, 10.
  CHECK(ema->n_averaged() == 4);
  CHECK(ema->latest_update_step() == 10);
  const std::vector<double> expected = ema_of(plain.trajectory, {1, 4, 7, 10}, 0.8);
  CHECK(max_difference(averaged.final_weights, expected) < 1e-6);
  CHECK(max_difference(plain.final_weights, expected) > 1e-3);  // the average is not the last weights
  // Each validation ran on the average of the updates so far.
  const std::map<int64_t, std::vector<int64_t>> updates_before = {
      {2, {1}}, {4, {1, 4}}, {6, {1, 4}}, {8, {1, 4, 7}}, {10, {1, 4, 7, 10}}, {12, {1, 4, 7, 10}}};
  REQUIRE(averaged.validated.size() == updates_before.size());
  for (const auto& [step, updates] : updates_before) {
    CAPTURE(step);
    CHECK(max_difference(averaged.validated.at(step), ema_of(plain.trajectory, updates, 0.8)) < 1e-6);
    CHECK(plain.validated.at(step) == plain.trajectory.at(step));  // without the callback: the current weights
  }
  fs::remove_all(root);
}

TEST_CASE("EMAWeightAveraging: a run resumed from a mid-epoch checkpoint ends with the uninterrupted run's average, bit for bit") {
  const fs::path root = testing::fresh_folder("ema", "resume");
  EMAWeightAveragingOptions options;
  options.decay = 0.7;
  options.update_every_n_steps = 2;
  const std::string checkpoint = (root / "step5.safetensors").string();
  const Run whole = fit(root, std::make_shared<EMAWeightAveraging>(options),
                        {std::make_shared<testing::SaveCheckpointAtStep>(5, checkpoint)});
  REQUIRE(fs::exists(checkpoint));
  auto resumed_ema = std::make_shared<EMAWeightAveraging>(options);
  const Run resumed = fit(root, resumed_ema, {}, checkpoint);
  CHECK(resumed.final_weights == whole.final_weights);
  CHECK(resumed_ema->n_averaged() == 6);  // steps 1, 3, 5 before the checkpoint, 7, 9, 11 after
  // A fresh average (no checkpoint) from step 6 on would differ: the state mattered.
  CHECK(resumed.trajectory.begin()->first == 6);
  fs::remove_all(root);
}

TEST_CASE("EMAWeightAveraging: bad options and bad saved states are refused, naming what is wrong") {
  auto with = [](auto change) {
    EMAWeightAveragingOptions options;
    change(options);
    return testing::error_of([&] { EMAWeightAveraging{options}; });
  };
  CHECK(with([](auto& o) { o.decay = 1.5; }).find("decay must be in [0, 1], got 1.5") != std::string::npos);
  CHECK(with([](auto& o) { o.update_every_n_steps = 0; }).find("update_every_n_steps must be >= 1") != std::string::npos);
  CHECK(with([](auto& o) { o.update_starting_at_step = -1; }).find("update_starting_at_step") != std::string::npos);
  CHECK(with([](auto&) {}).empty());
  EMAWeightAveraging ema;
  CHECK(testing::error_of([&] { ema.check_state_dict({{"latest_update_step", "five"}, {"latest_update_epoch", -1}}); })
            .find("latest_update_step") != std::string::npos);
  CHECK(testing::error_of([&] {
          ema.check_state_dict({{"latest_update_step", 1}, {"latest_update_epoch", -1}, {"average_model_state", 3}});
        }).find("average_model_state") != std::string::npos);
}

TEST_CASE("EMAWeightAveraging on a GPU equals the CPU run [gpu]") {
  KILN_REQUIRE_GPU();
  auto run_on = [](const std::string& accelerator) {
    TrainerOptions options = testing::quiet_trainer_options();
    options.accelerator = accelerator;
    options.max_epochs = 2;
    options.logger = false;
    options.enable_checkpointing = false;
    options.callbacks = {std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.9})};
    testing::Regression module;
    DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));
    Trainer(options).fit(module, loader);
    return testing::parameter_values(module.model());
  };
  CHECK(max_difference(run_on("gpu"), run_on("cpu")) < 1e-5);
}

namespace {

std::map<std::string, std::vector<double>> exported_weights(const fs::path& path) {
  std::map<std::string, std::vector<double>> weights;
  for (const auto& [name, tensor] : load_safetensors(path.string()).tensors) {
    weights[name] = tensor.to(DType::f64).contiguous().to_vector<double>();
  }
  return weights;
}

}  // namespace

TEST_CASE("train_fashion --ema: decay 0 exports exactly the plain run's weights, 0.5 averaged ones; --ema with --swa is refused") {
  const fs::path root = testing::fresh_folder("ema", "cli");
  const std::string common =
      "--max-epochs 1 --limit-train-batches 6 --limit-val-batches 1 --batch-size 32 "
      "--deterministic --enable-progress-bar false --default-root-dir " + root.string() + " --export-weights ";
  auto run = [&](const std::string& name, const std::string& flags) {
    const testing::BinaryRun result =
        testing::run_built_binary("train_fashion", common + (root / (name + ".safetensors")).string() + " " + flags);
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    return exported_weights(root / (name + ".safetensors"));
  };
  const auto plain = run("plain", "");
  CHECK(run("ema0", "--ema 0") == plain);  // lerp with weight 1 is the weights themselves
  const auto averaged = run("ema05", "--ema 0.5");
  REQUIRE(averaged.size() == plain.size());
  CHECK(averaged != plain);
  const testing::BinaryRun both = testing::run_built_binary("train_fashion", "--ema 0.9 --swa");
  CHECK(both.exit_code != 0);
  CHECK(both.output.find("--swa excludes --ema") != std::string::npos);
  const testing::BinaryRun out_of_range = testing::run_built_binary("train_fashion", "--ema 1.5");
  CHECK(out_of_range.exit_code != 0);
  CHECK(out_of_range.output.find("--ema") != std::string::npos);
  // train_vit is the same program with another model: it has the flag too.
  CHECK(testing::run_built_binary("train_vit", "--help").output.find("--ema") != std::string::npos);
  fs::remove_all(root);
}
