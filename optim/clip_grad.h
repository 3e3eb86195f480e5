// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_.
//
// The norm is a multi-tensor reduction on the gradients' device (deterministic:
// per-chunk partials combined in a fixed order) that leaves the total norm and
// the clip coefficient in 0-d device tensors; the gradients are then scaled by
// the coefficient on the device. Nothing reads back to the host, except
// error_if_nonfinite, which must look at the norm and therefore synchronizes.
// With a GradScaler, call scaler.unscale_(optimizer) first so that clipping
// acts on unscaled gradients (as in PyTorch's AMP recipe).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace kiln::optim {

// Scales the gradients of `params` (those that have one) in place so that
// their total norm_type-norm is at most max_norm: grads *= min(max_norm /
// (total + 1e-6), 1). norm_type: 1, 2, any p > 0, or infinity. Returns the
// total norm (of the gradients before clipping) and the coefficient, float32
// on the gradients' device (zeros / ones on the cpu when no parameter has a
// gradient). error_if_nonfinite: throws kiln::Error when the total norm is
// inf or NaN (this synchronizes the device).
ClipGradNormResult clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                                   bool error_if_nonfinite = false);

// The total gradient norm and the clip coefficient for max_norm, without
// changing the gradients. Does not synchronize.
ClipGradNormResult grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

// Clamps every gradient into [-clip_value, clip_value] in place (NaN stays NaN).
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

// Lightning's gradient_clip_val / gradient_clip_algorithm on `optimizer`'s
// gradients: "norm" through optimizer.clip_grad_norm_ (applied by its next
// step(), on the device), "value" through clip_grad_value_ now. A clip_val of
// 0 does nothing. The caller checks the algorithm's name.
void clip_gradients(Optimizer& optimizer, double clip_val, const std::string& algorithm);

}  // namespace kiln::optim
