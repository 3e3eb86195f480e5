// Weights saved by kiln load into the equivalent torch.nn model and back
// (PyTorch's dotted state_dict names, BatchNorm buffers included): kiln saves
// a FashionCNN / MLP state_dict and its eval-mode logits; PyTorch
// (scripts/check_torch_interop.py) loads them strictly and must compute the
// same logits; it then trains one step and saves its state_dict, which kiln
// loads strictly and must again compute PyTorch's logits. Needs a Python with
// torch (Debian's python3-torch); without one the case says SKIPPED.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/serialization.h"
#include "nn/models.h"
#include "nn/transformer.h"
#include "tests/support/test_util.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

std::string python_with_torch() {
  if (const char* configured = std::getenv("KILN_TORCH_PYTHON")) return configured;
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    const std::string probe = std::string(candidate) + " -c 'import torch' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return candidate;
  }
  return "";
}

std::string run(const std::string& command, int* exit_code) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  while (size_t count = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, count);
  const int status = ::pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return output;
}

std::shared_ptr<nn::Module> make(const std::string& name) {
  if (name == "cnn") return std::make_shared<nn::FashionCNN>();
  return std::make_shared<nn::MLP>();
}

}  // namespace

TEST_CASE("kiln state_dicts load into torch.nn models and back, with the same outputs") {
  const std::string python = python_with_torch();
  if (python.empty()) {
    MESSAGE("SKIPPED (no Python with torch; apt-get install python3-torch, or set KILN_TORCH_PYTHON): "
            "the PyTorch round trip was not run");
    return;
  }
  const fs::path script = kiln::testing::source_root() / "scripts" / "check_torch_interop.py";
  for (const std::string model_name : {"cnn", "mlp"}) {
    CAPTURE(model_name);
    const fs::path folder = fs::temp_directory_path() / ("kiln_torch_interop_" + std::to_string(::getpid()));
    fs::remove_all(folder);
    fs::create_directories(folder);
    manual_seed(7);
    std::shared_ptr<nn::Module> model = make(model_name);
    // A few training-mode forwards so BatchNorm's running statistics and
    // num_batches_tracked differ from their initial values.
    model->train();
    for (int i = 0; i < 3; ++i) (void)model->forward(randn({16, 1, 28, 28}));
    model->eval();
    NoGradGuard no_grad;
    Tensor input = randn({8, 1, 28, 28});
    NamedTensorList weights;
    for (auto& [name, tensor] : model->state_dict()) weights.emplace_back(name, tensor);
    save_safetensors((folder / "kiln_weights.safetensors").string(), weights);
    save_safetensors((folder / "kiln_io.safetensors").string(), {{"input", input}, {"output", model->forward(input)}});

    int exit_code = 0;
    const std::string output =
        run(python + " " + script.string() + " " + folder.string() + " " + model_name, &exit_code);
    INFO(output);
    REQUIRE(exit_code == 0);

    // Back: PyTorch's state_dict after one training step, loaded strictly.
    std::shared_ptr<nn::Module> reloaded = make(model_name);
    nn::StateDict state;
    for (auto& [name, tensor] : load_safetensors((folder / "torch_weights.safetensors").string()).tensors) {
      state.emplace_back(name, tensor);
    }
    reloaded->load_state_dict(state, /*strict=*/true);
    reloaded->eval();
    SafetensorsFile io = load_safetensors((folder / "torch_io.safetensors").string());
    Tensor torch_logits = io.tensors.back().second;
    Tensor kiln_logits = reloaded->forward(io.tensors.at(0).second);
    const double difference = max(abs(sub(kiln_logits, torch_logits))).item<double>();
    CHECK(difference < 1e-4);
    // The step changed the weights: kiln's original model disagrees with them.
    CHECK(max(abs(sub(model->forward(io.tensors.at(0).second), torch_logits))).item<double>() > 1e-3);
    fs::remove_all(folder);
  }
}

namespace {

// A transformer layer of the interop script (d_model 32, 4 heads, feed-forward
// 64, dropout 0), its inputs, and how it is called on them.
struct TransformerCase {
  std::shared_ptr<nn::Module> model;
  NamedTensorList inputs;
  std::function<Tensor(const NamedTensorList&)> run;
};

Tensor input_named(const NamedTensorList& inputs, const std::string& name) {
  for (const auto& [key, tensor] : inputs) {
    if (key == name) return tensor;
  }
  FAIL("no input named " << name);
  return Tensor();
}

TransformerCase transformer_case(const std::string& name) {
  nn::TransformerLayerOptions options;
  options.dim_feedforward = 64;
  options.dropout = 0.0;
  TransformerCase c;
  // Key padding: the last 2 keys of sample 1 are padding (torch.nn: true = ignore).
  const Tensor padding = tensor<uint8_t>({0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1}, {2, 10}).to(DType::b8);
  if (name == "vit") {
    nn::ViTConfig config;
    config.patch_size = 7;
    config.dim = 32;
    config.depth = 2;
    config.mlp_dim = 64;
    auto vit = std::make_shared<nn::ViT>(config);
    c.model = vit;
    c.inputs = {{"input", randn({3, 1, 28, 28})}};
    c.run = [vit](const NamedTensorList& in) { return vit->forward(input_named(in, "input")); };
  } else if (name == "gpt") {
    nn::GPTConfig config;
    config.vocab_size = 65;
    config.block_size = 16;
    config.n_layer = 2;
    config.n_head = 4;
    config.n_embd = 32;
    auto gpt = std::make_shared<nn::GPT>(config);
    c.model = gpt;
    c.inputs = {{"input", randint(0, 65, {2, 11})}};
    c.run = [gpt](const NamedTensorList& in) { return gpt->forward(input_named(in, "input")); };
  } else if (name == "encoder") {
    auto layer = std::make_shared<nn::TransformerEncoderLayer>(32, 4, options);
    c.model = layer;
    c.inputs = {{"input", randn({7, 2, 32})}, {"mask", mul(randn({7, 7}), 0.5)}};
    c.run = [layer](const NamedTensorList& in) { return layer->forward(input_named(in, "input"), input_named(in, "mask")); };
  } else if (name == "encoder_prenorm") {
    options.activation = "gelu";
    options.batch_first = true;
    options.norm_first = true;
    auto layer = std::make_shared<nn::TransformerEncoderLayer>(32, 4, options);
    c.model = layer;
    c.inputs = {{"input", randn({2, 10, 32})}, {"padding", padding}};
    c.run = [layer](const NamedTensorList& in) {
      return layer->forward(input_named(in, "input"), Tensor(), input_named(in, "padding"));
    };
  } else {
    options.activation = "gelu";
    options.batch_first = true;
    options.norm_first = true;
    auto layer = std::make_shared<nn::TransformerDecoderLayer>(32, 4, options);
    c.model = layer;
    const Tensor causal = gt(triu(ones({6, 6}), 1), 0.0);  // torch.nn: true = may not attend
    c.inputs = {{"input", randn({2, 6, 32})}, {"memory", randn({2, 10, 32})}, {"mask", causal}, {"padding", padding}};
    c.run = [layer](const NamedTensorList& in) {
      return layer->forward(input_named(in, "input"), input_named(in, "memory"), input_named(in, "mask"), Tensor(),
                            Tensor(), input_named(in, "padding"));
    };
  }
  return c;
}

}  // namespace

TEST_CASE("transformer layers, ViT and GPT load into torch.nn with torch's names and masks, with the same outputs, and back") {
  const std::string python = python_with_torch();
  if (python.empty()) {
    MESSAGE("SKIPPED (no Python with torch; apt-get install python3-torch, or set KILN_TORCH_PYTHON): "
            "the PyTorch round trip of the transformer layers was not run");
    return;
  }
  const fs::path script = kiln::testing::source_root() / "scripts" / "check_torch_interop.py";
  for (const std::string name : {"encoder", "encoder_prenorm", "decoder", "vit", "gpt"}) {
    CAPTURE(name);
    const fs::path folder = fs::temp_directory_path() / ("kiln_torch_interop_" + name + std::to_string(::getpid()));
    fs::remove_all(folder);
    fs::create_directories(folder);
    manual_seed(9);
    TransformerCase c = transformer_case(name);
    NoGradGuard no_grad;
    NamedTensorList weights;
    for (auto& [key, tensor] : c.model->state_dict()) weights.emplace_back(key, tensor);
    save_safetensors((folder / "kiln_weights.safetensors").string(), weights);
    NamedTensorList io = c.inputs;
    io.emplace_back("output", c.run(c.inputs));
    save_safetensors((folder / "kiln_io.safetensors").string(), io);
    int exit_code = 0;
    const std::string output = run(python + " " + script.string() + " " + folder.string() + " " + name, &exit_code);
    INFO(output);
    REQUIRE(exit_code == 0);
    TransformerCase reloaded = transformer_case(name);
    nn::StateDict state;
    for (auto& [key, tensor] : load_safetensors((folder / "torch_weights.safetensors").string()).tensors) {
      state.emplace_back(key, tensor);
    }
    reloaded.model->load_state_dict(state, /*strict=*/true);
    NamedTensorList torch_io = load_safetensors((folder / "torch_io.safetensors").string()).tensors;
    const Tensor torch_output = torch_io.back().second;
    torch_io.pop_back();
    CHECK(max(abs(sub(reloaded.run(torch_io), torch_output))).item<double>() < 1e-4);
    CHECK(max(abs(sub(c.run(torch_io), torch_output))).item<double>() > 1e-4);  // the step changed the weights
    fs::remove_all(folder);
  }
}
