#include "nn/init.h"

#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"

namespace kiln::nn::init {

Fans calculate_fans(const Tensor& tensor) {
  KILN_CHECK(tensor.dim() >= 2, "init: fan in and fan out need a tensor with at least 2 dims, got shape ",
             shape_str(tensor.shape()));
  int64_t receptive = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive *= tensor.shape()[d];
  return {tensor.shape()[1] * receptive, tensor.shape()[0] * receptive};
}

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" ||
      nonlinearity == "sigmoid") {
    return 1.0;
  }
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  KILN_THROW("calculate_gain: unsupported nonlinearity '", nonlinearity, "'");
}

Tensor& uniform_(Tensor& tensor, double low, double high) {
  NoGradGuard no_grad;
  Tensor values = rand(tensor.shape(), {.dtype = tensor.dtype(), .device = tensor.device()});
  tensor.copy_(add(mul(values, high - low), low));
  return tensor;
}

Tensor& normal_(Tensor& tensor, double mean, double std) {
  NoGradGuard no_grad;
  Tensor values = randn(tensor.shape(), {.dtype = tensor.dtype(), .device = tensor.device()});
  tensor.copy_(add(mul(values, std), mean));
  return tensor;
}

Tensor& constant_(Tensor& tensor, double value) {
  NoGradGuard no_grad;
  tensor.fill_(value);
  return tensor;
}
Tensor& zeros_(Tensor& tensor) { return constant_(tensor, 0.0); }
Tensor& ones_(Tensor& tensor) { return constant_(tensor, 1.0); }

namespace {
double kaiming_std(const Tensor& tensor, double a, const std::string& mode, const std::string& nonlinearity) {
  Fans fans = calculate_fans(tensor);
  KILN_CHECK(mode == "fan_in" || mode == "fan_out", "kaiming init: mode must be fan_in or fan_out, got '", mode, "'");
  const double fan = static_cast<double>(mode == "fan_in" ? fans.fan_in : fans.fan_out);
  return calculate_gain(nonlinearity, a) / std::sqrt(fan);
}
}  // namespace

Tensor& kaiming_uniform_(Tensor& tensor, double a, const std::string& mode, const std::string& nonlinearity) {
  const double bound = std::sqrt(3.0) * kaiming_std(tensor, a, mode, nonlinearity);
  return uniform_(tensor, -bound, bound);
}

Tensor& kaiming_normal_(Tensor& tensor, double a, const std::string& mode, const std::string& nonlinearity) {
  return normal_(tensor, 0.0, kaiming_std(tensor, a, mode, nonlinearity));
}

Tensor& xavier_uniform_(Tensor& tensor, double gain) {
  Fans fans = calculate_fans(tensor);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fans.fan_in + fans.fan_out));
  return uniform_(tensor, -bound, bound);
}

Tensor& xavier_normal_(Tensor& tensor, double gain) {
  Fans fans = calculate_fans(tensor);
  return normal_(tensor, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fans.fan_in + fans.fan_out)));
}

}  // namespace kiln::nn::init
