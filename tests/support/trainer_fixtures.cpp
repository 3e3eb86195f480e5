#include "tests/support/trainer_fixtures.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/generator.h"
#include "core/ops.h"
#include "optim/lr_scheduler.h"

namespace kiln::testing {

std::filesystem::path fresh_folder(const std::string& prefix, const std::string& name) {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("kiln_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder;
}

std::shared_ptr<TensorDataset> regression_data(int64_t count, double noise) {
  manual_seed(11);
  Tensor x = randn({count, 4});
  Tensor w = tensor<float>({1, -2, 0.5, 3}, {4, 1});
  Tensor y = add(matmul(x, w), mul(randn({count, 1}), noise));
  return std::make_shared<TensorDataset>(x, y);
}

TrainerOptions quiet_trainer_options(const std::filesystem::path& root) {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.default_root_dir = root.string();
  options.enable_progress_bar = false;
  options.num_sanity_val_steps = 0;
  options.deterministic = true;
  return options;
}

DataLoaderOptions seeded_loader_options(int64_t batch_size, bool shuffle) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = shuffle;
  options.seed = 5;
  return options;
}

SchedulerFactory step_lr(int64_t step_size, double gamma) {
  return [step_size, gamma](optim::Optimizer& optimizer) {
    return std::make_unique<optim::StepLR>(optimizer, step_size, gamma);
  };
}

Regression::Regression(RegressionOptions options) : options(std::move(options)) {
  manual_seed(3);
  net = std::make_shared<nn::Linear>(4, 1);
}

Tensor Regression::mean_squared_error(const Batch& batch) {
  Tensor difference = sub(model().forward(batch.input), batch.target);
  return mean(mul(difference, difference));
}

Tensor Regression::training_step(const Batch& batch, int64_t) {
  Tensor loss = mean_squared_error(batch);
  if (options.log_losses) log("train_loss", loss, options.train_loss_on_step, options.train_loss_on_epoch);
  ++training_steps;
  if (options.record_losses) losses.push_back(loss.item<double>());
  return loss;
}

void Regression::validation_step(const Batch& batch, int64_t) {
  Tensor loss = mean_squared_error(batch);
  if (options.log_losses) {
    log("val_loss", loss, std::nullopt, std::nullopt, false, options.val_loss_weighted ? batch.size() : 1);
  }
  ++validation_steps;
}

OptimizerConfigs Regression::configure_optimizers() {
  OptimizerConfig config;
  optim::SGDOptions sgd;
  sgd.lr = options.lr;
  sgd.momentum = options.momentum;
  config.optimizer = std::make_unique<optim::SGD>(model().parameters(), sgd);
  if (options.make_scheduler) config.scheduler = options.make_scheduler(*config.optimizer);
  config.interval = options.interval;
  return config;
}

std::vector<double> parameter_values(nn::Module& model) {
  std::vector<double> values;
  for (const Tensor& p : model.parameters()) {
    for (double v : p.detach().to(Device::cpu(), DType::f64).contiguous().to_vector<double>()) values.push_back(v);
  }
  return values;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

}  // namespace kiln::testing
