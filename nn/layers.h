// Basic layers: Linear, activations, Dropout, Flatten, Identity, Embedding,
// Sequential. Defaults and initialization follow torch.nn.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"

namespace kiln::nn {

// y = x W^T + b; W (out, in) kaiming_uniform(a=sqrt(5)), b uniform(+-1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;
  bool drop_bias() override;
  void reset_parameters();

  int64_t in_features, out_features;
  Tensor weight, bias;
};

// Elementwise activations without parameters.
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ReLU"; }
};
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "GELU"; }
  std::string approximate;
};
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SiLU"; }
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Tanh"; }
};
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Sigmoid"; }
};
class Identity : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input; }
  std::string type_name() const override { return "Identity"; }
};
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim, end_dim); }
  std::string type_name() const override { return "Flatten"; }
  int64_t start_dim, end_dim;
};
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override { return "p=" + std::to_string(p); }
  double p;
};
// Rows of a (num_embeddings, embedding_dim) table, initialized N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  int64_t num_embeddings, embedding_dim;
  Tensor weight;
};

// Children named "0", "1", ... run in order. A layer with a bias directly
// followed by BatchNorm gets its bias dropped, with a one-line notice: the
// normalization subtracts the mean, so the bias does nothing but cost time.
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<ModulePtr> modules);
  Sequential& push_back(ModulePtr module);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return modules_.size(); }
  const ModulePtr& operator[](size_t index) const { return modules_.at(index); }
  // Number of biases dropped before BatchNorm so far (for tests).
  int dropped_biases() const { return dropped_biases_; }

 private:
  std::vector<ModulePtr> modules_;
  int dropped_biases_ = 0;
};

}  // namespace kiln::nn
