// Stochastic weight averaging on modules: torch.optim.swa_utils'
// AveragedModel and update_bn (SWALR is in optim/lr_scheduler.h).
//
// torch's AveragedModel deep-copies the model; a kiln module cannot be copied
// generically, so an AveragedModel keeps a named copy of the model's
// parameters (and buffers), updates it from the model, and copy_to() writes
// it into a module of the same architecture (the trained model itself, or a
// second instance for evaluation). Averages of 16-bit tensors are kept in
// float32 (float64 ones in float64): a running mean of many bf16 snapshots in
// bf16 would lose most of what it averages.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/dataloader.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln::optim {

// The new average from the current one, the model's tensor (on the average's
// device, in its dtype) and the number of models averaged so far (>= 1).
using AvgFn = std::function<Tensor(const Tensor& averaged, const Tensor& current, int64_t num_averaged)>;

// torch's get_ema_avg_fn: decay * averaged + (1 - decay) * current.
AvgFn get_ema_avg_fn(double decay = 0.999);
// torch's get_swa_avg_fn: averaged + (current - averaged) / (num_averaged + 1).
AvgFn get_swa_avg_fn();

struct AveragedModelOptions {
  std::optional<Device> device;  // where the averages live; default: the model's device
  AvgFn avg_fn;                  // empty: the equal-weight running mean (one fused kernel per dtype)
  bool use_buffers = false;      // average floating buffers too; else they are copied from the model
  // Set (and avg_fn empty): the exponential moving average avg = lerp(avg, current,
  // 1 - ema_decay) (torch's get_ema_multi_avg_fn) in one fused kernel per dtype,
  // instead of the running mean; in [0, 1]. The first update copies, as every avg_fn's.
  std::optional<double> ema_decay;
};

class AveragedModel {
 public:
  // Copies the model's parameters and buffers (n_averaged() is 0). Throws
  // kiln::Error for an ema_decay outside [0, 1] or together with avg_fn.
  explicit AveragedModel(const nn::Module& model, AveragedModelOptions options = {});

  // Averages the model's current parameters in (the first call copies them).
  // Integer buffers (num_batches_tracked) are always copied. Throws kiln::Error
  // when the model's names or shapes differ from the ones at construction.
  // Synchronizes only when the averages live on another device than the model.
  void update_parameters(const nn::Module& model);

  // Writes the averaged parameters (and, with use_buffers, buffers) into a
  // module of the same architecture, converting dtype and device.
  void copy_to(nn::Module& model) const;

  int64_t n_averaged() const { return n_averaged_; }
  const nn::NamedTensors& parameters() const { return parameters_; }
  const nn::NamedTensors& buffers() const { return buffers_; }
  Device device() const { return device_; }

  // {"averager": "AveragedModel", "n_averaged"} + tensors "param.<name>" and
  // "buffer.<name>" (aliases). Loading checks names and shapes first.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  void average(const nn::NamedTensors& averages, const nn::NamedTensors& current, const char* kind);

  AveragedModelOptions options_;
  Device device_;
  nn::NamedTensors parameters_;
  nn::NamedTensors buffers_;
  int64_t n_averaged_ = 0;
};

// Recomputes the running statistics of every BatchNorm in `model` with one
// pass over its inputs (torch's update_bn): resets them, switches the layers to
// the cumulative average (momentum None), runs the model in train mode without
// gradients on each input that `next_input` returns until it returns an
// undefined tensor, then restores momenta and the training mode (also when the
// pass throws). Inputs go to `device` (default: the model's) and floating ones
// take the model's floating dtype. Does nothing (reads no input) without BatchNorm.
void update_bn(const std::function<Tensor()>& next_input, nn::Module& model,
               std::optional<Device> device = std::nullopt);

// The pass over one epoch of `loader` (from the first batch of its current
// epoch; at most max_batches when >= 0), whose position is restored afterwards.
// Inline so that kiln_optim does not link the data library.
inline void update_bn(DataLoader& loader, nn::Module& model, std::optional<Device> device = std::nullopt,
                      int64_t max_batches = -1) {
  const nlohmann::json position = loader.state_dict();
  loader.set_epoch(loader.epoch());
  int64_t taken = 0;
  update_bn(
      [&]() -> Tensor {
        if (max_batches >= 0 && taken >= max_batches) return Tensor();
        std::optional<Batch> batch = loader.next();
        if (!batch) return Tensor();
        ++taken;
        return batch->input;
      },
      model, device);
  loader.load_state_dict(position);
}

// Whether `model` contains a BatchNorm layer that tracks running statistics.
bool contains_batch_norm(nn::Module& model);

}  // namespace kiln::optim
