#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <fstream>

#include "core/generator.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/timer.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

fs::path fresh_folder(const std::string& name) { return testing::fresh_folder("trainer", name); }

std::shared_ptr<TensorDataset> regression_data(int64_t count) { return testing::regression_data(count, 0.01); }

using testing::Regression;

TrainerOptions quiet_options(const fs::path& root) { return testing::quiet_trainer_options(root); }

DataLoaderOptions loader_options(int64_t batch_size, bool shuffle = true) {
  return testing::seeded_loader_options(batch_size, shuffle);
}

}  // namespace

TEST_CASE("Trainer: accumulating k micro-batches equals one batch k times larger") {
  auto data = regression_data(64);
  fs::path root = fresh_folder("accumulate");
  Regression small, large;
  {
    TrainerOptions options = quiet_options(root);
    options.max_steps = 4;
    options.accumulate_grad_batches = 4;
    options.logger = false;
    DataLoader loader(data, loader_options(4, false));
    Trainer(options).fit(small, loader);
  }
  {
    TrainerOptions options = quiet_options(root);
    options.max_steps = 4;
    options.logger = false;
    DataLoader loader(data, loader_options(16, false));
    Trainer(options).fit(large, loader);
  }
  KILN_CHECK_CLOSE(small.net->weight, large.net->weight, 1e-5, 1e-6);
  KILN_CHECK_CLOSE(small.net->bias, large.net->bias, 1e-5, 1e-6);
  CHECK(small.training_steps == 16);
  CHECK(large.training_steps == 4);
  fs::remove_all(root);
}

TEST_CASE("Trainer: val_check_interval=0.25 validates four times per epoch; max_steps stops") {
  auto data = regression_data(64);
  fs::path root = fresh_folder("cadence");
  Regression module;
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 2;
  options.val_check_interval = 0.25;
  DataLoader train(data, loader_options(4));
  DataLoader val(data, loader_options(32, false));
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  CHECK(module.validation_steps == 2 * 4 * 2);  // 2 epochs x 4 checks x 2 batches
  CHECK(trainer.global_step() == 32);

  // limit_val_batches=0 turns validation off: no step, no on_validation_end
  // (a strict EarlyStopping checking on val_loss after validation would
  // otherwise stop the run with an error).
  Regression unvalidated;
  TrainerOptions no_validation = quiet_options(root);
  no_validation.max_epochs = 1;
  no_validation.limit_val_batches = 0;
  no_validation.num_sanity_val_steps = 2;  // skipped too, as in Lightning
  no_validation.callbacks = {std::make_shared<EarlyStopping>(EarlyStoppingOptions{.check_on_train_epoch_end = false})};
  DataLoader train3(data, loader_options(4));
  DataLoader val3(data, loader_options(32, false));
  Trainer unvalidated_trainer(no_validation);
  unvalidated_trainer.fit(unvalidated, train3, &val3);
  CHECK(unvalidated.validation_steps == 0);
  CHECK(unvalidated_trainer.global_step() == 16);

  Regression limited;
  TrainerOptions step_limited = quiet_options(root);
  step_limited.max_steps = 5;
  DataLoader train2(data, loader_options(4));
  Trainer limited_trainer(step_limited);
  limited_trainer.fit(limited, train2);
  CHECK(limited_trainer.global_step() == 5);
  CHECK(limited.training_steps == 5);
  fs::remove_all(root);
}

TEST_CASE("Trainer: CSV logs in Lightning's layout") {
  auto data = regression_data(32);
  fs::path root = fresh_folder("csv");
  Regression module;
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 2;
  options.log_every_n_steps = 2;
  DataLoader train(data, loader_options(4));
  DataLoader val(data, loader_options(16, false));
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  const fs::path csv = root / "lightning_logs" / "version_0" / "metrics.csv";
  REQUIRE(fs::exists(csv));
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  CHECK(header.find("epoch") == 0);
  CHECK(header.find("train_loss") != std::string::npos);
  CHECK(header.find("val_loss") != std::string::npos);
  int rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  CHECK(rows == 8 + 2);  // 16 steps logged every 2, plus one validation row per epoch
  std::ifstream hparams(root / "lightning_logs" / "version_0" / "hparams.yaml");
  std::string hparams_text((std::istreambuf_iterator<char>(hparams)), {});
  CHECK(hparams_text.find("optimizer: SGD") != std::string::npos);
  // A second run gets the next version folder.
  Regression again;
  DataLoader train2(data, loader_options(4));
  Trainer(options).fit(again, train2);
  CHECK(fs::exists(root / "lightning_logs" / "version_1" / "metrics.csv"));
  fs::remove_all(root);
}

TEST_CASE("EarlyStopping follows Lightning's sequences") {
  SUBCASE("check_finite stops at the NaN of [4, 3, NaN, 2, 1]") {
    EarlyStopping stopping(EarlyStoppingOptions{.patience = 3});
    std::string reason;
    CHECK_FALSE(stopping.update(4, &reason));
    CHECK_FALSE(stopping.update(3, &reason));
    CHECK(stopping.update(NAN, &reason));
    CHECK(reason.find("not finite") != std::string::npos);
  }
  SUBCASE("stopping_threshold stops when reached") {
    EarlyStoppingOptions options;
    options.stopping_threshold = 1.0;
    EarlyStopping stopping(options);
    std::string reason;
    CHECK_FALSE(stopping.update(3, &reason));
    CHECK_FALSE(stopping.update(1.5, &reason));
    CHECK(stopping.update(0.9, &reason));
    CHECK(reason.find("Stopping threshold") != std::string::npos);
  }
  SUBCASE("divergence_threshold stops when exceeded") {
    EarlyStoppingOptions options;
    options.divergence_threshold = 10.0;
    EarlyStopping stopping(options);
    std::string reason;
    CHECK_FALSE(stopping.update(3, &reason));
    CHECK(stopping.update(11, &reason));
    CHECK(reason.find("Divergence") != std::string::npos);
  }
  SUBCASE("patience counts checks without improvement; min_delta must be beaten") {
    EarlyStoppingOptions options;
    options.patience = 2;
    options.min_delta = 0.5;
    EarlyStopping stopping(options);
    std::string reason;
    CHECK_FALSE(stopping.update(5, &reason));
    CHECK_FALSE(stopping.update(4.8, &reason));  // not better by 0.5
    CHECK(stopping.wait_count() == 1);
    CHECK_FALSE(stopping.update(4.0, &reason));  // better: resets
    CHECK(stopping.wait_count() == 0);
    CHECK_FALSE(stopping.update(4.1, &reason));
    CHECK(stopping.update(4.2, &reason));
  }
}

TEST_CASE("Trainer: resume mid-epoch is bit-identical to an uninterrupted run") {
  auto data = regression_data(48);
  fs::path root = fresh_folder("resume");
  const testing::RegressionOptions with_schedule{.make_scheduler = testing::step_lr(3, 0.5)};
  // Uninterrupted: 10 steps (an epoch is 6 batches, so the stop at 4 is mid-epoch).
  Regression full(with_schedule);
  {
    TrainerOptions options = quiet_options(root);
    options.max_steps = 10;
    options.logger = false;
    DataLoader loader(data, loader_options(8));
    Trainer(options).fit(full, loader);
  }
  // 4 steps, checkpoint, then a new process-like run resumes for 6 more.
  const std::string checkpoint = (root / "mid.safetensors").string();
  {
    Regression first(with_schedule);
    TrainerOptions options = quiet_options(root);
    options.max_steps = 4;
    options.logger = false;
    DataLoader loader(data, loader_options(8));
    Trainer trainer(options);
    trainer.fit(first, loader);
    trainer.save_checkpoint(checkpoint);
  }
  Regression resumed(with_schedule);
  {
    manual_seed(999);  // the checkpoint restores the generators
    TrainerOptions options = quiet_options(root);
    options.max_steps = 10;
    options.logger = false;
    DataLoader loader(data, loader_options(8));
    Trainer trainer(options);
    trainer.fit(resumed, loader, nullptr, checkpoint);
    CHECK(trainer.global_step() == 10);
  }
  CHECK(resumed.net->weight.to_vector<float>() == full.net->weight.to_vector<float>());
  CHECK(resumed.net->bias.to_vector<float>() == full.net->bias.to_vector<float>());

  // A checkpoint of another model is refused with a clear error, and nothing changes.
  struct Other : Regression {
    explicit Other(const testing::RegressionOptions& options) : Regression(options) {
      net = std::make_shared<nn::Linear>(4, 2);
    }
  } other(with_schedule);
  std::vector<float> before = other.net->weight.to_vector<float>();
  TrainerOptions options = quiet_options(root);
  options.max_steps = 12;
  options.logger = false;
  DataLoader loader(data, loader_options(8));
  CHECK_THROWS_WITH_AS(Trainer(options).fit(other, loader, nullptr, checkpoint),
                       doctest::Contains("does not match"), Error);
  CHECK(other.net->weight.to_vector<float>() == before);
  fs::remove_all(root);
}

TEST_CASE("ModelCheckpoint keeps the best save_top_k and formats file names") {
  auto data = regression_data(32);
  fs::path root = fresh_folder("checkpoint");
  Regression module;
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 4;
  ModelCheckpointOptions checkpointing;
  checkpointing.monitor = "val_loss";
  checkpointing.save_top_k = 2;
  checkpointing.save_last = true;
  checkpointing.filename = "e{epoch}-{val_loss}";
  checkpointing.auto_insert_metric_name = false;  // bare values: the loss is read back from the name
  auto callback = std::make_shared<ModelCheckpoint>(checkpointing);
  options.callbacks = {callback};
  DataLoader train(data, loader_options(4));
  DataLoader val(data, loader_options(16, false));
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  // Two best by val_loss plus last.safetensors; the best path holds the smallest loss.
  std::vector<std::pair<double, std::string>> kept;
  int files = 0;
  for (auto& entry : fs::directory_iterator(fs::path(trainer.log_dir()) / "checkpoints")) {
    ++files;
    const std::string stem = entry.path().stem().string();
    if (stem == "last") continue;
    kept.emplace_back(std::stod(stem.substr(stem.find('-') + 1)), entry.path().string());
  }
  CHECK(files == 3);
  REQUIRE(kept.size() == 2);
  std::sort(kept.begin(), kept.end());
  CHECK(callback->best_model_path() == kept[0].second);
  CHECK(fs::exists(callback->last_model_path()));
  CHECK(ModelCheckpoint::format_filename("epoch={epoch}-step={step}-{acc}", 2, 30, {{"acc", 0.91234}}, false) ==
        "epoch=2-step=30-0.9123");
  // Lightning's default (auto_insert_metric_name=True), its "epoch=epoch=" gotcha included.
  CHECK(ModelCheckpoint::format_filename("{epoch}-{step}-{acc}", 2, 30, {{"acc", 0.91234}}) ==
        "epoch=2-step=30-acc=0.9123");
  CHECK(ModelCheckpoint::format_filename("epoch={epoch}", 2, 30, {}) == "epoch=epoch=2");
  CHECK(ModelCheckpointOptions{}.filename == "{epoch}-{step}");
  fs::remove_all(root);
}

TEST_CASE("Trainer: bad flags give clear errors") {
  CHECK_THROWS_WITH_AS(Trainer(TrainerOptions{.accumulate_grad_batches = 0}), doctest::Contains("accumulate_grad_batches"),
                       Error);
  TrainerOptions precision;
  precision.precision = "8-bit";
  CHECK_THROWS_WITH_AS(Trainer{precision}, doctest::Contains("unknown precision"), Error);
  TrainerOptions half;
  half.precision = "16-mixed";
  half.accelerator = "cpu";
  CHECK_THROWS_WITH_AS(Trainer{half}, doctest::Contains("needs a GPU"), Error);
  TrainerOptions two_devices;
  two_devices.devices = 2;  // strategy "auto" becomes "ddp", which needs kiln-run
  CHECK_THROWS_WITH_AS(Trainer{two_devices}, doctest::Contains("kiln-run --nproc-per-node 2"), Error);
  TrainerOptions unknown_strategy;
  unknown_strategy.strategy = "fsdp";
  CHECK_THROWS_WITH_AS(Trainer{unknown_strategy}, doctest::Contains("strategy must be"), Error);
  TrainerOptions one_device_ddp;
  one_device_ddp.strategy = "ddp";  // a group of one: allowed, nothing to synchronize
  CHECK(Trainer{one_device_ddp}.world_size() == 1);
  // Lightning's ranges: -1 is "no limit" (all batches for the sanity check), below that is refused.
  CHECK_THROWS_WITH_AS(Trainer(TrainerOptions{.max_epochs = -5}),
                       doctest::Contains("max_epochs must be >= 0, -1 for no limit, or None"), Error);
  CHECK_THROWS_WITH_AS(Trainer(TrainerOptions{.max_steps = -2}), doctest::Contains("max_steps must be >= 0, or -1"),
                       Error);
  CHECK_THROWS_WITH_AS(Trainer(TrainerOptions{.min_epochs = -1}), doctest::Contains("min_epochs must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(Trainer(TrainerOptions{.min_steps = -1}), doctest::Contains("min_steps must be >= 0"), Error);
  TrainerOptions negative_sanity, negative_smoke;
  negative_sanity.num_sanity_val_steps = -2;
  negative_smoke.fast_dev_run = -1;
  CHECK_THROWS_WITH_AS(Trainer{negative_sanity}, doctest::Contains("num_sanity_val_steps must be >= 0, or -1"), Error);
  CHECK_THROWS_WITH_AS(Trainer{negative_smoke}, doctest::Contains("fast_dev_run must be >= 0"), Error);
  CHECK(parse_max_time("00:00:01:30").count() == 90);
  CHECK(parse_max_time("45").count() == 45);
  CHECK_THROWS_AS(parse_max_time("1:2"), Error);
}

TEST_CASE("Trainer: num_sanity_val_steps validates that many batches before training; -1 every one, 0 none") {
  auto data = regression_data(64);
  fs::path root = fresh_folder("sanity");
  for (const auto& [sanity_steps, expected_sanity_batches] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {2, 2}, {-1, 8}, {20, 8}}) {
    INFO("num_sanity_val_steps = " << sanity_steps);
    Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 1;
    options.limit_train_batches = 1;
    options.num_sanity_val_steps = sanity_steps;
    DataLoader train(data, loader_options(8));
    DataLoader val(data, loader_options(8, false));  // 8 batches, all validated again after the epoch
    Trainer trainer(options);
    trainer.fit(module, train, &val);
    CHECK(module.validation_steps == expected_sanity_batches + 8);
    CHECK(trainer.global_step() == 1);
  }
  fs::remove_all(root);
}

TEST_CASE("Trainer: max_epochs None is Lightning's 1000 unless steps or time limit the run; -1 is no limit") {
  auto data = regression_data(32);
  DataLoader loader(data, loader_options(4));  // 8 batches per epoch
  auto epochs_and_steps = [&](TrainerOptions options) {
    options.accelerator = "cpu";
    Trainer trainer(options);
    return std::pair{trainer.max_epochs(), trainer.estimated_stepping_batches(loader)};
  };
  CHECK(epochs_and_steps({}) == std::pair<int64_t, int64_t>{1000, 8000});
  CHECK(epochs_and_steps({.max_epochs = -1}) == std::pair<int64_t, int64_t>{-1, -1});
  CHECK(epochs_and_steps({.max_epochs = 3}) == std::pair<int64_t, int64_t>{3, 24});
  CHECK(epochs_and_steps({.max_steps = 20}) == std::pair<int64_t, int64_t>{-1, 20});
  CHECK(epochs_and_steps({.max_epochs = 1, .max_steps = 20}) == std::pair<int64_t, int64_t>{1, 8});
  TrainerOptions timed;
  timed.max_time = "00:00:01:00";
  CHECK(epochs_and_steps(timed).first == -1);
  TrainerOptions with_timer;
  with_timer.callbacks = {std::make_shared<Timer>("00:00:01:00")};
  CHECK(epochs_and_steps(with_timer).first == -1);
  TrainerOptions smoke;
  smoke.fast_dev_run = 2;
  smoke.max_epochs = -1;
  CHECK(epochs_and_steps(smoke).first == 1);

  // -1 really trains past 1000 epochs' worth of a tiny loader: max_steps stops it instead.
  auto one_batch = regression_data(4);
  Regression module;
  fs::path root = fresh_folder("unlimited_epochs");
  TrainerOptions unlimited = quiet_options(root);
  unlimited.max_epochs = -1;
  unlimited.max_steps = 1005;
  unlimited.logger = false;
  unlimited.enable_checkpointing = false;
  DataLoader single(one_batch, loader_options(4));
  Trainer trainer(unlimited);
  trainer.fit(module, single);
  CHECK(trainer.global_step() == 1005);
  CHECK(trainer.current_epoch() >= 1004);
  fs::remove_all(root);
}

TEST_CASE("Trainer: max_time stops training on time") {
  struct Slow : Regression {
    Tensor training_step(const Batch& batch, int64_t index) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return Regression::training_step(batch, index);
    }
  } module;
  auto data = regression_data(64);
  fs::path root = fresh_folder("max_time");
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 1000;
  options.max_time = "00:00:00:01";
  options.logger = false;
  DataLoader loader(data, loader_options(4));
  Trainer trainer(options);
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(module, loader);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(trainer.stop_reason == "max_time reached");
  CHECK(seconds >= 1.0);
  CHECK(seconds < 3.0);
  CHECK(module.training_steps < 1000 * 16);
  fs::remove_all(root);
}

TEST_CASE("Trainer: overfit_batches trains and validates on the same first batches every epoch, in order") {
  // Records the first input value of every batch it sees.
  struct Recording : Regression {
    Tensor training_step(const Batch& batch, int64_t index) override {
      trained.push_back(batch.input.to_vector<float>()[0]);
      return Regression::training_step(batch, index);
    }
    void validation_step(const Batch& batch, int64_t index) override {
      validated.push_back(batch.input.to_vector<float>()[0]);
      Regression::validation_step(batch, index);
    }
    std::vector<float> trained, validated;
  };
  auto data = regression_data(64);
  const float first = data->get(0).input.to_vector<float>()[0], second = data->get(4).input.to_vector<float>()[0];
  auto other = std::make_shared<TensorDataset>(full({8, 4}, 7.0), zeros({8, 1}));
  fs::path root = fresh_folder("overfit");
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 3;
  options.logger = false;
  options.overfit_batches = 2;
  Recording module;
  DataLoader train(data, loader_options(4, /*shuffle=*/true));
  DataLoader val(other, loader_options(4, false));
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  // The first two batches of the data set, unshuffled, every epoch; validation sees the same ones.
  const std::vector<float> expected = {first, second, first, second, first, second};
  CHECK(module.trained == expected);
  CHECK(module.validated == expected);
  CHECK(trainer.global_step() == 6);
  // A fraction: a quarter of the 16 batches.
  Recording fraction;
  options.overfit_batches = 0.25;
  options.max_epochs = 1;
  DataLoader train2(data, loader_options(4, true));
  Trainer(options).fit(fraction, train2);
  CHECK(fraction.trained.size() == 4);
  CHECK(fraction.trained[1] == second);
  fs::remove_all(root);
}

TEST_CASE("Trainer: a validation inside an epoch neither reports nor resets the training epoch's logged values") {
  struct EpochLogging : Regression {
    Tensor training_step(const Batch& batch, int64_t) override {
      Tensor loss = mean_squared_error(batch);
      log("epoch_loss", loss, false, true);
      epoch_losses[trainer()->current_epoch()].push_back(loss.item<double>());
      return loss;
    }
    std::map<int64_t, std::vector<double>> epoch_losses;
  } module;
  auto data = regression_data(64);
  fs::path root = fresh_folder("val_inside_epoch");
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 2;
  options.val_check_interval = 0.5;
  options.logger = false;
  DataLoader train(data, loader_options(4));
  DataLoader val(data, loader_options(32, false));
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  REQUIRE(module.epoch_losses[1].size() == 16);
  double sum = 0;
  for (double loss : module.epoch_losses[1]) sum += loss;
  // The mean over all 16 batches of the last epoch, not over those after the mid-epoch validation.
  CHECK(trainer.callback_metrics().at("epoch_loss") == doctest::Approx(sum / 16).epsilon(1e-12));
  CHECK(trainer.callback_metrics().count("val_loss") == 1);
  fs::remove_all(root);
}

TEST_CASE("Trainer: values logged by on_fit_start callbacks stay out of the first epoch's averages") {
  // As LearningRateFinder, whose sweep runs training_step (and its log()
  // calls) in on_fit_start before the first epoch.
  struct SweepLike : Callback {
    std::string name() const override { return "SweepLike"; }
    void on_fit_start(Trainer&, TrainModule& module) override {
      module.log("train_loss", full({}, 1000.0), /*on_step=*/true, /*on_epoch=*/true);
    }
  };
  Regression module({.train_loss_on_step = true, .train_loss_on_epoch = true, .record_losses = true});
  auto data = regression_data(32);
  fs::path root = fresh_folder("fit_start_logs");
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 1;
  options.logger = false;
  options.callbacks.push_back(std::make_shared<SweepLike>());
  DataLoader loader(data, loader_options(8));
  Trainer trainer(options);
  trainer.fit(module, loader);
  REQUIRE(module.losses.size() == 4);
  double mean_loss = 0;
  for (double value : module.losses) mean_loss += value / 4;
  CHECK(trainer.callback_metrics().at("train_loss_epoch") == doctest::Approx(mean_loss).epsilon(1e-9));
  fs::remove_all(root);
}

TEST_CASE("Trainer: 1 means one batch and 1.0 the whole epoch, as Lightning's int and float") {
  fs::path root = fresh_folder("int_or_float");
  auto run = [&](BatchesOrFraction val_check_interval, BatchesOrFraction limit_train_batches, int64_t batches) {
    Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 1;
    options.num_sanity_val_steps = 0;
    options.logger = false;
    options.val_check_interval = val_check_interval;
    options.limit_train_batches = limit_train_batches;
    DataLoader loader(regression_data(8 * batches), loader_options(8));
    DataLoader val(regression_data(16), loader_options(8));
    Trainer(options).fit(module, loader, &val);
    return std::make_pair(module.training_steps, module.validations);
  };
  CHECK(run(1, 1.0, 6) == std::make_pair(6, 6));    // validation after every batch
  CHECK(run(1.0, 1.0, 6) == std::make_pair(6, 1));  // once, at the epoch's end
  CHECK(run(1.0, 1, 6) == std::make_pair(1, 1));    // one training batch
  CHECK(run(1.0, 0.5, 6) == std::make_pair(3, 1));
  // A fraction of the epoch's batches is rounded down as Lightning's int(10 * 0.25) = 2:
  // validations after batches 2, 4, 6, 8 and 10.
  CHECK(run(0.25, 1.0, 10) == std::make_pair(10, 5));
  // A fraction that leaves no batch is refused, saying which would give one.
  CHECK_THROWS_WITH_AS(run(1.0, 0.1, 6), doctest::Contains("try at least limit_train_batches=0.16"), Error);
  CHECK_THROWS_WITH_AS(run(2.5, 1.0, 6), doctest::Contains("val_check_interval: invalid value 2.5"), Error);
  fs::remove_all(root);
}

TEST_CASE("Trainer: check_val_every_n_epoch None counts val_check_interval batches across epochs, resume included") {
  // 6 batches of 8 per epoch, 3 epochs: validation after every 4th batch of
  // the run (global steps 4, 8, 12, 16), not after batch 4 of each epoch.
  fs::path root = fresh_folder("val_across_epochs");
  struct StepsAtValidation : Callback {
    std::string name() const override { return "StepsAtValidation"; }
    void on_validation_end(Trainer& trainer, TrainModule&) override { steps.push_back(trainer.global_step()); }
    std::vector<int64_t> steps;
  };
  auto run = [&](BatchesOrFraction interval, std::vector<std::shared_ptr<Callback>> callbacks = {},
                 const std::string& ckpt_path = "") {
    auto recorder = std::make_shared<StepsAtValidation>();
    callbacks.push_back(recorder);
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 3;
    options.check_val_every_n_epoch = std::nullopt;
    options.val_check_interval = interval;
    options.logger = false;
    options.callbacks = std::move(callbacks);
    Regression module;
    DataLoader loader(regression_data(48), loader_options(8));
    DataLoader val(regression_data(16), loader_options(8));
    Trainer(options).fit(module, loader, &val, ckpt_path);
    return recorder->steps;
  };
  CHECK(run(4) == std::vector<int64_t>{4, 8, 12, 16});
  CHECK(run(7) == std::vector<int64_t>{7, 14});  // more than an epoch's batches is fine here
  // Resumed from step 9 (inside the second epoch), the count goes on from 9.
  const std::string checkpoint = (root / "step9.safetensors").string();
  run(4, {std::make_shared<testing::SaveCheckpointAtStep>(9, checkpoint)});
  CHECK(run(4, {}, checkpoint) == std::vector<int64_t>{12, 16});
  CHECK_THROWS_WITH_AS(run(0.5), doctest::Contains("must be a number of batches when check_val_every_n_epoch is None"),
                       Error);
  fs::remove_all(root);
}

TEST_CASE("Trainer: an integer val_check_interval validates every N batches, the epoch's last included when a multiple") {
  auto data = regression_data(48);  // 6 batches of 8
  fs::path root = fresh_folder("val_every_n");
  for (const auto& [interval, expected] : {std::pair<double, int>{2, 3}, {4, 1}}) {
    CAPTURE(interval);
    Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 1;
    options.val_check_interval = interval;
    options.logger = false;
    DataLoader loader(data, loader_options(8));
    DataLoader val(regression_data(16), loader_options(8));
    Trainer(options).fit(module, loader, &val);
    CHECK(module.validations == expected);  // 2: after batches 2, 4, 6; 4: after batch 4 only (6 % 4 != 0)
  }
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 1;
  options.val_check_interval = 7;
  options.logger = false;
  Regression module;
  DataLoader loader(data, loader_options(8));
  DataLoader val(regression_data(16), loader_options(8));
  CHECK_THROWS_WITH_AS(Trainer(options).fit(module, loader, &val), doctest::Contains("val_check_interval (7)"), Error);
  fs::remove_all(root);
}
