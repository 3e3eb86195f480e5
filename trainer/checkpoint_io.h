// Trainer checkpoints: one safetensors file holding the model ("model.*"),
// optimizer and schedule tensors, with the loop progress, data-loader
// position, RNG states, callback states and the optimizer/schedule structure
// as JSON in the header's __metadata__ ("kiln").
//
// Optimizer i's tensors are "optimizer.*" and "scheduler.*" for i = 0 (the
// layout of single-optimizer checkpoints, which still load) and
// "optimizer_<i>.*" / "scheduler_<i>.*" after; the JSON keys follow the same names.
// The loss scaler of precision "16-mixed" is an optional section ("scaler.*"
// and the "scaler" key): files without one (other precisions, older files) still load.
// Binary values in a callback's state (StochasticWeightAveraging's averaged
// weights) are u8 tensors "callbacks/<JSON pointer into the callback states>",
// with null in their place in the JSON, so the header stays small.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace kiln {

struct TrainerCheckpoint {
  int64_t epoch = 0;
  int64_t global_step = 0;
  int64_t batch_in_epoch = 0;
  int64_t total_batches = -1;  // over all epochs; -1: a file from before it was saved
  // The epoch's on_train_epoch_end hooks had run when it was written (a
  // checkpoint saved from them); its per-epoch schedules had not stepped yet.
  bool epoch_end_hooks_done = false;
  // Written from on_train_batch_end of a batch after which a validation was
  // due (it runs after that hook): a resumed run validates before its next batch.
  bool validation_pending = false;
  nlohmann::json loader_state;
  // The Trainer's callback_metrics and the epoch's logged values so far (its own layout).
  nlohmann::json metrics;
  std::map<std::string, nlohmann::json> callback_states;
  std::map<std::string, std::string> hyperparameters;
};

// One optimizer and its schedule (null: none), as saved and loaded.
struct OptimizerSlot {
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
};

// Writes atomically (see save_safetensors). `scaler` may be null (no scaler section).
void save_trainer_checkpoint(const std::string& path, const nn::Module& model,
                             const std::vector<OptimizerSlot>& optimizers, const TrainerCheckpoint& progress,
                             const optim::GradScaler* scaler = nullptr);

// A checkpoint file read and checked, nothing applied yet: load it in stages
// (model, then callbacks, then optimizers) with the functions below.
struct TrainerCheckpointFile {
  std::string path;
  TrainerCheckpoint progress;
  nn::StateDict model;
  std::vector<optim::StateDict> optimizers;
  std::vector<std::optional<optim::StateDict>> schedulers;  // nullopt: saved without a schedule
  std::optional<optim::StateDict> scaler;                   // nullopt: saved without a loss scaler
  nlohmann::json rng;
};

// Reads the whole file and checks it: a truncated or corrupt file, one of
// another model type or one with another number of optimizers throws
// kiln::Error naming the file and the problem. Changes nothing.
TrainerCheckpointFile read_trainer_checkpoint(const std::string& path, const nn::Module& model,
                                              size_t num_optimizers);
// Loads the weights (strict); throws kiln::Error, with the model untouched, when they do not match.
void load_checkpoint_model(const TrainerCheckpointFile& file, nn::Module& model);
// Loads the optimizer and schedule states; throws kiln::Error when a schedule
// is present in only one of the file and the run, or a state does not match.
void load_checkpoint_optimizers(const TrainerCheckpointFile& file, const std::vector<OptimizerSlot>& optimizers);
// Loads the loss scaler's state when both the file and the run have one. As
// Lightning's MixedPrecision plugin, a run with a scaler resumed from a file
// without one keeps its initial scale, and a run without one (scaler null)
// ignores the file's. Throws kiln::Error for a corrupt scaler state.
void load_checkpoint_scaler(const TrainerCheckpointFile& file, optim::GradScaler* scaler);
// Restores the default generators' states (CPU and the CUDA devices present).
void load_checkpoint_rng(const TrainerCheckpointFile& file);

}  // namespace kiln
