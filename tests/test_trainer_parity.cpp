// Lightning 2.x behaviours of the Trainer and its callbacks that kiln once
// did otherwise (each case names the Lightning source it follows).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "tests/support/trainer_fixtures.h"
#include "trainer/lr_monitor.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<TensorDataset> regression_data(int64_t count) { return testing::regression_data(count, 0.01); }

DataLoaderOptions loader_options(int64_t batch_size) { return testing::seeded_loader_options(batch_size, false); }

// The trainer tests' options, without logs (logger=false) and writing under `root`.
TrainerOptions quiet_options(const fs::path& root) {
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.logger = false;
  return options;
}

// Regression logging "train_loss" once per epoch (the epoch mean) instead of per step.
testing::RegressionOptions epoch_train_loss() {
  testing::RegressionOptions options;
  options.train_loss_on_step = false;
  options.train_loss_on_epoch = true;
  return options;
}

// Runs the given functions from the hooks the tests watch.
struct Hooks : Callback {
  std::string name() const override { return "Hooks"; }
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override {
    if (epoch_end) epoch_end(trainer, module);
  }
  void on_validation_end(Trainer& trainer, TrainModule& module) override {
    if (validation_end) validation_end(trainer, module);
  }
  void on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t batch_idx) override {
    if (batch_end) batch_end(trainer, module, batch_idx);
  }
  std::function<void(Trainer&, TrainModule&)> epoch_end, validation_end;
  std::function<void(Trainer&, TrainModule&, int64_t)> batch_end;
};

size_t count_files(const fs::path& folder) {
  if (!fs::exists(folder)) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(folder), fs::directory_iterator{}));
}

}  // namespace

// early_stopping.py setup(): check_on_train_epoch_end None becomes
// `val_check_interval == 1.0 and check_val_every_n_epoch == 1`.
TEST_CASE("EarlyStopping: check_on_train_epoch_end None checks at the epoch's end, so it works without validation") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "es_epoch_end");
  testing::Regression module(epoch_train_loss());
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 6;
  EarlyStoppingOptions stopping;
  stopping.monitor = "train_loss";
  stopping.min_delta = 1e9;  // no improvement after the first epoch
  stopping.patience = 1;
  auto early_stopping = std::make_shared<EarlyStopping>(stopping);
  options.callbacks = {early_stopping};
  DataLoader train(data, loader_options(4));
  Trainer trainer(options);
  CHECK(early_stopping->checks_on_train_epoch_end(trainer));
  trainer.fit(module, train);  // no validation loader
  CHECK(module.epoch_ends == 2);
  CHECK(trainer.current_epoch() == 2);
  CHECK(early_stopping->stopped_epoch() == 1);

  // Where the check runs follows the validation cadence, unless given.
  TrainerOptions twice_per_epoch = quiet_options(root);
  twice_per_epoch.val_check_interval = 0.5;
  TrainerOptions every_other_epoch = quiet_options(root);
  every_other_epoch.check_val_every_n_epoch = 2;
  TrainerOptions by_batches = quiet_options(root);
  by_batches.check_val_every_n_epoch = std::nullopt;
  by_batches.val_check_interval = 4;
  EarlyStopping unset;
  EarlyStopping after_validation(EarlyStoppingOptions{.check_on_train_epoch_end = false});
  CHECK_FALSE(unset.checks_on_train_epoch_end(Trainer(twice_per_epoch)));
  CHECK_FALSE(unset.checks_on_train_epoch_end(Trainer(every_other_epoch)));
  CHECK_FALSE(unset.checks_on_train_epoch_end(Trainer(by_batches)));
  CHECK_FALSE(after_validation.checks_on_train_epoch_end(Trainer(quiet_options(root))));

  // Lightning's strict check then fails at the epoch's end when the monitored
  // metric (val_loss by default) was never logged because nothing validates.
  testing::Regression unvalidated;
  TrainerOptions strict = quiet_options(root);
  strict.max_epochs = 1;
  strict.callbacks = {std::make_shared<EarlyStopping>()};
  DataLoader train2(data, loader_options(4));
  CHECK_THROWS_WITH_AS(Trainer(strict).fit(unvalidated, train2), doctest::Contains("'val_loss' was not logged"), Error);
  // As Lightning's message, it names what was logged instead (here: nothing).
  CHECK_THROWS_WITH_AS(Trainer(strict).fit(unvalidated, train2), doctest::Contains("logged: none"), Error);
  fs::remove_all(root);
}

// early_stopping.py: _run_early_stopping_check returns under fast_dev_run;
// load_state_dict restores patience; `min_delta *= 1 if mode max else -1` keeps its sign.
TEST_CASE("EarlyStopping: off under fast_dev_run; the checkpoint's patience wins; min_delta keeps its sign") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "es_details");
  testing::Regression module;
  TrainerOptions options = quiet_options(root);
  options.fast_dev_run = 2;
  EarlyStoppingOptions missing;
  missing.monitor = "never_logged";  // strict: would throw if the check ran
  options.callbacks = {std::make_shared<EarlyStopping>(missing)};
  DataLoader train(data, loader_options(4));
  DataLoader val(data, loader_options(8));
  CHECK_NOTHROW(Trainer(options).fit(module, train, &val));

  EarlyStopping restored(EarlyStoppingOptions{.patience = 5});
  restored.load_state_dict({{"wait_count", 0}, {"best_score", 1.0}, {"stopped_epoch", 0}, {"patience", 1}});
  std::string reason;
  CHECK(restored.update(2.0, &reason));  // one check without improvement is the restored patience
  CHECK(reason.find("did not improve in the last 1 records") != std::string::npos);

  // A negative min_delta in mode "min" accepts a value up to |min_delta| worse as an improvement.
  EarlyStoppingOptions tolerant;
  tolerant.min_delta = -0.5;
  EarlyStopping lenient(tolerant);
  CHECK_FALSE(lenient.update(5.0, &reason));
  CHECK_FALSE(lenient.update(5.3, &reason));
  CHECK(lenient.wait_count() == 0);
  CHECK(lenient.best_score() == 5.3);
  fs::remove_all(root);
}

// model_checkpoint.py _should_save_on_train_epoch_end: without validation
// (num_val_batches 0) the top-k checkpoint is written at the training epoch's end.
TEST_CASE("ModelCheckpoint: a monitored metric without validation saves at each training epoch's end") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "ckpt_no_val");
  testing::Regression module(epoch_train_loss());
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 3;
  ModelCheckpointOptions checkpointing;
  checkpointing.monitor = "train_loss";
  checkpointing.dirpath = (root / "checkpoints").string();
  auto checkpoint = std::make_shared<ModelCheckpoint>(checkpointing);
  std::vector<double> epoch_losses;
  auto hooks = std::make_shared<Hooks>();
  hooks->epoch_end = [&](Trainer& trainer, TrainModule&) {
    epoch_losses.push_back(trainer.callback_metrics().at("train_loss"));
  };
  options.callbacks = {checkpoint, hooks};
  DataLoader train(data, loader_options(4));
  Trainer trainer(options);
  CHECK(checkpoint->saves_on_train_epoch_end(trainer));
  trainer.fit(module, train);
  REQUIRE(epoch_losses.size() == 3);
  REQUIRE(checkpoint->best_model_score().has_value());
  CHECK(*checkpoint->best_model_score() == *std::min_element(epoch_losses.begin(), epoch_losses.end()));
  CHECK(fs::exists(checkpoint->best_model_path()));
  CHECK(count_files(root / "checkpoints") == 1);

  // With validation not every epoch it saves after validation (also when it
  // validates more than once per epoch: the step-0 case below).
  TrainerOptions every_other = quiet_options(root);
  every_other.check_val_every_n_epoch = 2;
  CHECK_FALSE(checkpoint->saves_on_train_epoch_end(Trainer(every_other)));
  CHECK_FALSE(ModelCheckpoint(ModelCheckpointOptions{.save_on_train_epoch_end = false})
                  .saves_on_train_epoch_end(Trainer(quiet_options(root))));
  fs::remove_all(root);
}

// model_checkpoint.py __init_triggers and __validate_init_configuration.
TEST_CASE("ModelCheckpoint: every_n_train_steps and every_n_epochs are mutually exclusive and not negative") {
  CHECK_THROWS_WITH_AS(ModelCheckpoint(ModelCheckpointOptions{.every_n_train_steps = 2, .every_n_epochs = 1}),
                       doctest::Contains("should be mutually exclusive"), Error);
  CHECK_THROWS_WITH_AS(ModelCheckpoint(ModelCheckpointOptions{.every_n_train_steps = -1}),
                       doctest::Contains("every_n_train_steps=-1. Must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(ModelCheckpoint(ModelCheckpointOptions{.every_n_epochs = -1}),
                       doctest::Contains("every_n_epochs=-1. Must be >= 0"), Error);
  CHECK_NOTHROW(ModelCheckpoint(ModelCheckpointOptions{.every_n_train_steps = 2, .every_n_epochs = 0}));
}

// model_checkpoint.py: _last_global_step_saved starts at 0 ("no need to save
// when no steps were taken"); _update_best_and_save replaces a NaN score by
// +inf ("min") so it ranks worst; _save_topk_checkpoint only warns about a
// missing monitor until the validation loop has run.
TEST_CASE("ModelCheckpoint: nothing saved at step 0; a NaN score ranks worst; a missing monitor waits for validation") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "ckpt_details");
  {
    // Accumulating 4 batches, validating every 2: validations at steps 0, 1, 1, 2 of the epoch.
    testing::Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 1;
    options.accumulate_grad_batches = 4;
    options.val_check_interval = 2;
    ModelCheckpointOptions checkpointing;
    checkpointing.save_top_k = -1;
    checkpointing.dirpath = (root / "steps").string();
    checkpointing.filename = "{step}";
    options.callbacks = {std::make_shared<ModelCheckpoint>(checkpointing)};
    DataLoader train(data, loader_options(4));
    DataLoader val(data, loader_options(8));
    Trainer(options).fit(module, train, &val);
    CHECK_FALSE(fs::exists(root / "steps" / "step=0.safetensors"));
    CHECK(fs::exists(root / "steps" / "step=1.safetensors"));
    CHECK(fs::exists(root / "steps" / "step=2.safetensors"));
    CHECK(count_files(root / "steps") == 2);
  }
  {
    struct Scripted : testing::Regression {
      Scripted() : testing::Regression({.log_losses = false}) {}
      void validation_step(const Batch&, int64_t) override {
        const double value = scores.at(static_cast<size_t>(trainer()->current_epoch()));
        log("val_loss", full({}, value));
      }
      std::vector<double> scores = {NAN, 1.0, 2.0};
    } module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 3;
    ModelCheckpointOptions checkpointing;
    checkpointing.monitor = "val_loss";
    checkpointing.dirpath = (root / "nan").string();
    checkpointing.filename = "{epoch}";
    auto checkpoint = std::make_shared<ModelCheckpoint>(checkpointing);
    options.callbacks = {checkpoint};
    DataLoader train(data, loader_options(8));
    DataLoader val(data, loader_options(16));
    Trainer(options).fit(module, train, &val);
    CHECK(checkpoint->best_model_path() == (root / "nan" / "epoch=1.safetensors").string());
    CHECK(checkpoint->best_model_score() == 1.0);
    CHECK(count_files(root / "nan") == 1);
    // Lightning's state keys; a score kept as +inf travels as JSON null and comes back as +inf.
    const nlohmann::json state = checkpoint->state_dict();
    CHECK(state.at("best_model_score") == 1.0);
    CHECK(state.at("monitor") == "val_loss");
    ModelCheckpoint restored(checkpointing);
    restored.load_state_dict(
        nlohmann::json::parse(R"({"best_model_path": "a", "best_k_models": {"a": 1.0, "b": null}})"));
    CHECK(restored.best_k_models() == std::map<std::string, double>{{"a", 1.0}, {"b", INFINITY}});
    CHECK(restored.best_model_score() == 1.0);
  }
  {
    // Checkpoints every 2 steps monitored on val_loss, which exists only after the epoch's validation.
    testing::Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 2;
    ModelCheckpointOptions checkpointing;
    checkpointing.monitor = "val_loss";
    checkpointing.every_n_train_steps = 2;
    checkpointing.dirpath = (root / "every2").string();
    auto checkpoint = std::make_shared<ModelCheckpoint>(checkpointing);
    options.callbacks = {checkpoint};
    DataLoader train(data, loader_options(4));
    DataLoader val(data, loader_options(8));
    CHECK_NOTHROW(Trainer(options).fit(module, train, &val));
    CHECK(checkpoint->best_model_path().find("epoch=1-step=") != std::string::npos);
    // After a validation a metric that never appears is an error.
    testing::Regression other;
    checkpointing.monitor = "never_logged";
    checkpointing.dirpath = (root / "missing").string();
    options.callbacks = {std::make_shared<ModelCheckpoint>(checkpointing)};
    DataLoader train2(data, loader_options(4));
    CHECK_THROWS_WITH_AS(Trainer(options).fit(other, train2, &val), doctest::Contains("could not find the monitored"),
                         Error);
    CHECK_THROWS_WITH_AS(Trainer(options).fit(other, train2, &val),
                         doctest::Contains("returned metrics: 'val_loss'."), Error);
  }
  fs::remove_all(root);
}

// callback_connector.py _configure_checkpoint_callbacks.
TEST_CASE("Trainer: a ModelCheckpoint with enable_checkpointing=false is refused") {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.enable_checkpointing = false;
  options.callbacks = {std::make_shared<ModelCheckpoint>()};
  CHECK_THROWS_WITH_AS(Trainer{options}, doctest::Contains("enable_checkpointing=false but found a ModelCheckpoint"),
                       Error);
}

// callback_connector.py _configure_checkpoint_callbacks: enable_checkpointing (the
// default) without a ModelCheckpoint adds ModelCheckpoint(): the latest epoch's
// checkpoint only, in <log dir>/checkpoints (<default_root_dir>/checkpoints without a logger).
TEST_CASE("Trainer: enable_checkpointing adds a default ModelCheckpoint keeping the latest epoch") {
  fs::path root = testing::fresh_folder("parity", "default_checkpoint");
  auto data = regression_data(16);
  for (bool enabled : {true, false}) {
    CAPTURE(enabled);
    testing::Regression module;
    TrainerOptions options = quiet_options(root / (enabled ? "on" : "off"));
    options.max_epochs = 2;
    options.enable_checkpointing = enabled;
    DataLoader train(data, loader_options(4));
    Trainer trainer(options);
    const auto checkpoints =
        std::count_if(trainer.options().callbacks.begin(), trainer.options().callbacks.end(),
                      [](const auto& callback) { return dynamic_cast<const ModelCheckpoint*>(callback.get()); });
    CHECK(checkpoints == (enabled ? 1 : 0));
    trainer.fit(module, train);
    const fs::path folder = root / (enabled ? "on" : "off") / "checkpoints";
    CHECK(fs::exists(folder / "epoch=1-step=8.safetensors") == enabled);
    CHECK(fs::exists(folder / "epoch=0-step=4.safetensors") == false);  // replaced by the next epoch's
  }
  fs::remove_all(root);
}

// setup.py _init_debugging_flags: max_steps=n, num_sanity_val_steps 0,
// val_check_interval 1.0, check_val_every_n_epoch 1; the loggers become a
// DummyLogger, so LearningRateMonitor finds "a logger".
TEST_CASE("Trainer: fast_dev_run validates once at the epoch's end whatever the cadence; LearningRateMonitor passes") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "fast_dev_run");
  testing::Regression module;
  TrainerOptions options = quiet_options(root);
  options.fast_dev_run = 2;
  options.check_val_every_n_epoch = 3;
  options.val_check_interval = 1;
  options.logger = true;
  options.callbacks = {std::make_shared<LearningRateMonitor>()};
  DataLoader train(data, loader_options(4));
  DataLoader val(data, loader_options(4));
  Trainer trainer(options);
  CHECK(trainer.options().max_steps == 2);
  CHECK(trainer.options().num_sanity_val_steps == 0);
  trainer.fit(module, train, &val);
  CHECK(module.training_steps == 2);
  CHECK(module.validations == 1);
  CHECK(module.validation_steps == 2);
  CHECK(count_files(root) == 0);  // no logs, no checkpoints
  fs::remove_all(root);
}

// evaluation_loop.py on_run_end: on_validation_epoch_end runs, its logged
// values join the epoch's metrics, then on_validation_end; Trainer.validate too.
TEST_CASE("Trainer: on_validation_epoch_end runs before the callbacks' on_validation_end and logs validation metrics") {
  struct EpochEndLogging : testing::Regression {
    void on_validation_epoch_end() override {
      ++validations;
      log("val_score", full({}, 10.0 * validations));
    }
  };
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "val_epoch_end");
  EpochEndLogging module;
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 2;
  std::vector<double> seen;
  auto hooks = std::make_shared<Hooks>();
  hooks->validation_end = [&](Trainer& trainer, TrainModule&) {
    seen.push_back(trainer.callback_metrics().at("val_score"));
  };
  EarlyStoppingOptions stopping;
  stopping.monitor = "val_score";
  stopping.check_on_train_epoch_end = false;
  stopping.patience = 10;
  options.callbacks = {hooks, std::make_shared<EarlyStopping>(stopping)};
  DataLoader train(data, loader_options(8));
  DataLoader val(data, loader_options(16));
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  CHECK(seen == std::vector<double>{10.0, 20.0});
  const std::map<std::string, double> metrics = trainer.validate(module, val);
  CHECK(metrics.at("val_score") == 30.0);
  CHECK(module.validations == 3);
  fs::remove_all(root);
}

// fit_loop.py / training_epoch_loop.py: trainer.should_stop is never cleared;
// the loops end once _can_stop_early (min_epochs and min_steps met), mid-epoch included.
TEST_CASE("Trainer: a stop requested once waits for min_epochs and min_steps, then stops") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "min_epochs");
  auto request_once = std::make_shared<Hooks>();
  request_once->epoch_end = [](Trainer& trainer, TrainModule&) {
    if (trainer.current_epoch() == 0) trainer.should_stop = true;
  };
  {
    testing::Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 10;
    options.min_epochs = 3;
    options.callbacks = {request_once};
    DataLoader train(data, loader_options(4));
    Trainer trainer(options);
    trainer.fit(module, train);
    CHECK(module.epoch_ends == 3);
    CHECK(trainer.global_step() == 24);
  }
  {
    testing::Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 10;
    options.min_steps = 10;  // mid-way through the second epoch of 8 batches
    options.callbacks = {request_once};
    DataLoader train(data, loader_options(4));
    Trainer trainer(options);
    trainer.fit(module, train);
    CHECK(trainer.global_step() == 10);
    CHECK(module.epoch_ends == 1);
  }
  fs::remove_all(root);
}

// lightning/fabric/loggers/csv_logs.py _ExperimentWriter._record_new_keys: the columns are kept sorted.
TEST_CASE("CSVLogger: metrics.csv columns are sorted, epoch and step among them") {
  fs::path root = testing::fresh_folder("parity", "csv_columns");
  CSVLogger logger(root.string());
  logger.log_metrics({{"val_loss", 1.0}, {"acc", 0.5}}, 3, 0);
  logger.log_metrics({{"lr-SGD", 0.1}, {"zeta", 2.0}}, 4, 1);
  logger.save();
  std::ifstream in(fs::path(logger.log_dir()) / "metrics.csv");
  std::string header, first, second;
  std::getline(in, header);
  std::getline(in, first);
  std::getline(in, second);
  CHECK(header == "acc,epoch,lr-SGD,step,val_loss,zeta");
  CHECK(first == "0.5,0,,3,1,");
  CHECK(second == ",1,0.1,4,,2");
  fs::remove_all(root);
}

// fit_loop.py: skip (limit_train_batches == 0) returns before on_train_start;
// setup_data refuses an integer val_check_interval above the epoch's batches, validation or not.
TEST_CASE("Trainer: limit_train_batches=0 trains nothing; an integer val_check_interval above the epoch is refused") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "no_train_batches");
  for (BatchesOrFraction none : {BatchesOrFraction(0), BatchesOrFraction(0.0)}) {
    testing::Regression module({.make_scheduler = testing::step_lr(1, 0.5), .interval = "epoch"});
    TrainerOptions options = quiet_options(root);  // max_epochs None: 1000
    options.limit_train_batches = none;
    DataLoader train(data, loader_options(4));
    Trainer trainer(options);
    trainer.fit(module, train);
    CHECK(module.epoch_starts == 0);
    CHECK(module.epoch_ends == 0);
    CHECK(trainer.current_epoch() == 0);
    CHECK(trainer.optimizer().lr(0).item<double>() == 0.05);  // the epoch schedule never stepped
  }
  testing::Regression module;
  TrainerOptions options = quiet_options(root);
  options.val_check_interval = 100;
  DataLoader train(data, loader_options(4));
  CHECK_THROWS_WITH_AS(Trainer(options).fit(module, train),
                       doctest::Contains("val_check_interval (100) must be less than or equal to the number of the "
                                         "training batches (8)"),
                       Error);
  fs::remove_all(root);
}

// fit_loop.py on_advance_end: on_train_epoch_end of the other callbacks, then
// the module's, then EarlyStopping's and ModelCheckpoint's ("otherwise they
// wouldn't be able to monitor a key logged in LightningModule.on_train_epoch_end").
TEST_CASE("Trainer: on_train_epoch_end calls the other callbacks, the module, then the monitoring callbacks") {
  struct EpochEndLogging : testing::Regression {
    void on_train_epoch_end() override {
      ++epoch_ends;
      log("epoch_score", full({}, scores.at(static_cast<size_t>(epoch_ends - 1))));  // an epoch value by default
    }
    std::vector<double> scores = {3.0, 1.0, 2.0};
  };
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "train_epoch_end");
  EpochEndLogging module;
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 3;
  ModelCheckpointOptions checkpointing;
  checkpointing.monitor = "epoch_score";
  checkpointing.dirpath = (root / "checkpoints").string();
  checkpointing.filename = "{epoch}";
  auto checkpoint = std::make_shared<ModelCheckpoint>(checkpointing);
  EarlyStoppingOptions stopping;
  stopping.monitor = "epoch_score";
  stopping.patience = 5;
  auto early_stopping = std::make_shared<EarlyStopping>(stopping);
  std::vector<int> module_hooks_seen;
  auto hooks = std::make_shared<Hooks>();
  hooks->epoch_end = [&](Trainer&, TrainModule&) { module_hooks_seen.push_back(module.epoch_ends); };
  options.callbacks = {early_stopping, checkpoint, hooks};
  DataLoader train(data, loader_options(4));
  Trainer trainer(options);
  trainer.fit(module, train);
  CHECK(module_hooks_seen == std::vector<int>{0, 1, 2});  // before the module's hook each epoch
  CHECK(early_stopping->best_score() == 1.0);
  CHECK(early_stopping->wait_count() == 1);
  CHECK(checkpoint->best_model_path() == (root / "checkpoints" / "epoch=1.safetensors").string());
  CHECK(trainer.callback_metrics().at("epoch_score") == 2.0);
  fs::remove_all(root);
}

// training_epoch_loop.py _should_check_val_fx: "allow validation if requesting
// to stop early through Trainer.should_stop ... and when the loop allows to stop".
TEST_CASE("Trainer: a stop requested mid-epoch validates before it stops; max_steps does not") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "stop_validates");
  auto stop_at_third_batch = std::make_shared<Hooks>();
  stop_at_third_batch->batch_end = [](Trainer& trainer, TrainModule&, int64_t batch_idx) {
    if (batch_idx == 2) trainer.should_stop = true;
  };
  for (bool requested : {true, false}) {
    CAPTURE(requested);
    testing::Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = 3;
    if (requested) {
      options.callbacks = {stop_at_third_batch};
    } else {
      options.max_steps = 3;
    }
    DataLoader train(data, loader_options(4));
    DataLoader val(data, loader_options(16));
    Trainer trainer(options);
    trainer.fit(module, train, &val);
    CHECK(module.training_steps == 3);
    CHECK(module.validations == (requested ? 1 : 0));
    CHECK(trainer.callback_metrics().count("val_loss") == (requested ? 1 : 0));
  }
  fs::remove_all(root);
}

// model_checkpoint.py _get_metric_interpolated_filepath_name: with the version
// counter (enable_version_counter=True), a name already taken gets "-v1", "-v2", ...
TEST_CASE("ModelCheckpoint: a file name already taken gets a -v1 suffix instead of being overwritten") {
  auto data = regression_data(32);
  fs::path root = testing::fresh_folder("parity", "ckpt_versions");
  testing::Regression module;
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 2;
  options.val_check_interval = 0.5;  // two validations, so two saves, per epoch
  ModelCheckpointOptions checkpointing;
  checkpointing.save_top_k = -1;
  checkpointing.dirpath = (root / "checkpoints").string();
  checkpointing.filename = "{epoch}";
  options.callbacks = {std::make_shared<ModelCheckpoint>(checkpointing)};
  DataLoader train(data, loader_options(4));
  DataLoader val(data, loader_options(16));
  Trainer(options).fit(module, train, &val);
  for (const char* name : {"epoch=0", "epoch=0-v1", "epoch=1", "epoch=1-v1"}) {
    CAPTURE(name);
    CHECK(fs::exists(root / "checkpoints" / (std::string(name) + ".safetensors")));
  }
  CHECK(count_files(root / "checkpoints") == 4);
  fs::remove_all(root);
}

TEST_CASE("ModelCheckpoint: a loaded state cannot make it delete files outside its own folder") {
  auto data = regression_data(16);
  fs::path root = testing::fresh_folder("parity", "ckpt_outside");
  fs::create_directories(root / "outside");
  fs::create_directories(root / "checkpoints");
  const fs::path victims[] = {root / "outside" / "victim.safetensors", root / "outside" / "victim.txt",
                              root / "checkpoints" / "notes.txt"};
  const fs::path own_stale = root / "checkpoints" / "stale.safetensors";
  for (const fs::path& file : {victims[0], victims[1], victims[2], own_stale}) std::ofstream(file) << "keep me";
  ModelCheckpointOptions checkpointing;
  checkpointing.dirpath = (root / "checkpoints").string();
  auto callback = std::make_shared<ModelCheckpoint>(checkpointing);
  // No monitor, save_top_k 1: each save removes every other kept file.
  nlohmann::json kept = nlohmann::json::object();
  for (const fs::path& file : {victims[0], victims[1], victims[2], own_stale}) kept[file.string()] = 0.0;
  callback->load_state_dict({{"best_k_models", kept}, {"best_model_path", own_stale.string()}});
  testing::Regression module;
  TrainerOptions options = quiet_options(root);
  options.max_epochs = 1;
  options.callbacks = {callback};
  DataLoader train(data, loader_options(8));
  Trainer(options).fit(module, train);
  for (const fs::path& victim : victims) CHECK_MESSAGE(fs::exists(victim), victim.string());
  CHECK_FALSE(fs::exists(own_stale));  // its own kind of file in its own folder still goes
  CHECK(fs::exists(callback->best_model_path()));
  fs::remove_all(root);
}

// model_checkpoint.py load_state_dict: the kept files, their scores and the last
// path are reloaded only when the saved dirpath is the folder this fit writes to
// (a resume into a new version_N folder, say, starts its top-k afresh); else only
// best_model_path is.
TEST_CASE("ModelCheckpoint: a fit resumed into another folder reloads only best_model_path") {
  auto data = regression_data(16);
  fs::path root = testing::fresh_folder("parity", "ckpt_dirpath");
  auto fit = [&](const fs::path& folder, int64_t max_epochs, const std::string& ckpt_path) {
    ModelCheckpointOptions checkpointing;
    checkpointing.dirpath = folder.string();
    checkpointing.save_top_k = -1;
    checkpointing.save_last = true;
    auto callback = std::make_shared<ModelCheckpoint>(checkpointing);
    testing::Regression module;
    TrainerOptions options = quiet_options(root);
    options.max_epochs = max_epochs;
    options.callbacks = {callback};
    DataLoader train(data, loader_options(8));
    Trainer(options).fit(module, train, nullptr, ckpt_path);
    return callback;
  };
  auto in_folder = [](const std::map<std::string, double>& kept, const fs::path& folder) {
    return std::all_of(kept.begin(), kept.end(), [&](const auto& entry) {
      return fs::path(entry.first).parent_path() == folder;
    });
  };
  const auto first = fit(root / "a", 2, "");
  REQUIRE(first->best_k_models().size() == 2);
  CHECK(first->state_dict().at("dirpath") == (root / "a").string());
  const std::string last = (root / "a" / "last.safetensors").string();

  const auto finished_elsewhere = fit(root / "b", 2, last);  // nothing left to train: only the reload shows
  CHECK(finished_elsewhere->best_model_path() == first->best_model_path());
  CHECK(finished_elsewhere->best_k_models().empty());
  CHECK(finished_elsewhere->last_model_path().empty());

  const auto elsewhere = fit(root / "b", 3, last);
  CHECK(elsewhere->best_k_models().size() == 1);
  CHECK(in_folder(elsewhere->best_k_models(), root / "b"));

  // The same folder named another way ("b/../a") is the same folder.
  const auto same_folder = fit(root / "b" / ".." / "a", 3, last);
  CHECK(same_folder->best_k_models().size() == 3);  // epochs 0 and 1 reloaded, epoch 2 added
  CHECK(in_folder(same_folder->best_k_models(), root / "a"));
  CHECK(same_folder->last_model_path() == last);

  // load_state_dict called directly (no fit whose folder it could compare) reloads everything.
  ModelCheckpoint direct;
  direct.load_state_dict({{"best_model_path", "x"}, {"best_k_models", {{"x", 1.0}}}, {"last_model_path", "y"}});
  CHECK(direct.best_k_models().size() == 1);
  CHECK(direct.last_model_path() == "y");
  fs::remove_all(root);
}

// model_checkpoint.py format_checkpoint_name: str.format specs ("{epoch:03d}",
// "{val_loss:.2f}"), and a missing key written as 0 ("{missing:d}" -> "missing=0").
TEST_CASE("ModelCheckpoint: file names take Python format specs; a metric not logged is 0") {
  const std::map<std::string, double> metrics = {{"val_loss", 0.123456}};
  CHECK(ModelCheckpoint::format_filename("e{epoch:03d}-s{step:d}-{val_loss:.2f}", 5, 30, metrics, false) ==
        "e005-s30-0.12");
  CHECK(ModelCheckpoint::format_filename("{val_loss:.1e}-{missing:.1f}-{other}", 0, 0, metrics, false) ==
        "1.2e-01-0.0-0.0000");
  CHECK(ModelCheckpoint::format_filename("{epoch:02d}-{val_loss:.2f}-{missing:d}", 5, 30, metrics) ==
        "epoch=05-val_loss=0.12-missing=0");
  CHECK_THROWS_WITH_AS(ModelCheckpoint::format_filename("{val_loss:>8}", 0, 0, metrics),
                       doctest::Contains("unsupported format '>8'"), Error);
}
