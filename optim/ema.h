// Weight averaging over lists of tensors: an exponential moving average (EMA)
// and SWA's equal-weight running mean. The averages are kept in float32 (float64
// for float64 params) on the params' device and updated by one multi-tensor
// kernel per dtype, without synchronizing.
//
// torch.optim.swa_utils.AveragedModel and update_bn work on a Module; they are
// left to be written against nn/module.h (WeightAverage is the tensor-level core
// they will use).
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace kiln::optim {

// avg = lerp(avg, param, 1 - decay) per update (torch's get_ema_multi_avg_fn).
// With use_num_updates the decay is min(decay, (1 + n) / (10 + n)) for the
// n-th update (TensorFlow's ExponentialMovingAverage warm-up).
class ExponentialMovingAverage {
 public:
  ExponentialMovingAverage(std::vector<Tensor> params, double decay, bool use_num_updates = false);
  // One update from the params' current values. A defined `skip_flag` (0-d
  // float32 on the device, e.g. an optimizer's found_inf) skips it on the
  // device when != 0 (num_updates counts calls either way).
  void update(const Tensor& skip_flag = Tensor());
  // Writes the averages into the params (e.g. for evaluation).
  void copy_to(const std::vector<Tensor>& params) const;
  // Swaps: store() saves the params, restore() writes them back.
  void store();
  void restore();

  const std::vector<Tensor>& averages() const { return averages_; }
  double decay() const { return decay_; }
  int64_t num_updates() const { return num_updates_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> averages_;
  std::vector<Tensor> stored_;
  double decay_;
  bool use_num_updates_;
  int64_t num_updates_ = 0;
};

// SWA's running mean: avg = avg + (param - avg) / (n + 1), the first update
// copying (AveragedModel's default avg_fn).
class WeightAverage {
 public:
  explicit WeightAverage(std::vector<Tensor> params);
  void update();
  void copy_to(const std::vector<Tensor>& params) const;
  const std::vector<Tensor>& averages() const { return averages_; }
  int64_t n_averaged() const { return n_averaged_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> averages_;
  int64_t n_averaged_ = 0;
};

}  // namespace kiln::optim
