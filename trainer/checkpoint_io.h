// Trainer checkpoints: one safetensors file holding the model ("model.*"),
// optimizer ("optimizer.*") and schedule ("scheduler.*") tensors, with the
// loop progress, data-loader position, RNG states, callback states and the
// optimizer/schedule structure as JSON in the header's __metadata__ ("kiln").
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "nn/module.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace kiln {

struct TrainerCheckpoint {
  int64_t epoch = 0;
  int64_t global_step = 0;
  int64_t batch_in_epoch = 0;
  nlohmann::json loader_state;
  std::map<std::string, nlohmann::json> callback_states;
  std::map<std::string, std::string> hyperparameters;
};

// Writes atomically (see save_safetensors).
void save_trainer_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                             const optim::LRScheduler* scheduler, const TrainerCheckpoint& progress);

// Validates the whole file before changing anything: a truncated or corrupt
// file, or one from a different model or optimizer, throws kiln::Error naming
// the file and the problem, and leaves the model and optimizer untouched.
// Restores the default generators' states too.
TrainerCheckpoint load_trainer_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer,
                                          optim::LRScheduler* scheduler);

}  // namespace kiln
