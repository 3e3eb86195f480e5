// Dynamic loss scaling for mixed precision, as torch.amp.GradScaler.
//
// The scale (float32) and the growth tracker (int32) are 0-d tensors on the
// device. unscale_ multiplies every gradient of an optimizer by 1/scale and
// sets the optimizer's found-inf flag in one multi-tensor kernel per dtype;
// step() then runs the optimizer, whose kernels skip the update on the device
// when the flag is set (and its step counters and schedules do not advance);
// update() adjusts the scale on the device. Nothing synchronizes.
//
// Semantics of update() (torch._amp_update_scale_), per call:
//   found inf/NaN:  scale *= backoff_factor, tracker = 0
//   otherwise:      tracker += 1; when tracker == growth_interval:
//                   scale *= growth_factor (kept only if finite), tracker = 0
// So with init_scale 4, growth 2, backoff 0.25, interval 2 the scale used by
// three finite steps is 4, 4, 8 (after update 1: 4, after update 2: 8), and an
// inf step then gives 2 with the tracker reset.
//
// On the CPU the same logic runs on host memory (bf16-mixed on CPU needs no
// scaler, but it works and is tested there).
#pragma once

#include <map>

#include "optim/optimizer.h"

namespace kiln::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  // loss * scale (differentiable). The scale lives on the loss's device, made
  // there on first use. Disabled: returns the loss.
  Tensor scale(const Tensor& loss);
  // Unscales the optimizer's gradients in place and records inf/NaN in its
  // found-inf flag. At most once per optimizer between update()s, before step().
  void unscale_(Optimizer& optimizer);
  // unscale_ (if not done yet), then optimizer.step(), skipped on the device
  // when the gradients held inf/NaN. Disabled: optimizer.step().
  void step(Optimizer& optimizer);
  // Updates the scale from the found-inf flags of the optimizers stepped since
  // the last update. Throws when none was.
  void update();
  // Sets the scale (no sync).
  void update(double new_scale);

  bool is_enabled() const { return options_.enabled; }
  // 0-d float32 scale on its device (undefined before first use).
  Tensor get_scale_tensor() const { return scale_; }
  // The scale as a number (reads the device: synchronizes).
  double get_scale() const;
  Tensor growth_tracker() const { return growth_tracker_; }
  const GradScalerOptions& options() const { return options_; }

  // The host side of a step in progress: which optimizers were unscaled or
  // stepped since the last update(). The Trainer keeps it before capturing a
  // step into a CUDA graph and puts it back when it gives that capture up:
  // nothing recorded ran, and the step runs again eagerly.
  enum class Stage { ready, unscaled, stepped };
  using StepProgress = std::map<Optimizer*, Stage>;
  StepProgress step_progress() const { return stages_; }
  void restore_step_progress(StepProgress progress) { stages_ = std::move(progress); }

  // {"growth_factor", "backoff_factor", "growth_interval", "enabled"} + the
  // tensors "scale" and "_growth_tracker" (torch's keys; no sync). As torch,
  // load_state_dict does nothing on a disabled scaler and throws kiln::Error
  // on an enabled one given a disabled scaler's state; it never changes `enabled`.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  void lazy_init(Device device);

  GradScalerOptions options_;
  Tensor scale_;           // 0-d float32
  Tensor growth_tracker_;  // 0-d int32
  Tensor scale_loaded_, tracker_loaded_;  // loaded before first use
  std::map<Optimizer*, Stage> stages_;
};

}  // namespace kiln::optim
