#include "nn/conv.h"

#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "nn/init.h"

namespace kiln::nn {

namespace {
std::string size2_str(Size2 size) {
  return size.h == size.w ? std::to_string(size.h) : "(" + std::to_string(size.h) + ", " + std::to_string(size.w) + ")";
}
}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride, Size2 padding,
               Size2 dilation, int64_t groups, bool with_bias)
    : in_channels(in_channels),
      out_channels(out_channels),
      kernel_size(kernel_size),
      stride(stride),
      padding(padding),
      dilation(dilation),
      groups(groups) {
  KILN_CHECK(in_channels > 0 && out_channels > 0 && groups > 0 && in_channels % groups == 0 &&
                 out_channels % groups == 0,
             "Conv2d: channels (", in_channels, " in, ", out_channels, " out) must be positive and divisible by groups=",
             groups);
  KILN_CHECK(kernel_size.h > 0 && kernel_size.w > 0, "Conv2d: kernel_size must be positive");
  weight = register_parameter("weight", empty({out_channels, in_channels / groups, kernel_size.h, kernel_size.w}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    bias = register_parameter("bias", empty({out_channels}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(init::calculate_fans(weight).fan_in));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  // Parameters stay contiguous for the optimizers; the layout copy is part of
  // the graph (its gradient flows back to the weight).
  const bool channels_last = memory_format == MemoryFormat::channels_last && input.is_cuda() && input.dim() == 4;
  const Tensor w = channels_last ? weight.contiguous(MemoryFormat::channels_last) : weight;
  return conv2d(input, w, bias, stride, padding, dilation, groups);
}

std::string Conv2d::extra_repr() const {
  return std::to_string(in_channels) + ", " + std::to_string(out_channels) + ", kernel_size=" +
         size2_str(kernel_size) + ", stride=" + size2_str(stride) + ", padding=" + size2_str(padding) +
         (bias.defined() ? "" : ", bias=false");
}

bool Conv2d::drop_bias() {
  if (!bias.defined()) return false;
  remove_parameter("bias");
  bias = Tensor();
  return true;
}

BatchNorm::BatchNorm(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                     bool track_running_stats, int spatial_dims)
    : num_features(num_features), eps(eps), momentum(momentum), spatial_dims_(spatial_dims) {
  KILN_CHECK(num_features > 0, "BatchNorm: num_features must be positive, got ", num_features);
  if (affine) {
    weight = register_parameter("weight", ones({num_features}));
    bias = register_parameter("bias", zeros({num_features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}));
    running_var = register_buffer("running_var", ones({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, {.dtype = DType::i64}));
  }
}

// The functional op for the fused pieces (relu, relu then 2x2 max pool).
Tensor BatchNorm::run(const Tensor& input, Fused fused) {
  const int64_t expected_dims = spatial_dims_ == 0 ? 2 : 4;
  KILN_CHECK(input.dim() == expected_dims || (spatial_dims_ == 0 && input.dim() == 3), type_name(),
             ": expected a ", expected_dims, "-D input, got shape ", shape_str(input.shape()));
  const auto op = [fused](auto&&... args) {
    switch (fused) {
      case Fused::none: return batch_norm(args...);
      case Fused::relu: return batch_norm_relu(args...);
      case Fused::relu_max_pool: return batch_norm_relu_max_pool2d(args...);
    }
    KILN_ASSERT(false, "BatchNorm: unknown fusion");
  };
  const bool use_batch_stats = is_training() || !running_mean.defined();
  if (is_training() && is_recomputing()) {
    // The forward already updated the running statistics; the recomputation
    // normalizes with the same batch statistics and leaves them alone.
    return op(input, Tensor(), Tensor(), weight, bias, true, 0.0, eps);
  }
  double factor = momentum.value_or(0.0);
  if (is_training() && num_batches_tracked.defined()) {
    NoGradGuard no_grad;
    // The counter lives with the module; its host value only matters for the
    // cumulative average (momentum=None), which then needs it on the host.
    num_batches_tracked.add_(ones({}, {.dtype = DType::i64, .device = num_batches_tracked.device()}));
    if (!momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  // In eval without running stats (track_running_stats=false) torch uses batch statistics.
  return op(input, running_mean, running_var, weight, bias, use_batch_stats, factor, eps);
}

Tensor BatchNorm::forward(const Tensor& input) { return run(input, Fused::none); }
Tensor BatchNorm::forward_relu(const Tensor& input) { return run(input, Fused::relu); }
Tensor BatchNorm::forward_relu_max_pool2d(const Tensor& input) { return run(input, Fused::relu_max_pool); }

std::string BatchNorm::extra_repr() const {
  return std::to_string(num_features) + ", eps=" + std::to_string(eps) +
         (momentum ? ", momentum=" + std::to_string(*momentum) : ", momentum=None");
}

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : normalized_shape(std::move(normalized_shape)), eps(eps) {
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(this->normalized_shape));
    bias = register_parameter("bias", zeros(this->normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& input) { return layer_norm(input, normalized_shape, weight, bias, eps); }

ConvBnAct::ConvBnAct(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride, Size2 padding) {
  conv = register_module("conv", std::make_shared<Conv2d>(in_channels, out_channels, kernel_size, stride, padding,
                                                         1, 1, /*bias=*/false));
  bn = register_module("bn", std::make_shared<BatchNorm2d>(out_channels));
}

Tensor ConvBnAct::forward(const Tensor& input) { return bn->forward_relu(conv->forward(input)); }

std::shared_ptr<ConvBnAct> conv_bn_act(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride,
                                       Size2 padding) {
  return std::make_shared<ConvBnAct>(in_channels, out_channels, kernel_size, stride, padding);
}

}  // namespace kiln::nn
