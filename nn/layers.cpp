#include "nn/layers.h"

#include <cmath>
#include <iostream>

#include "core/ops.h"
#include "nn/conv.h"
#include "nn/init.h"

namespace kiln::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias)
    : in_features(in_features), out_features(out_features) {
  KILN_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in_features=",
             in_features, " out_features=", out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) { return linear(input, weight, bias); }

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) + ", out_features=" + std::to_string(out_features) +
         ", bias=" + (bias.defined() ? "true" : "false");
}

bool Linear::drop_bias() {
  if (!bias.defined()) return false;
  remove_parameter("bias");
  bias = Tensor();
  return true;
}

Tensor ReLU::forward(const Tensor& input) { return relu(input); }
Tensor GELU::forward(const Tensor& input) { return gelu(input, approximate); }
Tensor SiLU::forward(const Tensor& input) { return silu(input); }
Tensor Tanh::forward(const Tensor& input) { return tanh(input); }
Tensor Sigmoid::forward(const Tensor& input) { return sigmoid(input); }

Dropout::Dropout(double p) : p(p) {
  KILN_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got ", p);
}
Tensor Dropout::forward(const Tensor& input) { return dropout(input, p, is_training()); }

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  KILN_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive, got ", num_embeddings,
             " x ", embedding_dim);
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  init::normal_(weight, 0.0, 1.0);
}
Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

Sequential::Sequential(std::vector<ModulePtr> modules) {
  for (auto& module : modules) push_back(std::move(module));
}

Sequential& Sequential::push_back(ModulePtr module) {
  KILN_CHECK(module != nullptr, "Sequential: null module at position ", modules_.size());
  if (module->is_batch_norm() && !modules_.empty() && modules_.back()->drop_bias()) {
    ++dropped_biases_;
    std::cerr << "kiln: dropped the bias of layer " << modules_.size() - 1 << " (" << modules_.back()->type_name()
              << ") because " << module->type_name() << " follows it and cancels it\n";
  }
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < modules_.size(); ++i) {
    // BatchNorm followed by ReLU runs as one fused pass (conv -> BN -> ReLU is
    // the hot path), and with a 2x2 max pool after them as one op that never
    // stores the full-size activation on the CPU.
    auto* norm = dynamic_cast<BatchNorm*>(modules_[i].get());
    if (norm != nullptr && i + 1 < modules_.size() && dynamic_cast<ReLU*>(modules_[i + 1].get()) != nullptr) {
      auto* pool = i + 2 < modules_.size() ? dynamic_cast<MaxPool2d*>(modules_[i + 2].get()) : nullptr;
      if (pool != nullptr && pool->is_2x2_stride_2() && x.dim() == 4) {
        x = norm->forward_relu_max_pool2d(x);
        i += 2;
        continue;
      }
      x = norm->forward_relu(x);
      ++i;
      continue;
    }
    x = modules_[i]->forward(x);
  }
  return x;
}

}  // namespace kiln::nn
