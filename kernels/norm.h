// Normalization kernels: batch norm (optionally fused with ReLU) and layer
// norm, forward and backward. Front ends in core/ops/normalization.cpp.
//
// Batch norm sees its input as (outer, channels, inner), contiguous: NCHW is
// (N, C, H*W), (N, C) is (N, C, 1), and a channels-last NHWC tensor is
// (N*H*W, C, 1). Per-channel vectors (weight, bias, running stats, saved
// mean/invstd) are in the compute type: float for float16/bfloat16/float32
// inputs, double for float64. Weight and bias may be null (affine off: 1 and 0).
// Layer norm sees (rows, cols) with cols the normalized size; weight/bias (cols)
// are in the input's dtype; saved mean/rstd (rows) in the compute type.
//
// Every reduction has a fixed order and blocking: results do not depend on the
// thread count (CPU) or the GPU model (CUDA).
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

struct BatchNormShape {
  int64_t outer = 0, channels = 0, inner = 0;
  KILN_HOST_DEVICE int64_t reduced() const { return outer * inner; }  // elements per channel
};

struct BatchNormArgs {
  BatchNormShape shape;
  DType dtype = DType::f32;  // of x, y, dy, dx
  bool training = true;      // batch statistics (else the running ones)
  bool relu = false;         // y = max(bn(x), 0)
  double momentum = 0.1;
  double eps = 1e-5;
};

// y = (x - mean) * invstd * weight + bias (then ReLU when args.relu). In
// training mode mean/invstd are the batch's (biased variance) and, when
// running_mean/running_var are non-null, running = (1 - momentum) * running +
// momentum * batch with the unbiased variance, in place. In eval mode the
// running stats are read (never null). save_mean/save_invstd (C) receive the
// statistics used, for the backward.
void batch_norm_forward_cpu(const BatchNormArgs& args, const void* x, const void* weight, const void* bias,
                            void* running_mean, void* running_var, void* y, void* save_mean, void* save_invstd);
// From dy and the saved statistics: dx (when non-null) and dweight/dbias (C,
// when non-null), all written (=). With args.relu the ReLU mask is recomputed
// from x, weight and bias (y is not saved). Training mode differentiates
// through the batch statistics (the fused formula: one pass for the two
// per-channel sums, one for dx).
void batch_norm_backward_cpu(const BatchNormArgs& args, const void* x, const void* dy, const void* weight,
                             const void* bias, const void* save_mean, const void* save_invstd, void* dx,
                             void* dweight, void* dbias);

// max_pool2d(relu(bn(x)), 2): an NCHW x (N, C, H, W) seen as (N, C, H*W), H
// and W at least 2 and args.relu on. y and indices are (N, C, H/2, W/2) as
// max_pool2d's (kernels/pool.h: the 2x2 windows with stride 2, indices the
// argmax's flat offset in the (H, W) plane), the statistics and running stats
// as batch_norm_forward_cpu's. The full-size activation is never stored: each
// plane is normalized into a thread's buffer and pooled from there, and the
// backward rebuilds each plane's gradient from dy (N, C, H/2, W/2) and the
// indices the same way. Values, indices and gradients are the same bits as
// batch_norm_forward_cpu then max_pool2d_forward_cpu (and their backwards).
void batch_norm_relu_max_pool2d_forward_cpu(const BatchNormArgs& args, int64_t height, int64_t width, const void* x,
                                            const void* weight, const void* bias, void* running_mean,
                                            void* running_var, void* y, int32_t* indices, void* save_mean,
                                            void* save_invstd);
void batch_norm_relu_max_pool2d_backward_cpu(const BatchNormArgs& args, int64_t height, int64_t width,
                                             const void* x, const void* dy, const int32_t* indices,
                                             const void* weight, const void* bias, const void* save_mean,
                                             const void* save_invstd, void* dx, void* dweight, void* dbias);

// The CUDA versions; asynchronous on `stream`. `workspace` must hold
// batch_norm_workspace_bytes(args) bytes of device memory.
size_t batch_norm_workspace_bytes(const BatchNormArgs& args);
void batch_norm_forward_cuda(const BatchNormArgs& args, const void* x, const void* weight, const void* bias,
                             void* running_mean, void* running_var, void* y, void* save_mean, void* save_invstd,
                             void* workspace, cuda::Stream stream);
void batch_norm_backward_cuda(const BatchNormArgs& args, const void* x, const void* dy, const void* weight,
                              const void* bias, const void* save_mean, const void* save_invstd, void* dx,
                              void* dweight, void* dbias, void* workspace, cuda::Stream stream);
// The fused op above on CUDA, for NCHW (shape (N, C, H*W)) or channels-last
// NHWC (shape (N*H*W, C, 1)) x; y, indices, dy in x's layout. Same bits as
// batch_norm_forward_cuda (relu) then max_pool2d_forward_cuda, and as
// max_pool2d_backward_cuda then batch_norm_backward_cuda; neither stores the
// full-size activation or its gradient.
void batch_norm_relu_max_pool2d_forward_cuda(const BatchNormArgs& args, int64_t height, int64_t width, const void* x,
                                             const void* weight, const void* bias, void* running_mean,
                                             void* running_var, void* y, int32_t* indices, void* save_mean,
                                             void* save_invstd, void* workspace, cuda::Stream stream);
void batch_norm_relu_max_pool2d_backward_cuda(const BatchNormArgs& args, int64_t height, int64_t width,
                                              const void* x, const void* dy, const int32_t* indices,
                                              const void* weight, const void* bias, const void* save_mean,
                                              const void* save_invstd, void* dx, void* dweight, void* dbias,
                                              void* workspace, cuda::Stream stream);

struct LayerNormArgs {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::f32;
  double eps = 1e-5;
};

// y = (x - mean_row) * rstd_row * weight + bias; weight/bias (cols) may be null.
void layer_norm_forward_cpu(const LayerNormArgs& args, const void* x, const void* weight, const void* bias, void* y,
                            void* save_mean, void* save_rstd);
// dx (rows, cols), dweight/dbias (cols), each written when non-null.
void layer_norm_backward_cpu(const LayerNormArgs& args, const void* x, const void* dy, const void* weight,
                             const void* save_mean, const void* save_rstd, void* dx, void* dweight, void* dbias);

// `workspace` must hold layer_norm_workspace_bytes(args) bytes of device memory.
size_t layer_norm_workspace_bytes(const LayerNormArgs& args);
void layer_norm_forward_cuda(const LayerNormArgs& args, const void* x, const void* weight, const void* bias, void* y,
                             void* save_mean, void* save_rstd, cuda::Stream stream);
void layer_norm_backward_cuda(const LayerNormArgs& args, const void* x, const void* dy, const void* weight,
                              const void* save_mean, const void* save_rstd, void* dx, void* dweight, void* dbias,
                              void* workspace, cuda::Stream stream);

}  // namespace kiln::kernels
