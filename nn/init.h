// Parameter initializers, drawing from the default generator of the tensor's
// device (seeded Philox), with PyTorch's formulas. Each writes in place
// (under no_grad) and returns the tensor.
#pragma once

#include <string>

#include "core/tensor.h"

namespace kiln::nn::init {

struct Fans {
  int64_t fan_in;
  int64_t fan_out;
};
// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field.
Fans calculate_fans(const Tensor& tensor);
// torch.nn.init.calculate_gain for "linear", "conv2d", "sigmoid", "tanh", "relu", "leaky_relu".
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

Tensor& uniform_(Tensor& tensor, double low, double high);
Tensor& normal_(Tensor& tensor, double mean, double std);
Tensor& constant_(Tensor& tensor, double value);
Tensor& zeros_(Tensor& tensor);
Tensor& ones_(Tensor& tensor);
// mode "fan_in" or "fan_out"; nonlinearity as calculate_gain.
Tensor& kaiming_uniform_(Tensor& tensor, double a = 0, const std::string& mode = "fan_in",
                         const std::string& nonlinearity = "leaky_relu");
Tensor& kaiming_normal_(Tensor& tensor, double a = 0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu");
Tensor& xavier_uniform_(Tensor& tensor, double gain = 1.0);
Tensor& xavier_normal_(Tensor& tensor, double gain = 1.0);

}  // namespace kiln::nn::init
