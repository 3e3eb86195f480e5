#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/autograd.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/lr_finder.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// Linear regression whose inputs have variance 9: plain SGD converges for
// lr < 1/9 and diverges above, so a sweep up to lr = 1 must stop early.
std::shared_ptr<TensorDataset> regression_data(int64_t count) {
  manual_seed(11);
  Tensor x = mul(randn({count, 4}), 3.0);
  Tensor w = tensor<float>({1, -2, 0.5, 3}, {4, 1});
  Tensor y = add(matmul(x, w), mul(randn({count, 1}), 0.01));
  return std::make_shared<TensorDataset>(x, y);
}

// testing::Regression trained by SGD at lr 0.01 (no momentum unless given),
// keeping every loss, with what the finder must put back: a buffer that
// training changes (as BatchNorm's running statistics) and, with draw_random,
// the default generator's state. used_lrs holds the lr of every step.
struct WatchedRegression : testing::Regression {
  explicit WatchedRegression(double momentum = 0)
      : testing::Regression({.lr = 0.01, .momentum = momentum, .log_losses = false, .record_losses = true}) {
    samples_seen = net->register_buffer("samples_seen", zeros({1}, {.dtype = DType::f64}));
  }
  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    if (draw_random) randn({1});  // consumes the default generator, as dropout would
    {
      NoGradGuard no_grad;
      samples_seen.add_(full({1}, static_cast<double>(batch.size()), {.dtype = DType::f64}));
    }
    Tensor loss = testing::Regression::training_step(batch, batch_idx);
    if (optimizer != nullptr) used_lrs.push_back(optimizer->lr(0).item<double>());
    return loss;
  }
  OptimizerConfigs configure_optimizers() override {
    OptimizerConfigs configs = testing::Regression::configure_optimizers();
    optimizer = configs.configs.front().optimizer.get();
    return configs;
  }
  Tensor samples_seen;
  bool draw_random = false;
  optim::Optimizer* optimizer = nullptr;  // the last one configure_optimizers made
  std::vector<double> used_lrs;
};

TrainerOptions quiet_options() {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.logger = false;
  options.enable_progress_bar = false;
  options.num_sanity_val_steps = 0;
  options.enable_checkpointing = false;
  return options;
}

DataLoaderOptions loader_options() { return testing::seeded_loader_options(16); }

nn::StateDict cloned(const nn::StateDict& state) {
  nn::StateDict copy;
  for (const auto& [name, tensor] : state) copy.emplace_back(name, tensor.clone());
  return copy;
}

void check_equal(const nn::StateDict& actual, const nn::StateDict& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(actual[i].first);
    CHECK(actual[i].first == expected[i].first);
    KILN_CHECK_CLOSE(actual[i].second, expected[i].second, 0.0, 0.0);
  }
}

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("kiln_lr_finder_" + std::to_string(::getpid()) + "_" + name);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

std::vector<std::string> polylines(const std::string& svg) {
  std::vector<std::string> points;
  const std::regex pattern("<polyline[^>]*points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), pattern); it != std::sregex_iterator(); ++it) {
    points.push_back((*it)[1]);
  }
  return points;
}

std::vector<std::string> split(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> parts;
  for (std::string part; in >> part;) parts.push_back(part);
  return parts;
}

}  // namespace

TEST_CASE("lr_find: a bias-corrected average of the loss that diverges at high lr; a sensible suggestion") {
  auto data = regression_data(256);
  // Large batches keep the loss from jumping between batches, which the
  // steepest-descent rule would mistake for progress; 4 batches per epoch make
  // the sweep run through several epochs.
  DataLoaderOptions full = loader_options();
  full.batch_size = 64;
  DataLoader loader(data, full);
  WatchedRegression module;
  const nn::StateDict initial = cloned(module.net->state_dict());
  std::optional<double> written;
  LRFinderOptions options;
  options.lr_attr = [&](double lr) { written = lr; };
  Trainer trainer(quiet_options());
  const LRFinder finder = lr_find(trainer, module, loader, options);

  // Divergence stops the sweep early, at the first smoothed loss above 4x the best before it.
  const size_t n = finder.losses.size();
  REQUIRE(n == finder.lrs.size());
  CHECK(finder.stopped_early);
  CHECK(n > 20);
  CHECK(n < 100);
  double best = finder.losses[0];
  for (size_t k = 1; k + 1 < n; ++k) {
    CHECK(finder.losses[k] <= 4.0 * best);
    best = std::min(best, finder.losses[k]);
  }
  CHECK(finder.losses.back() > 4.0 * best);

  // Exponential schedule: min_lr, then min_lr * (max_lr / min_lr)^((k + 1) / num_training).
  CHECK(finder.lrs[0] == 1e-8);
  for (size_t k = 1; k < n; ++k)
    CHECK(finder.lrs[k] == doctest::Approx(1e-8 * std::pow(1e8, (k + 1) / 100.0)).epsilon(1e-12));
  // Each step trained with the lr it reports.
  REQUIRE(module.used_lrs.size() == n);
  for (size_t k = 0; k < n; ++k) CHECK(module.used_lrs[k] == doctest::Approx(finder.lrs[k]).epsilon(1e-12));

  // Smoothing: avg = 0.98 avg + 0.02 loss, divided by 1 - 0.98^steps (bias correction).
  REQUIRE(module.losses.size() == n);
  CHECK(finder.losses[0] == doctest::Approx(module.losses[0]).epsilon(1e-12));
  double average = 0;
  for (size_t k = 0; k < n; ++k) {
    average = 0.98 * average + 0.02 * module.losses[k];
    CHECK(finder.losses[k] == doctest::Approx(average / (1 - std::pow(0.98, k + 1))).epsilon(1e-12));
  }

  // The steepest descent lies where SGD converges (lr < 1/9), well above min_lr.
  const std::optional<double> suggestion = finder.suggestion();
  REQUIRE(suggestion.has_value());
  MESSAGE("suggested lr " << *suggestion << " after " << n << " steps");
  CHECK(*suggestion > 1e-4);
  CHECK(*suggestion < 1.0 / 9.0);
  REQUIRE(written.has_value());  // update_attr wrote it through lr_attr
  CHECK(*written == *suggestion);

  // The model is back where it started; the loader too.
  check_equal(module.net->state_dict(), initial);
  CHECK(loader.epoch() == 0);
  CHECK(loader.position() == 0);

  const fs::path svg_path = temp_file("sweep.svg");
  finder.plot(svg_path.string());
  const std::string svg = read_text(svg_path);
  CHECK(svg.find("<svg") != std::string::npos);
  const std::vector<std::string> lines = polylines(svg);
  REQUIRE(lines.size() == 1);
  CHECK(split(lines[0]).size() == n);
  fs::remove(svg_path);
}

TEST_CASE("lr_find: linear and exponential sweeps follow Lightning's formulas") {
  auto data = regression_data(64);
  for (const std::string mode : {"linear", "exponential"}) {
    CAPTURE(mode);
    DataLoader loader(data, loader_options());
    WatchedRegression module;
    LRFinderOptions options;
    options.mode = mode;
    options.min_lr = 1e-5;
    options.max_lr = 1e-2;
    options.num_training = 20;
    options.early_stop_threshold = std::nullopt;
    Trainer trainer(quiet_options());
    const LRFinder finder = lr_find(trainer, module, loader, options);
    REQUIRE(finder.lrs.size() == 20);
    CHECK_FALSE(finder.stopped_early);
    for (int64_t k = 0; k < 20; ++k) {
      const double r = (k + 1) / 20.0;
      const double expected = k == 0 ? 1e-5 : mode == "linear" ? 1e-5 + r * (1e-2 - 1e-5) : 1e-5 * std::pow(1e3, r);
      CHECK(finder.lrs[k] == doctest::Approx(expected).epsilon(1e-12));
      CHECK(lr_finder_lr(options, k) == doctest::Approx(expected).epsilon(1e-12));
      CHECK(module.used_lrs[k] == doctest::Approx(expected).epsilon(1e-12));
    }
    CHECK(finder.lrs.back() == doctest::Approx(1e-2).epsilon(1e-12));  // the last step reaches max_lr
  }
}

TEST_CASE("LRFinder::suggestion: steepest descent of the loss, skipping 10 points at the start and 1 at the end") {
  LRFinderOptions linear;
  linear.mode = "linear";
  SUBCASE("even spacing: the first most negative central difference; skipped and NaN points ignored") {
    LRFinder finder(linear);
    double loss = 100;
    for (int i = 0; i < 30; ++i) {
      finder.lrs.push_back(i + 1.0);
      finder.losses.push_back(loss);
      // Slope -1 per point, except a cliff at 3 (skipped), 20 and 28 -> 29 (the last point, skipped).
      loss -= i == 3 ? 50 : i == 20 ? 10 : i == 28 ? 100 : 1;
    }
    finder.losses[15] = NAN;
    REQUIRE(finder.suggestion_index().has_value());
    CHECK(*finder.suggestion_index() == 20);  // gradients at 20 and 21 tie at -5.5: the first wins
    CHECK(*finder.suggestion() == 21.0);
    CHECK(*finder.suggestion_index(0, 1) == 3);    // without the skip the early cliff wins
    CHECK(*finder.suggestion_index(10, 0) == 29);  // without skip_end the last drop wins (one-sided)
  }
  SUBCASE("linear mode: the gradient is taken with respect to the lr, not the index") {
    LRFinder finder(linear);
    for (int i = 0; i < 30; ++i) {
      finder.lrs.push_back(1 - std::pow(0.9, i));  // spacing shrinks along the sweep
      finder.losses.push_back(-i);                 // the loss falls by 1 per point
    }
    CHECK(*finder.suggestion_index() == 28);  // per index all slopes tie (argmin would say 10)
  }
  SUBCASE("exponential mode: the gradient is taken with respect to log10(lr)") {
    LRFinder finder;  // exponential
    double loss = 0;
    for (int i = 0; i < 40; ++i) {
      finder.lrs.push_back(1e-8 * std::pow(1e8, (i + 1) / 40.0));
      finder.losses.push_back(loss);
      loss -= i == 25 ? 5 : 1;  // a cliff at 25; elsewhere the loss falls evenly per decade
    }
    // Over lr itself the tiny first steps would win (-1 / 1e-7 at index 10).
    CHECK(*finder.suggestion_index() == 25);
  }
  SUBCASE("too few points give no suggestion") {
    LRFinder finder;
    for (int i = 0; i < 12; ++i) {
      finder.lrs.push_back(i + 1.0);
      finder.losses.push_back(-i);
    }
    CHECK_FALSE(finder.suggestion().has_value());  // only index 10 survives the skips
    CHECK(finder.suggestion(9, 1).has_value());
  }
}

TEST_CASE("LRFinder::plot: an SVG of loss against lr with the suggestion as a red point on the curve") {
  LRFinder finder;
  for (int i = 0; i < 40; ++i) {
    finder.lrs.push_back(1e-6 * std::pow(10.0, i / 8.0));
    finder.losses.push_back(1.0 / (1.0 + std::exp((i - 20.0) / 3.0)) + (i > 35 ? (i - 35) * 0.5 : 0.0));
  }
  const size_t index = *finder.suggestion_index();
  const fs::path path = temp_file("plot.svg");
  finder.plot(path.string());
  const std::string svg = read_text(path);
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("Learning rate") != std::string::npos);
  CHECK(svg.find(">1e-6<") != std::string::npos);  // decade ticks of the log axis
  std::vector<std::string> lines = polylines(svg);
  REQUIRE(lines.size() == 1);
  const std::vector<std::string> points = split(lines[0]);
  CHECK(points.size() == 40);
  // Points go left to right (log x increases) and the marker sits on the suggested point.
  std::smatch circle;
  REQUIRE(std::regex_search(svg, circle, std::regex("<circle cx=\"([^\"]+)\" cy=\"([^\"]+)\"[^>]*fill=\"red\"")));
  CHECK(points[index] == circle[1].str() + "," + circle[2].str());
  for (size_t i = 1; i < points.size(); ++i) CHECK(std::stod(points[i]) > std::stod(points[i - 1]));

  finder.plot(path.string(), /*suggest=*/false);
  CHECK(read_text(path).find("<circle") == std::string::npos);
  // A non-finite loss breaks the curve in two.
  finder.losses[5] = INFINITY;
  finder.plot(path.string());
  lines = polylines(read_text(path));
  REQUIRE(lines.size() == 2);
  CHECK(split(lines[0]).size() + split(lines[1]).size() == 39);
  fs::remove(path);
  CHECK_THROWS_AS(finder.plot("/nonexistent-folder/plot.svg"), Error);
}

namespace {

struct RunState {
  nn::StateDict model;
  std::vector<Tensor> gradients;
  optim::StateDict optimizer;
  nlohmann::json loader;
  GeneratorState generator;
};

RunState capture(Trainer& trainer, TrainModule& module) {
  RunState state;
  state.model = cloned(module.model().state_dict());
  for (const Tensor& parameter : module.model().parameters()) {
    state.gradients.push_back(parameter.grad().defined() ? parameter.grad().clone() : Tensor());
  }
  state.optimizer = trainer.optimizer().state_dict();
  for (auto& [name, tensor] : state.optimizer.tensors) tensor = tensor.clone();
  state.loader = trainer.train_loader()->state_dict();
  state.generator = default_generator(Device::cpu()).state();
  return state;
}

// Before the finder: a few steps so that the optimizer has momentum buffers and
// step counts, the loader a position mid-epoch, and the parameters a gradient.
struct PrepareRun : Callback {
  std::string name() const override { return "PrepareRun"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override {
    optim::Optimizer& optimizer = trainer.optimizer();
    for (int64_t i = 0; i < 3; ++i) {
      Batch batch = *trainer.train_loader()->next();
      module.training_step(batch, i).backward();
      if (i < 2) {
        optimizer.step();
        optimizer.zero_grad();
      }
    }
    before = capture(trainer, module);
  }
  RunState before;
};

struct CaptureAfterFinder : Callback {
  std::string name() const override { return "CaptureAfterFinder"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override { after = capture(trainer, module); }
  RunState after;
};

}  // namespace

TEST_CASE("LearningRateFinder callback: model, buffers, gradients, optimizer, loader and RNG come back bit-exactly") {
  auto data = regression_data(128);
  for (const bool update_attr : {false, true}) {
    CAPTURE(update_attr);
    DataLoader loader(data, loader_options());
    WatchedRegression module(/*momentum=*/0.9);
    module.draw_random = true;
    auto prepare = std::make_shared<PrepareRun>();
    LRFinderOptions options;
    options.update_attr = update_attr;
    auto finder = std::make_shared<LearningRateFinder>(options);
    auto after = std::make_shared<CaptureAfterFinder>();
    TrainerOptions trainer_options = quiet_options();
    trainer_options.max_steps = 0;  // only on_fit_start runs
    trainer_options.callbacks = {prepare, finder, after};
    Trainer trainer(trainer_options);
    trainer.fit(module, loader);

    REQUIRE(finder->lr_finder() != nullptr);
    CHECK(finder->lr_finder()->losses.size() > 20);  // the sweep did train
    const RunState& before = prepare->before;
    check_equal(after->after.model, before.model);
    CHECK(before.model[2].first == "samples_seen");
    CHECK(before.model[2].second.item<double>() == 48);  // 3 batches of 16 before the finder
    REQUIRE(after->after.gradients.size() == before.gradients.size());
    for (size_t i = 0; i < before.gradients.size(); ++i) {
      REQUIRE(before.gradients[i].defined());
      REQUIRE(after->after.gradients[i].defined());
      KILN_CHECK_CLOSE(after->after.gradients[i], before.gradients[i], 0.0, 0.0);
    }
    CHECK(after->after.loader == before.loader);
    CHECK(after->after.generator.seed == before.generator.seed);
    CHECK(after->after.generator.offset == before.generator.offset);
    REQUIRE(after->after.optimizer.tensors.size() == before.optimizer.tensors.size());
    CHECK(before.optimizer.tensors.count("state.0.momentum_buffer") == 1);
    const double suggestion = finder->lr_finder()->suggestion().value_or(-1);
    for (const auto& [name, tensor] : before.optimizer.tensors) {
      CAPTURE(name);
      if (update_attr && name == "group.0.lr") {
        CHECK(after->after.optimizer.tensors.at(name).item<double>() == suggestion);
      } else {
        KILN_CHECK_CLOSE(after->after.optimizer.tensors.at(name), tensor, 0.0, 0.0);
      }
    }
    if (update_attr) {
      CHECK(trainer.optimizer().group_options(0).lr == suggestion);
    } else {
      CHECK(after->after.optimizer.meta == before.optimizer.meta);
    }
  }
}

TEST_CASE("lr_find: skipped under fast_dev_run; invalid options are refused") {
  auto data = regression_data(64);
  DataLoader loader(data, loader_options());
  WatchedRegression module;
  TrainerOptions trainer_options = quiet_options();
  trainer_options.fast_dev_run = 1;
  Trainer trainer(trainer_options);
  const LRFinder finder = lr_find(trainer, module, loader);
  CHECK(finder.lrs.empty());
  CHECK(module.losses.empty());
  CHECK_FALSE(finder.suggestion().has_value());

  Trainer normal(quiet_options());
  LRFinderOptions bad;
  bad.mode = "cosine";
  CHECK_THROWS_AS(lr_find(normal, module, loader, bad), Error);
  CHECK_THROWS_AS(LearningRateFinder{bad}, Error);
  bad = LRFinderOptions{};
  bad.min_lr = 1.0;
  bad.max_lr = 0.5;
  CHECK_THROWS_AS(lr_find(normal, module, loader, bad), Error);
}

namespace {

// A regression with no host-side state, for the GPU; its loss is float32 under
// autocast (sub promotes).
struct DeviceRegression : testing::Regression {
  DeviceRegression() : testing::Regression({.lr = 0.01, .log_losses = false, .record_losses = true}) {}
};

// PrepareRun on the device: two plain steps give the optimizer momentum buffers
// and step counts, and the loader a position, before the finder runs.
struct PrepareDeviceRun : Callback {
  std::string name() const override { return "PrepareDeviceRun"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override {
    optim::Optimizer& optimizer = trainer.optimizer();
    for (int64_t i = 0; i < 2; ++i) {
      const Batch batch = *trainer.train_loader()->next();
      Batch moved;
      moved.input = batch.input.to(trainer.device());
      moved.target = batch.target.to(trainer.device());
      module.training_step(moved, i).backward();
      optimizer.step();
      optimizer.zero_grad();
    }
    before = capture(trainer, module);
    scale = trainer.scaler()->get_scale();
  }
  RunState before;
  double scale = 0;
};

}  // namespace

TEST_CASE("lr_find under 16-mixed: scaled losses, skipped overflowing steps, everything restored exactly [gpu]") {
  KILN_REQUIRE_GPU();
  auto data = regression_data(128);
  DataLoader loader(data, loader_options());
  DeviceRegression module;
  auto prepare = std::make_shared<PrepareDeviceRun>();
  LRFinderOptions options;
  options.num_training = 30;
  options.max_lr = 0.1;  // SGD with momentum 0.9 converges up to lr ~0.2 here
  options.early_stop_threshold = std::nullopt;
  options.update_attr = false;
  auto finder = std::make_shared<LearningRateFinder>(options);
  auto after = std::make_shared<CaptureAfterFinder>();
  TrainerOptions trainer_options = quiet_options();
  trainer_options.accelerator = "gpu";
  trainer_options.precision = "16-mixed";
  trainer_options.max_steps = 0;  // only on_fit_start runs
  trainer_options.callbacks = {prepare, finder, after};
  Trainer trainer(trainer_options);
  trainer.fit(module, loader);

  REQUIRE(finder->lr_finder() != nullptr);
  CHECK(finder->lr_finder()->losses.size() == 30);
  for (const double loss : finder->lr_finder()->losses) CHECK(std::isfinite(loss));
  REQUIRE(module.losses.size() == 2 + 30);
  for (const double loss : module.losses) CHECK(std::isfinite(loss));
  const RunState& before = prepare->before;
  check_equal(after->after.model, before.model);
  CHECK(after->after.loader == before.loader);
  CHECK(after->after.generator.offset == before.generator.offset);
  CHECK(after->after.optimizer.meta == before.optimizer.meta);
  REQUIRE(after->after.optimizer.tensors.size() == before.optimizer.tensors.size());
  CHECK(before.optimizer.tensors.count("state.0.momentum_buffer") == 1);
  for (const auto& [name, tensor] : before.optimizer.tensors) {
    CAPTURE(name);
    KILN_CHECK_CLOSE(after->after.optimizer.tensors.at(name), tensor, 0.0, 0.0);
  }
  // The trainer's own scaler is where fit's first step will find it.
  CHECK(trainer.scaler()->get_scale() == prepare->scale);
  const Tensor tracker = trainer.scaler()->growth_tracker();
  CHECK((!tracker.defined() || tracker.item<double>() == 0));

  // The function form, on one fixed batch so that the loss only changes when a
  // step is taken. At the initial scale 65536 the float16 weight gradient
  // (about 2 * 65536 * 9 * |w - w*|) overflows: the first steps are skipped
  // while the scale backs off, then the sweep trains. Unscaled, none would be.
  DataLoaderOptions one_batch = loader_options();
  one_batch.batch_size = 128;
  one_batch.shuffle = false;
  DataLoader fixed(data, one_batch);
  options.min_lr = 1e-3;
  options.num_training = 20;
  module.losses.clear();
  const nn::StateDict weights = cloned(module.model().state_dict());
  const LRFinder swept = lr_find(trainer, module, fixed, options);
  REQUIRE(swept.losses.size() == 20);
  REQUIRE(module.losses.size() == 20);
  int64_t repeated = 0;
  for (size_t i = 1; i < module.losses.size(); ++i) {
    CHECK(std::isfinite(module.losses[i]));
    if (std::abs(module.losses[i] - module.losses[i - 1]) <= 1e-6 * module.losses[i - 1]) ++repeated;
  }
  MESSAGE("sweep steps skipped by the loss scaler: " << repeated);
  CHECK(repeated >= 1);
  // Then it trained: on an H200 the 15 steps taken (lr 3e-3 rising to 0.1,
  // momentum still building) took the loss from 19.9 to 12.4. Had the skipped
  // steps never ended, the loss would not have moved at all.
  MESSAGE("sweep loss: first " << module.losses.front() << ", last " << module.losses.back());
  CHECK(module.losses.back() < 0.75 * module.losses.front());
  check_equal(module.model().state_dict(), weights);
}

TEST_CASE("lr_find under bf16-true: the trials run a bfloat16 model on bfloat16 batches, as fit does") {
  // Lightning's tuner runs its trials through fit, under the precision
  // plugin: bf16-true converts the module, and every floating tensor of a
  // batch takes the parameters' dtype (convert_input). A float32 target too.
  struct TargetDtypes : testing::Regression {
    TargetDtypes() : testing::Regression({.lr = 0.01, .log_losses = false}) {}
    Tensor training_step(const Batch& batch, int64_t batch_idx) override {
      seen.insert(batch.target.dtype());
      seen.insert(batch.input.dtype());
      for (const Tensor& parameter : model().parameters()) seen.insert(parameter.dtype());
      return testing::Regression::training_step(batch, batch_idx);
    }
    std::set<DType> seen;
  };
  auto data = regression_data(64);
  DataLoader loader(data, loader_options());
  REQUIRE(loader.next()->target.dtype() == DType::f32);
  TargetDtypes module;
  TrainerOptions options = quiet_options();
  options.precision = "bf16-true";
  Trainer trainer(options);
  LRFinderOptions finder;
  finder.num_training = 5;
  lr_find(trainer, module, loader, finder);
  CHECK(module.seen == std::set<DType>{DType::bf16});
}
