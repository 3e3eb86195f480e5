// Small fixtures shared by the trainer tests: scratch folders, a linear
// regression data set with a known answer, and a mid-epoch checkpoint writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "data/dataloader.h"
#include "data/dataset.h"
#include "trainer/trainer.h"

namespace kiln::testing {

// An empty folder <tmp>/kiln_<prefix>_<name>_<pid> (removed first if it exists).
std::filesystem::path fresh_folder(const std::string& prefix, const std::string& name);

// (count, 4) inputs x ~ N(0, 1) and targets x · [1, -2, 0.5, 3] + noise · N(0, 1),
// drawn after manual_seed(11), so every call gives the same data.
std::shared_ptr<TensorDataset> regression_data(int64_t count, double noise);

// A CPU trainer writing under `root`, without progress bar or sanity
// validation, in deterministic mode (so runs can be compared bit for bit).
TrainerOptions quiet_trainer_options(const std::filesystem::path& root);

// Batches of `batch_size`, shuffled (or not) with a fixed seed.
DataLoaderOptions seeded_loader_options(int64_t batch_size, bool shuffle = true);

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
