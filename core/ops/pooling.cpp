// max_pool2d, avg_pool2d, adaptive_avg_pool2d: checks, dispatch to
// kernels/pool.h, and the backward. A channels-last input (is_channels_last)
// runs the NHWC kernels as it is and gives a channels-last output and dx (as
// torch); any other input is made contiguous NCHW. Max pool saves int32
// argmax offsets within each plane (not the input) for backward.
#include <limits>

#include "core/autograd.h"
#include "core/launch.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/pool.h"

namespace kiln {

namespace {

enum class PoolKind { max, avg, adaptive };

void check_pool_input(const Tensor& x, const char* op) {
  KILN_CHECK(x.defined(), op, ": input is undefined");
  KILN_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected input (N, C, H, W) or (C, H, W), got shape ",
             shape_str(x.shape()));
  KILN_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", dtype_name(x.dtype()));
}

// Output size of a sliding window of dilated size `extent` along one dim (0 or
// less when it does not fit); written so that no term overflows once
// 2 * pad <= extent has been checked.
int64_t window_out_size(int64_t in, int64_t extent, int64_t stride, int64_t pad) {
  return (in - (extent - 2 * pad)) / stride + 1;
}

kernels::Pool2dParams window_params(const char* op, const Tensor& x, Size2 kernel, std::optional<Size2> stride_opt,
                                    Size2 padding, Size2 dilation) {
  const Size2 stride = stride_opt.value_or(kernel);
  KILN_CHECK(kernel.h > 0 && kernel.w > 0, op, ": kernel size must be positive, got [", kernel.h, ", ", kernel.w,
             "]");
  KILN_CHECK(stride.h > 0 && stride.w > 0, op, ": stride must be positive, got [", stride.h, ", ", stride.w, "]");
  KILN_CHECK(dilation.h > 0 && dilation.w > 0, op, ": dilation must be positive, got [", dilation.h, ", ",
             dilation.w, "]");
  int64_t eff_h = 0, eff_w = 0;  // the dilated kernel size, less 1 until checked
  KILN_CHECK(!__builtin_mul_overflow(dilation.h, kernel.h - 1, &eff_h) &&
                 !__builtin_mul_overflow(dilation.w, kernel.w - 1, &eff_w) &&
                 eff_h < std::numeric_limits<int64_t>::max() && eff_w < std::numeric_limits<int64_t>::max(),
             op, ": kernel [", kernel.h, ", ", kernel.w, "] with dilation [", dilation.h, ", ", dilation.w,
             "] is too large (the dilated kernel size overflows 64 bits)");
  ++eff_h;
  ++eff_w;
  KILN_CHECK(padding.h >= 0 && padding.w >= 0 && padding.h <= eff_h / 2 && padding.w <= eff_w / 2, op,
             ": padding must be non-negative and at most half the (dilated) kernel size; got padding [", padding.h,
             ", ", padding.w, "] for kernel [", eff_h, ", ", eff_w, "]");
  const int64_t H = x.size(-2), W = x.size(-1);
  KILN_CHECK(eff_h - 2 * padding.h <= H && eff_w - 2 * padding.w <= W, op, ": kernel size [", eff_h, ", ", eff_w,
             "] (after dilation) is larger than the padded input [", H + 2 * padding.h, ", ", W + 2 * padding.w,
             "] (input ", shape_str(x.shape()), ")");
  kernels::Pool2dParams p;
  p.planes = x.numel() / std::max<int64_t>(H * W, 1);
  p.in_h = H;
  p.in_w = W;
  p.kernel_h = kernel.h;
  p.kernel_w = kernel.w;
  p.stride_h = stride.h;
  p.stride_w = stride.w;
  p.pad_h = padding.h;
  p.pad_w = padding.w;
  p.dilation_h = dilation.h;
  p.dilation_w = dilation.w;
  p.out_h = window_out_size(H, eff_h, stride.h, padding.h);
  p.out_w = window_out_size(W, eff_w, stride.w, padding.w);
  return p;
}

Shape pooled_shape(const Tensor& x, const kernels::Pool2dParams& p) {
  Shape shape = x.shape();
  shape[shape.size() - 2] = p.out_h;
  shape[shape.size() - 1] = p.out_w;
  return shape;
}

// Runs the forward kernel of `kind` and records its backward.
Tensor pool_forward(const char* op, PoolKind kind, const Tensor& x_in, kernels::Pool2dParams p) {
  const bool channels_last = is_channels_last(x_in);
  Tensor x;
  {
    NoGradGuard no_grad;  // the layout copy is not part of the graph
    x = channels_last ? x_in : x_in.contiguous();
  }
  p.channels_last = channels_last;
  if (channels_last) p.channels = x.size(1);
  // y, the indices and dx in the input's layout.
  const auto empty_like_layout = [channels_last](const Shape& shape, const TensorOptions& options) {
    return channels_last ? empty_strided(shape, channels_last_strides(shape), options) : empty(shape, options);
  };
  const DType dtype = x.dtype();
  const TensorOptions options{.dtype = dtype, .device = x.device()};
  Tensor y = empty_like_layout(pooled_shape(x, p), options);
  Tensor indices;
  if (kind == PoolKind::max) indices = empty_like_layout(y.shape(), {.dtype = DType::i32, .device = x.device()});
  if (y.numel() > 0) {
    if (x.is_cuda()) {
      const cuda::DeviceScope scope(x.device().index, op);
      const cuda::Stream stream = scope.stream;
      switch (kind) {
        case PoolKind::max:
          kernels::max_pool2d_forward_cuda(dtype, p, x.data_ptr(), y.data_ptr(), indices.data<int32_t>(), stream);
          break;
        case PoolKind::avg: kernels::avg_pool2d_forward_cuda(dtype, p, x.data_ptr(), y.data_ptr(), stream); break;
        case PoolKind::adaptive:
          kernels::adaptive_avg_pool2d_forward_cuda(dtype, p, x.data_ptr(), y.data_ptr(), stream);
          break;
      }
    } else {
      switch (kind) {
        case PoolKind::max:
          kernels::max_pool2d_forward_cpu(dtype, p, x.data_ptr(), y.data_ptr(), indices.data<int32_t>());
          break;
        case PoolKind::avg: kernels::avg_pool2d_forward_cpu(dtype, p, x.data_ptr(), y.data_ptr()); break;
        case PoolKind::adaptive: kernels::adaptive_avg_pool2d_forward_cpu(dtype, p, x.data_ptr(), y.data_ptr()); break;
      }
    }
  }
  if (autograd::any_requires_grad({&x_in})) {
    const Shape x_shape = x.shape();
    autograd::SavedTensor saved_indices(indices, op);
    autograd::record(op, {x_in}, {y}, [=](const autograd::TensorList& grads) -> autograd::TensorList {
      const Tensor g = channels_last ? grads[0].contiguous(MemoryFormat::channels_last) : grads[0].contiguous();
      Tensor dx = empty_like_layout(x_shape, {.dtype = g.dtype(), .device = g.device()});
      if (dx.numel() == 0) return {dx};
      if (g.numel() == 0) return {dx.zero_()};
      const Tensor idx = saved_indices.unpack();
      if (g.is_cuda()) {
        const cuda::DeviceScope scope(g.device().index, op);
        const cuda::Stream stream = scope.stream;
        switch (kind) {
          case PoolKind::max:
            kernels::max_pool2d_backward_cuda(dtype, p, g.data_ptr(), idx.data<int32_t>(), dx.data_ptr(), stream);
            break;
          case PoolKind::avg: kernels::avg_pool2d_backward_cuda(dtype, p, g.data_ptr(), dx.data_ptr(), stream); break;
          case PoolKind::adaptive:
            kernels::adaptive_avg_pool2d_backward_cuda(dtype, p, g.data_ptr(), dx.data_ptr(), stream);
            break;
        }
      } else {
        switch (kind) {
          case PoolKind::max:
            kernels::max_pool2d_backward_cpu(dtype, p, g.data_ptr(), idx.data<int32_t>(), dx.data_ptr());
            break;
          case PoolKind::avg: kernels::avg_pool2d_backward_cpu(dtype, p, g.data_ptr(), dx.data_ptr()); break;
          case PoolKind::adaptive:
            kernels::adaptive_avg_pool2d_backward_cpu(dtype, p, g.data_ptr(), dx.data_ptr());
            break;
        }
      }
      return {dx};
    });
  }
  return y;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding, Size2 dilation) {
  check_pool_input(x, "max_pool2d");
  const kernels::Pool2dParams p = window_params("max_pool2d", x, kernel, stride, padding, dilation);
  KILN_CHECK(p.in_h * p.in_w <= std::numeric_limits<int32_t>::max(), "max_pool2d: input planes of ", p.in_h, " x ",
             p.in_w, " elements exceed the int32 argmax indices");
  return pool_forward("max_pool2d", PoolKind::max, x, p);
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding,
                  bool count_include_pad) {
  check_pool_input(x, "avg_pool2d");
  kernels::Pool2dParams p = window_params("avg_pool2d", x, kernel, stride, padding, 1);
  p.count_include_pad = count_include_pad;
  return pool_forward("avg_pool2d", PoolKind::avg, x, p);
}

Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size) {
  check_pool_input(x, "adaptive_avg_pool2d");
  KILN_CHECK(output_size.h > 0 && output_size.w > 0, "adaptive_avg_pool2d: output size must be positive, got [",
             output_size.h, ", ", output_size.w, "]");
  kernels::Pool2dParams p;
  p.in_h = x.size(-2);
  p.in_w = x.size(-1);
  KILN_CHECK(p.in_h > 0 && p.in_w > 0, "adaptive_avg_pool2d: expected a non-empty spatial size, got input ",
             shape_str(x.shape()));
  p.planes = x.numel() / (p.in_h * p.in_w);
  p.out_h = output_size.h;
  p.out_w = output_size.w;
  return pool_forward("adaptive_avg_pool2d", PoolKind::adaptive, x, p);
}

}  // namespace kiln
