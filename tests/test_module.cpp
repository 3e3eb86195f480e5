#include <doctest/doctest.h>

#include <cmath>

#include "core/generator.h"
#include "nn/layers.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {
// A module with a parameter, a buffer and nested children, to check dotted names.
struct Block : nn::Module {
  Block() {
    scale = register_parameter("scale", ones({3}));
    count = register_buffer("count", zeros({1}, {.dtype = DType::i64}));
    inner = register_module("inner", std::make_shared<nn::Linear>(3, 2));
  }
  std::string type_name() const override { return "Block"; }
  Tensor scale, count;
  std::shared_ptr<nn::Linear> inner;
};
}  // namespace

TEST_CASE("Module: dotted names, parameters vs buffers, counts") {
  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<Block>(), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(2, 4)});
  std::vector<std::string> names;
  for (auto& [name, tensor] : model->state_dict()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0.scale", "0.inner.weight", "0.inner.bias", "2.weight", "2.bias", "0.count"});
  CHECK(model->parameters().size() == 5);
  CHECK(model->parameter_count() == 3 + 6 + 2 + 8 + 4);
  for (auto& [name, buffer] : model->named_buffers()) CHECK_FALSE(buffer.requires_grad());
  for (auto& parameter : model->parameters()) CHECK(parameter.requires_grad());
  const std::string summary = model->summary();
  CHECK(summary.find("0.inner") != std::string::npos);
  CHECK(summary.find("total parameters: 23") != std::string::npos);
  model->eval();
  CHECK_FALSE((*model)[0]->is_training());
  model->train();
  CHECK((*model)[2]->is_training());
}

TEST_CASE("Module: load_state_dict copies values and lists missing, unexpected and mis-shaped keys") {
  manual_seed(1);
  nn::Linear a(3, 2), b(3, 2);
  b.load_state_dict(a.state_dict());
  CHECK(b.weight.to_vector<float>() == a.weight.to_vector<float>());
  // The layer's own handle sees the loaded values (copied into the same tensor).
  CHECK(b.parameters()[0].same(b.weight));

  nn::StateDict bad = {{"weight", zeros({2, 4})}, {"extra", zeros({1})}};
  try {
    b.load_state_dict(bad);
    FAIL("expected an error");
  } catch (const Error& error) {
    const std::string message = error.what();
    CHECK(message.find("missing keys: bias") != std::string::npos);
    CHECK(message.find("unexpected keys: extra") != std::string::npos);
    CHECK(message.find("shape mismatch: weight") != std::string::npos);
  }
  // Nothing was written by the failed load.
  CHECK(b.weight.to_vector<float>() == a.weight.to_vector<float>());
  // Non-strict ignores missing/unexpected keys.
  nn::Linear c(3, 2);
  c.load_state_dict({{"bias", ones({2})}, {"extra", zeros({1})}}, /*strict=*/false);
  CHECK(c.bias.to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("Module::to(dtype) converts parameters in place so every handle sees it") {
  manual_seed(2);
  nn::Linear layer(4, 3);
  Tensor handle = layer.weight;
  std::vector<float> before = handle.to_vector<float>();
  layer.to(DType::f64);
  CHECK(handle.dtype() == DType::f64);
  CHECK(layer.weight.dtype() == DType::f64);
  std::vector<double> after = handle.to_vector<double>();
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == doctest::Approx(before[i]));
  CHECK(handle.requires_grad());
}

TEST_CASE("Linear: PyTorch's default initialization bounds and forward") {
  manual_seed(3);
  nn::Linear layer(100, 50);
  const double bound = 1.0 / std::sqrt(100.0);  // kaiming_uniform(a=sqrt(5)) gives 1/sqrt(fan_in)
  double max_abs = 0;
  for (float w : layer.weight.to_vector<float>()) max_abs = std::max(max_abs, static_cast<double>(std::abs(w)));
  CHECK(max_abs <= bound);
  CHECK(max_abs > 0.9 * bound);  // 5000 draws come close to the bound
  Tensor x = ones({2, 100});
  Tensor y = layer(x);
  CHECK(y.shape() == Shape{2, 50});
}

TEST_CASE("Sequential drops the bias of a layer directly followed by BatchNorm") {
  struct FakeBatchNorm : nn::Module {
    std::string type_name() const override { return "FakeBatchNorm"; }
    bool is_batch_norm() const override { return true; }
    Tensor forward(const Tensor& x) override { return x; }
  };
  auto linear = std::make_shared<nn::Linear>(4, 4, /*bias=*/true);
  nn::Sequential model;
  model.push_back(linear).push_back(std::make_shared<FakeBatchNorm>());
  CHECK(model.dropped_biases() == 1);
  CHECK_FALSE(linear->bias.defined());
  CHECK(model.state_dict().size() == 1);
  // Without BatchNorm after it, a bias stays.
  nn::Sequential plain;
  auto kept = std::make_shared<nn::Linear>(4, 4);
  plain.push_back(kept).push_back(std::make_shared<nn::ReLU>());
  CHECK(kept->bias.defined());
}
