// The kiln side of the kiln-vs-PyTorch training comparison
// (bench/compare_fashion.py runs both and prints the table).
//
// Trains the same network with the same recipe as bench/torch_fashion.py:
// FashionCNN (or the ResNet-9-style net) with PyTorch's default
// initialization, AdamW (lr 3e-3, weight decay 5e-4) with OneCycle
// (pct_start 0.25) over the epochs' steps, batch 128 with drop_last, a fresh
// shuffle every epoch, RandomCrop(padding 2) + RandomHorizontalFlip +
// Normalize fitted on the training images, fp32. The loop is the plain
// training step (no Trainer), as on the PyTorch side. Prints one JSON line:
// samples/s of the training loop (data loading included, the first warm-up
// steps excluded) and the test accuracy after the epochs.
// --cuda-graph (GPU): after kGraphWarmupSteps eager steps the whole step
// (forward, backward, scaler, AdamW, OneCycle) is captured once with
// kiln::cuda::Graph on static input buffers and replayed for every later
// batch: torch.cuda.graph's recipe, here without the Trainer.
// --profile-step (GPU): the first timed iteration (batch, copy and step)
// runs between cudaProfilerStart and cudaProfilerStop, for ncu
// --profile-from-start off (bench/profile_step.py --model cnn|resnet9).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/cuda_graph.h"
#include "core/generator.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "data/host_batch_holder.h"
#include "data/transforms.h"
#include "examples/cli_checks.h"
#include "kernels/cuda/runtime.h"
#include "nn/models.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

using namespace kiln;

int main(int argc, char** argv) {
  CLI::App app{"Train FashionCNN or ResNet-9 with kiln's plain training step and report samples/s"};
  std::string model_name = "cnn", data_dir, accelerator = "cpu", precision = "32-true";
  int64_t epochs = 1, batch_size = 128, limit_train_batches = 0, warmup_steps = 5;
  double lr = 3e-3, weight_decay = 5e-4;
  int num_workers = 2;
  uint64_t seed = 42;
  bool augment = true, cuda_graph = false, channels_last = false, profile_step = false, cudnn_benchmark = false;
  app.add_flag("--cuda-graph", cuda_graph, "GPU: replay the captured training step as one CUDA graph");
  app.add_flag("--channels-last", channels_last,
               "Images in channels-last (NHWC) memory, as torch's memory_format=torch.channels_last: on a GPU "
               "the convolutions run cuDNN's NHWC kernels and the layout carries through the network");
  app.add_flag("--cudnn-benchmark", cudnn_benchmark,
               "GPU: cuDNN autotuning (set_cudnn_benchmark, torch.backends.cudnn.benchmark): each convolution's "
               "first call times cuDNN's candidates, the warm-up steps included");
  app.add_flag("--profile-step", profile_step,
               "GPU: the first iteration after the warm-up between cudaProfilerStart and cudaProfilerStop "
               "(for ncu --profile-from-start off: bench/profile_step.py)");
  app.add_option("--model", model_name, "cnn or resnet9")->capture_default_str();
  app.add_option("--epochs", epochs)->capture_default_str();
  app.add_option("--batch-size", batch_size)->capture_default_str()->check(examples::kPositive);
  app.add_option("--lr", lr)->capture_default_str();
  app.add_option("--weight-decay", weight_decay)->capture_default_str();
  app.add_option("--limit-train-batches", limit_train_batches, "0: the whole epoch")->capture_default_str();
  app.add_option("--warmup-steps", warmup_steps)->capture_default_str();
  app.add_option("--num-workers", num_workers)->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  app.add_option("--data-dir", data_dir, "Fashion-MNIST folder");
  app.add_flag("--augment,!--no-augment", augment,
               "RandomCrop(28, padding=2) + RandomHorizontalFlip before Normalize (default: on)");
  app.add_option("--accelerator", accelerator, "cpu or gpu")->capture_default_str();
  app.add_option("--precision", precision, "32-true, bf16-mixed or 16-mixed (GPU; with a GradScaler)")
      ->capture_default_str()
      ->check(CLI::IsMember({"32-true", "bf16-mixed", "16-mixed"}));
  CLI11_PARSE(app, argc, argv);

  try {
    const Device device = accelerator == "gpu" ? Device::cuda(0) : Device::cpu();
    KILN_CHECK(!cuda_graph || device.is_cuda(), "--cuda-graph needs --accelerator gpu");
    KILN_CHECK(!profile_step || device.is_cuda(), "--profile-step: brackets GPU work; give --accelerator gpu");
    KILN_CHECK(!cudnn_benchmark || device.is_cuda(), "--cudnn-benchmark tunes cuDNN; give --accelerator gpu");
    set_cudnn_benchmark(cudnn_benchmark);
    manual_seed(seed);
    MnistOptions data_options;
    data_options.root = data_dir;
    data_options.train = true;
    auto train_set = std::make_shared<FashionMNIST>(data_options);
    data_options.train = false;
    auto test_set = std::make_shared<FashionMNIST>(data_options);
    auto normalize = Normalize::fit(*train_set);

    DataLoaderOptions train_options;
    train_options.batch_size = batch_size;
    train_options.shuffle = true;
    train_options.seed = seed;
    train_options.num_workers = num_workers;
    train_options.pin_memory = device.is_cuda();
    train_options.persistent_workers = true;
    train_options.drop_last = true;
    train_options.transforms = {normalize};
    if (augment) {
      train_options.transforms = {std::make_shared<RandomCrop>(2), std::make_shared<RandomHorizontalFlip>(), normalize};
    }
    DataLoaderOptions test_options = train_options;
    test_options.batch_size = 1000;
    test_options.shuffle = false;
    test_options.drop_last = false;
    test_options.transforms = {normalize};
    DataLoader train_loader(train_set, train_options);
    DataLoader test_loader(test_set, test_options);

    std::shared_ptr<nn::Module> model;
    if (model_name == "cnn") {
      model = std::make_shared<nn::FashionCNN>();
    } else {
      KILN_CHECK(model_name == "resnet9", "--model: expected cnn or resnet9, got '", model_name, "'");
      model = std::make_shared<nn::ResNet9>();
    }
    model->to(device, DType::f32);
    if (channels_last) model->to(MemoryFormat::channels_last);  // as torch's model.to(memory_format=...)
    int64_t batches = train_loader.size();
    if (limit_train_batches > 0) batches = std::min(batches, limit_train_batches);
    KILN_CHECK(!profile_step || warmup_steps < batches, "--profile-step: the warm-up (--warmup-steps ", warmup_steps,
               ") takes all ", batches, " batches of the epoch; no step is left to profile");
    optim::AdamWOptions adamw;
    adamw.lr = lr;
    adamw.weight_decay = weight_decay;
    optim::AdamW optimizer(model->parameters(), adamw);
    optim::OneCycleLROptions one_cycle;
    one_cycle.max_lr = {lr};
    one_cycle.total_steps = batches * epochs;
    one_cycle.pct_start = 0.25;
    optim::OneCycleLR schedule(optimizer, one_cycle);
    const bool mixed = precision != "32-true";
    const DType autocast_dtype = precision == "16-mixed" ? DType::f16 : DType::bf16;
    optim::GradScalerOptions scaler_options;
    scaler_options.enabled = precision == "16-mixed";
    optim::GradScaler scaler(scaler_options);

    // One training step on (input, target); `loss` keeps its loss.
    Tensor loss;
    const auto train_step = [&](const Tensor& input, const Tensor& target) {
      {
        AutocastGuard autocast(device.type, autocast_dtype, mixed);
        loss = cross_entropy(model->forward(input), target);
      }
      optimizer.zero_grad(true);
      scaler.scale(loss).backward();
      scaler.step(optimizer);
      scaler.update();
      schedule.step();
    };
    constexpr int64_t kGraphWarmupSteps = 3;  // optimizer state, cuDNN and cuBLAS set-up happen eagerly
    // The images on the device, in the layout the run asks for (the layout
    // copy, when there is one, runs on the device).
    const auto to_model_input = [&](const Tensor& images) {
      Tensor on_device = images.to(device, DType::f32, true);
      return channels_last ? on_device.contiguous(MemoryFormat::channels_last) : on_device;
    };
    // Pinned batches are copied with non_blocking: each is held until its copy
    // ran, or the loader could refill its buffer first (data/host_batch_holder.h).
    HostBatchHolder host_batches;
    const auto hold_until_copied = [&](Batch&& host) {
      if (device.is_cuda()) host_batches.hold_until_done(std::move(host), device.index, cuda::current_stream(device.index));
    };
    std::unique_ptr<cuda::Graph> graph;
    Tensor static_input, static_target;
    int64_t steps_taken = 0;

    using Clock = std::chrono::steady_clock;
    int64_t timed_samples = 0;
    double timed_seconds = 0;
    double final_loss = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      model->train();
      train_loader.set_epoch(static_cast<uint64_t>(epoch));
      Clock::time_point start;
      bool timing = false;
      for (int64_t step = 0; step < batches; ++step) {
        if (step == (epoch == 0 ? warmup_steps : 0)) {
          if (device.is_cuda()) cuda::device_synchronize(device.index);
          start = Clock::now();
          timing = true;
        }
        const bool profiled = profile_step && epoch == 0 && step == warmup_steps;
        if (profiled) cuda::profiler_start();  // the device is idle: synchronized just above
        std::optional<Batch> batch = train_loader.next();
        KILN_CHECK(batch.has_value(), "the training loader ended early at batch ", step);
        Tensor input = to_model_input(batch->input);
        Tensor target = batch->target.to(device, DType::i64, true);
        hold_until_copied(std::move(*batch));
        if (!cuda_graph || steps_taken < kGraphWarmupSteps) {
          train_step(input, target);
        } else {
          if (!graph) {  // capture once (recorded, not run), then every step is a replay
            static_input = input.clone();
            static_target = target.clone();
            graph = std::make_unique<cuda::Graph>(device.index);
            graph->capture_begin();
            train_step(static_input, static_target);
            graph->capture_end();
          } else {
            static_input.copy_(input);
            static_target.copy_(target);
          }
          graph->replay();
        }
        ++steps_taken;
        if (timing) timed_samples += batch_size;
        if (profiled) {
          cuda::device_synchronize(device.index);
          cuda::profiler_stop();
        }
      }
      if (device.is_cuda()) cuda::device_synchronize(device.index);
      if (timing) timed_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      final_loss = loss.item<double>();
    }

    model->eval();
    NoGradGuard no_grad;
    test_loader.set_epoch(0);
    int64_t correct = 0, seen = 0;
    while (std::optional<Batch> batch = test_loader.next()) {
      Tensor logits = model->forward(to_model_input(batch->input));
      Tensor target = batch->target.to(device, DType::i64, true);
      correct += sum(cast(eq(argmax(logits, 1), target), DType::i64)).item<int64_t>();
      seen += batch->size();
      hold_until_copied(std::move(*batch));
    }
    nlohmann::json result = {{"framework", "kiln"},
                             {"model", model_name},
                             {"batch_size", batch_size},
                             {"epochs", epochs},
                             {"steps", batches * epochs},
                             {"samples_per_s", static_cast<double>(timed_samples) / std::max(timed_seconds, 1e-9)},
                             {"test_acc", static_cast<double>(correct) / static_cast<double>(seen)},
                             {"final_loss", final_loss},
                             {"device", device.str()},
                             {"precision", precision},
                             {"augment", augment},
                             {"cuda_graph", cuda_graph},
                             {"cudnn_benchmark", cudnn_benchmark}};
    std::printf("%s\n", result.dump().c_str());
  } catch (const Error& error) {
    std::cerr << "bench_fashion: " << error.message() << "\n";
    return 1;
  }
  return 0;
}
