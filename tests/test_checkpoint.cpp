#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/allocator.h"
#include "core/generator.h"
#include "nn/checkpoint.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {
struct Gradients {
  std::vector<std::vector<double>> parameters;
  std::vector<double> input;
};

Gradients run(uint64_t seed, bool use_checkpoint, int segments) {
  manual_seed(100);  // same weights every run
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::Dropout>(0.3), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::Dropout>(0.3), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(8, 3)});
  model->to(DType::f64);
  manual_seed(seed);  // same dropout masks for the same seed
  Tensor x = randn({5, 6}, {.dtype = DType::f64}).requires_grad_(true);
  std::vector<nn::ModulePtr> layers;
  for (size_t i = 0; i < model->size(); ++i) layers.push_back((*model)[i]);
  Tensor y = use_checkpoint ? nn::checkpoint_sequential(layers, segments, x) : model->forward(x);
  sum(mul(y, y)).backward();
  Gradients result;
  for (auto& parameter : model->parameters()) result.parameters.push_back(parameter.grad().to_vector<double>());
  result.input = x.grad().to_vector<double>();
  return result;
}
}  // namespace

TEST_CASE("checkpoint_sequential gives the same gradients as the plain forward, dropout on") {
  for (uint64_t seed : {1, 2, 3}) {
    for (int segments : {2, 3}) {
      INFO("seed " << seed << " segments " << segments);
      Gradients plain = run(seed, false, segments);
      Gradients checkpointed = run(seed, true, segments);
      CHECK(checkpointed.input == plain.input);
      REQUIRE(checkpointed.parameters.size() == plain.parameters.size());
      for (size_t i = 0; i < plain.parameters.size(); ++i) CHECK(checkpointed.parameters[i] == plain.parameters[i]);
    }
  }
}

TEST_CASE("checkpoint keeps no activations: the recomputation happens in backward") {
  manual_seed(5);
  auto layer = std::make_shared<nn::Linear>(4, 4);
  int calls = 0;
  Tensor x = randn({2, 4}).requires_grad_(true);
  Tensor y = nn::checkpoint(
      [&](const std::vector<Tensor>& inputs) {
        ++calls;
        return layer->forward(inputs[0]);
      },
      {x});
  CHECK(calls == 1);
  sum(y).backward();
  CHECK(calls == 2);
  CHECK(layer->weight.grad().defined());
  CHECK(x.grad().defined());
}

// What activation checkpointing is for: the graph of a checkpointed run holds
// only the checkpointed parts' outputs, so less memory is live between forward and backward.
TEST_CASE("checkpoint and checkpoint_sequential hold less memory after the forward, with the same gradients") {
  manual_seed(7);
  std::vector<nn::ModulePtr> layers;
  for (int i = 0; i < 8; ++i) {
    layers.push_back(std::make_shared<nn::Linear>(256, 256));
    layers.push_back(std::make_shared<nn::ReLU>());
  }
  auto stack = [&](const std::vector<Tensor>& inputs) {
    Tensor h = inputs[0];
    for (const auto& layer : layers) h = layer->forward(h);
    return h;
  };
  const Tensor input = randn({512, 256});  // each activation: 512 KiB
  enum class Mode { plain, whole, two_segments };
  auto held_after_forward = [&](Mode mode, std::vector<float>* gradient) {
    for (const auto& layer : layers) {
      for (auto& parameter : layer->parameters()) parameter.set_grad(Tensor());
    }
    const Tensor x = input.clone().requires_grad_(true);
    const size_t before = memory_stats(Device::cpu()).allocated_bytes;
    const Tensor y = mode == Mode::plain   ? stack({x})
                     : mode == Mode::whole ? nn::checkpoint(stack, {x})
                                           : nn::checkpoint_sequential(layers, 2, x);
    const size_t held = memory_stats(Device::cpu()).allocated_bytes - before;
    sum(y).backward();
    *gradient = x.grad().to_vector<float>();
    return held;
  };
  std::vector<float> plain_gradient, whole_gradient, segments_gradient;
  const size_t plain = held_after_forward(Mode::plain, &plain_gradient);
  const size_t whole = held_after_forward(Mode::whole, &whole_gradient);
  const size_t segments = held_after_forward(Mode::two_segments, &segments_gradient);
  MESSAGE("held after forward: plain " << plain << " B, checkpoint " << whole << " B, 2 segments " << segments
                                       << " B");
  constexpr size_t kActivation = 512 * 256 * 4;
  CHECK(plain >= 8 * kActivation);        // at least one saved activation per Linear + ReLU
  CHECK(whole <= 2 * kActivation);        // the output (and no saved activation)
  CHECK(segments < plain - 2 * kActivation);  // the first half's activations are gone
  CHECK(whole_gradient == plain_gradient);
  CHECK(segments_gradient == plain_gradient);
}

TEST_CASE("checkpoint reaches parameters even when the input needs no gradient") {
  manual_seed(6);
  auto layer = std::make_shared<nn::Linear>(3, 2);
  Tensor x = randn({4, 3});
  Tensor y = nn::checkpoint(layer, x);
  sum(y).backward();
  REQUIRE(layer->weight.grad().defined());
  // d sum(x W^T + b) / dW = column sums of x, for every output row.
  std::vector<float> grad = layer->weight.grad().to_vector<float>();
  std::vector<float> column_sums = sum(x, {0}).to_vector<float>();
  for (int row = 0; row < 2; ++row) {
    for (int col = 0; col < 3; ++col) CHECK(grad[row * 3 + col] == doctest::Approx(column_sums[col]));
  }
}

TEST_CASE("checkpoint through BatchNorm updates the running statistics once, with the same gradients") {
  struct Outcome {
    std::vector<double> running_mean, running_var, input_grad, weight_grad;
    int64_t batches_tracked = 0;
  };
  auto run_once = [](bool use_checkpoint, std::optional<double> momentum) {
    manual_seed(3);
    auto conv = std::make_shared<nn::Conv2d>(2, 4, 3, 1, 1, 1, 1, false);
    auto bn = std::make_shared<nn::BatchNorm2d>(4, 1e-5, momentum);
    auto block = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{conv, bn, std::make_shared<nn::ReLU>()});
    block->to(DType::f64);
    block->train();
    Tensor x = randn({3, 2, 5, 5}, {.dtype = DType::f64}).requires_grad_(true);
    for (int step = 0; step < 2; ++step) {
      Tensor y = use_checkpoint ? nn::checkpoint(block, x) : block->forward(x);
      sum(mul(y, y)).backward();
    }
    return Outcome{bn->running_mean.to_vector<double>(), bn->running_var.to_vector<double>(),
                   x.grad().to_vector<double>(), conv->weight.grad().to_vector<double>(),
                   bn->num_batches_tracked.item<int64_t>()};
  };
  auto largest_gap = [](const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double gap = 0;
    for (size_t i = 0; i < a.size(); ++i) gap = std::max(gap, std::abs(a[i] - b[i]));
    return gap;
  };
  for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    CAPTURE(momentum.has_value());
    const Outcome plain = run_once(false, momentum), checkpointed = run_once(true, momentum);
    CHECK(checkpointed.batches_tracked == 2);
    CHECK(checkpointed.batches_tracked == plain.batches_tracked);
    CHECK(checkpointed.running_mean == plain.running_mean);
    CHECK(checkpointed.running_var == plain.running_var);
    CHECK(largest_gap(checkpointed.input_grad, plain.input_grad) < 1e-12);
    CHECK(largest_gap(checkpointed.weight_grad, plain.weight_grad) < 1e-12);
  }
  CHECK_FALSE(nn::is_recomputing());
}
