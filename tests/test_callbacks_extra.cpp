// LearningRateMonitor, Timer, GradientAccumulationScheduler and
// StochasticWeightAveraging driven by a Trainer on the CPU.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numbers>
#include <thread>

#include <unistd.h>

#include "core/autograd.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/accumulation_scheduler.h"
#include "trainer/lr_monitor.h"
#include "trainer/swa_callback.h"
#include "trainer/timer.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// y = x w + noise (noisy enough that SGD's weights keep moving between epochs).
std::shared_ptr<TensorDataset> regression_data(int64_t count) { return testing::regression_data(count, 0.5); }

// testing::Regression logging nothing: these tests read the callbacks' own metrics.
struct UnloggedRegression : testing::Regression {
  UnloggedRegression() : testing::Regression({.log_losses = false}) {}
};

// UnloggedRegression whose model is Linear(4, 8), BatchNorm1d(8), Linear(8, 1)
// instead of Linear(4, 1).
struct BatchNormRegression : UnloggedRegression {
  BatchNormRegression() {
    // Seeded again: the layers take the draws that follow manual_seed(3), as
    // the fixture's Linear(4, 1), unused here, did.
    manual_seed(3);
    bn = std::make_shared<nn::BatchNorm1d>(8);
    layers = std::make_shared<nn::Sequential>(
        std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(4, 8), bn, std::make_shared<nn::Linear>(8, 1)});
  }
  nn::Module& model() override { return *layers; }
  std::shared_ptr<nn::Sequential> layers;
  std::shared_ptr<nn::BatchNorm1d> bn;
};

// Keeps every logged row.
class RecordingLogger : public Logger {
 public:
  explicit RecordingLogger(std::string folder) : folder_(std::move(folder)) {}
  const std::string& log_dir() const override { return folder_; }
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t) override {
    rows.emplace_back(step, metrics);
  }
  void log_hyperparams(const std::map<std::string, std::string>&) override {}
  void save() override {}
  // (step, value) of every row holding `key`.
  std::vector<std::pair<int64_t, double>> series(const std::string& key) const {
    std::vector<std::pair<int64_t, double>> out;
    for (const auto& [step, metrics] : rows) {
      auto it = metrics.find(key);
      if (it != metrics.end()) out.emplace_back(step, it->second);
    }
    return out;
  }
  std::vector<std::pair<int64_t, std::map<std::string, double>>> rows;

 private:
  std::string folder_;
};

// Calls the given functions from the hooks the tests watch.
struct Probe : Callback {
  std::string name() const override { return "Probe"; }
  void on_train_batch_start(Trainer& trainer, TrainModule& module, int64_t batch_idx) override {
    if (batch_start) batch_start(trainer, module, batch_idx);
  }
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override {
    if (epoch_end) epoch_end(trainer, module);
  }
  std::function<void(Trainer&, TrainModule&, int64_t)> batch_start;
  std::function<void(Trainer&, TrainModule&)> epoch_end;
};

fs::path fresh_folder(const std::string& name) { return testing::fresh_folder("callbacks", name); }

TrainerOptions quiet_options() {
  TrainerOptions options = testing::quiet_trainer_options();
  options.logger = false;
  options.enable_checkpointing = false;
  return options;
}

DataLoaderOptions loader_options(int64_t batch_size) { return testing::seeded_loader_options(batch_size); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// ---------------------------------------------------------------- LearningRateMonitor
TEST_CASE("LearningRateMonitor logs lr-<Optimizer> and its momentum every log_every_n_steps, as StepLR sets them") {
  auto data = regression_data(64);
  fs::path root = fresh_folder("lr_step");
  for (int64_t every : {1, 2}) {
    UnloggedRegression module;
    module.options.make_scheduler = testing::step_lr(3, 0.5);
    auto logger = std::make_shared<RecordingLogger>(root.string());
    auto monitor = std::make_shared<LearningRateMonitor>(LearningRateMonitorOptions{"step", true, true});
    TrainerOptions options = quiet_options();
    options.logger = true;
    options.loggers = {logger};
    options.log_every_n_steps = every;
    options.max_steps = 10;
    options.callbacks = {monitor};
    DataLoader loader(data, loader_options(4));
    Trainer(options).fit(module, loader);

    const auto lr = logger->series("lr-SGD");
    REQUIRE(lr.size() == static_cast<size_t>(10 / every));
    for (size_t i = 0; i < lr.size(); ++i) {
      const int64_t step = static_cast<int64_t>(i + 1) * every - 1;  // Lightning: (step + 1) % n == 0
      CHECK(lr[i].first == step);
      CHECK(lr[i].second == doctest::Approx(0.05 * std::pow(0.5, static_cast<double>(step / 3))).epsilon(1e-12));
    }
    for (const auto& [step, momentum] : logger->series("lr-SGD-momentum")) CHECK(momentum == doctest::Approx(0.9));
    CHECK(logger->series("lr-SGD-momentum").size() == lr.size());
    CHECK(logger->series("lr-SGD-weight_decay").size() == lr.size());
  }
  fs::remove_all(root);
}

TEST_CASE("LearningRateMonitor with logging_interval epoch logs once per epoch; it needs a logger") {
  auto data = regression_data(64);
  fs::path root = fresh_folder("lr_epoch");
  UnloggedRegression module;
  module.options.make_scheduler = testing::step_lr(1, 0.5);
  module.options.interval = "epoch";
  auto logger = std::make_shared<RecordingLogger>(root.string());
  TrainerOptions options = quiet_options();
  options.logger = true;
  options.loggers = {logger};
  options.log_every_n_steps = 1;
  options.max_epochs = 3;
  options.callbacks = {std::make_shared<LearningRateMonitor>(LearningRateMonitorOptions{"epoch", false, false})};
  DataLoader loader(data, loader_options(4));
  Trainer(options).fit(module, loader);
  const auto lr = logger->series("lr-SGD");
  REQUIRE(lr.size() == 3);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    CHECK(lr[epoch].first == epoch * 16);
    CHECK(lr[epoch].second == doctest::Approx(0.05 * std::pow(0.5, static_cast<double>(epoch))).epsilon(1e-12));
  }
  CHECK(logger->series("lr-SGD-momentum").empty());

  CHECK_THROWS_AS(LearningRateMonitor(LearningRateMonitorOptions{"batch", false, false}), Error);
  UnloggedRegression silent;
  TrainerOptions no_logger = quiet_options();
  no_logger.max_steps = 1;
  no_logger.callbacks = {std::make_shared<LearningRateMonitor>()};
  DataLoader loader2(data, loader_options(4));
  CHECK_THROWS_WITH_AS(Trainer(no_logger).fit(silent, loader2), doctest::Contains("no logger"), Error);
  fs::remove_all(root);
}

TEST_CASE("LearningRateMonitor without logging_interval logs a schedule at its own interval, into callback_metrics") {
  auto data = regression_data(64);  // 16 batches per epoch
  fs::path root = fresh_folder("lr_auto");
  UnloggedRegression module;
  module.options.make_scheduler = testing::step_lr(1, 0.5);
  module.options.interval = "epoch";
  auto logger = std::make_shared<RecordingLogger>(root.string());
  TrainerOptions options = quiet_options();
  options.logger = true;
  options.loggers = {logger};
  options.log_every_n_steps = 1;
  options.max_epochs = 3;
  options.callbacks = {std::make_shared<LearningRateMonitor>()};
  DataLoader loader(data, loader_options(4));
  Trainer trainer(options);
  trainer.fit(module, loader);
  CHECK(trainer.lr_scheduler_interval() == "epoch");
  const auto lr = logger->series("lr-SGD");
  REQUIRE(lr.size() == 3);  // at each epoch's start, not at every step
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    CHECK(lr[epoch].first == epoch * 16);
    CHECK(lr[epoch].second == doctest::Approx(0.05 * std::pow(0.5, static_cast<double>(epoch))).epsilon(1e-12));
  }
  REQUIRE(trainer.callback_metrics().count("lr-SGD") == 1);
  CHECK(trainer.callback_metrics().at("lr-SGD") == lr.back().second);
  fs::remove_all(root);
}

TEST_CASE("LearningRateMonitor under ddp: a rank other than 0 has no logger of its own and is not refused") {
  // The launcher's environment for rank 1 of 2; the Trainer's constructor does not communicate.
  const std::map<std::string, std::string> launch = {{"RANK", "1"},           {"LOCAL_RANK", "1"},
                                                     {"WORLD_SIZE", "2"},     {"LOCAL_WORLD_SIZE", "2"},
                                                     {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29555"}};
  struct Environment {
    explicit Environment(const std::map<std::string, std::string>& values) {
      for (const auto& [name, value] : values) {
        const char* old = std::getenv(name.c_str());
        if (old != nullptr) saved[name] = old;
        names.push_back(name);
        ::setenv(name.c_str(), value.c_str(), 1);
      }
    }
    ~Environment() {
      for (const std::string& name : names) {
        auto it = saved.find(name);
        if (it == saved.end()) {
          ::unsetenv(name.c_str());
        } else {
          ::setenv(name.c_str(), it->second.c_str(), 1);
        }
      }
    }
    std::map<std::string, std::string> saved;
    std::vector<std::string> names;
  } environment(launch);
  TrainerOptions options = quiet_options();
  options.logger = true;
  options.strategy = "ddp";
  options.devices = 2;
  Trainer rank1(options);
  REQUIRE_FALSE(rank1.is_global_zero());
  CHECK(rank1.loggers().empty());
  UnloggedRegression module;
  LearningRateMonitor monitor;
  CHECK_NOTHROW(monitor.on_train_start(rank1, module));
  // Without loggers on rank 0 (logger=false), every rank refuses alike.
  options.logger = false;
  Trainer silent(options);
  CHECK_THROWS_WITH_AS(monitor.on_train_start(silent, module), doctest::Contains("no logger"), Error);
}

// ---------------------------------------------------------------- Timer
TEST_CASE("Timer: a 1-second duration stops a long run on time") {
  auto data = regression_data(32);
  UnloggedRegression module;
  auto timer = std::make_shared<Timer>("00:00:00:01", TimerOptions{"step", false});
  TrainerOptions options = quiet_options();
  options.max_epochs = 10'000'000;
  options.max_time = "00:00:00:20";  // a backstop if the Timer were ignored
  options.callbacks = {timer};
  DataLoader loader(data, loader_options(4));
  Trainer trainer(options);
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(module, loader);
  const double wall = seconds_since(start);
  CHECK(trainer.stop_reason == "Timer: time limit reached");
  CHECK(wall >= 1.0);
  CHECK(wall < 3.0);
  CHECK(timer->time_elapsed("train") >= 1.0);
  CHECK(timer->time_elapsed("train") <= wall);
  REQUIRE(timer->start_time().has_value());
  REQUIRE(timer->end_time().has_value());
  CHECK(*timer->end_time() - *timer->start_time() == doctest::Approx(timer->time_elapsed()));
  CHECK(*timer->time_remaining() <= 0.0);
  CHECK(timer->time_elapsed("validate") == 0.0);
}

TEST_CASE("Timer: durations, and the elapsed time carried by state_dict") {
  CHECK(Timer("00:01:00:00").duration()->count() == 3600.0);
  CHECK(Timer("90").duration()->count() == 90.0);
  CHECK(Timer(std::map<std::string, double>{{"minutes", 1}, {"seconds", 30}}).duration()->count() == 90.0);
  CHECK_FALSE(Timer().duration().has_value());
  CHECK_FALSE(Timer().time_remaining().has_value());
  CHECK_THROWS_AS(Timer("1:2"), Error);
  CHECK_THROWS_AS(Timer(std::map<std::string, double>{{"years", 1}}), Error);
  CHECK_THROWS_AS(Timer(TimerOptions{"batch", false}), Error);

  // A run that already spent 5 s of a 2 s budget stops after its first check.
  Timer previous("00:00:00:02");
  previous.load_state_dict({{"time_elapsed", {{"train", 5.0}, {"validate", 1.0}}}});
  CHECK(previous.time_elapsed("train") == 5.0);
  CHECK(previous.time_elapsed("validate") == 0.0);  // only training time resumes, as Lightning
  auto resumed = std::make_shared<Timer>("00:00:00:02", TimerOptions{"epoch", false});
  resumed->load_state_dict(previous.state_dict());
  auto data = regression_data(32);
  UnloggedRegression module;
  TrainerOptions options = quiet_options();
  options.max_epochs = 50;
  options.callbacks = {resumed};
  DataLoader loader(data, loader_options(4));
  Trainer trainer(options);
  trainer.fit(module, loader);
  CHECK(trainer.global_step() <= 8);  // at most the first epoch of 50
  CHECK(trainer.stop_reason == "Timer: time limit reached");
  CHECK(resumed->time_elapsed() >= 5.0);
  CHECK(resumed->state_dict()["time_elapsed"]["train"].get<double>() >= 5.0);
}

TEST_CASE("Timer: Trainer::validate, test and predict time their stages; validate does not checkpoint") {
  struct SlowEval : UnloggedRegression {
    void validation_step(const Batch&, int64_t) override { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }
    void test_step(const Batch&, int64_t) override { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }
    Tensor predict_step(const Batch& batch, int64_t index) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      return UnloggedRegression::predict_step(batch, index);
    }
  } module;
  auto data = regression_data(8);  // 2 batches of 4
  fs::path root = fresh_folder("timer_stages");
  auto timer = std::make_shared<Timer>();
  ModelCheckpointOptions checkpointing;
  checkpointing.dirpath = root.string();
  TrainerOptions options = quiet_options();
  options.enable_checkpointing = true;
  options.callbacks = {timer, std::make_shared<ModelCheckpoint>(checkpointing)};
  Trainer trainer(options);
  DataLoader loader(data, loader_options(4));
  for (const char* stage : {"validate", "test", "predict"}) CHECK_FALSE(timer->start_time(stage).has_value());
  trainer.validate(module, loader);
  trainer.test(module, loader);
  CHECK(trainer.predict(module, loader).size() == 2);
  const std::map<std::string, double> at_least = {{"validate", 0.02}, {"test", 0.04}, {"predict", 0.06}};
  for (const auto& [stage, seconds] : at_least) {
    CAPTURE(stage);
    REQUIRE(timer->start_time(stage).has_value());
    REQUIRE(timer->end_time(stage).has_value());
    CHECK(timer->time_elapsed(stage) >= seconds);
    CHECK(timer->time_elapsed(stage) < seconds + 1.0);
    CHECK(timer->state_dict()["time_elapsed"][stage].get<double>() == timer->time_elapsed(stage));
  }
  CHECK_FALSE(timer->start_time("train").has_value());
  CHECK_THROWS_AS(timer->time_elapsed("sanity_check"), Error);
  CHECK(fs::is_empty(root));  // ModelCheckpoint saves in fit only (Lightning)
  fs::remove_all(root);
}

// ---------------------------------------------------------------- GradientAccumulationScheduler
TEST_CASE("GradientAccumulationScheduler: Lightning's schedule semantics and checks") {
  using Schedule = std::map<int64_t, int64_t>;
  GradientAccumulationScheduler scheduler(Schedule{{2, 4}, {5, 2}});
  CHECK(scheduler.get_accumulate_grad_batches(0) == 1);
  CHECK(scheduler.get_accumulate_grad_batches(1) == 1);
  CHECK(scheduler.get_accumulate_grad_batches(2) == 4);
  CHECK(scheduler.get_accumulate_grad_batches(4) == 4);
  CHECK(scheduler.get_accumulate_grad_batches(5) == 2);
  CHECK(scheduler.get_accumulate_grad_batches(100) == 2);
  CHECK(scheduler.scheduling() == Schedule{{0, 1}, {2, 4}, {5, 2}});
  CHECK_THROWS_AS(GradientAccumulationScheduler(Schedule{}), Error);
  CHECK_THROWS_AS(GradientAccumulationScheduler(Schedule{{-1, 2}}), Error);
  CHECK_THROWS_AS(GradientAccumulationScheduler(Schedule{{1, 0}}), Error);

  auto data = regression_data(32);  // 8 batches per epoch
  auto callback = std::make_shared<GradientAccumulationScheduler>(Schedule{{1, 4}});
  for (bool also_as_option : {false, true}) {
    // The callback alone schedules: epoch 0 steps 8 times, epoch 1 twice (the
    // same schedule given as the Trainer's option too is accepted).
    CAPTURE(also_as_option);
    UnloggedRegression module;
    TrainerOptions options = quiet_options();
    options.max_epochs = 2;
    if (also_as_option) options.accumulation_schedule = {{1, 4}};
    options.callbacks = {callback};
    DataLoader loader(data, loader_options(4));
    Trainer trainer(options);
    CHECK(trainer.estimated_stepping_batches(loader) == 8 + 2);
    CHECK(trainer.options().accumulation_schedule == callback->scheduling());
    trainer.fit(module, loader);
    CHECK(trainer.global_step() == 8 + 2);
    CHECK(module.training_steps == 16);
  }
  {  // Another accumulation_schedule, or accumulate_grad_batches too, is refused.
    TrainerOptions options = quiet_options();
    options.callbacks = {callback};
    options.accumulation_schedule = {{1, 2}};
    CHECK_THROWS_WITH_AS(Trainer{options}, doctest::Contains("accumulation_schedule {1: 2}"), Error);
    options.accumulation_schedule.clear();
    options.accumulate_grad_batches = 2;
    CHECK_THROWS_WITH_AS(Trainer{options}, doctest::Contains("remove one"), Error);
  }
}

// ---------------------------------------------------------------- StochasticWeightAveraging
TEST_CASE("StochasticWeightAveraging: the final weights are the mean of the SWA epochs' weights; lr follows SWALR") {
  auto data = regression_data(64);  // 16 batches of 4 per epoch
  BatchNormRegression module;
  // StepLR per step until SWA swaps it out: 0.05 halves every 20 steps.
  module.options.make_scheduler = testing::step_lr(20, 0.5);
  StochasticWeightAveragingOptions swa_options;
  swa_options.swa_lrs = {0.002};
  swa_options.swa_epoch_start = int64_t{4};  // 1-based: epochs 3, 4, 5 (0-based) of 6
  swa_options.annealing_epochs = 2;
  auto swa = std::make_shared<StochasticWeightAveraging>(swa_options);
  auto probe = std::make_shared<Probe>();
  std::map<int64_t, std::vector<double>> lrs;  // epoch -> lr seen by each batch
  std::map<int64_t, nn::StateDict> weights;    // epoch -> parameters at its end
  probe->batch_start = [&](Trainer& trainer, TrainModule&, int64_t) {
    lrs[trainer.current_epoch()].push_back(trainer.optimizer().lr(0).item<double>());
  };
  probe->epoch_end = [&](Trainer& trainer, TrainModule& m) {
    nn::StateDict copy;
    for (const auto& [name, tensor] : m.model().named_parameters()) copy.emplace_back(name, tensor.detach().clone());
    weights[trainer.current_epoch()] = copy;
  };
  TrainerOptions options = quiet_options();
  options.max_epochs = 6;
  options.callbacks = {swa, probe};
  DataLoader loader(data, loader_options(4));
  Trainer trainer(options);
  trainer.fit(module, loader);

  CHECK(swa->swa_start() == 3);
  CHECK(swa->swa_end() == 5);
  CHECK(swa->n_averaged() == 3);
  // Before SWA: StepLR at step 16 * epoch + batch.
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (size_t batch = 0; batch < 16; ++batch) {
      const double step = static_cast<double>(16 * epoch + static_cast<int64_t>(batch));
      CHECK(lrs[epoch][batch] == doctest::Approx(0.05 * std::pow(0.5, std::floor(step / 20))).epsilon(1e-12));
    }
  }
  // SWA epochs: SWALR per epoch from the lr at its start (StepLR's at step 48)
  // to 0.002 over 2 epochs with cosine annealing; constant within an epoch.
  const double start_lr = 0.05 * 0.25;
  for (int64_t k = 0; k < 3; ++k) {
    const double t = std::min(1.0, static_cast<double>(k) / 2.0);
    const double alpha = (1.0 - std::cos(std::numbers::pi * t)) / 2.0;
    const double expected = 0.002 * alpha + start_lr * (1.0 - alpha);
    for (double lr : lrs[3 + k]) CHECK(lr == doctest::Approx(expected).epsilon(1e-12));
  }
  // The model holds the mean of the weights after epochs 3, 4 and 5.
  bool differs_from_last = false;
  const nn::NamedTensors final_params = module.layers->named_parameters();
  for (size_t i = 0; i < final_params.size(); ++i) {
    Tensor sum = zeros(final_params[i].second.shape(), {.dtype = DType::f64});
    for (int64_t epoch = 3; epoch <= 5; ++epoch) sum = add(sum, weights[epoch][i].second.to(DType::f64));
    KILN_CHECK_CLOSE(final_params[i].second, div(sum, 3.0), 1e-6, 1e-7);
    differs_from_last = differs_from_last || !testing::compare(final_params[i].second, weights[5][i].second, 0, 1e-6).empty();
  }
  CHECK(differs_from_last);
  // BatchNorm statistics were recomputed for the averaged weights: the mean of
  // the per-batch means of the first layer's output over one epoch.
  NoGradGuard no_grad;
  auto first = (*module.layers)[0];
  DataLoader pass(data, loader_options(4));
  Tensor mean_sum = zeros({8}, {.dtype = DType::f64});
  int64_t batches = 0;
  for (Batch& batch : pass) {
    mean_sum = add(mean_sum, mean(first->forward(batch.input), {0}).to(DType::f64));
    ++batches;
  }
  KILN_CHECK_CLOSE(module.bn->running_mean, div(mean_sum, static_cast<double>(batches)), 1e-5, 1e-6);
}

TEST_CASE("StochasticWeightAveraging: Lightning's arguments, and its state round-trips exactly") {
  CHECK_THROWS_AS(StochasticWeightAveraging(StochasticWeightAveragingOptions{}), Error);  // no swa_lrs
  StochasticWeightAveragingOptions bad;
  bad.swa_lrs = {0.01};
  bad.swa_epoch_start = int64_t{0};
  CHECK_THROWS_AS(StochasticWeightAveraging{bad}, Error);
  bad.swa_epoch_start = 1.5;
  CHECK_THROWS_AS(StochasticWeightAveraging{bad}, Error);
  bad.swa_epoch_start = 0.8;
  bad.annealing_strategy = "exp";
  CHECK_THROWS_AS(StochasticWeightAveraging{bad}, Error);

  // swa_epoch_start 0.8 of 10 epochs: from epoch int(8) (1-based), 7 (0-based).
  StochasticWeightAveragingOptions options;
  options.swa_lrs = {0.01};
  UnloggedRegression fraction_module;
  TrainerOptions ten = quiet_options();
  ten.max_epochs = 10;
  Trainer ten_trainer(ten);
  StochasticWeightAveraging fraction(options);
  fraction.on_fit_start(ten_trainer, fraction_module);
  CHECK(fraction.swa_start() == 7);
  CHECK(fraction.swa_end() == 9);

  auto data = regression_data(32);
  UnloggedRegression module;
  options.swa_epoch_start = int64_t{2};
  auto swa = std::make_shared<StochasticWeightAveraging>(options);
  TrainerOptions trainer_options = quiet_options();
  trainer_options.max_epochs = 3;
  trainer_options.callbacks = {swa};
  DataLoader loader(data, loader_options(4));
  Trainer trainer(trainer_options);
  trainer.fit(module, loader);
  REQUIRE(swa->n_averaged() == 2);

  // Through CBOR, which keeps JSON binary values (the averaged tensors' bytes).
  const nlohmann::json state = nlohmann::json::from_cbor(nlohmann::json::to_cbor(swa->state_dict()));
  CHECK(state["latest_update_epoch"] == 2);
  CHECK(state["average_model_state"]["tensors"]["param.weight"]["data"].is_binary());
  auto restored = std::make_shared<StochasticWeightAveraging>(options);
  restored->load_state_dict(state);
  UnloggedRegression other;
  restored->on_fit_start(trainer, other);
  REQUIRE(restored->averaged_model() != nullptr);
  CHECK(restored->n_averaged() == 2);
  const auto& expected = swa->averaged_model()->parameters();
  const auto& actual = restored->averaged_model()->parameters();
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) KILN_CHECK_CLOSE(actual[i].second, expected[i].second, 0, 0);

  // Older files held each tensor's bytes as base64 text: they still load, and bad text is refused.
  nlohmann::json as_text = state;
  for (auto& item : as_text["average_model_state"]["tensors"].items()) {
    const std::vector<uint8_t>& bytes = item.value()["data"].get_binary();
    std::string text;
    constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < bytes.size(); i += 3) {
      const uint32_t chunk = (uint32_t{bytes[i]} << 16) | (i + 1 < bytes.size() ? uint32_t{bytes[i + 1]} << 8 : 0) |
                             (i + 2 < bytes.size() ? uint32_t{bytes[i + 2]} : 0);
      for (size_t k = 0; k < 4; ++k) {
        text += k <= 1 || i + k - 1 < bytes.size() ? kDigits[(chunk >> (18 - 6 * k)) & 63] : '=';
      }
    }
    item.value()["data"] = text;
  }
  auto from_text = std::make_shared<StochasticWeightAveraging>(options);
  from_text->load_state_dict(as_text);
  from_text->on_fit_start(trainer, other);
  REQUIRE(from_text->averaged_model() != nullptr);
  const auto& decoded = from_text->averaged_model()->parameters();
  REQUIRE(decoded.size() == expected.size());
  for (size_t i = 0; i < decoded.size(); ++i) KILN_CHECK_CLOSE(decoded[i].second, expected[i].second, 0, 0);
  as_text["average_model_state"]["tensors"]["param.weight"]["data"] = "!!!!";
  CHECK_THROWS_WITH_AS(from_text->load_state_dict(as_text), doctest::Contains("corrupt tensor data"), Error);
}

TEST_CASE("StochasticWeightAveraging: resumed from a checkpoint taken after SWA started, it ends as the uninterrupted run") {
  auto data = regression_data(32);  // 8 batches of 4 per epoch
  fs::path root = fresh_folder("swa_resume");
  StochasticWeightAveragingOptions swa_options;
  swa_options.swa_lrs = {0.002};
  swa_options.swa_epoch_start = int64_t{3};  // 0-based epochs 2..5 of 6
  swa_options.annealing_epochs = 3;          // still annealing when the checkpoint is taken
  // Every epoch's end writes "epoch=<e>.safetensors" into `folder`; returns the final state.
  auto run = [&](const fs::path& folder, const std::string& ckpt_path) {
    BatchNormRegression module;
    module.options.make_scheduler = testing::step_lr(5, 0.5);
    ModelCheckpointOptions checkpointing;
    checkpointing.dirpath = folder.string();
    checkpointing.filename = "{epoch}";
    checkpointing.save_top_k = -1;
    auto swa = std::make_shared<StochasticWeightAveraging>(swa_options);
    TrainerOptions options = quiet_options();
    options.max_epochs = 6;
    options.enable_checkpointing = true;
    options.callbacks = {std::make_shared<ModelCheckpoint>(checkpointing), swa};
    DataLoader loader(data, loader_options(4));
    Trainer trainer(options);
    trainer.fit(module, loader, nullptr, ckpt_path);
    CHECK(swa->n_averaged() == 4);
    CHECK(trainer.lr_scheduler()->name() == "SWALR");
    std::vector<float> state;
    for (const auto& [name, tensor] : module.layers->state_dict()) {
      for (float v : tensor.to(DType::f32).to_vector<float>()) state.push_back(v);
    }
    state.push_back(static_cast<float>(trainer.optimizer().lr(0).item<double>()));
    return state;
  };
  const std::vector<float> full = run(root / "full", "");
  const fs::path checkpoint = root / "full" / "epoch=3.safetensors";  // after epochs 2 and 3 of SWA
  REQUIRE(fs::exists(checkpoint));
  manual_seed(999);
  CHECK(run(root / "resumed", checkpoint.string()) == full);
  fs::remove_all(root);
}
