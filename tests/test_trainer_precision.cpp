// Trainer precisions "bf16-mixed" (CPU and GPU) and "16-mixed" (GPU): the
// steps under autocast, float32 master weights, the GradScaler in the
// optimizer step (automatic and manual) and in checkpoints.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "core/autocast.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "optim/lr_scheduler.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/checkpoint_io.h"
#include "trainer/finder_support.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<TensorDataset> classification_data(int64_t count) {
  manual_seed(31);
  Tensor x = randn({count, 8});
  Tensor labels = argmax(matmul(x, randn({8, 3})), 1);
  return std::make_shared<TensorDataset>(x, labels);
}

struct Classifier : TrainModule {
  explicit Classifier(bool manual = false) {
    automatic_optimization = !manual;
    manual_seed(32);
    net = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(8, 32), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 3)});
  }
  nn::Module& model() override { return *net; }
  Tensor training_step(const Batch& batch, int64_t index) override {
    const Tensor logits = net->forward(batch.input);
    logits_dtype = logits.dtype();
    Tensor loss = cross_entropy(logits, batch.target);
    if (index == poison_batch) loss = mul(loss, std::numeric_limits<double>::infinity());
    log("train_loss", loss);
    if (automatic_optimization) return loss;
    // Manual optimization with clipping, as Lightning's docs show it.
    OptimizerHandle opt = optimizers().front();
    manual_backward(loss);
    clip_gradients(opt, manual_clip);
    opt.step();
    opt.zero_grad();
    return Tensor();
  }
  void validation_step(const Batch& batch, int64_t) override {
    val_logits_dtype = net->forward(batch.input).dtype();
  }
  OptimizerConfigs configure_optimizers() override {
    OptimizerConfig config;
    optim::AdamWOptions adamw;
    adamw.lr = 1e-2;
    config.optimizer = std::make_unique<optim::AdamW>(net->parameters(), adamw);
    config.scheduler = std::make_unique<optim::StepLR>(*config.optimizer, 1000, 0.5);
    return config;
  }
  std::shared_ptr<nn::Sequential> net;
  DType logits_dtype = DType::f64, val_logits_dtype = DType::f64;
  int64_t poison_batch = -1;
  double manual_clip = 0.5;
};

// Records what on_before_optimizer_step sees: the gradients' dtypes and the
// first step's gradient norm (unscaled, as Lightning's callbacks see it).
struct GradientProbe : Callback {
  std::string name() const override { return "GradientProbe"; }
  void on_before_optimizer_step(Trainer&, TrainModule&, optim::Optimizer& optimizer) override {
    for (const Tensor& p : optimizer.params_with_grad()) all_float32 = all_float32 && p.grad().dtype() == DType::f32;
    if (first_norm >= 0) return;
    double squares = 0;
    for (const Tensor& p : optimizer.params_with_grad()) squares += sum(mul(p.grad(), p.grad())).item<double>();
    first_norm = std::sqrt(squares);
  }
  bool all_float32 = true;
  double first_norm = -1;
};

struct RunResult {
  double train_loss = 0;
  int64_t global_step = 0, optimizer_steps = 0, schedule_steps = 0;
  double scale = 0, first_grad_norm = 0;
  bool grads_float32 = false;
};

TrainerOptions run_options(const std::string& precision, const std::string& accelerator) {
  TrainerOptions options = testing::quiet_trainer_options();
  options.accelerator = accelerator;
  options.precision = precision;
  options.max_steps = 40;
  options.log_every_n_steps = 10;
  options.logger = false;
  options.enable_checkpointing = false;
  return options;
}

DataLoaderOptions loader_options() { return testing::seeded_loader_options(32); }

RunResult train(const std::string& precision, Classifier& module, const std::string& accelerator = "cpu") {
  auto data = classification_data(256);  // 8 batches per epoch
  TrainerOptions options = run_options(precision, accelerator);
  auto probe = std::make_shared<GradientProbe>();
  options.callbacks.push_back(probe);
  DataLoader train_loader(data, loader_options()), val_loader(data, loader_options());
  Trainer trainer(options);
  trainer.fit(module, train_loader, &val_loader);
  RunResult result;
  result.train_loss = trainer.callback_metrics().at("train_loss");
  result.global_step = trainer.global_step();
  result.optimizer_steps = trainer.optimizer().step_state().step.item<int64_t>();
  result.schedule_steps = trainer.lr_scheduler()->last_epoch().item<int64_t>();
  result.scale = trainer.scaler() != nullptr ? trainer.scaler()->get_scale() : 1.0;
  result.first_grad_norm = probe->first_norm;
  result.grads_float32 = probe->all_float32;
  return result;
}

}  // namespace

TEST_CASE("Trainer: bf16-mixed runs the steps in autocast with float32 weights and tracks 32-true") {
  Classifier full, mixed;
  const RunResult full_run = train("32-true", full), mixed_run = train("bf16-mixed", mixed);
  MESSAGE("train_loss after 40 steps: 32-true " << full_run.train_loss << ", bf16-mixed " << mixed_run.train_loss);
  CHECK(full.logits_dtype == DType::f32);
  CHECK(mixed.logits_dtype == DType::bf16);      // training_step under autocast
  CHECK(mixed.val_logits_dtype == DType::bf16);  // validation_step too
  for (const Tensor& p : mixed.net->parameters()) CHECK(p.dtype() == DType::f32);
  CHECK(mixed_run.grads_float32);
  CHECK(mixed_run.scale == 1.0);  // no loss scaling in bf16
  CHECK_FALSE(autocast_enabled(DeviceType::cpu));  // nothing leaks out of the steps
  CHECK(mixed_run.optimizer_steps == 40);
  CHECK(std::abs(mixed_run.train_loss - full_run.train_loss) < 0.1 * full_run.train_loss + 0.02);
  CHECK(std::abs(mixed_run.first_grad_norm - full_run.first_grad_norm) < 0.05 * full_run.first_grad_norm);
  // And "bf16" is Lightning's short name for it; test/predict run under autocast as well.
  Trainer short_name(run_options("bf16", "cpu"));
  CHECK(short_name.autocast_dtype() == DType::bf16);
  CHECK(short_name.scaler() == nullptr);
  Trainer full_precision(run_options("32-true", "cpu"));
  CHECK_FALSE(full_precision.autocast_dtype().has_value());
  CHECK_FALSE(full_precision.autocast_region().has_value());
  struct Predictor : Classifier {
    Tensor predict_step(const Batch& batch, int64_t) override { return net->forward(batch.input); }
    void test_step(const Batch& batch, int64_t) override { test_logits_dtype = net->forward(batch.input).dtype(); }
    DType test_logits_dtype = DType::f64;
  } predictor;
  DataLoader loader(classification_data(64), loader_options());
  const std::vector<Tensor> predictions = short_name.predict(predictor, loader);
  REQUIRE(!predictions.empty());
  CHECK(predictions.front().dtype() == DType::bf16);
  short_name.test(predictor, loader);
  CHECK(predictor.test_logits_dtype == DType::bf16);
  CHECK_FALSE(autocast_enabled(DeviceType::cpu));
}

TEST_CASE("Trainer: 16-mixed needs a GPU") {
  for (const char* name : {"16-mixed", "16"}) {
    TrainerOptions options = run_options(name, "cpu");
    CHECK_THROWS_WITH_AS(Trainer{options}, doctest::Contains("needs a GPU"), Error);
  }
}

TEST_CASE("Trainer: the finders' trial steps run in the trainer's autocast region") {
  auto data = classification_data(64);
  Trainer trainer(run_options("bf16-mixed", "cpu"));
  const detail::StepSettings settings = detail::step_settings(trainer);
  REQUIRE(settings.autocast_dtype == DType::bf16);
  Classifier module;
  OptimizerConfig config = module.configure_optimizers();
  DataLoader loader(data, loader_options());
  detail::FinderLoop loop(module, *config.optimizer, loader, loader.size(), settings);
  const Tensor loss = loop.step();
  CHECK(module.logits_dtype == DType::bf16);
  CHECK(loss.dtype() == DType::f32);  // cross_entropy runs in float32 under autocast
  CHECK_FALSE(autocast_enabled(DeviceType::cpu));
  CHECK_FALSE(detail::step_settings(Trainer(run_options("32-true", "cpu"))).autocast_dtype.has_value());
}

TEST_CASE("Trainer checkpoints carry the GradScaler's state; files without it still load") {
  const fs::path file =
      fs::temp_directory_path() / ("kiln_scaler_ckpt_" + std::to_string(::getpid()) + ".safetensors");
  manual_seed(1);
  nn::Linear model(2, 1);
  optim::SGD sgd(model.parameters(), {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 8.0, .growth_interval = 1});
  Tensor loss = sum(model.forward(ones({1, 2})));
  scaler.scale(loss).backward();
  scaler.step(sgd);
  scaler.update();  // a finite step with growth_interval 1: scale 16
  REQUIRE(scaler.get_scale() == 16.0);
  const std::vector<OptimizerSlot> slots = {{&sgd, nullptr}};
  save_trainer_checkpoint(file.string(), model, slots, TrainerCheckpoint{}, &scaler);
  {
    const TrainerCheckpointFile read = read_trainer_checkpoint(file.string(), model, 1);
    REQUIRE(read.scaler.has_value());
    optim::GradScaler restored;
    load_checkpoint_scaler(read, &restored);
    CHECK(restored.get_scale() == 16.0);
    CHECK(restored.options().growth_interval == 1);
    load_checkpoint_scaler(read, nullptr);  // a run without a scaler ignores the file's
  }
  // A file without a scaler section (another precision, or written before
  // scalers were saved) leaves a run's scaler at its initial scale.
  save_trainer_checkpoint(file.string(), model, slots, TrainerCheckpoint{});
  {
    const TrainerCheckpointFile read = read_trainer_checkpoint(file.string(), model, 1);
    CHECK_FALSE(read.scaler.has_value());
    optim::GradScaler untouched;
    load_checkpoint_scaler(read, &untouched);
    CHECK(untouched.get_scale() == 65536.0);
  }
  fs::remove(file);
}

TEST_CASE("Trainer: 16-mixed skips the step of an inf loss without advancing the schedule [gpu]") {
  KILN_REQUIRE_GPU();
  Classifier full, module;
  module.poison_batch = 3;
  const RunResult full_run = train("32-true", full, "gpu");
  const RunResult run = train("16-mixed", module, "gpu");
  CHECK(module.logits_dtype == DType::f16);
  for (const Tensor& p : module.net->parameters()) CHECK(p.dtype() == DType::f32);
  CHECK(run.grads_float32);
  CHECK(run.global_step == 40);  // the loop's count, as Lightning's
  // Batch 3 of each of the 5 epochs is skipped on the device (and possibly a
  // few early steps whose fp16 gradients overflowed at the initial scale):
  // the optimizer and the schedule count only the steps that happened.
  CHECK(run.optimizer_steps <= 35);
  CHECK(run.optimizer_steps > 20);
  CHECK(run.schedule_steps == run.optimizer_steps);
  CHECK(run.scale <= 65536.0 / 32);
  // Callbacks see unscaled gradients (the first step is finite: batch 0).
  CHECK(std::abs(run.first_grad_norm - full_run.first_grad_norm) < 0.05 * full_run.first_grad_norm);
}

TEST_CASE("Trainer: 16-mixed manual optimization scales manual_backward and unscales before clipping [gpu]") {
  KILN_REQUIRE_GPU();
  Classifier full(/*manual=*/true), mixed(/*manual=*/true);
  const RunResult full_run = train("32-true", full, "gpu");
  const RunResult mixed_run = train("16-mixed", mixed, "gpu");
  CHECK(mixed.logits_dtype == DType::f16);
  CHECK(mixed_run.global_step == 40);
  CHECK(mixed_run.optimizer_steps == 40);
  CHECK(mixed_run.scale == 65536.0);  // no overflow, no growth before 2000 steps
  // Unscaled gradients clipped to the same norm: the runs stay together (a
  // scaled clip or an unscaled backward would leave the weights far apart).
  const std::vector<Tensor> a = full.net->parameters(), b = mixed.net->parameters();
  for (size_t i = 0; i < a.size(); ++i) KILN_CHECK_CLOSE(a[i], b[i], 0.05, 0.02);
  CHECK(std::abs(mixed_run.train_loss - full_run.train_loss) < 0.1 * full_run.train_loss + 0.02);
}

TEST_CASE("Trainer: a 16-mixed checkpoint restores the loss scale on resume [gpu]") {
  KILN_REQUIRE_GPU();
  const fs::path root = fs::temp_directory_path() / ("kiln_scaler_resume_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string file = (root / "mixed.safetensors").string();
  auto data = classification_data(256);
  double saved_scale = 0;
  {
    Classifier module;
    module.poison_batch = 1;  // one backoff per epoch: the scale differs from the initial one
    TrainerOptions options = run_options("16-mixed", "gpu");
    options.max_steps = 10;
    DataLoader loader(data, loader_options());
    Trainer trainer(options);
    trainer.fit(module, loader);
    saved_scale = trainer.scaler()->get_scale();
    REQUIRE(saved_scale < 65536.0);
    trainer.save_checkpoint(file);
  }
  Classifier module;
  TrainerOptions options = run_options("16-mixed", "gpu");
  options.max_steps = 10;  // already reached: fit only loads the checkpoint
  DataLoader loader(data, loader_options());
  Trainer trainer(options);
  trainer.fit(module, loader, nullptr, file);
  CHECK(trainer.scaler()->get_scale() == saved_scale);
  fs::remove_all(root);
}
