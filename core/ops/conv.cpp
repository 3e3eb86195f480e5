// conv2d: checks, dispatch to kernels/conv.h (CPU im2col + GEMM, CUDA cuDNN),
// and the backward (input, weight and bias gradients from one node).
//
// The CPU computes float32 and float64; float16/bfloat16 CPU inputs go through
// float32 (casts recorded by autograd). On CUDA a channels-last x (or weight)
// runs cuDNN's NHWC kernels and gives a channels-last output and gradients.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/conv.h"

namespace kiln {

namespace {

std::atomic<bool> benchmark_mode{false};

// Until set_cudnn_api is called: KILN_CUDNN_API (for benchmarks that compare
// the two APIs without a flag of their own). A value it does not name is an
// error at the first convolution, not a silent default.
CudnnApi cudnn_api_from_environment() {
  const char* value = std::getenv("KILN_CUDNN_API");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "automatic") return CudnnApi::automatic;
  if (std::string_view(value) == "legacy") return CudnnApi::legacy;
  if (std::string_view(value) == "graph") return CudnnApi::graph;
  throw Error(detail::concat("KILN_CUDNN_API: expected legacy, graph or automatic, got '", value, "'"), __FILE__,
              __LINE__);
}
CudnnApi initial_cudnn_api() {
  static const CudnnApi api = cudnn_api_from_environment();
  return api;
}
// Unset until set_cudnn_api; then the environment decides (at the first use).
std::atomic<int> cudnn_api_choice{-1};

CudnnApi current_cudnn_api() {
  const int choice = cudnn_api_choice.load();
  return choice < 0 ? initial_cudnn_api() : static_cast<CudnnApi>(choice);
}

Tensor empty_conv_output(const Shape& shape, const Tensor& like, bool channels_last) {
  const TensorOptions options{.dtype = like.dtype(), .device = like.device()};
  return channels_last ? empty_strided(shape, channels_last_strides(shape), options) : empty(shape, options);
}

// Keeps the workspace blocks of one kernel call alive until it returns.
struct Workspaces {
  int device;
  cuda::Stream stream;
  std::vector<std::shared_ptr<void>> blocks;
  kernels::WorkspaceAllocator allocator() {
    return [this](size_t bytes) -> void* {
      if (bytes == 0) return nullptr;
      blocks.push_back(allocate_cuda(bytes, device, stream));
      return blocks.back().get();
    };
  }
};

kernels::ConvCudaConfig cuda_config(const Tensor& x, bool channels_last) {
  kernels::ConvCudaConfig config;
  config.dtype = x.dtype();
  config.channels_last = channels_last;
  config.deterministic = deterministic_algorithms_enabled();
  config.allow_tf32 = x.dtype() == DType::f32 && allow_tf32();
  config.benchmark = benchmark_mode.load();
  const CudnnApi api = current_cudnn_api();
  config.graph_api = api == CudnnApi::graph ||
                     (api == CudnnApi::automatic && (x.dtype() == DType::f16 || x.dtype() == DType::bf16));
  config.device = x.device().index;
  config.stream = cuda::current_stream(x.device().index);  // cuDNN calls make the device current themselves
  return config;
}

void check_conv_args(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding,
                     Size2 dilation, int64_t groups) {
  KILN_CHECK(x.defined() && weight.defined(), "conv2d: input and weight must be defined");
  KILN_CHECK(x.dim() == 4, "conv2d: expected input (N, C, H, W) or (C, H, W), got shape ", shape_str(x.shape()));
  KILN_CHECK(weight.dim() == 4, "conv2d: expected weight (out_channels, in_channels/groups, kh, kw), got shape ",
             shape_str(weight.shape()));
  KILN_CHECK(is_floating(x.dtype()), "conv2d: expected a floating input, got ", dtype_name(x.dtype()));
  KILN_CHECK(weight.dtype() == x.dtype(), "conv2d: input is ", dtype_name(x.dtype()), " but weight is ",
             dtype_name(weight.dtype()));
  KILN_CHECK(weight.device() == x.device(), "conv2d: input is on ", x.device(), " but weight is on ",
             weight.device());
  KILN_CHECK(groups > 0, "conv2d: groups must be positive, got ", groups);
  KILN_CHECK(stride.h > 0 && stride.w > 0, "conv2d: stride must be positive, got [", stride.h, ", ", stride.w, "]");
  KILN_CHECK(padding.h >= 0 && padding.w >= 0, "conv2d: padding must be non-negative, got [", padding.h, ", ",
             padding.w, "]");
  KILN_CHECK(dilation.h > 0 && dilation.w > 0, "conv2d: dilation must be positive, got [", dilation.h, ", ",
             dilation.w, "]");
  const int64_t C = x.size(1), O = weight.size(0);
  KILN_CHECK(C % groups == 0, "conv2d: groups=", groups, " does not divide the input's ", C, " channels (input ",
             shape_str(x.shape()), ")");
  KILN_CHECK(O % groups == 0, "conv2d: groups=", groups, " does not divide the weight's ", O,
             " output channels (weight ", shape_str(weight.shape()), ")");
  KILN_CHECK(weight.size(1) * groups == C, "conv2d: channel mismatch: weight ", shape_str(weight.shape()),
             " with groups=", groups, " expects input with ", weight.size(1) * groups, " channels, got input ",
             shape_str(x.shape()));
  if (bias.defined()) {
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == O, "conv2d: expected bias of shape [", O, "], got ",
               shape_str(bias.shape()));
    KILN_CHECK(bias.dtype() == x.dtype() && bias.device() == x.device(), "conv2d: bias is ",
               dtype_name(bias.dtype()), " on ", bias.device(), ", expected ", dtype_name(x.dtype()), " on ",
               x.device());
  }
  KILN_CHECK(weight.size(2) > 0 && weight.size(3) > 0, "conv2d: expected a kernel of positive size, got weight ",
             shape_str(weight.shape()));
  // The dilated kernel and the padded input, refused where they overflow 64 bits.
  int64_t kh = 0, kw = 0, padded_h = 0, padded_w = 0;
  KILN_CHECK(!__builtin_mul_overflow(dilation.h, weight.size(2) - 1, &kh) &&
                 !__builtin_mul_overflow(dilation.w, weight.size(3) - 1, &kw) &&
                 !__builtin_add_overflow(kh, 1, &kh) && !__builtin_add_overflow(kw, 1, &kw),
             "conv2d: dilation [", dilation.h, ", ", dilation.w, "] is too large for weight ",
             shape_str(weight.shape()), " (the dilated kernel size overflows 64 bits)");
  KILN_CHECK(!__builtin_mul_overflow(padding.h, 2, &padded_h) && !__builtin_mul_overflow(padding.w, 2, &padded_w) &&
                 !__builtin_add_overflow(padded_h, x.size(2), &padded_h) &&
                 !__builtin_add_overflow(padded_w, x.size(3), &padded_w),
             "conv2d: padding [", padding.h, ", ", padding.w,
             "] is too large (the padded input size overflows 64 bits)");
  KILN_CHECK(kh <= padded_h && kw <= padded_w, "conv2d: kernel size [", kh, ", ", kw,
             "] (after dilation) is larger than the padded input [", padded_h, ", ", padded_w, "] (input ",
             shape_str(x.shape()), ", padding [", padding.h, ", ", padding.w, "])");
}

}  // namespace

void set_cudnn_benchmark(bool enabled) { benchmark_mode.store(enabled); }
bool cudnn_benchmark() { return benchmark_mode.load(); }
void set_cudnn_api(CudnnApi api) { cudnn_api_choice.store(static_cast<int>(api)); }
CudnnApi cudnn_api() { return current_cudnn_api(); }
CudnnBenchmarkStats cudnn_benchmark_stats() {
  const kernels::CudnnConvCacheStats stats = kernels::cudnn_conv_cache_stats();
  return {stats.hits, stats.misses, stats.entries, stats.graph_entries, stats.graph_fallbacks};
}
void cudnn_benchmark_cache_clear() { kernels::cudnn_conv_cache_clear(); }

Tensor conv2d(const Tensor& x_in, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding,
              Size2 dilation, int64_t groups) {
  KILN_CHECK(x_in.defined(), "conv2d: input is undefined");
  if (const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&x_in, &weight, &bias})) {
    return conv2d(to(x_in), to(weight), to(bias), stride, padding, dilation, groups);
  }
  if (x_in.dim() == 3) {  // unbatched (C, H, W)
    return conv2d(x_in.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  }
  check_conv_args(x_in, weight, bias, stride, padding, dilation, groups);
  const DType dtype = x_in.dtype();
  if (x_in.is_cpu() && (dtype == DType::f16 || dtype == DType::bf16)) {
    const Tensor bias32 = bias.defined() ? bias.to(DType::f32) : Tensor();
    AutocastGuard float32_kernel(DeviceType::cpu, DType::bf16, /*enabled=*/false);  // or it would cast back
    return conv2d(x_in.to(DType::f32), weight.to(DType::f32), bias32, stride, padding, dilation, groups).to(dtype);
  }

  kernels::Conv2dParams p;
  p.batch = x_in.size(0);
  p.in_channels = x_in.size(1);
  p.in_h = x_in.size(2);
  p.in_w = x_in.size(3);
  p.out_channels = weight.size(0);
  p.kernel_h = weight.size(2);
  p.kernel_w = weight.size(3);
  p.stride_h = stride.h;
  p.stride_w = stride.w;
  p.pad_h = padding.h;
  p.pad_w = padding.w;
  p.dilation_h = dilation.h;
  p.dilation_w = dilation.w;
  p.groups = groups;
  p.out_h = (p.in_h + 2 * p.pad_h - p.dilation_h * (p.kernel_h - 1) - 1) / p.stride_h + 1;
  p.out_w = (p.in_w + 2 * p.pad_w - p.dilation_w * (p.kernel_w - 1) - 1) / p.stride_w + 1;
  const Shape out_shape{p.batch, p.out_channels, p.out_h, p.out_w};

  const bool on_cuda = x_in.is_cuda();
  // float64 stays NCHW, as in PyTorch (cudnn_conv_suggest_memory_format):
  // cuDNN has no NHWC backward-data algorithm for doubles (seen on an H200, cuDNN 9).
  const bool channels_last =
      on_cuda && x_in.dtype() != DType::f64 && (is_channels_last(x_in) || is_channels_last(weight));
  Tensor x, w, b;
  {
    NoGradGuard no_grad;  // layout copies for the kernels are not part of the graph
    x = channels_last ? x_in.contiguous(MemoryFormat::channels_last) : x_in.contiguous();
    w = channels_last ? weight.contiguous(MemoryFormat::channels_last) : weight.contiguous();
    b = bias.defined() ? bias.contiguous() : Tensor();
  }
  Tensor y = empty_conv_output(out_shape, x, channels_last);
  if (y.numel() > 0) {
    if (on_cuda) {
      const kernels::ConvCudaConfig config = cuda_config(x, channels_last);
      Workspaces workspaces{config.device, config.stream, {}};
      kernels::conv2d_forward_cuda(p, config, x.data_ptr(), w.data_ptr(), y.data_ptr(), workspaces.allocator());
      if (b.defined()) {
        NoGradGuard no_grad;  // part of this op's node, not a node of its own
        y.add_(b.view({1, p.out_channels, 1, 1}));
      }
    } else if (p.batch > 0) {
      kernels::conv2d_forward_cpu(dtype, p, x.data_ptr(), w.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                                  y.data_ptr());
    }
  }

  if (autograd::any_requires_grad({&x_in, &weight, &bias})) {
    const bool need_dx = x_in.requires_grad(), need_dw = weight.requires_grad();
    const bool need_db = bias.defined() && bias.requires_grad();
    autograd::SavedTensor saved_x(need_dw ? x : Tensor(), "conv2d");
    autograd::SavedTensor saved_w(need_dx ? w : Tensor(), "conv2d");
    const Shape x_shape = x.shape(), w_shape = w.shape();
    autograd::record(
        "conv2d", {x_in, weight, bias}, {y},
        [=](const autograd::TensorList& grads) -> autograd::TensorList {
          const Tensor x = saved_x.unpack(), w = saved_w.unpack();
          const Tensor& grad = grads[0];
          const TensorOptions options{.dtype = grad.dtype(), .device = grad.device()};
          Tensor dx, dw, db;
          if (grad.is_cuda()) {
            const Tensor g = channels_last ? grad.contiguous(MemoryFormat::channels_last) : grad.contiguous();
            kernels::ConvCudaConfig config = cuda_config(g, channels_last);
            Workspaces workspaces{g.device().index, config.stream, {}};
            if (need_dx) {
              dx = empty_conv_output(x_shape, g, channels_last);
              if (dx.numel() > 0) {
                kernels::conv2d_backward_input_cuda(p, config, w.data_ptr(), g.data_ptr(), dx.data_ptr(),
                                                    workspaces.allocator());
              }
            }
            if (need_dw) {
              dw = empty_conv_output(w_shape, g, channels_last);
              if (g.numel() == 0) {
                dw.zero_();
              } else {
                kernels::conv2d_backward_weight_cuda(p, config, x.data_ptr(), g.data_ptr(), dw.data_ptr(),
                                                     workspaces.allocator());
              }
            }
            if (need_db) {
              NoGradGuard no_grad;
              db = sum(g, {0, 2, 3});  // zeros when g is empty
            }
            return {dx, dw, db};
          }
          const Tensor g = grad.contiguous();
          if (need_dx) dx = empty(x_shape, options);
          if (need_dw) dw = empty(w_shape, options);
          if (need_db) db = empty({p.out_channels}, options);
          if (g.numel() == 0) {  // nothing flows back: zero gradients
            for (Tensor* t : {&dx, &dw, &db}) {
              if (t->defined()) t->zero_();
            }
          } else {
            kernels::conv2d_backward_cpu(g.dtype(), p, need_dw ? x.data_ptr() : nullptr,
                                         need_dx ? w.data_ptr() : nullptr, g.data_ptr(),
                                         need_dx ? dx.data_ptr() : nullptr, need_dw ? dw.data_ptr() : nullptr,
                                         need_db ? db.data_ptr() : nullptr);
          }
          return {dx, dw, db};
        });
  }
  return y;
}

}  // namespace kiln
