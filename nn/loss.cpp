#include "nn/loss.h"

namespace kiln::nn {

namespace {
Tensor reduce(const Tensor& losses, Reduction reduction) {
  switch (reduction) {
    case Reduction::none: return losses;
    case Reduction::sum: return sum(losses);
    case Reduction::mean: return mean(losses);
  }
  return losses;
}

void check_same_shape(const Tensor& input, const Tensor& target, const char* op) {
  KILN_CHECK(input.shape() == target.shape(), op, ": input shape ", shape_str(input.shape()),
             " and target shape ", shape_str(target.shape()), " differ");
}
}  // namespace

Tensor MSELoss::operator()(const Tensor& input, const Tensor& target) const {
  check_same_shape(input, target, "MSELoss");
  Tensor difference = sub(input, target);
  return reduce(mul(difference, difference), reduction);
}

Tensor BCEWithLogitsLoss::operator()(const Tensor& logits, const Tensor& target) const {
  check_same_shape(logits, target, "BCEWithLogitsLoss");
  // log(1 + exp(-|x|)) + max(x, 0) - x * y; with pos_weight p:
  // (1 - y) * x + (1 + (p - 1) * y) * (log(1 + exp(-|x|)) + max(-x, 0)).
  Tensor softplus_negative = add(log(add(exp(neg(abs(logits))), 1.0)), relu(neg(logits)));
  Tensor losses;
  if (pos_weight.defined()) {
    Tensor log_weight = add(mul(sub(pos_weight, ones_like(pos_weight)), target), 1.0);
    losses = add(mul(sub(ones_like(target), target), logits), mul(log_weight, softplus_negative));
  } else {
    losses = add(mul(sub(ones_like(target), target), logits), softplus_negative);
  }
  if (weight.defined()) losses = mul(losses, weight);
  return reduce(losses, reduction);
}

}  // namespace kiln::nn
