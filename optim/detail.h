// Helpers shared by the optim/ sources (not part of the public API).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/launch.h"
#include "kernels/optim.h"

namespace kiln::optim::detail {

// A saved step count (one element) read back for a load_state_dict: it must
// be an integer (a float's NaN or out-of-range value converts with undefined
// behaviour) in [0, saved_json::kMaxCount = 2^53]. Throws naming `what`.
int64_t saved_step_count(const Tensor& saved, const std::string& what);

// "parameter 3 ('fc.weight')" for messages.
std::string param_label(const Tensor& param, int64_t index);

// The gradients of the params that have one, in order. A non-contiguous
// gradient is replaced (in .grad) by a contiguous copy, since the kernels
// write gradients in place. Throws naming `op` when gradients are on several
// devices or not floating.
std::vector<Tensor> grads_of(const std::vector<Tensor>& params, const char* op);

// Tensors grouped by dtype, in a fixed dtype order, as kernel lists.
struct DTypeList {
  DType dtype;
  std::vector<kernels::ListTensor> tensors;
};
std::vector<DTypeList> lists_by_dtype(const std::vector<Tensor>& tensors);

// Total norm of `grads` into total_norm (0-d float32) and, when clip_coef is
// defined, min(max_norm / (norm + 1e-6), 1) into clip_coef. Every gradient
// is on `device`. Does not synchronize.
void grad_norm_into(const std::vector<Tensor>& grads, Device device, double norm_type, double max_norm,
                    const Tensor& total_norm, const Tensor& clip_coef);

// Checks a norm type: p > 0 or infinity.
void check_norm_type(double norm_type, const char* op);

// avg <- update(avg, param) for every pair, one multi-tensor kernel per param
// dtype (EMA, SWA, AveragedModel); skip_flag (optional, one float32 on the
// device) makes the update a no-op on the device when nonzero.
void average_update(const std::vector<Tensor>& params, const std::vector<Tensor>& averages,
                    const kernels::AverageConfig& config, const Tensor& skip_flag = {});

}  // namespace kiln::optim::detail
