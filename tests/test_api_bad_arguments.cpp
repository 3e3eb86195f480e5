// Bad and edge-case arguments for the public API outside the tensor ops: the
// nn layers, optimizers, schedulers and scalers, the data pipeline, the
// Trainer and its callbacks, and the example binaries' flags. Every call must
// either work (and give the right answer where the case says what that is) or
// throw kiln::Error whose message names the thing that was wrong: never crash,
// throw another exception type, hang, or take a value torch refuses and then
// misbehave. A failed load must leave the module / optimizer as it was.
//
// Each test case runs a list of cases through a Sweep and reports every failure
// at the end (one failure does not stop the rest), naming the API, the argument
// and what happened. A fatal signal or a case running over a minute prints the
// case before the process goes down.
#include <doctest/doctest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/image_io.h"
#include "data/sampler.h"
#include "data/transforms.h"
#include "nn/conv.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/models.h"
#include "nn/transformer.h"
#include "optim/clip_grad.h"
#include "optim/ema.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "optim/swa.h"
#include "tests/support/misuse_sweep.h"
#include "tests/support/run_binary.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/accumulation_scheduler.h"
#include "trainer/batch_size_finder.h"
#include "trainer/callbacks.h"
#include "trainer/lr_finder.h"
#include "trainer/trainer.h"

namespace fs = std::filesystem;

namespace kiln::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using sweep::CrashReporter;
using sweep::g_where;
using sweep::set_case;
using sweep::Sweep;

std::vector<double> values_of(const nn::Module& module) {
  std::vector<double> out;
  for (const auto& [name, t] : module.state_dict()) {
    for (double v : t.to(DType::f64).contiguous().to_vector<double>()) out.push_back(v);
  }
  return out;
}

Tensor leaf(const Shape& shape) {
  Tensor t = randn(shape);
  t.requires_grad_(true);
  return t;
}

// A parameter list with gradients, for the optimizer and clipping cases.
std::vector<Tensor> params_with_grads() {
  std::vector<Tensor> params = {leaf({2, 3}), leaf({3})};
  for (Tensor& p : params) p.set_grad(randn(p.shape()));
  return params;
}

}  // namespace

// ================================================================ nn

TEST_CASE("bad arguments: nn layer constructors refuse bad sizes with the layer's name") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(1);
  for (int64_t bad : {int64_t{0}, int64_t{-3}}) {
    const std::string b = std::to_string(bad);
    s.refuses("Linear(in_features=" + b + ", 4)", {"Linear", b}, [&] { nn::Linear(bad, 4); });
    s.refuses("Linear(4, out_features=" + b + ")", {"Linear", b}, [&] { nn::Linear(4, bad); });
    s.refuses("Embedding(num_embeddings=" + b + ", 4)", {"Embedding", b}, [&] { nn::Embedding(bad, 4); });
    s.refuses("Embedding(4, embedding_dim=" + b + ")", {"Embedding", b}, [&] { nn::Embedding(4, bad); });
    s.refuses("Conv2d(in_channels=" + b + ")", {"Conv2d", b}, [&] { nn::Conv2d(bad, 4, 3); });
    s.refuses("Conv2d(out_channels=" + b + ")", {"Conv2d", b}, [&] { nn::Conv2d(4, bad, 3); });
    s.refuses("Conv2d(groups=" + b + ")", {"Conv2d", "groups"}, [&] { nn::Conv2d(4, 4, 3, 1, 0, 1, bad); });
    s.refuses("Conv2d(kernel_size=" + b + ")", {"Conv2d", "kernel_size"}, [&] { nn::Conv2d(4, 4, bad); });
    s.refuses("Conv2d(kernel_size=(3, " + b + "))", {"Conv2d", "kernel_size"},
              [&] { nn::Conv2d(4, 4, Size2{3, bad}); });
    s.refuses("BatchNorm2d(num_features=" + b + ")", {"BatchNorm", b}, [&] { nn::BatchNorm2d{bad}; });
    s.refuses("BatchNorm1d(num_features=" + b + ")", {"BatchNorm", b}, [&] { nn::BatchNorm1d{bad}; });
    s.refuses("MultiheadAttention(embed_dim=" + b + ", 1)", {"MultiheadAttention", b},
              [&] { nn::MultiheadAttention(bad, 1); });
    s.refuses("MultiheadAttention(8, num_heads=" + b + ")", {"MultiheadAttention", b},
              [&] { nn::MultiheadAttention(8, bad); });
    s.refuses("TransformerEncoderLayer(d_model=8, nhead=" + b + ")", {b}, [&] { nn::TransformerEncoderLayer(8, bad); });
    s.refuses("TransformerEncoderLayer(dim_feedforward=" + b + ")", {b}, [&] {
      nn::TransformerLayerOptions o;
      o.dim_feedforward = bad;
      nn::TransformerEncoderLayer(8, 2, o);
    });
    s.refuses("MLP(hidden=" + b + ")", {b}, [&] { nn::MLP(784, bad, 10); });
    s.refuses("FashionCNN(num_classes=" + b + ")", {b}, [&] { nn::FashionCNN{bad}; });
    s.refuses("ResNet9(num_classes=" + b + ")", {b}, [&] { nn::ResNet9(1, bad); });
    s.refuses("ResNet9(in_channels=" + b + ")", {b}, [&] { nn::ResNet9(bad, 10); });
  }
  s.refuses("Conv2d(4, 6, groups=4): out_channels not divisible", {"Conv2d", "groups=4"},
            [] { nn::Conv2d(4, 6, 3, 1, 0, 1, 4); });
  s.refuses("Conv2d(6, 4, groups=4): in_channels not divisible", {"Conv2d", "groups=4"},
            [] { nn::Conv2d(6, 4, 3, 1, 0, 1, 4); });
  // Sizes whose weight would not fit in int64 elements: refused by the allocation, naming the shape.
  s.refuses("Linear(2^40, 2^40)", {"1099511627776", "overflows"}, [] { nn::Linear(int64_t{1} << 40, int64_t{1} << 40); });
  s.refuses("Conv2d(kernel_size=2^31)", {"2147483648", "overflows"}, [] { nn::Conv2d(1 << 20, 1 << 20, int64_t{1} << 31); });
  s.refuses("Embedding(2^62, 2^62)", {"4611686018427387904", "overflows"}, [] { nn::Embedding(int64_t{1} << 62, int64_t{1} << 62); });

  for (double p : {-0.1, 1.5, kNaN}) {
    const std::string text = std::to_string(p);
    s.refuses("Dropout(p=" + text + ")", {"Dropout", "p"}, [&] { nn::Dropout{p}; });
    s.refuses("MultiheadAttention(dropout=" + text + ")", {"MultiheadAttention", "dropout"},
              [&] { nn::MultiheadAttention(8, 2, p); });
    s.refuses("TransformerEncoderLayer(dropout=" + text + ")", {"dropout"}, [&] {
      nn::TransformerLayerOptions o;
      o.dropout = p;
      nn::TransformerEncoderLayer(8, 2, o);
    });
  }
  s.works("Dropout(p=0) and Dropout(p=1) (torch accepts both)", []() -> std::string {
    nn::Dropout keep(0.0), drop(1.0);
    Tensor x = ones({4, 4});
    if (sum(keep(x)).item<double>() != 16) return "p=0 changed the input";
    if (sum(drop(x)).item<double>() != 0) return "p=1 kept something";
    return "";
  });
  s.refuses("MultiheadAttention(embed_dim=8, num_heads=3)", {"MultiheadAttention", "8", "3"},
            [] { nn::MultiheadAttention(8, 3); });
  s.refuses("TransformerEncoderLayer(d_model=8, nhead=3)", {"8", "3"}, [] { nn::TransformerEncoderLayer(8, 3); });
  s.refuses("TransformerDecoderLayer(d_model=8, nhead=3)", {"8", "3"}, [] { nn::TransformerDecoderLayer(8, 3); });
  s.refuses("TransformerEncoderLayer(activation=\"tanh\")", {"TransformerEncoderLayer", "tanh"}, [] {
    nn::TransformerLayerOptions o;
    o.activation = "tanh";
    nn::TransformerEncoderLayer(8, 2, o);
  });
  s.refuses("GELU(approximate=\"fast\").forward", {"fast"}, [] { nn::GELU("fast")(ones({2})); });
  s.refuses("LayerNorm({-3})", {"-3"}, [] { nn::LayerNorm({-3}); });
  s.refuses("RMSNorm({-3})", {"-3"}, [] { nn::RMSNorm({-3}); });
  s.refuses("Sequential.push_back(nullptr)", {"Sequential", "null"}, [] { nn::Sequential().push_back(nullptr); });
  s.refuses("ViTConfig(patch_size=0)", {"ViT", "patch_size"}, [] {
    nn::ViTConfig c;
    c.patch_size = 0;
    nn::ViT{c};
  });
  s.refuses("ViTConfig(image_size=28, patch_size=5)", {"ViT"}, [] {
    nn::ViTConfig c;
    c.patch_size = 5;
    nn::ViT{c};
  });
  s.refuses("GPTConfig(n_embd=10, n_head=3)", {"GPT", "n_head"}, [] {
    nn::GPTConfig c;
    c.n_embd = 10;
    c.n_head = 3;
    nn::GPT{c};
  });
  s.refuses("GPTConfig(vocab_size=0)", {"GPT", "vocab_size"}, [] {
    nn::GPTConfig c;
    c.vocab_size = 0;
    nn::GPT{c};
  });
  s.refuses("GPTConfig::named(\"gpt5\")", {"gpt5"}, [] { nn::GPTConfig::named("gpt5"); });
  s.refuses("BasicBlock(0, 4)", {"0"}, [] { nn::BasicBlock(0, 4); });
  s.refuses("BasicBlock(4, 4, stride=0)", {"stride"}, [] { nn::BasicBlock(4, 4, 0)(randn({1, 4, 4, 4})); });
  s.finish();
}

TEST_CASE("bad arguments: nn forward refuses inputs of the wrong rank, size, dtype") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(2);
  nn::Linear linear(4, 3);
  s.refuses("Linear(4, 3).forward((2, 5))", {"5"}, [&] { linear(randn({2, 5})); });
  s.refuses("Linear(4, 3).forward(int64 input)", {"int64"},
            [&] { linear(zeros({2, 4}, {.dtype = DType::i64})); });
  s.refuses("Linear(4, 3).forward(undefined)", {"undefined"}, [&] { linear(Tensor()); });
  s.works("Linear(4, 3).forward((4)) (1-d, as torch)", [&]() -> std::string {
    return linear(randn({4})).shape() == Shape{3} ? "" : "wrong output shape";
  });
  nn::Conv2d conv(3, 4, 3);
  s.refuses("Conv2d(3, 4, 3).forward((1, 2, 5, 5)): wrong channels", {"3", "2"}, [&] { conv(randn({1, 2, 5, 5})); });
  s.refuses("Conv2d(3, 4, 3).forward((5, 5)): wrong rank", {"conv2d", "[5, 5]"}, [&] { conv(randn({5, 5})); });
  s.refuses("Conv2d(3, 4, 3).forward((1, 3, 2, 2)): smaller than the kernel", {"kernel"},
            [&] { conv(randn({1, 3, 2, 2})); });
  s.refuses("Conv2d(3, 4, 3).forward(float64 input)", {"float64"}, [&] { conv(randn({1, 3, 5, 5}, {.dtype = DType::f64})); });
  for (auto [label, make] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"stride=0", [] { nn::Conv2d(1, 1, 3, 0)(randn({1, 1, 5, 5})); }},
           {"stride=-1", [] { nn::Conv2d(1, 1, 3, -1)(randn({1, 1, 5, 5})); }},
           {"padding=-1", [] { nn::Conv2d(1, 1, 3, 1, -1)(randn({1, 1, 5, 5})); }},
           {"dilation=0", [] { nn::Conv2d(1, 1, 3, 1, 0, 0)(randn({1, 1, 5, 5})); }},
           {"dilation=-2", [] { nn::Conv2d(1, 1, 3, 1, 0, -2)(randn({1, 1, 5, 5})); }},
       }) {
    const std::string word = label.substr(0, label.find('='));
    s.refuses("Conv2d(" + label + ") construct + forward", {word}, make);
  }
  nn::BatchNorm2d bn(3);
  s.refuses("BatchNorm2d(3).forward((2, 3)): wrong rank", {"BatchNorm2d"}, [&] { bn(randn({2, 3})); });
  s.refuses("BatchNorm2d(3).forward((2, 4, 2, 2)): wrong channels", {"4"}, [&] { bn(randn({2, 4, 2, 2})); });
  nn::BatchNorm1d bn1(3);
  s.refuses("BatchNorm1d(3).forward((2, 3, 4, 4)): wrong rank", {"BatchNorm1d"}, [&] { bn1(randn({2, 3, 4, 4})); });
  nn::LayerNorm ln({4});
  s.refuses("LayerNorm({4}).forward((2, 5))", {"4", "5"}, [&] { ln(randn({2, 5})); });
  nn::RMSNorm rms({4});
  s.refuses("RMSNorm({4}).forward((2, 5))", {"5"}, [&] { rms(randn({2, 5})); });
  nn::Embedding embedding(5, 3);
  for (int64_t index : {int64_t{5}, int64_t{-1}, int64_t{1} << 40}) {
    s.refuses("Embedding(5, 3).forward(index " + std::to_string(index) + ")", {std::to_string(index)},
              [&] { embedding(tensor<int64_t>({0, index}, {2})); });
  }
  s.refuses("Embedding(5, 3).forward(float indices)", {"float"}, [&] { embedding(zeros({2})); });
  nn::MultiheadAttention mha(8, 2);
  s.refuses("MultiheadAttention(8, 2).forward((3, 2, 6))", {"MultiheadAttention"}, [&] { mha(randn({3, 2, 6})); });
  s.refuses("MultiheadAttention(8, 2).forward((3, 8)): 2-D", {"MultiheadAttention"}, [&] { mha(randn({3, 8})); });
  s.refuses("MultiheadAttention(8, 2) key_padding_mask of the wrong shape", {"key_padding_mask"}, [&] {
    Tensor x = randn({3, 2, 8});
    mha.forward(x, x, x, zeros({2, 4}, {.dtype = DType::b8}));
  });
  s.refuses("MaxPool2d(kernel_size=0).forward", {"kernel"}, [] { nn::MaxPool2d(0)(randn({1, 1, 4, 4})); });
  s.refuses("MaxPool2d(2, stride=0).forward", {"stride"}, [] { nn::MaxPool2d(2, Size2{0})(randn({1, 1, 4, 4})); });
  s.refuses("MaxPool2d(2, padding=2).forward (more than half the kernel)", {"pad"},
            [] { nn::MaxPool2d(2, std::nullopt, 2)(randn({1, 1, 4, 4})); });
  s.refuses("AvgPool2d(kernel_size=-1).forward", {"kernel"}, [] { nn::AvgPool2d(-1)(randn({1, 1, 4, 4})); });
  s.refuses("AdaptiveAvgPool2d(0).forward", {"output"}, [] { nn::AdaptiveAvgPool2d(0)(randn({1, 1, 4, 4})); });
  s.refuses("Flatten(start_dim=5).forward((2, 3))", {"5"}, [] { nn::Flatten(5)(randn({2, 3})); });
  s.refuses("FashionCNN.forward((2, 1, 20, 20))", {}, [] { nn::FashionCNN()(randn({2, 1, 20, 20})); });
  nn::ViTConfig vit_config;
  vit_config.dim = 16;
  vit_config.depth = 1;
  vit_config.heads = 2;
  vit_config.mlp_dim = 16;
  nn::ViT vit(vit_config);
  s.refuses("ViT.forward((1, 1, 32, 32)): wrong image size", {"ViT"}, [&] { vit(randn({1, 1, 32, 32})); });
  nn::GPTConfig gpt_config;
  gpt_config.block_size = 4;
  gpt_config.vocab_size = 7;
  gpt_config.n_layer = 1;
  gpt_config.n_head = 2;
  gpt_config.n_embd = 8;
  nn::GPT gpt(gpt_config);
  s.refuses("GPT.forward(8 tokens, block_size 4)", {"block_size"},
            [&] { gpt(zeros({1, 8}, {.dtype = DType::i64})); });
  s.refuses("GPT.forward(token 7 of vocab 7)", {"7"}, [&] { gpt(full({1, 2}, 7.0, {.dtype = DType::i64})); });
  s.refuses("GPT.forward(float tokens)", {"GPT"}, [&] { gpt(zeros({1, 2})); });
  s.refuses("GPT.generate(temperature=0)", {"temperature"},
            [&] { gpt.generate(zeros({1, 2}, {.dtype = DType::i64}), 2, 0.0); });

  // Losses.
  s.refuses("CrossEntropyLoss(label_smoothing=1.5)", {"label_smoothing"}, [] {
    nn::CrossEntropyLoss loss;
    loss.label_smoothing = 1.5;
    loss(randn({2, 3}), tensor<int64_t>({0, 1}, {2}));
  });
  s.refuses("CrossEntropyLoss(label_smoothing=-0.1)", {"label_smoothing"}, [] {
    nn::CrossEntropyLoss loss;
    loss.label_smoothing = -0.1;
    loss(randn({2, 3}), tensor<int64_t>({0, 1}, {2}));
  });
  s.refuses("CrossEntropyLoss target 3 of 3 classes", {"3"},
            [] { nn::CrossEntropyLoss{}(randn({2, 3}), tensor<int64_t>({0, 3}, {2})); });
  s.refuses("CrossEntropyLoss weight of 2 for 3 classes", {"weight"}, [] {
    nn::CrossEntropyLoss loss;
    loss.weight = ones({2});
    loss(randn({2, 3}), tensor<int64_t>({0, 1}, {2}));
  });
  s.refuses("MSELoss shapes (2, 3) and (3, 2)", {"MSELoss"}, [] { nn::MSELoss{}(randn({2, 3}), randn({3, 2})); });
  s.refuses("BCEWithLogitsLoss pos_weight of 2 for 3 classes", {}, [] {
    nn::BCEWithLogitsLoss loss;
    loss.pos_weight = ones({2});
    loss(randn({2, 3}), zeros({2, 3}));
  });
  s.finish();
}

TEST_CASE("bad arguments: nn init functions and load_state_dict") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(3);
  for (const Shape& shape : {Shape{}, Shape{4}}) {
    const std::string text = shape_str(shape);
    s.refuses("init::calculate_fans(" + text + ")", {"fan", text}, [&] { nn::init::calculate_fans(zeros(shape)); });
    s.refuses("init::kaiming_uniform_(" + text + ")", {"fan"}, [&] {
      Tensor t = zeros(shape);
      nn::init::kaiming_uniform_(t);
    });
    s.refuses("init::kaiming_normal_(" + text + ")", {"fan"}, [&] {
      Tensor t = zeros(shape);
      nn::init::kaiming_normal_(t);
    });
    s.refuses("init::xavier_uniform_(" + text + ")", {"fan"}, [&] {
      Tensor t = zeros(shape);
      nn::init::xavier_uniform_(t);
    });
    s.refuses("init::xavier_normal_(" + text + ")", {"fan"}, [&] {
      Tensor t = zeros(shape);
      nn::init::xavier_normal_(t);
    });
  }
  // torch: a zero-element tensor is left alone (with a warning); never NaN or a crash.
  for (const Shape& shape : {Shape{0, 4}, Shape{4, 0}, Shape{3, 0, 2, 2}}) {
    s.works("init::kaiming_uniform_(" + shape_str(shape) + ")", [&] {
      Tensor t = zeros(shape);
      nn::init::kaiming_uniform_(t);
      nn::init::xavier_normal_(t);
    });
  }
  s.refuses("init::kaiming_uniform_(mode=\"fan_avg\")", {"mode", "fan_avg"}, [] {
    Tensor t = zeros({3, 3});
    nn::init::kaiming_uniform_(t, 0, "fan_avg");
  });
  s.refuses("init::calculate_gain(\"swish\")", {"swish"}, [] { nn::init::calculate_gain("swish"); });
  s.works("init::uniform_ on int64 and 0-d tensors", [] {
    Tensor a = zeros({}, {.dtype = DType::f32});
    nn::init::normal_(a, 0, 1);
    nn::init::constant_(a, 2);
  });

  // load_state_dict: refused whole, nothing written.
  auto model = [] {
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(3, 2));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::BatchNorm1d>(2));
    return m;
  };
  auto good = model()->state_dict();
  auto change = [&](const std::function<void(nn::StateDict&)>& edit) {
    nn::StateDict state;
    for (const auto& [name, t] : good) state.emplace_back(name, add(t, 1.0).to(t.dtype()));  // different values
    edit(state);
    return state;
  };
  auto refuses_load = [&](const std::string& what, std::vector<std::string> words, nn::StateDict state,
                          bool strict = true) {
    auto m = model();
    const std::vector<double> before = values_of(*m);
    s.refuses("Module.load_state_dict: " + what, words, [&] { m->load_state_dict(state, strict); });
    s.works("Module.load_state_dict: " + what + " leaves the module unchanged", [&]() -> std::string {
      return values_of(*m) == before ? "" : "the module was changed by the failed load";
    });
  };
  auto erase = [](nn::StateDict& st, const std::string& key) {
    auto it = std::find_if(st.begin(), st.end(), [&](auto& e) { return e.first == key; });
    REQUIRE(it != st.end());
    st.erase(it);
  };
  refuses_load("missing key 0.bias", {"missing", "0.bias"}, change([&](nn::StateDict& st) { erase(st, "0.bias"); }));
  refuses_load("unexpected key 3.weight", {"unexpected", "3.weight"},
               change([](nn::StateDict& st) { st.emplace_back("3.weight", ones({2})); }));
  refuses_load("0.weight of shape (3, 2)", {"0.weight", "[3, 2]"}, change([](nn::StateDict& st) {
                 for (auto& [name, t] : st)
                   if (name == "0.weight") t = ones({3, 2});
               }));
  refuses_load("0.weight of shape (3, 2), non-strict", {"0.weight"}, change([](nn::StateDict& st) {
                 for (auto& [name, t] : st)
                   if (name == "0.weight") t = ones({3, 2});
               }),
               false);
  refuses_load("float num_batches_tracked", {"num_batches_tracked"}, change([](nn::StateDict& st) {
                 for (auto& [name, t] : st)
                   if (name == "2.num_batches_tracked") t = full({}, kNaN);
               }));
  refuses_load("undefined 0.bias", {"0.bias"}, change([](nn::StateDict& st) {
                 for (auto& [name, t] : st)
                   if (name == "0.bias") t = Tensor();
               }));
  s.works("Module.load_state_dict: int64 values into float parameters (converted, as torch)", [&]() -> std::string {
    auto m = model();
    m->load_state_dict(change([](nn::StateDict& st) {
      for (auto& [name, t] : st)
        if (name == "0.bias") t = tensor<int64_t>({4, 5}, {2});
    }));
    return m->state_dict()[1].second.to_vector<float>() == std::vector<float>{4, 5} ? "" : "wrong values";
  });
  s.works("Module.load_state_dict: missing key, non-strict, loads the rest", [&]() -> std::string {
    auto m = model();
    nn::StateDict state = change([&](nn::StateDict& st) { erase(st, "0.weight"); });
    m->load_state_dict(state, false);
    return m->state_dict()[1].second.to_vector<float>() == state[0].second.to_vector<float>() ? "" : "not loaded";
  });
  s.refuses("Module.register_parameter twice under one name", {"weight"}, [] {
    nn::Linear l(2, 2);
    l.register_parameter("weight", ones({2}));
  });
  s.finish();
}

// ================================================================ optim

TEST_CASE("bad arguments: optimizers refuse bad hyperparameters and parameters") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(4);
  for (double bad : {-0.1, kNaN}) {
    const std::string b = bad == bad ? "-0.1" : "nan";
    s.refuses("SGD(lr=" + b + ")", {"SGD", "learning rate"}, [&] { optim::SGD(params_with_grads(), {.lr = bad}); });
    s.refuses("SGD(momentum=" + b + ")", {"SGD", "momentum"},
              [&] { optim::SGD(params_with_grads(), {.lr = 0.1, .momentum = bad}); });
    s.refuses("SGD(weight_decay=" + b + ")", {"SGD", "weight_decay"},
              [&] { optim::SGD(params_with_grads(), {.lr = 0.1, .weight_decay = bad}); });
    s.refuses("SGD(dampening=" + b + ")", {"SGD", "dampening"},
              [&] { optim::SGD(params_with_grads(), {.lr = 0.1, .dampening = bad}); });
    s.refuses("Adam(lr=" + b + ")", {"Adam", "learning rate"}, [&] { optim::Adam(params_with_grads(), {.lr = bad}); });
    s.refuses("Adam(eps=" + b + ")", {"Adam", "eps"}, [&] { optim::Adam(params_with_grads(), {.eps = bad}); });
    s.refuses("Adam(weight_decay=" + b + ")", {"Adam", "weight_decay"},
              [&] { optim::Adam(params_with_grads(), {.weight_decay = bad}); });
    s.refuses("AdamW(lr=" + b + ")", {"AdamW", "learning rate"}, [&] {
      optim::AdamWOptions o;
      o.lr = bad;
      optim::AdamW(params_with_grads(), o);
    });
    s.refuses("LAMB(eps=" + b + ")", {"LAMB", "eps"}, [&] { optim::LAMB(params_with_grads(), {.eps = bad}); });
    s.refuses("LARS(trust_coefficient=" + b + ")", {"LARS", "trust_coefficient"},
              [&] { optim::LARS(params_with_grads(), {.trust_coefficient = bad}); });
    s.refuses("LARS(lr=" + b + ")", {"LARS", "learning rate"}, [&] { optim::LARS(params_with_grads(), {.lr = bad}); });
  }
  for (double beta : {-0.1, 1.0, 1.5, kNaN}) {
    const std::string b = std::to_string(beta);
    s.refuses("Adam(beta1=" + b + ")", {"Adam", "beta1"}, [&] { optim::Adam(params_with_grads(), {.beta1 = beta}); });
    s.refuses("Adam(beta2=" + b + ")", {"Adam", "beta2"}, [&] { optim::Adam(params_with_grads(), {.beta2 = beta}); });
    s.refuses("LAMB(beta1=" + b + ")", {"LAMB", "beta1"}, [&] { optim::LAMB(params_with_grads(), {.beta1 = beta}); });
    s.refuses("LAMB(beta2=" + b + ")", {"LAMB", "beta2"}, [&] { optim::LAMB(params_with_grads(), {.beta2 = beta}); });
  }
  s.refuses("SGD(nesterov, momentum=0)", {"SGD", "Nesterov"},
            [] { optim::SGD(params_with_grads(), {.lr = 0.1, .nesterov = true}); });
  s.refuses("SGD(nesterov, dampening=0.5)", {"SGD", "Nesterov"},
            [] { optim::SGD(params_with_grads(), {.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .nesterov = true}); });
  s.refuses("SGD(nesterov) with a group of momentum 0", {"SGD", "Nesterov"}, [] {
    std::vector<optim::ParamGroup> groups(2);
    groups[0].params = {leaf({2})};
    groups[1].params = {leaf({2})};
    groups[1].momentum = 0.0;
    optim::SGD(groups, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  });
  s.refuses("SGD(empty parameter list)", {"SGD", "empty"}, [] { optim::SGD(std::vector<Tensor>{}, {.lr = 0.1}); });
  s.refuses("Adam(no parameter groups)", {"Adam", "groups"}, [] { optim::Adam(std::vector<optim::ParamGroup>{}, {}); });
  // torch allows an empty group beside others.
  s.works_or_refuses("Adam(a group with no parameters)", {"Adam"}, [] {
    std::vector<optim::ParamGroup> groups(2);
    groups[0].params = {leaf({2})};
    optim::Adam(groups, {});
  });
  s.refuses("SGD(a parameter twice)", {"SGD", "more than once"}, [] {
    Tensor p = leaf({2});
    optim::SGD({p, p}, {.lr = 0.1});
  });
  s.refuses("SGD(a parameter in two groups)", {"SGD"}, [] {
    Tensor p = leaf({2});
    std::vector<optim::ParamGroup> groups(2);
    groups[0].params = {p};
    groups[1].params = {p};
    optim::SGD(groups, {.lr = 0.1});
  });
  s.refuses("SGD(an int64 parameter)", {"SGD", "int64"},
            [] { optim::SGD({zeros({2}, {.dtype = DType::i64})}, {.lr = 0.1}); });
  s.refuses("Adam(a non-leaf parameter)", {"Adam", "leaf"}, [] {
    Tensor p = leaf({2});
    optim::Adam({mul(p, 2.0)}, {});
  });
  s.refuses("Adam(an undefined parameter)", {"Adam", "undefined"}, [] { optim::Adam({Tensor()}, {}); });
  s.refuses("Adam(a non-contiguous parameter)", {"Adam", "contiguous"}, [] {
    Tensor p = randn({3, 4}).transpose(0, 1);
    p.requires_grad_(true);
    optim::Adam({p}, {});
  });
  for (auto [label, edit] : std::vector<std::pair<std::string, std::function<void(optim::ParamGroup&)>>>{
           {"lr=-1", [](optim::ParamGroup& g) { g.lr = -1.0; }},
           {"weight_decay=-1", [](optim::ParamGroup& g) { g.weight_decay = -1.0; }},
           {"momentum=-1", [](optim::ParamGroup& g) { g.momentum = -1.0; }},
           {"momentum=1", [](optim::ParamGroup& g) { g.momentum = 1.0; }},
           {"beta2=1", [](optim::ParamGroup& g) { g.beta2 = 1.0; }},
           {"lr=nan", [](optim::ParamGroup& g) { g.lr = kNaN; }},
       }) {
    s.refuses("Adam(group 1 with " + label + ")", {"Adam", "group 1"}, [&] {
      std::vector<optim::ParamGroup> groups(2);
      groups[0].params = {leaf({2})};
      groups[1].params = {leaf({2})};
      edit(groups[1]);
      optim::Adam(groups, {});
    });
  }
  {
    optim::SGD sgd(params_with_grads(), {.lr = 0.1, .momentum = 0.9});
    s.refuses("Optimizer.set_lr(-1)", {"SGD", "learning rate", "-1"}, [&] { sgd.set_lr(0, -1.0); });
    s.refuses("Optimizer.set_lr(nan)", {"SGD", "learning rate"}, [&] { sgd.set_lr(0, kNaN); });
    s.refuses("Optimizer.set_lr(group 3)", {"SGD", "3"}, [&] { sgd.set_lr(3, 0.1); });
    s.refuses("Optimizer.set_momentum(-0.5)", {"SGD", "momentum"}, [&] { sgd.set_momentum(0, -0.5); });
    s.refuses("Optimizer.lr(group -1)", {"SGD", "-1"}, [&] { sgd.lr(-1); });
    s.refuses("Optimizer.params(group 1)", {"SGD", "1"}, [&] { sgd.params(1); });
    s.refuses("Optimizer.state(index 9)", {"SGD", "9"}, [&] { sgd.state(9, "momentum_buffer"); });
    s.refuses("Optimizer.step() with a gradient of another shape", {"gradient", "[3, 2]"}, [&] {
      optim::SGD other({leaf({2, 3})}, {.lr = 0.1});
      other.params(0)[0].set_grad(randn({3, 2}));
      other.step();
    });
    s.refuses("Optimizer.step() with a float64 gradient for a float32 parameter", {"gradient", "float64"}, [&] {
      optim::SGD other({leaf({2})}, {.lr = 0.1});
      other.params(0)[0].set_grad(randn({2}, {.dtype = DType::f64}));
      other.step();
    });
  }
  s.finish();
}

TEST_CASE("bad arguments: optimizer load_state_dict refuses mismatches and loads nothing") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(5);
  auto stepped_adam = [](const std::vector<Shape>& shapes, int steps) {
    std::vector<Tensor> params;
    for (const Shape& shape : shapes) params.push_back(leaf(shape));
    auto adam = std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 0.01});
    for (int i = 0; i < steps; ++i) {
      for (Tensor& p : params) p.set_grad(randn(p.shape()));
      adam->step();
    }
    return adam;
  };
  auto snapshot = [](const optim::Optimizer& o) {
    std::vector<double> out;
    for (int64_t g = 0; g < o.num_groups(); ++g) {
      out.push_back(o.lr(g).item<double>());
      out.push_back(o.group_options(g).lr);
    }
    for (int64_t i = 0; i < o.num_params(); ++i) {
      for (const char* name : {"step", "exp_avg", "exp_avg_sq"}) {
        Tensor t = o.state(i, name);
        if (!t.defined()) continue;
        for (double v : t.to(DType::f64).contiguous().to_vector<double>()) out.push_back(v);
      }
    }
    return out;
  };
  auto refuses_load = [&](const std::string& what, std::vector<std::string> words, optim::Optimizer& target,
                          const optim::StateDict& state) {
    const std::vector<double> before = snapshot(target);
    s.refuses("Optimizer.load_state_dict: " + what, words, [&] { target.load_state_dict(state); });
    s.works("Optimizer.load_state_dict: " + what + " leaves the optimizer unchanged", [&]() -> std::string {
      return snapshot(target) == before ? "" : "the optimizer was changed by the failed load";
    });
  };
  {
    auto source = stepped_adam({{2, 3}, {3}}, 2);
    source->set_lr(0, 0.5);
    auto target = stepped_adam({{2, 3}, {4}}, 1);
    refuses_load("second parameter (3) into (4)", {"[3]", "[4]"}, *target, source->state_dict());
  }
  {
    auto source = stepped_adam({{2, 3}, {3}}, 2);
    auto target = stepped_adam({{2, 3}, {3}, {3}}, 1);
    refuses_load("2 parameters into 3", {"load_state_dict"}, *target, source->state_dict());
  }
  {
    auto source = stepped_adam({{2, 3}}, 1);
    std::vector<Tensor> params = {leaf({2, 3})};
    optim::SGD target(params, {.lr = 0.1, .momentum = 0.9});
    params[0].set_grad(randn({2, 3}));
    target.step();
    refuses_load("an Adam state into SGD", {"Adam", "SGD"}, target, source->state_dict());
  }
  {
    auto source = stepped_adam({{2, 3}, {3}}, 2);
    optim::StateDict state = source->state_dict();
    state.tensors.erase(std::prev(state.tensors.end()));
    auto target = stepped_adam({{2, 3}, {3}}, 1);
    refuses_load("a state missing its last tensor", {"load_state_dict"}, *target, state);
  }
  {
    auto source = stepped_adam({{2, 3}, {3}}, 2);
    optim::StateDict state = source->state_dict();
    state.meta = "garbage";
    auto target = stepped_adam({{2, 3}, {3}}, 1);
    refuses_load("meta that is not an object", {"load_state_dict"}, *target, state);
  }
  {
    auto source = stepped_adam({{2, 3}, {3}}, 2);
    optim::StateDict state = source->state_dict();
    for (auto& [name, t] : state.tensors) {
      if (name.find("exp_avg_sq") != std::string::npos) t = zeros({7});
    }
    auto target = stepped_adam({{2, 3}, {3}}, 1);
    refuses_load("exp_avg_sq of the wrong shape", {"exp_avg_sq"}, *target, state);
  }
  {
    auto source = stepped_adam({{2, 3}, {3}}, 2);
    optim::StateDict state = source->state_dict();
    for (auto& [name, t] : state.tensors) {
      if (name.find("exp_avg") != std::string::npos) t = t.to(DType::i64);
    }
    auto target = stepped_adam({{2, 3}, {3}}, 1);
    s.works_or_refuses("Optimizer.load_state_dict: int64 exp_avg (converted or refused)", {"exp_avg"},
                       [&] { target->load_state_dict(state); });
  }
  s.finish();
}

TEST_CASE("bad arguments: lr schedulers, GradScaler, clipping, averaging") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(6);
  std::vector<Tensor> params = params_with_grads();
  optim::SGD sgd(params, {.lr = 0.1, .momentum = 0.9});
  optim::SGD plain(params_with_grads(), {.lr = 0.1});
  for (int64_t bad : {int64_t{0}, int64_t{-2}}) {
    const std::string b = std::to_string(bad);
    s.refuses("StepLR(step_size=" + b + ")", {"StepLR", "step_size", b}, [&] { optim::StepLR(sgd, bad); });
    s.refuses("LinearLR(total_iters=" + b + ")", {"LinearLR", "total_iters"},
              [&] { optim::LinearLR(sgd, 0.5, 1.0, bad); });
    s.refuses("CosineAnnealingLR(T_max=" + b + ")", {"CosineAnnealingLR", "T_max"},
              [&] { optim::CosineAnnealingLR(sgd, bad); });
    s.refuses("CosineAnnealingWarmRestarts(T_0=" + b + ")", {"CosineAnnealingWarmRestarts", "T_0"},
              [&] { optim::CosineAnnealingWarmRestarts(sgd, bad); });
    s.refuses("CosineAnnealingWarmRestarts(T_mult=" + b + ")", {"CosineAnnealingWarmRestarts", "T_mult"},
              [&] { optim::CosineAnnealingWarmRestarts(sgd, 5, bad); });
    s.refuses("OneCycleLR(total_steps=" + b + ")", {"OneCycleLR", "total_steps"},
              [&] { optim::OneCycleLR(sgd, {.max_lr = {0.1}, .total_steps = bad}); });
    s.refuses("CyclicLR(step_size_up=" + b + ")", {"CyclicLR", "step_size_up"},
              [&] { optim::CyclicLR(sgd, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = bad}); });
  }
  for (double bad : {-0.1, 1.5, kNaN}) {
    const std::string b = std::to_string(bad);
    s.refuses("OneCycleLR(pct_start=" + b + ")", {"OneCycleLR", "pct_start"},
              [&] { optim::OneCycleLR(sgd, {.max_lr = {0.1}, .total_steps = 10, .pct_start = bad}); });
    s.refuses("LinearLR(start_factor=" + b + ")", {"LinearLR", "start_factor"},
              [&] { optim::LinearLR(sgd, bad); });
    s.refuses("LinearLR(end_factor=" + b + ")", {"LinearLR", "end_factor"},
              [&] { optim::LinearLR(sgd, 0.5, bad); });
  }
  s.refuses("OneCycleLR(div_factor=0)", {"OneCycleLR", "div_factor"},
            [&] { optim::OneCycleLR(sgd, {.max_lr = {0.1}, .total_steps = 10, .div_factor = 0}); });
  s.refuses("OneCycleLR(max_lr with 2 values for 1 group)", {"OneCycleLR", "max_lr", "2"},
            [&] { optim::OneCycleLR(sgd, {.max_lr = {0.1, 0.2}, .total_steps = 10}); });
  s.refuses("OneCycleLR(max_lr empty)", {"OneCycleLR", "max_lr"},
            [&] { optim::OneCycleLR(sgd, {.max_lr = {}, .total_steps = 10}); });
  s.refuses("OneCycleLR(cycle_momentum) on SGD without momentum", {"OneCycleLR", "momentum"},
            [&] { optim::OneCycleLR(plain, {.max_lr = {0.1}, .total_steps = 10}); });
  // Every lr a schedule writes must be a number (torch raises where a phase has no length).
  auto finite_lrs = [](optim::LRScheduler& scheduler, int steps) -> std::string {
    for (int i = 0; i <= steps; ++i) {
      for (double lr : scheduler.get_last_lr()) {
        if (!std::isfinite(lr)) return "lr " + std::to_string(lr) + " at step " + std::to_string(i);
      }
      scheduler.step_unconditionally();
    }
    return "";
  };
  for (double pct : {0.0, 0.1, 0.5, 1.0}) {
    for (int64_t total : {int64_t{1}, int64_t{2}, int64_t{10}}) {
      for (bool three_phase : {false, true}) {
        const std::string what = "OneCycleLR(total_steps=" + std::to_string(total) + ", pct_start=" +
                                 std::to_string(pct) + (three_phase ? ", three_phase" : "") + ")";
        s.works_or_refuses(what + " writes finite lrs or is refused", {"OneCycleLR"}, [&]() -> std::string {
          optim::OneCycleLR scheduler(
              sgd, {.max_lr = {0.1}, .total_steps = total, .pct_start = pct, .three_phase = three_phase});
          return finite_lrs(scheduler, static_cast<int>(total) + 1);  // and past the end, where it holds
        });
      }
    }
  }
  s.works("OneCycleLR: stepping past total_steps holds the last lr (documented: a device cannot raise)",
          [&]() -> std::string {
            optim::OneCycleLR scheduler(sgd, {.max_lr = {0.1}, .total_steps = 3});
            return finite_lrs(scheduler, 6);
          });
  s.refuses("CyclicLR(step_size_down=-1)", {"CyclicLR", "step_size_down"}, [&] {
    optim::CyclicLR(sgd, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 2, .step_size_down = -1});
  });
  s.works("CyclicLR(step_size_down=0) (torch: a sawtooth)", [&]() -> std::string {
    optim::CyclicLR scheduler(sgd, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 2, .step_size_down = 0});
    return finite_lrs(scheduler, 5);
  });
  s.refuses("CyclicLR(base_lr with 3 values)", {"CyclicLR", "base_lr"},
            [&] { optim::CyclicLR(sgd, {.base_lr = {0.01, 0.02, 0.03}, .max_lr = {0.1}}); });
  s.refuses("SWALR(anneal_epochs=-1)", {"SWALR", "anneal_epochs"}, [&] { optim::SWALR(sgd, {0.05}, -1); });
  s.works("SWALR(anneal_epochs=0)", [&]() -> std::string {
    optim::SWALR scheduler(sgd, {0.05}, 0);
    return finite_lrs(scheduler, 3);
  });
  s.refuses("SequentialLR(no schedulers)", {"SequentialLR"}, [&] { optim::SequentialLR(sgd, {}, {}); });
  {
    optim::StepLR a(sgd, 2), b(sgd, 3);
    s.refuses("SequentialLR(2 schedulers, 0 milestones)", {"SequentialLR", "milestones"},
              [&] { optim::SequentialLR(sgd, {&a, &b}, {}); });
    s.refuses("SequentialLR(a scheduler of another optimizer)", {"SequentialLR", "another optimizer"}, [&] {
      optim::StepLR other(plain, 2);
      optim::SequentialLR(sgd, {&a, &other}, {3});
    });
  }
  s.refuses("ReduceLROnPlateau(factor=1)", {"ReduceLROnPlateau", "factor"},
            [&] { optim::ReduceLROnPlateau(sgd, {.factor = 1.0}); });
  s.refuses("ReduceLROnPlateau(factor=nan)", {"ReduceLROnPlateau", "factor"},
            [&] { optim::ReduceLROnPlateau(sgd, {.factor = kNaN}); });
  s.refuses("ReduceLROnPlateau(min_lr with 2 values)", {"ReduceLROnPlateau", "min_lr"},
            [&] { optim::ReduceLROnPlateau(sgd, {.min_lr = {0.0, 0.0}}); });
  s.works_or_refuses("ReduceLROnPlateau.step(nan)", {"ReduceLROnPlateau"}, [&]() -> std::string {
    optim::ReduceLROnPlateau plateau(sgd, {.patience = 0});
    plateau.step(kNaN);
    for (double lr : plateau.get_last_lr())
      if (!std::isfinite(lr)) return "non-finite lr";
    return "";
  });
  {
    optim::StepLR step_lr(sgd, 2);
    optim::CosineAnnealingLR cosine(sgd, 4);
    s.refuses("LRScheduler.load_state_dict(a CosineAnnealingLR state into StepLR)", {"CosineAnnealingLR", "StepLR"},
              [&] { step_lr.load_state_dict(cosine.state_dict()); });
    optim::StateDict no_counter = step_lr.state_dict();
    no_counter.tensors.clear();
    s.refuses("LRScheduler.load_state_dict(no last_epoch)", {"last_epoch"},
              [&] { step_lr.load_state_dict(no_counter); });
    optim::StateDict negative = step_lr.state_dict();
    negative.tensors["last_epoch"] = full({}, -5.0, {.dtype = DType::i64});
    s.refuses("LRScheduler.load_state_dict(last_epoch=-5)", {"last_epoch"},
              [&] { step_lr.load_state_dict(negative); });
    optim::StateDict fractional = step_lr.state_dict();
    fractional.tensors["last_epoch"] = full({}, 2.5);
    s.refuses("LRScheduler.load_state_dict(last_epoch=2.5)", {"last_epoch"},
              [&] { step_lr.load_state_dict(fractional); });
  }

  // GradScaler.
  for (double bad : {0.0, -1.0, kNaN}) {
    const std::string b = std::to_string(bad);
    s.refuses("GradScaler(init_scale=" + b + ")", {"GradScaler", "init_scale"},
              [&] { optim::GradScaler({.init_scale = bad}); });
  }
  for (double bad : {1.0, 0.5, kNaN}) {
    s.refuses("GradScaler(growth_factor=" + std::to_string(bad) + ")", {"GradScaler", "growth_factor"},
              [&] { optim::GradScaler({.growth_factor = bad}); });
  }
  for (double bad : {0.0, 1.0, 1.5, -0.5, kNaN}) {
    s.refuses("GradScaler(backoff_factor=" + std::to_string(bad) + ")", {"GradScaler", "backoff_factor"},
              [&] { optim::GradScaler({.backoff_factor = bad}); });
  }
  for (int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{1} << 40}) {
    s.refuses("GradScaler(growth_interval=" + std::to_string(bad) + ")", {"GradScaler", "growth_interval"},
              [&] { optim::GradScaler({.growth_interval = bad}); });
  }
  {
    optim::GradScaler scaler;
    s.refuses("GradScaler.update() before use", {"GradScaler.update"}, [&] { scaler.update(); });
    s.refuses("GradScaler.scale(int64 loss)", {"GradScaler.scale"},
              [&] { scaler.scale(zeros({}, {.dtype = DType::i64})); });
    scaler.scale(ones({}));
    s.refuses("GradScaler.update(new_scale=-1)", {"GradScaler.update", "new_scale"}, [&] { scaler.update(-1.0); });
    s.refuses("GradScaler.update(new_scale=nan)", {"GradScaler.update", "new_scale"}, [&] { scaler.update(kNaN); });
    s.refuses("GradScaler.unscale_ twice", {"unscale_"}, [&] {
      scaler.unscale_(sgd);
      scaler.unscale_(sgd);
    });
    s.refuses("GradScaler.load_state_dict(not a GradScaler's)", {"GradScaler.load_state_dict"},
              [&] { scaler.load_state_dict(sgd.state_dict()); });
  }

  // Gradient clipping.
  for (double bad : {-1.0, kNaN}) {
    s.refuses("clip_grad_norm_(max_norm=" + std::to_string(bad) + ")", {"clip_grad_norm_", "max_norm"},
              [&] { optim::clip_grad_norm_(params, bad); });
    s.refuses("Optimizer.clip_grad_norm_(max_norm=" + std::to_string(bad) + ")", {"clip_grad_norm_", "max_norm"},
              [&] { sgd.clip_grad_norm_(bad); });
    s.refuses("clip_grad_value_(clip_value=" + std::to_string(bad) + ")", {"clip_grad_value_", "clip_value"},
              [&] { optim::clip_grad_value_(params, bad); });
  }
  for (double bad : {0.0, -2.0, kNaN, -kInf}) {
    s.refuses("clip_grad_norm_(norm_type=" + std::to_string(bad) + ")", {"clip_grad_norm_", "norm_type"},
              [&] { optim::clip_grad_norm_(params, 1.0, bad); });
    s.refuses("grad_norm(norm_type=" + std::to_string(bad) + ")", {"grad_norm", "norm_type"},
              [&] { optim::grad_norm(params, 1.0, bad); });
  }
  s.works("clip_grad_norm_(norm_type=inf) and of no parameters", []() -> std::string {
    auto result = optim::clip_grad_norm_(params_with_grads(), 1.0, kInf);
    if (!std::isfinite(result.total_norm.item<double>())) return "non-finite inf-norm";
    auto none = optim::clip_grad_norm_({}, 1.0);
    return none.total_norm.defined() && none.total_norm.item<double>() != 0 ? "norm of nothing is not 0" : "";
  });
  s.refuses("clip_gradients(algorithm=\"l1\")", {"l1"}, [&] { optim::clip_gradients(sgd, 1.0, "l1"); });
  s.refuses("clip_gradients(clip_val=-1)", {"-1"}, [&] { optim::clip_gradients(sgd, -1.0, "norm"); });

  // Averaging.
  for (double bad : {-0.1, 1.5, kNaN}) {
    s.refuses("ExponentialMovingAverage(decay=" + std::to_string(bad) + ")", {"ExponentialMovingAverage", "decay"},
              [&] { optim::ExponentialMovingAverage(params, bad); });
    s.refuses("AveragedModel(ema_decay=" + std::to_string(bad) + ")", {"AveragedModel", "ema_decay"}, [&] {
      nn::Linear model(2, 2);
      optim::AveragedModelOptions o;
      o.ema_decay = bad;
      optim::AveragedModel(model, o);
    });
  }
  s.refuses("ExponentialMovingAverage(an int64 tensor)", {"ExponentialMovingAverage"},
            [] { optim::ExponentialMovingAverage({zeros({2}, {.dtype = DType::i64})}, 0.9); });
  s.refuses("ExponentialMovingAverage.restore() before store()", {"restore"}, [&] {
    optim::ExponentialMovingAverage ema(params, 0.9);
    ema.restore();
  });
  s.refuses("ExponentialMovingAverage.copy_to(fewer tensors)", {"ExponentialMovingAverage"}, [&] {
    optim::ExponentialMovingAverage ema(params, 0.9);
    ema.copy_to({params[0]});
  });
  s.refuses("AveragedModel.update_parameters(another architecture)", {"AveragedModel"}, [] {
    nn::Linear a(2, 2), b(3, 2);
    optim::AveragedModel averaged(a);
    averaged.update_parameters(b);
  });
  s.finish();
}

// ================================================================ data

namespace {

std::shared_ptr<TensorDataset> images(int64_t count, int64_t channels = 1) {
  return std::make_shared<TensorDataset>(rand({count, channels, 4, 4}), zeros({count}, {.dtype = DType::i64}));
}

std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, size_t data_bytes) {
  std::vector<uint8_t> bytes = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(d >> shift));
  }
  bytes.resize(bytes.size() + data_bytes, 7);
  return bytes;
}

}  // namespace

TEST_CASE("bad arguments: data loader, samplers, transforms, IDX files, image output") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(7);
  auto data = images(5);
  for (int64_t bad : {int64_t{0}, int64_t{-1}}) {
    s.refuses("DataLoader(batch_size=" + std::to_string(bad) + ")", {"DataLoader", "batch_size"},
              [&] { DataLoader(data, {.batch_size = bad}); });
  }
  s.refuses("DataLoader(num_workers=-1)", {"DataLoader", "num_workers"},
            [&] { DataLoader(data, {.batch_size = 2, .num_workers = -1}); });
  s.refuses("DataLoader(prefetch_factor=0)", {"DataLoader", "prefetch_factor"},
            [&] { DataLoader(data, {.batch_size = 2, .num_workers = 1, .prefetch_factor = 0}); });
  s.refuses("DataLoader(null data set)", {"DataLoader", "null"}, [] { DataLoader(nullptr, {}); });
  s.refuses("DataLoader(a null transform)", {"DataLoader", "null transform"},
            [&] { DataLoader(data, {.transforms = {nullptr}}); });
  s.refuses("DataLoader(transforms on int64 inputs)", {"DataLoader", "float32"}, [] {
    auto ints = std::make_shared<TensorDataset>(zeros({4, 1, 2, 2}, {.dtype = DType::i64}), zeros({4}));
    DataLoader(ints, {.transforms = {std::make_shared<RandomHorizontalFlip>()}});
  });
  s.works("DataLoader(drop_last, 5 examples, batch_size 8): no batches", [&]() -> std::string {
    DataLoader loader(data, {.batch_size = 8, .drop_last = true});
    if (loader.size() != 0) return "size() is " + std::to_string(loader.size());
    return loader.next() ? "returned a batch" : "";
  });
  s.works("DataLoader(5 examples, batch_size 8): one batch of 5", [&]() -> std::string {
    DataLoader loader(data, {.batch_size = 8});
    auto batch = loader.next();
    if (!batch || batch->size() != 5) return "expected one batch of 5";
    return loader.next() ? "a second batch" : "";
  });
  // torch gives one batch of everything for any batch_size >= the data set's size.
  for (int64_t huge : {int64_t{1} << 58, int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    s.works_or_refuses("DataLoader(5 examples, batch_size " + std::to_string(huge) + "): one batch of 5",
                       {"DataLoader", "batch_size"}, [&]() -> std::string {
                         DataLoader loader(data, {.batch_size = huge});
                         auto batch = loader.next();
                         if (!batch || batch->size() != 5) return "expected one batch of 5";
                         if (batch->input.to_vector<float>() != data->inputs().to_vector<float>()) return "wrong values";
                         return loader.next() ? "a second batch" : "";
                       });
  }
  for (int workers : {0, 2}) {
    s.works("DataLoader(an empty data set, shuffle, num_workers=" + std::to_string(workers) + ")",
            [&]() -> std::string {
              auto empty = std::make_shared<TensorDataset>(zeros({0, 1, 4, 4}), zeros({0}, {.dtype = DType::i64}));
              DataLoader loader(empty, {.batch_size = 2, .shuffle = true, .num_workers = workers});
              if (loader.size() != 0) return "size() is " + std::to_string(loader.size());
              return loader.next() ? "returned a batch" : "";
            });
  }
  {
    DataLoader loader(data, {.batch_size = 2});
    s.refuses("DataLoader.set_batch_size(0)", {"set_batch_size", "batch_size"}, [&] { loader.set_batch_size(0); });
    const nlohmann::json good = loader.state_dict();
    auto with = [&](const char* key, nlohmann::json value) {
      nlohmann::json state = good;
      state[key] = std::move(value);
      return state;
    };
    for (auto [label, state] : std::vector<std::pair<std::string, nlohmann::json>>{
             {"a string", nlohmann::json("garbage")},
             {"an array", nlohmann::json::array({1, 2})},
             {"null", nlohmann::json()},
             {"position -1", with("position", -1)},
             {"position 99", with("position", 99)},
             {"position \"2\"", with("position", "2")},
             {"position 1.5", with("position", 1.5)},
             {"epoch -1", with("epoch", -1)},
             {"batch_size 3", with("batch_size", 3)},
             {"num_samples 6", with("num_samples", 6)},
         }) {
      s.refuses("DataLoader.load_state_dict(" + label + ")", {"DataLoader::load_state_dict"},
                [&] { loader.load_state_dict(state); });
    }
  }
  s.refuses("SequentialSampler(-1)", {"SequentialSampler", "-1"}, [] { SequentialSampler(-1); });
  s.refuses("RandomSampler(-1)", {"RandomSampler", "-1"}, [] { RandomSampler(-1); });
  s.refuses("DistributedSampler(num_replicas=0)", {"DistributedSampler", "world_size"},
            [] { DistributedSampler(10, 0, 0); });
  s.refuses("DistributedSampler(rank=2 of 2)", {"DistributedSampler", "rank"}, [] { DistributedSampler(10, 2, 2); });
  s.refuses("DistributedSampler(rank=-1)", {"DistributedSampler", "rank"}, [] { DistributedSampler(10, 2, -1); });
  s.works("DistributedSampler(an empty data set, 3 replicas)", []() -> std::string {
    for (bool drop_last : {false, true}) {
      DistributedSampler sampler(0, 3, 1, true, 0, drop_last);
      if (sampler.size() != 0 || !sampler.indices(0).empty()) return "indices for an empty data set";
    }
    return "";
  });
  s.works("DistributedSampler(2 examples, 4 replicas): padded like torch", []() -> std::string {
    DistributedSampler sampler(2, 4, 3, false);
    auto indices = sampler.indices(0);
    return indices.size() == 1 && indices[0] >= 0 && indices[0] < 2 ? "" : "wrong indices";
  });

  // Transforms.
  s.refuses("Normalize(empty mean and std)", {"Normalize"}, [] { Normalize({}, {}); });
  s.refuses("Normalize(2 means, 1 std)", {"Normalize"}, [] { Normalize({0.5f, 0.5f}, {0.5f}); });
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    s.refuses("Normalize(std=" + std::to_string(bad) + ")", {"Normalize", "std"}, [&] { Normalize({0.5f}, {bad}); });
  }
  // torch does not check the mean.
  s.works_or_refuses("Normalize(mean=nan)", {"Normalize", "mean"},
            [] { Normalize({std::numeric_limits<float>::quiet_NaN()}, {1.0f}); });
  s.refuses("DataLoader + Normalize with 1 channel on 3-channel images", {"Normalize", "1", "3"}, [] {
    DataLoader loader(images(4, 3), {.batch_size = 2, .transforms = {std::make_shared<Normalize>(
                                                                      std::vector<float>{0.5f}, std::vector<float>{0.5f})}});
    loader.next();
  });
  s.refuses("RandomCrop(padding=-1)", {"RandomCrop", "padding"}, [] { RandomCrop(-1); });
  s.works_or_refuses("DataLoader + RandomCrop(padding much larger than the image)", {"RandomCrop"},
                     []() -> std::string {
                       DataLoader loader(images(2), {.batch_size = 2, .transforms = {std::make_shared<RandomCrop>(100)}});
                       auto batch = loader.next();
                       return batch && batch->input.shape() == Shape{2, 1, 4, 4} ? "" : "wrong batch";
                     });
  // Every crop is all fill: the right answer for such a padding.
  s.works_or_refuses("DataLoader + RandomCrop(padding=2^40)", {"RandomCrop", "padding"}, [] {
    DataLoader loader(images(2), {.batch_size = 2, .transforms = {std::make_shared<RandomCrop>(int64_t{1} << 40)}});
    loader.next();
  });
  for (float bad : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    s.refuses("RandomHorizontalFlip(p=" + std::to_string(bad) + ")", {"RandomHorizontalFlip", "p"},
              [&] { RandomHorizontalFlip{bad}; });
    s.refuses("RandomErasing(p=" + std::to_string(bad) + ")", {"RandomErasing", "p"}, [&] { RandomErasing{bad}; });
  }
  s.refuses("RandomErasing(scale=(0, 0.3))", {"RandomErasing", "scale"}, [] { RandomErasing(0.5f, 0.0f, 0.3f); });
  s.refuses("RandomErasing(scale=(0.5, 0.2))", {"RandomErasing", "scale"}, [] { RandomErasing(0.5f, 0.5f, 0.2f); });
  s.refuses("RandomErasing(scale=(0.1, 1.5))", {"RandomErasing", "scale"}, [] { RandomErasing(0.5f, 0.1f, 1.5f); });
  s.refuses("RandomErasing(ratio=(3, 0.3))", {"RandomErasing", "ratio"},
            [] { RandomErasing(0.5f, 0.02f, 0.33f, 3.0f, 0.3f); });
  s.refuses("RandomHorizontalFlip on (B, 4) rows", {"RandomHorizontalFlip"}, [] {
    auto rows = std::make_shared<TensorDataset>(rand({2, 4}), zeros({2}));
    DataLoader loader(rows, {.batch_size = 2, .transforms = {std::make_shared<RandomHorizontalFlip>()}});
    loader.next();
  });
  s.refuses("Normalize::fit(an empty data set)", {"Normalize::fit"}, [] {
    TensorDataset empty(zeros({0, 1, 2, 2}), zeros({0}));
    Normalize::fit(empty);
  });

  // IDX.
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> bad_idx = {
      {"no bytes", {}},
      {"3 bytes", {0, 0, 8}},
      {"bad magic", {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 5}},
      {"unknown type 0x05", idx_bytes(0x05, {2}, 2)},
      {"0 dims", idx_bytes(0x08, {}, 1)},
      {"header cut in the dims", std::vector<uint8_t>{0, 0, 8, 3, 0, 0, 0, 2, 0, 0}},
      {"data shorter than the dims say", idx_bytes(0x08, {2, 3, 3}, 17)},
      {"data longer than the dims say", idx_bytes(0x08, {2, 3, 3}, 19)},
      {"dims whose product overflows", idx_bytes(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, 4)},
      {"255 dims", idx_bytes(0x08, std::vector<uint32_t>(255, 2), 8)},
      {"float32 data cut mid-element", idx_bytes(0x0D, {3}, 10)},
      {"gzip magic then garbage", {0x1f, 0x8b, 8, 0, 1, 2, 3, 4, 5, 6, 7}},
  };
  for (const auto& [label, bytes] : bad_idx) {
    s.refuses("parse_idx(" + label + ")", {"bad.idx"}, [&] { parse_idx(bytes, "bad.idx"); });
  }
  s.refuses("parse_idx(images role, 1 dim)", {"bad.idx"},
            [] { parse_idx(idx_bytes(0x08, {4}, 4), "bad.idx", IdxRole::images); });
  s.refuses("parse_idx(labels role, 3 dims)", {"bad.idx"},
            [] { parse_idx(idx_bytes(0x08, {1, 2, 2}, 4), "bad.idx", IdxRole::labels); });
  s.works("parse_idx(2 x 3 x 3 uint8)", []() -> std::string {
    Tensor t = parse_idx(idx_bytes(0x08, {2, 3, 3}, 18), "ok.idx");
    return t.shape() == Shape{2, 3, 3} ? "" : "wrong shape " + shape_str(t.shape());
  });
  s.works_or_refuses("parse_idx(0 examples)", {"empty.idx"}, [] { parse_idx(idx_bytes(0x08, {0, 3, 3}, 0), "empty.idx"); });
  const fs::path folder = fresh_folder("api_bad_arguments", "idx");
  s.refuses("read_idx(a missing file)", {"nonexistent.idx"},
            [&] { read_idx((folder / "nonexistent.idx").string()); });
  s.refuses("read_idx(a folder)", {folder.filename().string()}, [&] { read_idx(folder.string()); });
  {
    const fs::path truncated = folder / "truncated-idx1-ubyte";
    const auto bytes = idx_bytes(0x08, {10}, 4);
    std::ofstream(truncated, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    s.refuses("read_idx(a truncated file)", {"truncated-idx1-ubyte"},
              [&] { read_idx(truncated.string(), IdxRole::labels); });
    const fs::path gz = folder / "broken.gz";
    std::ofstream(gz, std::ios::binary) << "\x1f\x8b\x08garbage";
    s.refuses("read_idx(a corrupt .gz)", {"broken.gz"}, [&] { read_idx(gz.string()); });
  }
  s.refuses("check_idx_images_labels(label 10 of 10 classes)", {"10"}, [] {
    check_idx_images_labels(zeros({2, 2, 2}, {.dtype = DType::u8}), tensor<uint8_t>({1, 10}, {2}), 10, "img", "lbl");
  });
  s.refuses("check_idx_images_labels(2 images, 3 labels)", {"img", "lbl"}, [] {
    check_idx_images_labels(zeros({2, 2, 2}, {.dtype = DType::u8}), tensor<uint8_t>({1, 1, 1}, {3}), 10, "img", "lbl");
  });

  // Image output.
  s.refuses("make_image_grid(nrow=0)", {"make_image_grid", "nrow"}, [] { make_image_grid(rand({2, 1, 3, 3}), {.nrow = 0}); });
  s.refuses("make_image_grid(padding=-1)", {"make_image_grid", "padding"},
            [] { make_image_grid(rand({2, 1, 3, 3}), {.padding = -1}); });
  for (int64_t padding : {int64_t{1} << 40, int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    s.refuses("make_image_grid(padding=" + std::to_string(padding) + ")", {"make_image_grid", "padding"},
              [&] { make_image_grid(rand({2, 1, 3, 3}), {.padding = padding}); });
  }
  // 3 + 2 * (2^63 - 1) wraps to 1: a 1 x 1 grid the image would be written far outside of.
  s.refuses("make_image_grid(one 3 x 3 image, padding=2^63-1)", {"make_image_grid", "padding"},
            [] { make_image_grid(rand({1, 1, 3, 3}), {.padding = std::numeric_limits<int64_t>::max()}); });
  s.refuses("make_image_grid(value_range=(1, 0))", {"make_image_grid", "value_range"},
            [] { make_image_grid(rand({2, 1, 3, 3}), {.normalize = true, .value_range = std::pair{1.0, 0.0}}); });
  s.refuses("make_image_grid(3 channels)", {"make_image_grid"}, [] { make_image_grid(rand({2, 3, 3, 3})); });
  s.refuses("make_image_grid(no images)", {"make_image_grid"}, [] { make_image_grid(rand({0, 1, 3, 3})); });
  s.refuses("make_image_grid(int64 images)", {"make_image_grid"},
            [] { make_image_grid(zeros({2, 1, 3, 3}, {.dtype = DType::i64})); });
  s.refuses("save_image(into a missing folder)", {"/nonexistent/folder/x.png"},
            [] { save_image(rand({1, 1, 3, 3}), "/nonexistent/folder/x.png"); });
  s.refuses("save_image(path \"\")", {"path"}, [] { save_image(rand({1, 1, 3, 3}), ""); });
  s.refuses("write_png_grayscale(width 0)", {"write_png_grayscale"},
            [&] { write_png_grayscale((folder / "x.png").string(), 0, 3, nullptr); });
  fs::remove_all(folder);
  s.finish();
}

// ================================================================ trainer

TEST_CASE("bad arguments: Trainer options and callbacks") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(8);
  const fs::path root = fresh_folder("api_bad_arguments", "trainer");
  auto refuses_options = [&](const std::string& what, std::vector<std::string> words,
                             const std::function<void(TrainerOptions&)>& edit) {
    TrainerOptions options = quiet_trainer_options(root);
    edit(options);
    s.refuses("Trainer(" + what + ")", words, [&] { Trainer{options}; });
  };
  refuses_options("max_epochs=-2", {"max_epochs", "-2"}, [](auto& o) { o.max_epochs = -2; });
  refuses_options("max_steps=-2", {"max_steps", "-2"}, [](auto& o) { o.max_steps = -2; });
  refuses_options("min_epochs=-1", {"min_epochs"}, [](auto& o) { o.min_epochs = -1; });
  refuses_options("min_steps=-1", {"min_steps"}, [](auto& o) { o.min_steps = -1; });
  refuses_options("accumulate_grad_batches=0", {"accumulate_grad_batches"}, [](auto& o) { o.accumulate_grad_batches = 0; });
  refuses_options("accumulation_schedule={0: 0}", {"accumulation_schedule"},
                  [](auto& o) { o.accumulation_schedule = {{0, 0}}; });
  refuses_options("accumulation_schedule={-1: 2}", {"accumulation_schedule"},
                  [](auto& o) { o.accumulation_schedule = {{-1, 2}}; });
  refuses_options("gradient_clip_val=-1", {"gradient_clip_val"}, [](auto& o) { o.gradient_clip_val = -1; });
  refuses_options("gradient_clip_val=nan", {"gradient_clip_val"}, [](auto& o) { o.gradient_clip_val = kNaN; });
  refuses_options("gradient_clip_algorithm=\"l1\"", {"gradient_clip_algorithm", "l1"},
                  [](auto& o) { o.gradient_clip_algorithm = "l1"; });
  refuses_options("precision=\"fp8\"", {"precision", "fp8"}, [](auto& o) { o.precision = "fp8"; });
  refuses_options("precision=\"\"", {"precision"}, [](auto& o) { o.precision = ""; });
  refuses_options("precision=\"16-mixed\" on the CPU", {"16-mixed", "GPU"}, [](auto& o) { o.precision = "16-mixed"; });
  refuses_options("accelerator=\"tpu\"", {"accelerator", "tpu"}, [](auto& o) { o.accelerator = "tpu"; });
  refuses_options("strategy=\"fsdp\"", {"strategy", "fsdp"}, [](auto& o) { o.strategy = "fsdp"; });
  refuses_options("devices=0", {"devices"}, [](auto& o) { o.devices = 0; });
  refuses_options("num_nodes=0", {"num_nodes"}, [](auto& o) { o.num_nodes = 0; });
  refuses_options("val_check_interval=0", {"val_check_interval"}, [](auto& o) { o.val_check_interval = 0.0; });
  refuses_options("val_check_interval=-1", {"val_check_interval"}, [](auto& o) { o.val_check_interval = -1; });
  refuses_options("val_check_interval=1.5", {"val_check_interval"}, [](auto& o) { o.val_check_interval = 1.5; });
  refuses_options("val_check_interval=nan", {"val_check_interval"}, [](auto& o) { o.val_check_interval = kNaN; });
  refuses_options("check_val_every_n_epoch=0", {"check_val_every_n_epoch"},
                  [](auto& o) { o.check_val_every_n_epoch = 0; });
  refuses_options("log_every_n_steps=0", {"log_every_n_steps"}, [](auto& o) { o.log_every_n_steps = 0; });
  refuses_options("limit_train_batches=-1", {"limit_train_batches"}, [](auto& o) { o.limit_train_batches = -1; });
  refuses_options("limit_train_batches=1.5", {"limit_train_batches"}, [](auto& o) { o.limit_train_batches = 1.5; });
  refuses_options("limit_val_batches=nan", {"limit_val_batches"}, [](auto& o) { o.limit_val_batches = kNaN; });
  refuses_options("overfit_batches=-0.5", {"overfit_batches"}, [](auto& o) { o.overfit_batches = -0.5; });
  refuses_options("num_sanity_val_steps=-2", {"num_sanity_val_steps"}, [](auto& o) { o.num_sanity_val_steps = -2; });
  refuses_options("fast_dev_run=-1", {"fast_dev_run"}, [](auto& o) { o.fast_dev_run = -1; });
  for (const char* text : {"soon", "-5", "00:00:00:-1", "1:2:3:4:5", "99999999999999999999", "9999999999999:00:00:00",
                           "106751991167300:00:00:00", ":", "1::2:3"}) {
    refuses_options("max_time=\"" + std::string(text) + "\"", {"max_time"}, [&](auto& o) { o.max_time = text; });
  }
  refuses_options("cuda_graph=true on the CPU", {"cuda_graph"}, [](auto& o) { o.cuda_graph = true; });
  refuses_options("profiler=\"advanced\"", {"profiler", "advanced"}, [](auto& o) { o.profiler = "advanced"; });
  refuses_options("a null callback", {"callback"}, [](auto& o) { o.callbacks = {nullptr}; });
  refuses_options("a null logger", {"logger"}, [](auto& o) { o.loggers = {nullptr}; });

  for (int bad : {-2, -5}) {
    s.refuses("ModelCheckpoint(save_top_k=" + std::to_string(bad) + ")", {"ModelCheckpoint", "save_top_k"},
              [&] { ModelCheckpoint({.save_top_k = bad}); });
  }
  s.refuses("ModelCheckpoint(mode=\"avg\")", {"ModelCheckpoint", "avg"}, [] { ModelCheckpoint({.mode = "avg"}); });
  s.refuses("ModelCheckpoint(save_top_k=3 without monitor)", {"ModelCheckpoint", "save_top_k"},
            [] { ModelCheckpoint({.save_top_k = 3}); });
  s.refuses("ModelCheckpoint(every_n_train_steps=-1)", {"ModelCheckpoint", "every_n_train_steps"},
            [] { ModelCheckpoint({.every_n_train_steps = -1}); });
  s.refuses("ModelCheckpoint(every_n_epochs=-1)", {"ModelCheckpoint", "every_n_epochs"},
            [] { ModelCheckpoint({.every_n_epochs = -1}); });
  s.refuses("ModelCheckpoint(every_n_train_steps=2, every_n_epochs=2)", {"ModelCheckpoint"},
            [] { ModelCheckpoint({.every_n_train_steps = 2, .every_n_epochs = 2}); });
  s.refuses("EarlyStopping(mode=\"avg\")", {"EarlyStopping", "avg"}, [] { EarlyStopping({.mode = "avg"}); });
  s.refuses("EarlyStopping(patience=-1)", {"EarlyStopping", "patience"}, [] { EarlyStopping({.patience = -1}); });
  s.refuses("GradientAccumulationScheduler({})", {"GradientAccumulationScheduler"},
            [] { GradientAccumulationScheduler(std::map<int64_t, int64_t>{}); });
  s.refuses("GradientAccumulationScheduler({-1: 2})", {"GradientAccumulationScheduler", "-1"},
            [] { GradientAccumulationScheduler(std::map<int64_t, int64_t>{{-1, 2}}); });
  s.refuses("GradientAccumulationScheduler({0: 0})", {"GradientAccumulationScheduler", "0"},
            [] { GradientAccumulationScheduler(std::map<int64_t, int64_t>{{0, 0}}); });
  s.refuses("BatchSizeFinder(mode=\"linear\")", {"BatchSizeFinder", "linear"},
            [] { BatchSizeFinder({.mode = "linear"}); });
  s.refuses("BatchSizeFinder(init_val=0)", {"BatchSizeFinder", "init_val"}, [] { BatchSizeFinder({.init_val = 0}); });
  s.refuses("BatchSizeFinder(steps_per_trial=0)", {"BatchSizeFinder", "steps_per_trial"},
            [] { BatchSizeFinder({.steps_per_trial = 0}); });
  s.refuses("BatchSizeFinder(max_trials=0)", {"BatchSizeFinder", "max_trials"},
            [] { BatchSizeFinder({.max_trials = 0}); });
  s.refuses("BatchSizeFinder(max_val < init_val)", {"BatchSizeFinder", "max_val"},
            [] { BatchSizeFinder({.init_val = 8, .max_val = 4}); });
  s.refuses("LearningRateFinder(min_lr=0)", {"LearningRateFinder", "min_lr"},
            [] { LearningRateFinder({.min_lr = 0}); });
  s.refuses("LearningRateFinder(max_lr < min_lr)", {"LearningRateFinder"},
            [] { LearningRateFinder({.min_lr = 1e-2, .max_lr = 1e-3}); });
  s.refuses("LearningRateFinder(num_training=0)", {"LearningRateFinder", "num_training"},
            [] { LearningRateFinder({.num_training = 0}); });
  s.refuses("LearningRateFinder(mode=\"cosine\")", {"LearningRateFinder", "cosine"},
            [] { LearningRateFinder({.mode = "cosine"}); });
  s.finish();
  fs::remove_all(root);
}

TEST_CASE("bad arguments: Trainer.fit with bad monitors, checkpoint folders and paths") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  manual_seed(9);
  const fs::path root = fresh_folder("api_bad_arguments", "fit");
  auto options_for = [&](const std::string& name) {
    TrainerOptions options = quiet_trainer_options(root / name);
    options.max_epochs = 1;
    options.logger = false;
    options.enable_checkpointing = false;
    return options;
  };
  auto fit = [](TrainerOptions options, bool with_val, const std::string& ckpt_path = "") {
    Regression module;
    DataLoader loader(regression_data(16, 0.01), seeded_loader_options(8));
    DataLoader val(regression_data(8, 0.01), seeded_loader_options(8));
    Trainer(std::move(options)).fit(module, loader, with_val ? &val : nullptr, ckpt_path);
  };
  s.refuses("fit: ModelCheckpoint(monitor=\"val_acc\") that is never logged", {"val_acc"}, [&] {
    TrainerOptions o = options_for("monitor");
    o.enable_checkpointing = true;
    o.callbacks = {std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.monitor = "val_acc"})};
    fit(o, true);
  });
  s.refuses("fit: EarlyStopping(monitor=\"val_acc\") that is never logged", {"val_acc"}, [&] {
    TrainerOptions o = options_for("early");
    o.callbacks = {std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val_acc"})};
    fit(o, true);
  });
  s.works("fit: EarlyStopping(monitor=\"val_acc\", strict=false) that is never logged", [&] {
    TrainerOptions o = options_for("early_lax");
    o.callbacks = {std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val_acc", .strict = false})};
    fit(o, true);
  });
  {
    fs::create_directories(root);
    const fs::path file = root / "a_file";
    std::ofstream(file) << "not a folder";
    s.refuses("fit: ModelCheckpoint(dirpath is a file)", {"a_file"}, [&] {
      TrainerOptions o = options_for("dirpath");
      o.enable_checkpointing = true;
      o.callbacks = {std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = file.string()})};
      fit(o, false);
    });
    s.works("fit: ModelCheckpoint(dirpath is a file) left the file alone", [&]() -> std::string {
      std::ifstream in(file);
      std::string text;
      std::getline(in, text);
      return fs::is_regular_file(file) && text == "not a folder" ? "" : "the file was changed";
    });
    s.refuses("fit: default_root_dir is a file", {"a_file"}, [&] {
      TrainerOptions o = options_for("x");
      o.default_root_dir = file.string();
      o.logger = true;
      o.enable_checkpointing = true;
      fit(o, false);
    });
  }
  s.refuses("fit(ckpt_path=a missing file)", {"missing.ckpt"},
            [&] { fit(options_for("ckpt"), false, (root / "missing.ckpt").string()); });
  s.refuses("fit(ckpt_path=\"best\" with no ModelCheckpoint)", {"best"},
            [&] { fit(options_for("best"), false, "best"); });
  {
    const fs::path garbage = root / "garbage.ckpt";
    std::ofstream(garbage) << "this is not a checkpoint";
    s.refuses("fit(ckpt_path=a file that is not a checkpoint)", {"garbage.ckpt"},
              [&] { fit(options_for("garbage"), false, garbage.string()); });
  }
  s.works("fit: limit_train_batches=3 with 2 batches trains the 2 there are (Lightning clips it)", [&]() -> std::string {
    TrainerOptions o = options_for("limit");
    o.limit_train_batches = 3;
    Regression module;
    DataLoader loader(regression_data(16, 0.01), seeded_loader_options(8));
    Trainer(std::move(o)).fit(module, loader);
    return module.training_steps == 2 ? "" : std::to_string(module.training_steps) + " training steps";
  });
  s.finish();
  fs::remove_all(root);
}

// ================================================================ the example binaries

TEST_CASE("bad arguments: example binaries refuse bad flags in one line, naming the flag, writing nothing") {
  CrashReporter reporter("test_api_bad_arguments", 60);
  INFO(g_where);
  Sweep s;
  const fs::path root = fresh_folder("api_bad_arguments", "cli");
  struct Launch {
    std::string binary, arguments, words;
  };
  // Flags that fail while parsing, before any data is read (each launch costs a start-up).
  const std::vector<Launch> launches = {
      {"train_fashion", "--max-steps", "--max-steps"},
      {"train_fashion", "--log-every-n-steps 0", "--log-every-n-steps"},
      {"train_fashion", "--gradient-clip-algorithm l1", "--gradient-clip-algorithm"},
      {"train_vit", "--batch-size 0", "--batch-size"},
      {"train_vit", "--label-smoothing nan", "--label-smoothing"},
      {"train_gpt", "--n-head -2", "--n-head"},
      {"train_gpt", "--dropout 1.5", "--dropout"},
      {"train_gan", "--lr abc", "--lr"},
      {"kiln-run", "--nproc-per-node 0 -- true", "--nproc-per-node"},
  };
  for (const Launch& launch : launches) {
    const std::string what = launch.binary + " " + launch.arguments;
    fs::remove_all(root);
    set_case(what);
    const std::string arguments = launch.arguments + (launch.binary == "kiln-run" ? std::string()
                                                                                   : " --default-root-dir " + root.string());
    BinaryRun run = launch.binary == "kiln-run"
                        ? run_built_binary(launch.binary, launch.arguments)
                        : run_built_binary(launch.binary, arguments);
    s.works(what, [&]() -> std::string {
      if (run.exit_code == 0) return "exited 0; printed: " + run.output;
      if (run.exit_code < 0) return "did not exit normally (crash?); printed: " + run.output;
      if (run.output.find(launch.words) == std::string::npos) return "did not name " + launch.words + ": " + run.output;
      if (std::count(run.output.begin(), run.output.end(), '\n') != 1) return "printed more than one line: " + run.output;
      if (fs::exists(root)) return "wrote " + root.string();
      return "";
    });
  }
  s.finish();
  fs::remove_all(root);
}

TEST_CASE("bad arguments: case count") {
  // Printed for the record; the sweeps above run first (doctest runs cases in file order).
  MESSAGE("test_api_bad_arguments: " << Sweep::total_cases() << " cases");
}

}  // namespace kiln::testing
