// Softmax, log-softmax, fused cross-entropy and NLL loss kernels.
//
// Invariants:
//   - Softmax and cross-entropy work on dense (rows, cols) buffers: the front
//     end moves the softmax dim (the class dim) last. One row per CUDA block.
//   - Math in float for f16/bf16/f32 and in double for f64; "Acc" below is
//     that type (kernels/reduction.h: reduce_acc_dtype).
//   - Losses write per-row values; the front end reduces them with the
//     deterministic sum of kernels/reduction.h (no atomics anywhere).
//   - Targets: ignore_index rows give loss 0 and weight 0. Any other target
//     outside [0, classes): the CPU kernels throw kiln::Error naming the value;
//     the CUDA kernels write NaN for that row's loss (never read out of bounds)
//     and store the value in *bad_target when it is not null.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

struct SoftmaxArgs {
  DType dtype = DType::f32;
  const void* x = nullptr;  // (rows, cols)
  void* y = nullptr;        // (rows, cols)
  int64_t rows = 0;
  int64_t cols = 0;
  bool log = false;         // log_softmax
};
// y = softmax(x) (or log_softmax) over each row.
void softmax_cpu(const SoftmaxArgs& args);
void softmax_cuda(const SoftmaxArgs& args, cuda::Stream stream);

struct SoftmaxGradArgs {
  DType dtype = DType::f32;
  const void* y = nullptr;   // (rows, cols) forward output
  const void* dy = nullptr;  // (rows, cols)
  void* dx = nullptr;        // (rows, cols)
  int64_t rows = 0;
  int64_t cols = 0;
  bool log = false;
};
// softmax:     dx = y * (dy - sum(dy * y))
// log_softmax: dx = dy - exp(y) * sum(dy)
void softmax_grad_cpu(const SoftmaxGradArgs& args);
void softmax_grad_cuda(const SoftmaxGradArgs& args, cuda::Stream stream);

struct CrossEntropyArgs {
  DType dtype = DType::f32;         // logits and weight
  const void* logits = nullptr;     // (rows, classes)
  const int64_t* target = nullptr;  // (rows)
  const void* weight = nullptr;     // (classes), or null for all ones
  int64_t rows = 0;
  int64_t classes = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  void* loss = nullptr;        // (rows) Acc: (1-ls) w[t] (lse - x[t]) + ls/C sum_c w[c] (lse - x[c])
  void* row_weight = nullptr;  // (rows) Acc: w[t] (1 without weights); 0 for ignored rows
  void* lse = nullptr;         // (rows) Acc: logsumexp of the row, saved for backward
  int64_t* bad_target = nullptr;  // CUDA only, may be null
};
// One pass per row (after the max): logsumexp, target logit and the smoothing sum.
void cross_entropy_cpu(const CrossEntropyArgs& args);
void cross_entropy_cuda(const CrossEntropyArgs& args, cuda::Stream stream);

struct CrossEntropyGradArgs {
  DType dtype = DType::f32;
  const void* logits = nullptr;     // (rows, classes)
  const int64_t* target = nullptr;  // (rows)
  const void* weight = nullptr;     // (classes) or null
  const void* lse = nullptr;        // (rows) Acc
  const void* grad = nullptr;       // Acc: (rows) when per_row_grad, else one value
  bool per_row_grad = false;
  const void* total_weight = nullptr;  // Acc scalar: the mean's divisor, or null (sum / none)
  const void* weight_sum = nullptr;    // Acc scalar: sum of the class weights, or null (then classes)
  int64_t rows = 0;
  int64_t classes = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  void* dlogits = nullptr;  // (rows, classes)
};
// dlogits[c] = g * [(1-ls) w[t] (p[c] - [c == t]) + ls/C (p[c] W - w[c])], p = softmax,
// g = grad / total_weight; 0 on ignored rows.
void cross_entropy_grad_cpu(const CrossEntropyGradArgs& args);
void cross_entropy_grad_cuda(const CrossEntropyGradArgs& args, cuda::Stream stream);

struct NllLossArgs {
  DType dtype = DType::f32;
  const void* log_probs = nullptr;  // (n, classes, inner)
  const int64_t* target = nullptr;  // (n, inner)
  const void* weight = nullptr;     // (classes) or null
  int64_t n = 0;
  int64_t classes = 0;
  int64_t inner = 1;
  int64_t ignore_index = -100;
  void* loss = nullptr;        // (n, inner) Acc: -w[t] log_probs[t]
  void* row_weight = nullptr;  // (n, inner) Acc: w[t]; 0 for ignored
  int64_t* bad_target = nullptr;
};
void nll_loss_cpu(const NllLossArgs& args);
void nll_loss_cuda(const NllLossArgs& args, cuda::Stream stream);

struct NllLossGradArgs {
  DType dtype = DType::f32;
  const int64_t* target = nullptr;  // (n, inner)
  const void* weight = nullptr;     // (classes) or null
  const void* grad = nullptr;       // dtype: (n, inner) when per_row_grad, else one value
  bool per_row_grad = false;
  const void* total_weight = nullptr;  // Acc scalar or null
  int64_t n = 0;
  int64_t classes = 0;
  int64_t inner = 1;
  int64_t ignore_index = -100;
  void* dlog_probs = nullptr;  // (n, classes, inner): -w[t] g at the target, 0 elsewhere
};
void nll_loss_grad_cpu(const NllLossGradArgs& args);
void nll_loss_grad_cuda(const NllLossGradArgs& args, cuda::Stream stream);

}  // namespace kiln::kernels
