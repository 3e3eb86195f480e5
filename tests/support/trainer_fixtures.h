// Small fixtures shared by the trainer tests: scratch folders, a linear
// regression data set with a known answer and the module that learns it, and
// a mid-epoch checkpoint writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataloader.h"
#include "data/dataset.h"
#include "nn/layers.h"
#include "trainer/trainer.h"

namespace kiln::testing {

// An empty folder <tmp>/kiln_<prefix>_<name>_<pid> (removed first if it exists).
std::filesystem::path fresh_folder(const std::string& prefix, const std::string& name);

// (count, 4) inputs x ~ N(0, 1) and targets x · [1, -2, 0.5, 3] + noise · N(0, 1),
// drawn after manual_seed(11), so every call gives the same data.
std::shared_ptr<TensorDataset> regression_data(int64_t count, double noise);

// Every parameter of `model` in order, as float64 on the host.
std::vector<double> parameter_values(nn::Module& model);
// The largest |a[i] - b[i]| (a and b must have the same length).
double max_difference(const std::vector<double>& a, const std::vector<double>& b);

// A CPU trainer writing under `root` (by default the Trainer's own default),
// without progress bar or sanity validation, in deterministic mode (so runs can
// be compared bit for bit).
TrainerOptions quiet_trainer_options(const std::filesystem::path& root = TrainerOptions{}.default_root_dir);

// Batches of `batch_size`, shuffled (or not) with a fixed seed.
DataLoaderOptions seeded_loader_options(int64_t batch_size, bool shuffle = true);

// Makes the lr scheduler of the optimizer configure_optimizers has just made.
using SchedulerFactory = std::function<std::unique_ptr<optim::LRScheduler>(optim::Optimizer&)>;

// StepLR(optimizer, step_size, gamma).
SchedulerFactory step_lr(int64_t step_size, double gamma);

// How testing::Regression trains and what it logs; the defaults are test_trainer.cpp's.
struct RegressionOptions {
  double lr = 0.05;
  double momentum = 0.9;
  SchedulerFactory make_scheduler;  // none when empty
  std::string interval = "step";    // when the scheduler steps: "step" or "epoch"
  // log("train_loss", loss, train_loss_on_step, train_loss_on_epoch) in
  // training_step and log("val_loss", ...) in validation_step; neither when false.
  bool log_losses = true;
  std::optional<bool> train_loss_on_step, train_loss_on_epoch;
  bool val_loss_weighted = true;  // val_loss logged with batch_size = the batch's size (else 1)
  bool record_losses = false;     // every training loss into `losses` (a read to the host)
};

// The trainer tests' module: Linear(4, 1), built right after manual_seed(3),
// fitted to regression_data's targets by SGD on the mean squared error. It
// counts its steps and epoch hooks. Its class name, "Regression", is the one
// profiler action names show.
struct Regression : TrainModule {
  explicit Regression(RegressionOptions options = {});
  nn::Module& model() override { return *net; }
  Tensor training_step(const Batch& batch, int64_t batch_idx) override;
  void validation_step(const Batch& batch, int64_t batch_idx) override;
  OptimizerConfigs configure_optimizers() override;  // SGD over model().parameters()
  void on_train_epoch_start() override { ++epoch_starts; }
  void on_train_epoch_end() override { ++epoch_ends; }
  void on_validation_epoch_end() override { ++validations; }

  // mean((model()(batch.input) - batch.target)^2).
  Tensor mean_squared_error(const Batch& batch);

  RegressionOptions options;  // read where used (the optimizer's when fit starts): may change until then
  std::shared_ptr<nn::Linear> net;
  int training_steps = 0, validation_steps = 0;  // training_step and validation_step calls
  int validations = 0, epoch_starts = 0, epoch_ends = 0;
  std::vector<double> losses;  // with options.record_losses
};

// Writes a checkpoint to `path` from on_train_batch_end once global_step
// reaches `step`, as ModelCheckpoint's every_n_train_steps does (under ddp every
// rank calls save_checkpoint: it is a collective).
struct SaveCheckpointAtStep : Callback {
  SaveCheckpointAtStep(int64_t step, std::string path) : step(step), path(std::move(path)) {}
  std::string name() const override { return "SaveCheckpointAtStep"; }
  void on_train_batch_end(Trainer& trainer, TrainModule&, int64_t) override {
    if (trainer.global_step() == step) trainer.save_checkpoint(path);
  }
  int64_t step;
  std::string path;
};

}  // namespace kiln::testing
