// Automatic mixed precision, as torch.autocast.
//
// Inside an AutocastGuard, ops on tensors of the guarded device type choose
// their own precision (the policy lists follow PyTorch's autocast op lists):
//   lower precision  matmul, mm, bmm, linear, conv2d: float32/16-bit inputs are
//                    cast to the autocast dtype and the output is in it.
//   float32          softmax, log_softmax, cross_entropy, nll_loss, layer_norm,
//                    sum, mean, norm, exp, log, rsqrt, pow: float16/bfloat16
//                    inputs are cast up to float32 and the output is float32.
//   promote          add, sub, mul, div, maximum, minimum, where: floating
//                    inputs of different dtypes are cast to the widest of them
//                    (outside autocast these ops throw on mixed dtypes).
//   everything else  runs in its input's dtype. batch_norm is left alone, as in
//                    PyTorch: with a 16-bit input its statistics, parameters and
//                    arithmetic are already float32 (core/nn_ops.h).
// float64 tensors are never cast down. The casts are recorded by autograd, so
// gradients flow back to float32 parameters in float32.
//
// Weight cache: a float32 leaf that requires grad (a parameter) is cast to the
// low dtype once per autocast region; later uses in the region reuse the cast
// tensor (and its graph node), so a weight used twice costs one cast and one
// backward cast. The cache is cleared when the outermost guard exits. Unlike
// PyTorch's, a cached cast is not reused (the parameter is cast again) once
// the parameter was written in place (its version changed, e.g. by an
// optimizer step inside the region), nor when it was made under no_grad and
// the new use records a graph.
//
// State is per thread. Run backward outside the guard (as PyTorch recommends):
// backward formulas are not meant to be autocast (a reduction in one could
// hand a 16-bit product a float32 gradient, which the GEMM refuses).
//
//   {
//     kiln::AutocastGuard autocast(kiln::DeviceType::cuda, kiln::DType::f16);
//     loss = cross_entropy(model.forward(x), y);  // linear/conv in fp16, loss in fp32
//   }
//   scaler.scale(loss).backward();
#pragma once

#include <cstddef>
#include <initializer_list>

#include "core/tensor.h"

namespace kiln {

// Whether autocast is on for ops on tensors of `device` in this thread, and
// the low-precision dtype it uses (defaults: float16 on CUDA, bfloat16 on the
// CPU, as PyTorch).
bool autocast_enabled(DeviceType device);
DType autocast_dtype(DeviceType device);

// Turns autocast on (or off, enabled = false) for `device` until the guard is
// destroyed, then restores the previous state; guards nest. Throws kiln::Error
// for a dtype other than float16/bfloat16, and for float16 on the CPU
// ("16-mixed" needs a GPU; bfloat16 works on both). cache_enabled: whether
// casts of parameters are cached (see above).
class AutocastGuard {
 public:
  AutocastGuard(DeviceType device, DType dtype, bool enabled = true, bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_;
  bool previous_enabled_;
  DType previous_dtype_;
  bool previous_cache_enabled_;
};

namespace autocast {

// Used by the op front ends (core/ops/*.cpp); see the policy lists above.
enum class Policy { lower_precision, float32, promote };

// How the inputs of one op must be cast. Converts to false when there is
// nothing to do: autocast is off for the inputs' device, or they already fit
// the policy. An op consults it first and calls itself again with cast inputs:
//   if (const autocast::Cast to = autocast::plan(Policy::lower_precision, {&x, &w})) return op(to(x), to(w));
struct Cast {
  Policy policy = Policy::promote;
  DType dtype = DType::f32;
  bool active = false;
  explicit operator bool() const { return active; }
  // `x` in the op's dtype; undefined, integer, bool and (for lower precision)
  // float64 tensors are returned as they are. Parameters go through the cache.
  Tensor operator()(const Tensor& x) const;
};
Cast plan(Policy policy, std::initializer_list<const Tensor*> inputs);
// The same for a list of tensors (cat, stack).
Cast plan(Policy policy, const std::vector<Tensor>& inputs);

// Entries in this thread's weight cache (for tests and diagnostics).
size_t weight_cache_size();

}  // namespace autocast

}  // namespace kiln
