// The run a trainer checkpoint is loaded into, shared by the checkpoint fuzz
// target and the seed writer: a small MLP with BatchNorm, one optimizer with its schedule
// and a loss scaler. `config` picks the optimizer and schedule, so that the
// fuzzer reaches each one's load_state_dict (the input's first byte picks it).
#pragma once

#include <memory>

#include "core/ops.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "trainer/checkpoint_io.h"

namespace kiln::fuzz {

constexpr int kCheckpointConfigs = 4;

struct CheckpointRun {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LRScheduler> scheduler;  // null for config 3
  optim::GradScaler scaler{optim::GradScalerOptions{.init_scale = 1024.0, .growth_interval = 3}};

  explicit CheckpointRun(int config) {
    // BatchNorm brings an integer buffer (num_batches_tracked).
    model = std::make_shared<nn::Sequential>(
        std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::Tanh>(),
                                   std::make_shared<nn::BatchNorm1d>(4), std::make_shared<nn::Linear>(4, 2)});
    switch (config % kCheckpointConfigs) {
      case 0:
        optimizer = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 0.01});
        scheduler = std::make_unique<optim::StepLR>(*optimizer, 2, 0.5);
        break;
      case 1: {
        optim::AdamWOptions adamw;
        adamw.amsgrad = true;
        optimizer = std::make_unique<optim::AdamW>(model->parameters(), adamw);
        scheduler = std::make_unique<optim::OneCycleLR>(*optimizer, optim::OneCycleLROptions{.max_lr = {0.01},
                                                                                             .total_steps = 10});
        break;
      }
      case 2:
        optimizer = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
        scheduler = std::make_unique<optim::CosineAnnealingWarmRestarts>(*optimizer, 2, 2);
        break;
      default:
        optimizer = std::make_unique<optim::LAMB>(model->parameters(), optim::LAMBOptions{});
        break;
    }
  }

  std::vector<OptimizerSlot> slots() const { return {{optimizer.get(), scheduler.get()}}; }

  // One scaled training step on fixed data: it uses every piece of loaded state.
  void train_step() {
    const Tensor input = arange(0.0, 6.0, 1.0, {.dtype = DType::f32}).reshape({2, 3});
    const Tensor target = full({2, 2}, 0.5);
    const Tensor error = model->forward(input) - target;
    optimizer->zero_grad();
    scaler.scale(mean(error * error)).backward();
    scaler.step(*optimizer);
    scaler.update();
    if (scheduler != nullptr) scheduler->step();
  }
};

}  // namespace kiln::fuzz
