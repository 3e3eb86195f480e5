// Trainer checkpoints: several optimizers (manual optimization), the
// single-optimizer layout of older files, and resuming from checkpoints
// written at an epoch's end (by ModelCheckpoint from on_train_epoch_end or
// on_validation_end), each compared bit for bit with an uninterrupted run;
// and corrupt files (fuzz findings), each a kiln::Error naming the file.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/generator.h"
#include "core/ops.h"
#include "core/serialization.h"
#include "data/dataloader.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/checkpoint_io.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

fs::path fresh_folder(const std::string& name) { return testing::fresh_folder("resume", name); }

TrainerOptions quiet_options(const fs::path& root) {
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.logger = false;
  return options;
}

std::vector<float> values(const nn::Module& model) {
  std::vector<float> out;
  for (const auto& [name, tensor] : model.state_dict()) {
    for (float v : tensor.to(DType::f32).to_vector<float>()) out.push_back(v);
  }
  return out;
}

// A small GAN optimized by hand: SGD with momentum for G, Adam for D, each
// with a per-batch StepLR the module steps itself (Lightning's manual schedules).
struct TwoOptimizerGan : TrainModule {
  TwoOptimizerGan() {
    automatic_optimization = false;
    manual_seed(21);
    generator = nets.register_module("generator", std::make_shared<nn::Linear>(2, 3));
    discriminator = nets.register_module("discriminator", std::make_shared<nn::Linear>(3, 1));
  }
  struct Nets : nn::Module {
    std::string type_name() const override { return "TwoOptimizerGanNets"; }
  };
  nn::Module& model() override { return nets; }
  OptimizerConfigs configure_optimizers() override {
    OptimizerConfig g{
        std::make_unique<optim::SGD>(generator->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9})};
    g.scheduler = std::make_unique<optim::StepLR>(*g.optimizer, 3, 0.5);
    OptimizerConfig d{std::make_unique<optim::Adam>(discriminator->parameters(), optim::AdamOptions{.lr = 0.01})};
    d.scheduler = std::make_unique<optim::StepLR>(*d.optimizer, 2, 0.7);
    return {std::move(g), std::move(d)};
  }
  static Tensor square_mean(const Tensor& x) { return mean(x * x); }
  Tensor training_step(const Batch& batch, int64_t) override {
    auto [g_opt, d_opt] = optimizers<2>();
    // Noise drawn from the default generator: resume must restore its state too.
    Tensor fake = generator->forward(add(batch.target, mul(randn(batch.target.shape()), 0.1)));
    {
      auto toggled = d_opt.toggle_model();
      manual_backward(square_mean(discriminator->forward(batch.input) - 1.0) +
                      square_mean(discriminator->forward(fake.detach())));
      d_opt.step();
      d_opt.zero_grad();
    }
    {
      auto toggled = g_opt.toggle_model();
      manual_backward(square_mean(discriminator->forward(fake) - 1.0));
      g_opt.step();
      g_opt.zero_grad();
    }
    for (optim::LRScheduler* scheduler : lr_schedulers()) scheduler->step();
    return Tensor();
  }
  Nets nets;
  std::shared_ptr<nn::Linear> generator, discriminator;
};

std::shared_ptr<TensorDataset> gan_data() {
  manual_seed(5);
  return std::make_shared<TensorDataset>(add(randn({10, 3}), 2.0), randn({10, 2}));
}

DataLoaderOptions shuffled(int64_t batch_size) { return {.batch_size = batch_size, .shuffle = true, .seed = 9}; }

// testing::Regression with a per-epoch StepLR, logging a per-epoch training
// loss (for EarlyStopping) and a validation loss.
const testing::RegressionOptions epoch_schedule{
    .make_scheduler = testing::step_lr(1, 0.5), .interval = "epoch", .train_loss_on_step = false,
    .train_loss_on_epoch = true, .val_loss_weighted = false};

std::shared_ptr<TensorDataset> regression_data(int64_t count) { return testing::regression_data(count, 0.5); }

}  // namespace

TEST_CASE("Checkpoint of two optimizers (manual optimization): resume mid-epoch equals the uninterrupted run") {
  auto data = gan_data();  // 5 batches of 2 per epoch, 2 optimizer steps per batch
  fs::path root = fresh_folder("two_optimizers");
  TwoOptimizerGan full;
  std::vector<double> full_lrs;
  {
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 2;
    DataLoader loader(data, shuffled(2));
    Trainer trainer(options);
    trainer.fit(full, loader);
    CHECK(trainer.global_step() == 20);
    for (size_t i = 0; i < 2; ++i) full_lrs.push_back(trainer.optimizer(i).lr(0).item<double>());
  }
  const std::string checkpoint = (root / "mid.safetensors").string();
  {
    TwoOptimizerGan first;
    TrainerOptions options = quiet_options(root);
    options.max_steps = 6;  // 3 batches: mid-epoch 0
    DataLoader loader(data, shuffled(2));
    Trainer trainer(options);
    trainer.fit(first, loader);
    trainer.save_checkpoint(checkpoint);
  }
  // The second optimizer's state and schedule have their own tensors, after optimizer 0's names.
  const SafetensorsFile file = load_safetensors(checkpoint);
  bool has_first = false, has_second = false, has_second_schedule = false;
  for (const auto& [name, tensor] : file.tensors) {
    has_first = has_first || name.rfind("optimizer.", 0) == 0;
    has_second = has_second || name.rfind("optimizer_1.", 0) == 0;
    has_second_schedule = has_second_schedule || name.rfind("scheduler_1.", 0) == 0;
  }
  CHECK(has_first);
  CHECK(has_second);
  CHECK(has_second_schedule);

  TwoOptimizerGan resumed;
  manual_seed(999);  // the checkpoint restores the generators
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 2;
  DataLoader loader(data, shuffled(2));
  Trainer trainer(options);
  trainer.fit(resumed, loader, nullptr, checkpoint);
  CHECK(trainer.global_step() == 20);
  CHECK(values(resumed.nets) == values(full.nets));
  // Both schedules continued from their saved steps (10 batches: 0.05 * 0.5^3, 0.01 * 0.7^5).
  for (size_t i = 0; i < 2; ++i) CHECK(trainer.optimizer(i).lr(0).item<double>() == full_lrs[i]);
  CHECK(full_lrs[0] == doctest::Approx(0.05 * 0.125).epsilon(1e-12));
  CHECK(full_lrs[1] == doctest::Approx(0.01 * std::pow(0.7, 5)).epsilon(1e-12));

  // A run with one optimizer is told how many the file holds.
  struct OneOptimizer : TwoOptimizerGan {
    OptimizerConfigs configure_optimizers() override {
      OptimizerConfigs both = TwoOptimizerGan::configure_optimizers();
      both.configs.pop_back();
      return std::move(both.configs);
    }
    Tensor training_step(const Batch&, int64_t) override { return Tensor(); }
  } one;
  DataLoader loader2(data, shuffled(2));
  CHECK_THROWS_WITH_AS(Trainer(quiet_options(root)).fit(one, loader2, nullptr, checkpoint),
                       doctest::Contains("holds 2 optimizer(s) but configure_optimizers returned 1"), Error);
  fs::remove_all(root);
}

TEST_CASE("Checkpoint: a file in the single-optimizer layout written before several optimizers still resumes") {
  auto data = regression_data(48);  // 6 batches of 8
  fs::path root = fresh_folder("old_layout");
  testing::Regression full(epoch_schedule);
  {
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 2;
    DataLoader loader(data, DataLoaderOptions{.batch_size = 8, .shuffle = true, .seed = 5});
    Trainer(options).fit(full, loader);
  }
  const std::string checkpoint = (root / "old.safetensors").string();
  {
    testing::Regression first(epoch_schedule);
    TrainerOptions options = quiet_options(root);
    options.max_steps = 4;
    DataLoader loader(data, DataLoaderOptions{.batch_size = 8, .shuffle = true, .seed = 5});
    Trainer trainer(options);
    trainer.fit(first, loader);
    trainer.save_checkpoint(checkpoint);
  }
  // Rewritten as the old writer did: no optimizer count, no epoch-end flag.
  SafetensorsFile file = load_safetensors(checkpoint);
  nlohmann::json meta = nlohmann::json::parse(file.metadata.at("kiln"));
  REQUIRE(meta.contains("num_optimizers"));
  meta.erase("num_optimizers");
  meta.erase("epoch_end_hooks_done");
  for (const auto& [name, tensor] : file.tensors) {
    CHECK((name.rfind("model.", 0) == 0 || name.rfind("optimizer.", 0) == 0 || name.rfind("scheduler.", 0) == 0));
  }
  save_safetensors(checkpoint, file.tensors, {{"kiln", meta.dump()}});

  testing::Regression resumed(epoch_schedule);
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 2;
  DataLoader loader(data, DataLoaderOptions{.batch_size = 8, .shuffle = true, .seed = 5});
  Trainer trainer(options);
  trainer.fit(resumed, loader, nullptr, checkpoint);
  CHECK(trainer.global_step() == 12);
  CHECK(values(*resumed.net) == values(*full.net));
  fs::remove_all(root);
}

namespace {
struct EpochEndRun {
  std::vector<float> weights;
  double lr = 0;
  int epoch_starts = 0, epoch_ends = 0;
  int early_stopping_wait = 0;
  double early_stopping_best = 0;
};

// 4 epochs of 6 batches; ModelCheckpoint writes "epoch=<e>.safetensors" at
// every epoch's end into `checkpoints` (from on_validation_end with a
// validation loader, else from on_train_epoch_end). Resumes from `ckpt_path`
// when given.
EpochEndRun run_epochs(const fs::path& root, const fs::path& checkpoints, bool validate, const std::string& ckpt_path) {
  auto data = regression_data(48);
  testing::Regression module(epoch_schedule);
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 4;
  ModelCheckpointOptions checkpointing;
  checkpointing.dirpath = checkpoints.string();
  checkpointing.filename = "{epoch}";
  checkpointing.save_top_k = -1;
  if (validate) {
    checkpointing.monitor = "val_loss";
    // After the validation: Lightning's default (None) would save at the
    // epoch's end here, since validation runs once per epoch.
    checkpointing.save_on_train_epoch_end = false;
  }
  // Given first, ModelCheckpoint still runs after EarlyStopping (Lightning's order),
  // so its checkpoints hold EarlyStopping's state after the same epoch.
  EarlyStoppingOptions stopping;
  stopping.monitor = "train_loss";
  stopping.check_on_train_epoch_end = true;
  stopping.patience = 100;
  stopping.mode = "max";  // never improves after the first epoch: the wait grows every epoch
  auto early_stopping = std::make_shared<EarlyStopping>(stopping);
  options.callbacks = {std::make_shared<ModelCheckpoint>(checkpointing), early_stopping};
  DataLoader train(data, DataLoaderOptions{.batch_size = 8, .shuffle = true, .seed = 5});
  DataLoader val(data, DataLoaderOptions{.batch_size = 16});
  Trainer trainer(options);
  trainer.fit(module, train, validate ? &val : nullptr, ckpt_path);
  CHECK(trainer.global_step() == 24);
  return {values(*module.net), trainer.optimizer().lr(0).item<double>(), module.epoch_starts, module.epoch_ends,
          early_stopping->wait_count(), early_stopping->best_score()};
}
}  // namespace

TEST_CASE("Resume from a checkpoint written at an epoch's end: hooks once, the epoch schedule steps once") {
  for (bool validate : {false, true}) {
    CAPTURE(validate);
    fs::path root = fresh_folder(validate ? "epoch_end_val" : "epoch_end");
    const EpochEndRun full = run_epochs(root, root / "full", validate, "");
    CHECK(full.epoch_starts == 4);
    CHECK(full.epoch_ends == 4);
    CHECK(full.lr == doctest::Approx(0.05 * std::pow(0.5, 4)).epsilon(1e-12));
    const fs::path checkpoint = root / "full" / "epoch=1.safetensors";
    REQUIRE(fs::exists(checkpoint));
    manual_seed(999);
    const EpochEndRun resumed = run_epochs(root, root / "resumed", validate, checkpoint.string());
    CHECK(resumed.weights == full.weights);
    CHECK(resumed.lr == full.lr);
    // Epochs 2 and 3 start. From on_train_epoch_end the checkpoint followed
    // epoch 1's end hooks; from on_validation_end it preceded them.
    CHECK(resumed.epoch_starts == 2);
    CHECK(resumed.epoch_ends == (validate ? 3 : 2));
    CHECK(resumed.early_stopping_wait == full.early_stopping_wait);
    CHECK(resumed.early_stopping_best == full.early_stopping_best);
    // The resumed run writes the epochs after the checkpoint's, not epoch 1's again.
    CHECK_FALSE(fs::exists(root / "resumed" / "epoch=1.safetensors"));
    CHECK(fs::exists(root / "resumed" / "epoch=3.safetensors"));
    fs::remove_all(root);
  }
}

TEST_CASE("Resume from a checkpoint written after a batch whose validation was due: it validates first") {
  // val_check_interval 0.5 in epochs of 4 batches: validations after batches
  // 2 and 4. The checkpoint is written in on_train_batch_end of batch 2 (as
  // ModelCheckpoint's every_n_train_steps does), before that validation runs.
  fs::path root = fresh_folder("validation_pending");
  auto data = regression_data(32);
  auto val_data = regression_data(16);
  const std::string checkpoint = (root / "step2.safetensors").string();
  auto run = [&](const std::string& ckpt_path, std::vector<std::shared_ptr<Callback>> callbacks) {
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 1;
    options.val_check_interval = 0.5;
    options.callbacks = std::move(callbacks);
    testing::Regression module(epoch_schedule);
    DataLoader loader(data, shuffled(8));
    DataLoader val(val_data, DataLoaderOptions{.batch_size = 8});
    Trainer trainer(options);
    trainer.fit(module, loader, &val, ckpt_path);
    return std::make_pair(module.validations, trainer.callback_metrics().at("val_loss"));
  };
  const auto [full_validations, full_val_loss] = run("", {std::make_shared<testing::SaveCheckpointAtStep>(2, checkpoint)});
  CHECK(full_validations == 2);
  REQUIRE(fs::exists(checkpoint));
  manual_seed(999);
  const auto [resumed_validations, resumed_val_loss] = run(checkpoint, {});
  CHECK(resumed_validations == 2);  // the pending one after batch 2, then after batch 4
  CHECK(resumed_val_loss == full_val_loss);
  fs::remove_all(root);
}

// ---------------------------------------------------------------- corrupt files (fuzz findings)
namespace {
// A small MLP with BatchNorm (an integer buffer), Adam, StepLR and a loss scaler, after one scaled step: every
// section of a checkpoint has state.
struct SmallRun {
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(3, 2), std::make_shared<nn::Tanh>(), std::make_shared<nn::BatchNorm1d>(2)});
  optim::Adam optimizer{model->parameters(), optim::AdamOptions{.lr = 0.01}};
  optim::StepLR scheduler{optimizer, 2, 0.5};
  optim::GradScaler scaler{optim::GradScalerOptions{.init_scale = 1024.0, .growth_interval = 3}};
  std::vector<OptimizerSlot> slots() { return {{&optimizer, &scheduler}}; }
};

using MetadataEdit = std::function<void(nlohmann::json&)>;
using TensorEdit = std::function<void(NamedTensorList&)>;

// A SmallRun's checkpoint with its "kiln" metadata and its tensors changed.
std::string corrupt_checkpoint(const fs::path& folder, const MetadataEdit& edit_metadata,
                               const TensorEdit& edit_tensors = [](NamedTensorList&) {}) {
  SmallRun run;
  Tensor out = run.model->forward(arange(0.0, 6.0, 1.0, {.dtype = DType::f32}).reshape({2, 3}));
  run.scaler.scale(mean(out * out)).backward();
  run.scaler.step(run.optimizer);
  run.scaler.update();
  run.scheduler.step();
  const std::string path = (folder / "corrupt.safetensors").string();
  save_trainer_checkpoint(path, *run.model, run.slots(), TrainerCheckpoint{}, &run.scaler);
  SafetensorsFile file = load_safetensors(path);
  nlohmann::json meta = nlohmann::json::parse(file.metadata.at("kiln"));
  edit_metadata(meta);
  edit_tensors(file.tensors);
  save_safetensors(path, file.tensors, {{"kiln", meta.dump()}});
  return path;
}

void replace_tensor(NamedTensorList& tensors, const std::string& name, const Tensor& value) {
  for (auto& [key, tensor] : tensors) {
    if (key == name) tensor = value;
  }
}

// Reads `path` and loads it into a fresh SmallRun; every error must be a
// kiln::Error that names the file and contains `expected`.
void check_load_fails(const std::string& path, const std::string& expected) {
  SmallRun run;
  const std::string message = testing::error_of([&] {
    const TrainerCheckpointFile file = read_trainer_checkpoint(path, *run.model, 1);
    load_checkpoint_model(file, *run.model);
    load_checkpoint_optimizers(file, run.slots());
    load_checkpoint_scaler(file, &run.scaler);
    load_checkpoint_rng(file);
  });
  CHECK_MESSAGE(message.find(path) != std::string::npos, "no error naming the file: '", message, "'");
  CHECK_MESSAGE(message.find(expected) != std::string::npos, "expected '", expected, "' in: '", message, "'");
}
}  // namespace

TEST_CASE("Checkpoint: a malformed optimizer state is a kiln::Error naming the file (fuzz finding)") {
  fs::path folder = fresh_folder("corrupt_optimizer");
  // Optimizer::load_state_dict let nlohmann's exceptions (and std::stoll's) escape.
  const std::vector<std::pair<MetadataEdit, std::string>> cases = {
      {[](nlohmann::json& meta) { meta["optimizer"].erase("param_groups"); }, "key 'param_groups' not found"},
      {[](nlohmann::json& meta) { meta["optimizer"]["state"]["0"].erase("buffers"); }, "key 'buffers' not found"},
      {[](nlohmann::json& meta) { meta["optimizer"]["param_groups"][0].erase("beta2"); },
       "parameter group 0: no \"beta2\""},
      {[](nlohmann::json& meta) { meta["optimizer"]["param_groups"] = 3; }, "the state has no list of parameter"},
      {[](nlohmann::json& meta) { meta["optimizer"]["param_groups"][0]["lr"] = "fast"; },
       "parameter group 0: \"lr\" is \"fast\" (expected a finite number)"},
      {[](nlohmann::json& meta) { meta["optimizer"]["param_groups"][0]["beta2"] = 1.5; }, "invalid beta2 1.5"},
      {[](nlohmann::json& meta) { meta["optimizer"]["state"]["x"] = meta["optimizer"]["state"]["0"]; },
       "state for parameter 'x' (expected an index in [0, 4))"},
  };
  for (const auto& [edit, expected] : cases) check_load_fails(corrupt_checkpoint(folder, edit), expected);
  // A float step count was converted with undefined behaviour, a negative one accepted, and the largest
  // int64 overflows when the next step increments it.
  const std::vector<std::pair<TensorEdit, std::string>> tensor_cases = {
      {[](NamedTensorList& t) { replace_tensor(t, "optimizer.state.0.step", full({}, NAN)); },
       "state.0.step has dtype float32, expected an integer step count"},
      {[](NamedTensorList& t) { replace_tensor(t, "optimizer.step", full({}, -3, {.dtype = DType::i64})); },
       "step is -3 (expected a step count in [0, 2^53])"},
      {[](NamedTensorList& t) {
         replace_tensor(t, "optimizer.state.1.step", tensor<int64_t>({std::numeric_limits<int64_t>::max()}, {}));
       },
       "state.1.step is 9223372036854775807 (expected a step count in [0, 2^53])"},
  };
  for (const auto& [edit, expected] : tensor_cases) {
    check_load_fails(corrupt_checkpoint(folder, [](nlohmann::json&) {}, edit), expected);
  }
  fs::remove_all(folder);
}

TEST_CASE("Checkpoint: bad generator states, counters, schedule and scaler states name the file (fuzz finding)") {
  fs::path folder = fresh_folder("corrupt_progress");
  const std::vector<std::pair<MetadataEdit, std::string>> cases = {
      // Device::parse's error did not name the file.
      {[](nlohmann::json& meta) { meta["rng"]["c0u"] = meta["rng"]["cpu"]; }, "corrupt generator state: Device"},
      // Floats out of range were converted to integers with undefined behaviour; negatives were accepted.
      {[](nlohmann::json& meta) { meta["rng"]["cpu"][0] = 1e300; }, "corrupt generator state for cpu"},
      // Counts are at most 2^53 (the loop increments them; a count near 2^63 would overflow).
      {[](nlohmann::json& meta) { meta["epoch"] = 1e300; },
       "\"epoch\" is 1e+300 (expected an integer in [0, 9007199254740992])"},
      {[](nlohmann::json& meta) { meta["global_step"] = -5; },
       "\"global_step\" is -5 (expected an integer in [0, 9007199254740992])"},
      {[](nlohmann::json& meta) { meta["global_step"] = 9007199254740993; },
       "\"global_step\" is 9007199254740993 (expected an integer in [0, 9007199254740992])"},
      {[](nlohmann::json& meta) { meta["num_optimizers"] = 1.5; }, "\"num_optimizers\" is 1.5"},
      {[](nlohmann::json& meta) { meta["scheduler"]["scheduler"] = 7; }, "the state is of a '7' scheduler"},
      {[](nlohmann::json& meta) { meta["scheduler"]["groups"] = 1.5; }, "the state has 1.5 parameter groups"},
      {[](nlohmann::json& meta) { meta["scaler"]["growth_interval"] = 1e300; },
       "\"growth_interval\" is 1e+300 (expected an integer)"},
      {[](nlohmann::json& meta) { meta["scaler"]["growth_interval"] = 0; }, "growth_interval must be in [1, 2^31 - 1]"},
      // nlohmann's value() threw its own exception for a header that is not an object.
      {[](nlohmann::json& meta) { meta = nlohmann::json::array(); }, "corrupt metadata: not a JSON object"},
  };
  for (const auto& [edit, expected] : cases) check_load_fails(corrupt_checkpoint(folder, edit), expected);
  const std::vector<std::pair<TensorEdit, std::string>> tensor_cases = {
      // Floats for integer counters converted with undefined behaviour.
      {[](NamedTensorList& t) { replace_tensor(t, "model.2.num_batches_tracked", full({}, NAN)); },
       "floating values for an integer tensor: 2.num_batches_tracked (checkpoint float32, model int64)"},
      {[](NamedTensorList& t) { replace_tensor(t, "scheduler.last_epoch", full({}, NAN)); },
       "last_epoch has dtype float32, expected an integer step count"},
      {[](NamedTensorList& t) { replace_tensor(t, "scheduler.last_epoch", full({}, -1, {.dtype = DType::i64})); },
       "last_epoch is -1 (expected a step count in [0, 2^53])"},
      {[](NamedTensorList& t) { replace_tensor(t, "scaler._growth_tracker", full({}, NAN)); },
       "_growth_tracker has dtype float32 (expected an integer)"},
      {[](NamedTensorList& t) { replace_tensor(t, "scaler._growth_tracker", full({}, 7, {.dtype = DType::i32})); },
       "_growth_tracker is 7 (expected in [0, growth_interval = 3))"},
      {[](NamedTensorList& t) { replace_tensor(t, "scaler.scale", full({}, 0.0)); },
       "scale is 0 (expected a positive finite number)"},
  };
  for (const auto& [edit, expected] : tensor_cases) {
    check_load_fails(corrupt_checkpoint(folder, [](nlohmann::json&) {}, edit), expected);
  }
  // The unedited file loads.
  SmallRun run;
  const std::string path = corrupt_checkpoint(folder, [](nlohmann::json&) {});
  const TrainerCheckpointFile file = read_trainer_checkpoint(path, *run.model, 1);
  load_checkpoint_optimizers(file, run.slots());
  load_checkpoint_scaler(file, &run.scaler);
  CHECK(run.scaler.get_scale() == 1024.0);
  CHECK(run.scheduler.last_epoch().item<int64_t>() == 1);
  fs::remove_all(folder);
}
