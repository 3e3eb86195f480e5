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
#include <memory>
#include <string>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/serialization.h"
#include "nn/models.h"
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
    save_safetensors((folder / "kiln_io.safetensors").string(), {{"input", input}, {"logits", model->forward(input)}});

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
    Tensor torch_logits = io.tensors.at(1).second;
    Tensor kiln_logits = reloaded->forward(io.tensors.at(0).second);
    const double difference = max(abs(sub(kiln_logits, torch_logits))).item<double>();
    CHECK(difference < 1e-4);
    // The step changed the weights: kiln's original model disagrees with them.
    CHECK(max(abs(sub(model->forward(io.tensors.at(0).second), torch_logits))).item<double>() > 1e-3);
    fs::remove_all(folder);
  }
}
