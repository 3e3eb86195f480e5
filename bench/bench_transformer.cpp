// The kiln side of the transformer training-step comparison
// (bench/compare_transformers.py runs it and bench/torch_transformer.py, the
// same models and recipe in PyTorch, and prints the table).
//
// Models, each on random inputs (the step costs the same as on real data):
//   vit        train_vit's ViT (patch 4, width 96, 6 blocks, 4 heads, MLP 192)
//              on (batch, 1, 28, 28) images, cross-entropy over 10 classes
//   gpt        train_gpt's small GPT (4 layers, 4 heads, width 128, context
//              128, bytes as tokens) on (batch, 128) tokens
//   gpt2-124m  GPT-2 124M's shapes (12 layers, width 768, context 1024,
//              vocabulary 50257) on (batch, 1024) tokens
// The step: forward, loss, backward, AdamW (lr 1e-3, betas (0.9, 0.95),
// weight decay 0.1), zero_grad(set_to_none). Prints one JSON line: steps/s,
// samples/s, tokens/s and model TFLOP/s (nanoGPT's count: 6 per parameter
// and token plus 12 * layers * context * width per token for GPTs; for the
// ViT, 6 per parameter and token plus the attention products), with the first
// --warmup-steps excluded. --cuda-graph (GPU): after the warm-up, one step is
// captured as a kiln::cuda::Graph and the timed steps replay it: the same
// work without kiln's host side (dispatch, autograd, launches), so the gap
// between the two runs is what the host costs the eager step.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/cuda_graph.h"
#include "core/generator.h"
#include "core/ops.h"
#include "examples/cli_checks.h"
#include "kernels/cuda/runtime.h"
#include "nn/models.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

using namespace kiln;

int main(int argc, char** argv) {
  CLI::App app{"Time kiln's training step of a ViT or a GPT"};
  std::string model_name = "vit", accelerator = "cpu", precision = "32-true";
  int64_t batch_size = 0, steps = 20, warmup_steps = 3;
  uint64_t seed = 42;
  bool profile_step = false, cuda_graph = false;
  app.add_option("--model", model_name, "vit, gpt or gpt2-124m")
      ->capture_default_str()
      ->check(CLI::IsMember({"vit", "gpt", "gpt2-124m"}));
  app.add_option("--batch-size", batch_size, "0: 128 (vit), 16 (gpt), 8 (gpt2-124m)")->capture_default_str();
  app.add_option("--steps", steps, "Timed steps")->capture_default_str()->check(examples::kPositive);
  app.add_option("--warmup-steps", warmup_steps)->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  app.add_option("--accelerator", accelerator, "cpu or gpu")->capture_default_str();
  app.add_option("--precision", precision, "32-true, bf16-mixed or 16-mixed (GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"32-true", "bf16-mixed", "16-mixed"}));
  app.add_flag("--profile-step", profile_step,
               "After the warm-up, run one more step between cudaProfilerStart and cudaProfilerStop (for ncu "
               "--profile-from-start off: bench/profile_step.py)");
  app.add_flag("--cuda-graph", cuda_graph,
               "Capture one step after the warm-up as a CUDA graph and time its replays (GPU; needs a warm-up step: "
               "the optimizer's state must exist before the capture)");
  CLI11_PARSE(app, argc, argv);
  try {
    KILN_CHECK(!cuda_graph || accelerator == "gpu", "--cuda-graph: captures GPU work; give --accelerator gpu");
    KILN_CHECK(!cuda_graph || warmup_steps >= 1,
               "--cuda-graph: needs --warmup-steps >= 1 (the optimizer creates its state in an eager step)");
    KILN_CHECK(!profile_step || accelerator == "gpu", "--profile-step: brackets GPU work; give --accelerator gpu");
    const Device device = accelerator == "gpu" ? Device::cuda(0) : Device::cpu();
    manual_seed(seed);
    std::shared_ptr<nn::Module> model;
    int64_t tokens_per_sample = 0;
    double attention_flops_per_token = 0;
    Tensor inputs, targets;
    if (model_name == "vit") {
      if (batch_size == 0) batch_size = 128;
      nn::ViTConfig config;
      auto vit = std::make_shared<nn::ViT>(config);
      model = vit;
      tokens_per_sample = (config.image_size / config.patch_size) * (config.image_size / config.patch_size) + 1;
      // QK^T and PV: 2 * 2 * T * dim per token forward, x3 with backward.
      attention_flops_per_token = 12.0 * static_cast<double>(config.depth * tokens_per_sample * config.dim);
      inputs = randn({batch_size, 1, config.image_size, config.image_size});
      targets = randint(0, 10, {batch_size});
    } else {
      nn::GPTConfig config;
      if (model_name == "gpt") {
        if (batch_size == 0) batch_size = 16;
        config.vocab_size = 256;
        config.block_size = 128;
        config.n_layer = 4;
        config.n_head = 4;
        config.n_embd = 128;
      } else {
        if (batch_size == 0) batch_size = 8;
        config = nn::GPTConfig::named("gpt2-124m");
      }
      model = std::make_shared<nn::GPT>(config);
      tokens_per_sample = config.block_size;
      attention_flops_per_token = 12.0 * static_cast<double>(config.n_layer * config.block_size * config.n_embd);
      Tensor tokens = randint(0, config.vocab_size, {batch_size, config.block_size + 1});
      inputs = tokens.narrow(1, 0, config.block_size).contiguous();
      targets = tokens.narrow(1, 1, config.block_size).contiguous();
    }
    model->to(device);
    inputs = inputs.to(device);
    targets = targets.to(device);
    optim::AdamWOptions adamw;
    adamw.lr = 1e-3;
    adamw.beta2 = 0.95;
    adamw.weight_decay = 0.1;
    optim::AdamW optimizer(model->parameters(), adamw);
    const bool mixed = precision != "32-true";
    const DType low = precision == "bf16-mixed" ? DType::bf16 : DType::f16;
    optim::GradScaler scaler({.enabled = precision == "16-mixed"});
    auto gpt = std::dynamic_pointer_cast<nn::GPT>(model);
    auto step = [&] {
      Tensor loss;
      {
        std::optional<AutocastGuard> autocast;
        if (mixed) autocast.emplace(device.type, low);
        Tensor out = model->forward(inputs);
        loss = gpt ? gpt->loss(out, targets) : cross_entropy(out, targets);
      }
      scaler.scale(loss).backward();
      scaler.step(optimizer);
      scaler.update();
      optimizer.zero_grad();
      return loss;
    };
    for (int64_t i = 0; i < warmup_steps; ++i) step();
    if (profile_step) {
      cuda::device_synchronize(device.index);
      cuda::profiler_start();
      step();
      cuda::device_synchronize(device.index);
      cuda::profiler_stop();
    }
    // The captured step is recorded, not run: the replays are the steps.
    std::optional<cuda::Graph> graph;
    Tensor graph_loss;
    if (cuda_graph) {
      graph.emplace(device.index);
      graph->capture_begin();
      graph_loss = step();
      graph->capture_end();
    }
    auto timed_step = [&] {
      if (!graph) return step();
      graph->replay();
      return graph_loss;
    };
    Tensor last;
    if (device.is_cuda()) cuda::device_synchronize(device.index);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) last = timed_step();
    const double loss = last.item<double>();  // waits for the last step
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double samples_per_s = static_cast<double>(steps * batch_size) / seconds;
    const double tokens_per_s = samples_per_s * static_cast<double>(tokens_per_sample);
    const double flops_per_token = 6.0 * static_cast<double>(model->parameter_count()) + attention_flops_per_token;
    nlohmann::json result = {{"framework", "kiln"},
                             {"model", model_name},
                             {"batch_size", batch_size},
                             {"steps", steps},
                             {"precision", precision},
                             {"cuda_graph", cuda_graph},
                             {"parameters", model->parameter_count()},
                             {"ms_per_step", 1e3 * seconds / static_cast<double>(steps)},
                             {"samples_per_s", samples_per_s},
                             {"tokens_per_s", tokens_per_s},
                             {"model_tflops", tokens_per_s * flops_per_token / 1e12},
                             {"loss", loss}};
    std::cout << result.dump() << std::endl;
  } catch (const Error& error) {
    std::cerr << "bench_transformer: " << error.message() << "\n";
    return 1;
  }
  return 0;
}
