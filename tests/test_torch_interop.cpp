// Weights saved by kiln load into the equivalent torch.nn model and back
// (PyTorch's dotted state_dict names, BatchNorm buffers included): kiln saves
// a FashionCNN / MLP state_dict and its eval-mode logits; PyTorch
// (scripts/check_torch_interop.py) loads them with safetensors.torch.load_file,
// as the README tells users to, strictly, and must compute the same logits; it
// then trains one step and saves its state_dict with save_file, which kiln
// loads strictly and must again compute PyTorch's logits. float16 and bfloat16
// files go both ways bit for bit. Needs a Python with torch and safetensors
// (`bash scripts/setup.sh --tests` makes .venv with them); without one the
// cases say SKIPPED, and fail under KILN_REQUIRE_PYTHON_CHECKS=1 (CI).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/serialization.h"
#include "nn/models.h"
#include "nn/transformer.h"
#include "tests/support/python_checks.h"
#include "tests/support/test_util.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

// The tensor called `name` in a file's list (save_file orders tensors by dtype
// and name, not as written).
Tensor input_named(const NamedTensorList& inputs, const std::string& name) {
  for (const auto& [key, tensor] : inputs) {
    if (key == name) return tensor;
  }
  FAIL("no input named " << name);
  return Tensor();
}

constexpr const char* kTorchImports = "torch, safetensors.torch";

// Runs the interop script on `folder` for `model_name` and requires it to pass.
void run_interop_script(const std::string& python, const fs::path& folder, const std::string& model_name) {
  const fs::path script = kiln::testing::source_root() / "scripts" / "check_torch_interop.py";
  const kiln::testing::BinaryRun run =
      kiln::testing::run_shell(python + " " + script.string() + " " + folder.string() + " " + model_name);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
}

std::shared_ptr<nn::Module> make(const std::string& name) {
  if (name == "cnn") return std::make_shared<nn::FashionCNN>();
  return std::make_shared<nn::MLP>();
}

}  // namespace

TEST_CASE("kiln state_dicts load into torch.nn models and back, with the same outputs") {
  const std::string python = kiln::testing::require_python(kTorchImports, "KILN_TORCH_PYTHON", "the PyTorch round trip");
  if (python.empty()) return;
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

    run_interop_script(python, folder, model_name);

    // Back: PyTorch's state_dict after one training step, loaded strictly.
    std::shared_ptr<nn::Module> reloaded = make(model_name);
    nn::StateDict state;
    for (auto& [name, tensor] : load_safetensors((folder / "torch_weights.safetensors").string()).tensors) {
      state.emplace_back(name, tensor);
    }
    reloaded->load_state_dict(state, /*strict=*/true);
    reloaded->eval();
    const NamedTensorList io = load_safetensors((folder / "torch_io.safetensors").string()).tensors;
    const Tensor torch_logits = input_named(io, "output");
    const Tensor kiln_logits = reloaded->forward(input_named(io, "input"));
    const double difference = max(abs(sub(kiln_logits, torch_logits))).item<double>();
    CHECK(difference < 1e-4);
    // The step changed the weights: kiln's original model disagrees with them.
    CHECK(max(abs(sub(model->forward(input_named(io, "input")), torch_logits))).item<double>() > 1e-3);
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
  const std::string python =
      kiln::testing::require_python(kTorchImports, "KILN_TORCH_PYTHON", "the PyTorch round trip of the transformer layers");
  if (python.empty()) return;
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
    run_interop_script(python, folder, name);
    TransformerCase reloaded = transformer_case(name);
    nn::StateDict state;
    for (auto& [key, tensor] : load_safetensors((folder / "torch_weights.safetensors").string()).tensors) {
      state.emplace_back(key, tensor);
    }
    reloaded.model->load_state_dict(state, /*strict=*/true);
    NamedTensorList torch_io;
    Tensor torch_output;
    for (auto& [key, tensor] : load_safetensors((folder / "torch_io.safetensors").string()).tensors) {
      if (key == "output") {
        torch_output = tensor;
      } else {
        torch_io.emplace_back(key, tensor);
      }
    }
    REQUIRE(torch_output.defined());
    CHECK(max(abs(sub(reloaded.run(torch_io), torch_output))).item<double>() < 1e-4);
    CHECK(max(abs(sub(c.run(torch_io), torch_output))).item<double>() > 1e-4);  // the step changed the weights
    fs::remove_all(folder);
  }
}

namespace {

// Elementwise equal as float32 (exact for 16-bit values), -0 apart from +0,
// NaN matching NaN; "" or the first difference.
std::string first_difference(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape()) return "the shapes differ";
  const std::vector<float> a = actual.to(DType::f32).to_vector<float>();
  const std::vector<float> b = expected.to(DType::f32).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = (std::isnan(a[i]) && std::isnan(b[i])) || (a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]));
    if (!same) return "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  }
  return "";
}

}  // namespace

TEST_CASE("float16 and bfloat16 tensors go to torch through safetensors.torch.load_file and back bit for bit") {
  const std::string python =
      kiln::testing::require_python(kTorchImports, "KILN_TORCH_PYTHON", "the float16/bfloat16 round trip with PyTorch");
  if (python.empty()) return;
  const fs::path folder = fs::temp_directory_path() / ("kiln_torch_interop_dtypes_" + std::to_string(::getpid()));
  fs::remove_all(folder);
  fs::create_directories(folder);
  manual_seed(11);
  nn::MLP mlp;
  NoGradGuard no_grad;
  const float inf = std::numeric_limits<float>::infinity();
  // Signed zeros, infinities, NaN, each dtype's largest finite value and
  // smallest subnormal, and values that round.
  const std::vector<std::pair<std::string, DType>> dtypes = {{"f16", DType::f16}, {"bf16", DType::bf16}};
  NamedTensorList weights, reference;
  for (const auto& [prefix, dtype] : dtypes) {
    const float largest = dtype == DType::f16 ? 65504.0f : 3.3895313892515355e38f;
    const float subnormal = dtype == DType::f16 ? 5.9604644775390625e-8f : 9.183549615799121e-41f;
    const Tensor special = tensor<float>({0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), largest,
                                          -largest, subnormal, 1.0f / 3.0f, -2.5e-3f, 1000.7f},
                                         {11});
    NamedTensorList named = {{"special", special}};
    for (auto& [name, tensor] : mlp.state_dict()) named.emplace_back(name, tensor);
    for (const auto& [name, values] : named) {
      const Tensor narrow = values.to(dtype);
      REQUIRE(narrow.dtype() == dtype);
      weights.emplace_back(prefix + "." + name, narrow);
      reference.emplace_back(prefix + "." + name, narrow.to(DType::f32));  // exact
    }
  }
  save_safetensors((folder / "kiln_weights.safetensors").string(), weights);
  save_safetensors((folder / "kiln_io.safetensors").string(), reference);
  run_interop_script(python, folder, "dtypes");

  // torch's rounding of x * 3 to each tensor's dtype, against kiln's.
  const NamedTensorList from_torch = load_safetensors((folder / "torch_weights.safetensors").string()).tensors;
  REQUIRE(from_torch.size() == weights.size());
  for (const auto& [name, exact] : reference) {
    CAPTURE(name);
    const Tensor torch_value = input_named(from_torch, name);
    const DType dtype = input_named(weights, name).dtype();
    CHECK(torch_value.dtype() == dtype);
    // x * 3 in float on the host (IEEE: -0 stays -0), rounded by kiln's conversion.
    std::vector<float> tripled = exact.to_vector<float>();
    for (float& value : tripled) value *= 3.0f;
    const std::string difference = first_difference(torch_value, tensor<float>(tripled, exact.shape()).to(dtype));
    CHECK_MESSAGE(difference.empty(), difference);
  }
  fs::remove_all(folder);
}
