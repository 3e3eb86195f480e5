// Optimizer, gradient-scaler, clipping, averaging and schedule kernels over
// lists of tensors (raw pointers; no Tensor type here).
//
// Invariants:
// - Every list is processed in chunks of kOptimChunk elements. On CUDA one
//   launch covers a whole list (up to the per-launch tensor limit of
//   multi_tensor_apply.cuh; longer lists take a few launches of the same
//   kernel) with one block per chunk; on the CPU the chunks are the OpenMP work
//   items. Reductions produce one partial per chunk and combine the partials
//   in a fixed order, so results do not depend on the thread count.
// - Values that change from step to step (learning rate, momentum/beta1, step
//   counters, found-inf flag, clip coefficient, loss scale) are read through
//   pointers: device memory on CUDA, host memory on the CPU. No kernel here
//   reads anything back to the host.
// - An optimizer kernel does nothing when *found_inf != 0 (a skipped step).
// - Params and grads share one dtype per call (f32, f64, f16, bf16). Optimizer
//   state is in the compute type: float, or double for f64 params. A 16-bit
//   param either keeps an fp32 master copy (the kernel updates the master and
//   writes the rounded param) or, with a null master, keeps its state in its
//   own 16-bit type (bf16-true): the update is computed in float and rounded
//   into the param and the state.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"
#include "kernels/schedule_formulas.h"

namespace kiln::kernels {

constexpr int64_t kOptimChunk = 65536;

// Number of chunks of a tensor of `numel` elements.
KILN_HOST_DEVICE inline int64_t optim_chunks(int64_t numel) { return (numel + kOptimChunk - 1) / kOptimChunk; }

// One parameter of an optimizer call. Unused state slots are null.
struct OptimTensor {
  void* param = nullptr;    // (numel) param dtype
  void* grad = nullptr;     // (numel) param dtype
  float* master = nullptr;  // (numel) fp32 master weights of a 16-bit param; null otherwise
  // (numel) each: exp_avg / momentum buffer, exp_avg_sq, max_exp_avg_sq; in the
  // compute type, or in the param's type for a 16-bit param without a master.
  void* state[3] = {};
  int64_t* step = nullptr;  // (0-d) steps this param has taken, including the current one
  int64_t numel = 0;
};

// The step-dependent scalars of one parameter group.
struct OptimScalars {
  const double* lr = nullptr;          // (0-d) learning rate
  const double* momentum = nullptr;    // (0-d) SGD/LARS momentum, Adam/LAMB beta1
  const float* found_inf = nullptr;    // (0-d) skip the update when != 0; null: never skip
  const float* grad_scale = nullptr;   // (0-d) gradients are multiplied by it (clip coefficient); null: 1
};

struct SgdConfig {
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  bool has_momentum = false;  // a momentum buffer exists (state[0])
};

struct AdamConfig {
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false;                 // state[2] holds max_exp_avg_sq
  bool maximize = false;
};

struct LambConfig {
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0;
  bool bias_correction = true;
};

struct LarsConfig {
  double weight_decay = 0;
  double trust_coefficient = 0.001;
  double eps = 1e-8;
  bool has_momentum = false;  // state[0] holds the momentum buffer
};

// Adds 1 to *global_step and to every *param_steps[i], unless *found_inf != 0
// (found_inf may be null). Runs before the update kernels of a step.
void optim_step_prologue_cpu(int64_t* global_step, int64_t* const* param_steps, int64_t count, const float* found_inf);
void optim_step_prologue_cuda(int64_t* global_step, int64_t* const* param_steps, int64_t count,
                              const float* found_inf, cuda::Stream stream);

void sgd_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                  const SgdConfig& config);
void sgd_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const SgdConfig& config, cuda::Stream stream);
void adam_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const AdamConfig& config);
void adam_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                    const AdamConfig& config, cuda::Stream stream);
// LAMB and LARS need per-tensor norms: `partials` is scratch of
// 2 * sum(optim_chunks(numel)) doubles in the kernel's memory space.
void lamb_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const LambConfig& config, double* partials);
void lamb_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                    const LambConfig& config, double* partials, cuda::Stream stream);
void lars_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const LarsConfig& config, double* partials);
void lars_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                    const LarsConfig& config, double* partials, cuda::Stream stream);

// A plain tensor of a list (gradients, averages).
struct ListTensor {
  void* data = nullptr;
  int64_t numel = 0;
};

// grads *= 1 / *scale (the reciprocal taken in double, then rounded to float,
// as torch.amp does); *found_inf = 1 when any gradient element is inf or NaN
// (it is only ever set, never cleared, here).
void grad_scaler_unscale_cpu(DType dtype, const ListTensor* grads, int64_t count, const float* scale,
                             float* found_inf);
void grad_scaler_unscale_cuda(DType dtype, const ListTensor* grads, int64_t count, const float* scale,
                              float* found_inf, cuda::Stream stream);

constexpr int kGradScalerMaxFoundInf = 16;
// torch._amp_update_scale_: if sum(*found_infs[i]) > 0, scale *= backoff and
// the tracker resets; else the tracker counts up and, on reaching
// growth_interval, scale *= growth (kept only if finite) and the tracker resets.
void grad_scaler_update_cpu(float* scale, int32_t* growth_tracker, const float* const* found_infs, int count,
                            double growth_factor, double backoff_factor, int64_t growth_interval);
void grad_scaler_update_cuda(float* scale, int32_t* growth_tracker, const float* const* found_infs, int count,
                             double growth_factor, double backoff_factor, int64_t growth_interval,
                             cuda::Stream stream);

// Gradient norm in two stages. Stage 1 writes one partial per chunk of every
// tensor (sum of |g|^p; max |g| for p = inf) at partials[0 .. sum(chunks)).
// norm_type: any p > 0, or infinity.
void grad_norm_partials_cpu(DType dtype, const ListTensor* grads, int64_t count, double norm_type, double* partials);
void grad_norm_partials_cuda(DType dtype, const ListTensor* grads, int64_t count, double norm_type,
                             double* partials, cuda::Stream stream);
// Stage 2 combines `count` partials: *total_norm, and *clip_coef =
// min(max_norm / (total_norm + 1e-6), 1) with NaN propagated (torch semantics).
// clip_coef may be null.
void grad_norm_finish_cpu(const double* partials, int64_t count, double norm_type, double max_norm,
                          float* total_norm, float* clip_coef);
void grad_norm_finish_cuda(const double* partials, int64_t count, double norm_type, double max_norm,
                           float* total_norm, float* clip_coef, cuda::Stream stream);
// grads *= *coef; nothing is written when *coef == 1.
void grad_scale_cpu(DType dtype, const ListTensor* grads, int64_t count, const float* coef);
void grad_scale_cuda(DType dtype, const ListTensor* grads, int64_t count, const float* coef, cuda::Stream stream);
// grads = clamp(grads, -clip_value, clip_value); NaN stays NaN.
void grad_clamp_cpu(DType dtype, const ListTensor* grads, int64_t count, double clip_value);
void grad_clamp_cuda(DType dtype, const ListTensor* grads, int64_t count, double clip_value, cuda::Stream stream);

// Running averages of parameters: averages[i] (float, or double for f64
// params) and params[i] (param_dtype) have the same numel.
//   divide == false: avg = lerp(avg, param, weight)  (torch.lerp's formula; EMA uses weight = 1 - decay)
//   divide == true:  avg = avg + (param - avg) / divisor  (SWA's running mean; divisor 1 copies)
// Nothing is written when skip_flag is non-null and *skip_flag != 0.
struct AverageConfig {
  double weight = 0;
  double divisor = 1;
  bool divide = false;
};
void average_update_cpu(DType param_dtype, const ListTensor* averages, const ListTensor* params, int64_t count,
                        const AverageConfig& config, const float* skip_flag);
void average_update_cuda(DType param_dtype, const ListTensor* averages, const ListTensor* params, int64_t count,
                         const AverageConfig& config, const float* skip_flag, cuda::Stream stream);

// One schedule step: *last_epoch += 1 when `advance` and not (*found_inf != 0)
// (found_inf may be null), then lr[g] = program value at *last_epoch, and
// momentum[g] likewise where the program sets momentum and momentum[g] is non-null.
// base_lr (may be null, as may each base_lr[g]) overrides the program's base
// lr of group g with a value read from memory (SWALR's lr at construction).
// Arrays have one entry per group of the program (program.groups.size()).
void schedule_step_cpu(const ScheduleProgram& program, int64_t* last_epoch, const float* found_inf, bool advance,
                       double* const* lr, double* const* momentum, const double* const* base_lr);
void schedule_step_cuda(const ScheduleProgram& program, int64_t* last_epoch, const float* found_inf, bool advance,
                        double* const* lr, double* const* momentum, const double* const* base_lr,
                        cuda::Stream stream);

}  // namespace kiln::kernels
