// Activation checkpointing: run a forward without saving its activations and
// recompute it during backward. The RNG state of the input's device is saved
// before the forward and restored for the recomputation, so dropout masks are
// the same and gradients equal those without checkpointing.
#pragma once

#include <functional>
#include <vector>

#include "nn/module.h"

namespace kiln::nn {

using CheckpointFunction = std::function<Tensor(const std::vector<Tensor>&)>;

// Returns fn(inputs). In grad mode, only the inputs are kept; backward
// re-runs fn with grad enabled and backpropagates through the recomputation
// (parameters used inside fn receive their gradients then).
Tensor checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs);
Tensor checkpoint(const ModulePtr& module, const Tensor& input);

// Splits a Sequential into `segments` runs of consecutive layers and
// checkpoints every run but the last (torch.utils.checkpoint.checkpoint_sequential).
Tensor checkpoint_sequential(const std::vector<ModulePtr>& layers, int segments, const Tensor& input);

// True while checkpoint() re-runs a forward inside backward. Layers with side
// effects skip them then, so a checkpointed forward changes module state
// exactly once: BatchNorm does not update its running statistics (or
// num_batches_tracked) a second time (torch updates them twice).
bool is_recomputing();

}  // namespace kiln::nn
