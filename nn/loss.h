// Loss modules with torch.nn's names and defaults (reduction "mean").
#pragma once

#include "core/ops.h"

namespace kiln::nn {

struct CrossEntropyLoss {
  Tensor weight;  // (C) or undefined
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::mean;
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return cross_entropy(logits, target, weight, ignore_index, label_smoothing, reduction);
  }
};

struct NLLLoss {
  Tensor weight;
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const {
    return nll_loss(log_probs, target, weight, ignore_index, reduction);
  }
};

// mean((input - target)^2) for Reduction::mean.
struct MSELoss {
  Reduction reduction = Reduction::mean;
  Tensor operator()(const Tensor& input, const Tensor& target) const;
};

// The numerically stable form: max(x, 0) - x * y + log(1 + exp(-|x|)), with
// pos_weight (C) scaling the positive term when defined.
struct BCEWithLogitsLoss {
  Tensor weight;
  Tensor pos_weight;
  Reduction reduction = Reduction::mean;
  Tensor operator()(const Tensor& logits, const Tensor& target) const;
};

}  // namespace kiln::nn
