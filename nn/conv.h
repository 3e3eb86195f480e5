// Convolution, normalization and pooling layers over core/nn_ops.h.
#pragma once

#include <optional>

#include "core/nn_ops.h"
#include "nn/module.h"

namespace kiln::nn {

// torch.nn.Conv2d: weight (O, C/groups, kh, kw) kaiming_uniform(a=sqrt(5)),
// bias uniform(+-1/sqrt(fan_in)).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1, Size2 padding = 0,
         Size2 dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  bool drop_bias() override;
  void set_memory_format(MemoryFormat format) override { memory_format = format; }

  int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding, dilation;
  int64_t groups;
  Tensor weight, bias;
  // channels_last: on a GPU the weight goes to conv2d as a channels-last copy
  // (Module::to(MemoryFormat)), so the convolution runs NHWC whatever the input.
  MemoryFormat memory_format = MemoryFormat::contiguous;
};

// torch.nn.BatchNorm1d/2d: weight ones, bias zeros, running_mean zeros,
// running_var ones, num_batches_tracked (int64). momentum nullopt means the
// cumulative moving average (1 / num_batches_tracked), as torch.
class BatchNorm : public Module {
 public:
  BatchNorm(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1, bool affine = true,
            bool track_running_stats = true, int spatial_dims = 2);
  Tensor forward(const Tensor& input) override;
  // relu(bn(x)) in one fused pass.
  Tensor forward_relu(const Tensor& input);
  // max_pool2d(relu(bn(x)), 2) fused (batch_norm_relu_max_pool2d; 4-D input).
  Tensor forward_relu_max_pool2d(const Tensor& input);
  std::string type_name() const override { return spatial_dims_ == 0 ? "BatchNorm1d" : "BatchNorm2d"; }
  std::string extra_repr() const override;
  bool is_batch_norm() const override { return true; }

  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  enum class Fused { none, relu, relu_max_pool };
  Tensor run(const Tensor& input, Fused fused);
  int spatial_dims_;
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm(num_features, eps, momentum, affine, track_running_stats, 0) {}
};
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm(num_features, eps, momentum, affine, track_running_stats, 2) {}
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LayerNorm"; }
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0)
      : kernel_size(kernel_size), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& input) override { return max_pool2d(input, kernel_size, stride, padding); }
  std::string type_name() const override { return "MaxPool2d"; }
  // 2x2 windows with stride 2 and no padding (what batch_norm_relu_max_pool2d fuses).
  bool is_2x2_stride_2() const {
    return kernel_size == Size2(2) && stride.value_or(kernel_size) == Size2(2) && padding == Size2(0);
  }
  Size2 kernel_size;
  std::optional<Size2> stride;
  Size2 padding;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0)
      : kernel_size(kernel_size), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& input) override { return avg_pool2d(input, kernel_size, stride, padding); }
  std::string type_name() const override { return "AvgPool2d"; }
  Size2 kernel_size;
  std::optional<Size2> stride;
  Size2 padding;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override { return adaptive_avg_pool2d(input, output_size); }
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  Size2 output_size;
};

// conv (no bias) -> BatchNorm2d -> ReLU, run as conv then one fused BN+ReLU
// pass. Its state_dict names are "conv.weight", "bn.weight", ... .
class ConvBnAct : public Module {
 public:
  ConvBnAct(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1, Size2 padding = 0);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ConvBnAct"; }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

// The seed documents' advice as a builder: a conv followed by BatchNorm gets no bias.
std::shared_ptr<ConvBnAct> conv_bn_act(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
                                       Size2 stride = 1, Size2 padding = 0);

}  // namespace kiln::nn
