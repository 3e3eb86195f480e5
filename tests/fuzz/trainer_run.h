// The fit a fuzzed trainer checkpoint resumes, shared by fuzz_trainer_checkpoint
// and the seed writer: a tiny CPU regression (Linear(3, 1), SGD with momentum)
// that logs an epoch value, a shuffled DataLoader of 8 examples in batches of
// 2, and the callbacks that keep state: EarlyStopping, ModelCheckpoint (into
// `root`), Timer and StochasticWeightAveraging (from the first epoch, so its
// SWALR schedule and average are in the checkpoints).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/generator.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "trainer/swa_callback.h"
#include "trainer/timer.h"
#include "trainer/trainer.h"

namespace kiln::fuzz {

struct TinyRegression : TrainModule {
  TinyRegression() {
    manual_seed(3);
    net = std::make_shared<nn::Linear>(3, 1);
  }
  nn::Module& model() override { return *net; }
  Tensor training_step(const Batch& batch, int64_t) override {
    const Tensor error = sub(net->forward(batch.input), batch.target);
    Tensor loss = mean(mul(error, error));
    log("loss", loss, /*on_step=*/false, /*on_epoch=*/true);
    return loss;
  }
  OptimizerConfigs configure_optimizers() override {
    return OptimizerConfig{
        std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9})};
  }
  std::shared_ptr<nn::Linear> net;
};

struct TrainerRun {
  // Trains until global_step reaches max_steps (or 3 epochs).
  TrainerRun(const std::filesystem::path& root, int64_t max_steps) {
    options.accelerator = "cpu";
    options.default_root_dir = root.string();
    options.enable_progress_bar = false;
    options.logger = false;
    options.num_sanity_val_steps = 0;
    options.deterministic = true;
    options.max_epochs = 3;
    options.max_steps = max_steps;
    EarlyStoppingOptions early;
    early.monitor = "loss";
    early.strict = false;
    ModelCheckpointOptions checkpoints;
    checkpoints.dirpath = (root / "checkpoints").string();
    StochasticWeightAveragingOptions swa;
    swa.swa_lrs = {0.01};
    swa.swa_epoch_start = int64_t{1};
    options.callbacks = {std::make_shared<EarlyStopping>(early), std::make_shared<ModelCheckpoint>(checkpoints),
                         std::make_shared<Timer>(), std::make_shared<StochasticWeightAveraging>(swa)};
  }

  // fit(ckpt_path); `extra` callbacks run after the built-in ones.
  void fit(const std::string& ckpt_path, std::vector<std::shared_ptr<Callback>> extra = {}) {
    TrainerOptions with_extra = options;
    with_extra.callbacks.insert(with_extra.callbacks.end(), extra.begin(), extra.end());
    Trainer trainer(with_extra);
    trainer.fit(module, loader, nullptr, ckpt_path);
  }

  TrainerOptions options;
  TinyRegression module;
  // 8 examples: inputs (8, 3) and targets (8, 1), made without the generator.
  DataLoader loader{std::make_shared<TensorDataset>(arange(0.0, 24.0, 1.0, {.dtype = DType::f32}).reshape({8, 3}),
                                                    arange(0.0, 8.0, 1.0, {.dtype = DType::f32}).reshape({8, 1})),
                    DataLoaderOptions{.batch_size = 2, .shuffle = true, .seed = 5}};
};

}  // namespace kiln::fuzz
