// Activation checkpointing on the ResNet-9-style net (issue 3's benchmark):
// memory and time of one training step (forward, cross-entropy, backward) on
// random 28x28 inputs, without checkpointing and with the trunk's stages
// checkpointed (nn::checkpoint_sequential over prep, layer1, residual1, layer2,
// layer3, residual3, head in --segments segments; the last one runs plainly).
//
// Memory comes from kiln::memory_stats(device): on the GPU the caching
// allocator's, on the CPU the bytes allocate_cpu holds. "held after forward"
// is what the graph keeps between forward and backward (the activations
// checkpointing drops); "peak" is the step's peak above the memory live
// before it (the weights and the input batch), gradients included. Each mode
// runs --steps times after one warm-up step; time is the median step. The
// gradients of every mode are compared with the plain run's (max |difference|).
//
//   bench_checkpointing [--batch 128] [--steps 3] [--segments 2,3,7] [--accelerator auto|cpu|gpu]
// (auto: the GPU when there is one, so the GPU kit's bench step measures the GPU).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/generator.h"
#include "core/ops.h"
#include "kernels/cuda/runtime.h"
#include "nn/checkpoint.h"
#include "nn/models.h"

using namespace kiln;

namespace {

struct StepFigures {
  double median_ms = 0;
  size_t held_after_forward = 0, peak = 0;
  std::vector<std::vector<float>> gradients;
};

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

StepFigures run(nn::ResNet9& model, const Tensor& input, const Tensor& target, int segments, int steps) {
  const Device device = input.device();
  const std::vector<nn::ModulePtr> stages = {model.prep,   model.layer1,    model.residual1, model.layer2,
                                             model.layer3, model.residual3, model.head};
  auto synchronize = [&] {
    if (device.is_cuda()) cuda::device_synchronize(device.index);
  };
  StepFigures figures;
  std::vector<double> times_ms;
  for (int step = -1; step < steps; ++step) {  // step -1: warm-up (cuDNN plans, cached blocks)
    for (auto& parameter : model.parameters()) parameter.set_grad(Tensor());
    synchronize();
    const size_t before = memory_stats(device).allocated_bytes;
    reset_peak_memory_stats(device);
    const auto start = std::chrono::steady_clock::now();
    const Tensor logits = segments == 0 ? model.forward(input) : nn::checkpoint_sequential(stages, segments, input);
    const Tensor loss = cross_entropy(logits, target);
    synchronize();
    const size_t held = memory_stats(device).allocated_bytes - before;
    loss.backward();
    synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (step < 0) continue;
    times_ms.push_back(ms);
    figures.held_after_forward = held;
    figures.peak = memory_stats(device).peak_allocated_bytes - before;
  }
  std::sort(times_ms.begin(), times_ms.end());
  figures.median_ms = times_ms[times_ms.size() / 2];
  for (auto& parameter : model.parameters()) figures.gradients.push_back(parameter.grad().to_vector<float>());
  return figures;
}

double max_difference(const StepFigures& a, const StepFigures& b) {
  double worst = 0;
  for (size_t i = 0; i < a.gradients.size(); ++i) {
    for (size_t k = 0; k < a.gradients[i].size(); ++k) {
      worst = std::max(worst, static_cast<double>(std::fabs(a.gradients[i][k] - b.gradients[i][k])));
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Memory and time of ResNet-9's training step with and without activation checkpointing"};
  int64_t batch = 128;
  int steps = 3;
  std::vector<int> segment_counts = {2, 3, 7};
  std::string accelerator = "auto";
  app.add_option("--batch", batch)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--steps", steps)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--segments", segment_counts, "checkpoint_sequential segment counts to measure")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 7));
  app.add_option("--accelerator", accelerator, "auto (the GPU when there is one), cpu or gpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
  CLI11_PARSE(app, argc, argv);
  try {
    const bool gpu = accelerator == "gpu" || (accelerator == "auto" && cuda::is_available());
    const Device device = gpu ? Device::cuda(0) : Device::cpu();
    manual_seed(0);
    nn::ResNet9 model;
    model.to(device, DType::f32);
    model.train();
    const Tensor input = randn({batch, 1, 28, 28}, {.device = device});
    const Tensor target = randint(0, 10, {batch}, {.dtype = DType::i64, .device = device});
    // BatchNorm's running statistics move every step; the gradients do not depend on them in training mode.
    std::printf("ResNet-9 training step, batch %lld, %s, median of %d steps\n\n", static_cast<long long>(batch),
                device.str().c_str(), steps);
    std::printf("| mode | held after forward (MiB) | peak above start (MiB) | step (ms) | max |grad diff| |\n");
    std::printf("|---|---|---|---|---|\n");
    const StepFigures plain = run(model, input, target, 0, steps);
    std::printf("| no checkpointing | %.1f | %.1f | %.1f | - |\n", mib(plain.held_after_forward), mib(plain.peak),
                plain.median_ms);
    for (int segments : segment_counts) {
      const StepFigures checkpointed = run(model, input, target, segments, steps);
      std::printf("| checkpoint_sequential, %d segments | %.1f (%.2fx) | %.1f (%.2fx) | %.1f (%.2fx) | %.3g |\n",
                  segments, mib(checkpointed.held_after_forward),
                  static_cast<double>(checkpointed.held_after_forward) /
                      static_cast<double>(std::max<size_t>(plain.held_after_forward, 1)),
                  mib(checkpointed.peak),
                  static_cast<double>(checkpointed.peak) / static_cast<double>(std::max<size_t>(plain.peak, 1)),
                  checkpointed.median_ms, checkpointed.median_ms / plain.median_ms,
                  max_difference(checkpointed, plain));
    }
  } catch (const Error& error) {
    std::fprintf(stderr, "bench_checkpointing: %s\n", error.what());
    return 1;
  }
  return 0;
}
