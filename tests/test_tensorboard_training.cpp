// TensorBoard images and histograms in training: the TensorBoardHistograms
// callback in a Trainer fit, the LR finder's plot as an image, train_fashion
// --logger tensorboard --log-histograms and train_gan's samples grid, read back
// by the specification reader (tests/support/tensorboard_reader.h) and, for
// train_gan, by TensorBoard's own reader.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "data/dataloader.h"
#include "tests/support/python_checks.h"
#include "tests/support/run_binary.h"
#include "tests/support/tensorboard_reader.h"
#include "tests/support/captured_stderr.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/lr_finder.h"
#include "trainer/tensorboard_histograms.h"
#include "trainer/tensorboard_logger.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& name) : path(testing::fresh_folder("tensorboard_training", name)) {}
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

// Every events.out.tfevents.* file under `root`.
std::vector<fs::path> event_files_under(const fs::path& root) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path());
  }
  return files;
}

// tag -> the steps of its histograms, in file order.
std::map<std::string, std::vector<int64_t>> histogram_steps(const std::vector<testing::Event>& events) {
  std::map<std::string, std::vector<int64_t>> steps;
  for (const testing::Event& event : events) {
    for (const testing::HistogramSummary& histogram : event.histograms) steps[histogram.tag].push_back(event.step);
  }
  return steps;
}

// The histogram `tag` at `step`.
testing::HistogramSummary histogram_at(const std::vector<testing::Event>& events, const std::string& tag,
                                       int64_t step) {
  for (const testing::Event& event : events) {
    for (const testing::HistogramSummary& histogram : event.histograms) {
      if (histogram.tag == tag && event.step == step) return histogram;
    }
  }
  FAIL("no histogram " << tag << " at step " << step);
  return {};
}

// The (step, image) pairs of `tag`, in file order.
std::vector<std::pair<int64_t, testing::ImageSummary>> images_of(const std::vector<testing::Event>& events,
                                                                 const std::string& tag) {
  std::vector<std::pair<int64_t, testing::ImageSummary>> images;
  for (const testing::Event& event : events) {
    for (const testing::ImageSummary& image : event.images) {
      if (image.tag == tag) images.emplace_back(event.step, image);
    }
  }
  return images;
}

using testing::CapturedStderr;

size_t count_of(const std::string& text, const std::string& word) {
  size_t count = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++count;
  return count;
}

}  // namespace

TEST_CASE("TensorBoardHistograms in a fit: weights and gradients every 2 optimizer steps, before each step") {
  Scratch root("fit");
  TrainerOptions options = testing::quiet_trainer_options(root.path);
  options.max_epochs = 2;
  options.enable_checkpointing = false;
  options.loggers = {std::make_shared<TensorBoardLogger>(root.path.string())};
  options.callbacks = {std::make_shared<TensorBoardHistograms>(2)};
  Trainer trainer(options);
  testing::Regression module;
  const std::vector<double> initial_weight = module.net->weight.to(DType::f64).to_vector<double>();
  DataLoader loader(testing::regression_data(64, 0.1), testing::seeded_loader_options(16));
  trainer.fit(module, loader);
  REQUIRE(trainer.global_step() == 8);  // 4 batches a epoch, 2 epochs

  const std::vector<testing::Event> events =
      testing::read_events(testing::only_event_file(root.path / "lightning_logs" / "version_0"));
  const std::vector<int64_t> every_2{0, 2, 4, 6};
  CHECK(histogram_steps(events) == std::map<std::string, std::vector<int64_t>>{{"weights/weight", every_2},
                                                                               {"weights/bias", every_2},
                                                                               {"grads/weight", every_2},
                                                                               {"grads/bias", every_2}});
  // Step 0's weights are the initial ones: logged before the optimizer stepped.
  const testing::HistogramSummary first = histogram_at(events, "weights/weight", 0);
  double low = initial_weight[0], high = initial_weight[0], sum = 0;
  for (double value : initial_weight) {
    low = std::min(low, value);
    high = std::max(high, value);
    sum += value;
  }
  CHECK(first.num == 4);
  CHECK(first.min == low);
  CHECK(first.max == high);
  CHECK(first.sum == doctest::Approx(sum).epsilon(1e-12));
  CHECK(histogram_at(events, "weights/bias", 6).num == 1);
  CHECK(histogram_at(events, "weights/weight", 6).sum != first.sum);  // training moved the weights
  const testing::HistogramSummary grad = histogram_at(events, "grads/weight", 0);
  CHECK(grad.num == 4);
  CHECK(grad.sum_squares > 0);  // a real gradient, not zeros
}

TEST_CASE("TensorBoardHistograms without a TensorBoardLogger writes nothing and says so, once for 8 steps") {
  Scratch root("no_logger");
  TrainerOptions options = testing::quiet_trainer_options(root.path);  // the default CSVLogger
  options.max_epochs = 2;
  options.enable_checkpointing = false;
  options.callbacks = {std::make_shared<TensorBoardHistograms>(1)};
  Trainer trainer(options);
  testing::Regression module;
  DataLoader loader(testing::regression_data(64, 0.1), testing::seeded_loader_options(16));
  std::string said;
  {
    CapturedStderr captured(root.path / "stderr.txt");
    trainer.fit(module, loader);
    said = captured.text();
  }
  CHECK(trainer.global_step() == 8);
  CHECK(count_of(said, "TensorBoardHistograms:") == 1);
  CHECK(said.find("the Trainer has no TensorBoardLogger among its loggers; no histograms are written") !=
        std::string::npos);
  CHECK(event_files_under(root.path).empty());
  CHECK(testing::error_of([] { TensorBoardHistograms refused(0); }).find("every_n_steps must be >= 1, got 0") !=
        std::string::npos);
}

TEST_CASE("The LR finder's plot goes to TensorBoard as the RGB image lr_finder (lr_find and the callback)") {
  Scratch root("lr_finder");
  auto logger = std::make_shared<TensorBoardLogger>(root.path.string());
  TrainerOptions options = testing::quiet_trainer_options(root.path);
  options.loggers = {logger};
  options.max_steps = 2;
  options.enable_checkpointing = false;
  LRFinderOptions finder_options;
  finder_options.num_training = 30;
  testing::Regression module;
  DataLoader loader(testing::regression_data(256, 0.1), testing::seeded_loader_options(64));
  {
    Trainer tuner(options);
    const LRFinder finder = lr_find(tuner, module, loader, finder_options);
    REQUIRE(!finder.lrs.empty());
    REQUIRE(finder.suggestion().has_value());
  }
  options.callbacks = {std::make_shared<LearningRateFinder>(finder_options)};
  Trainer trainer(options);
  trainer.fit(module, loader);

  const std::vector<testing::Event> events = testing::read_events(logger->event_file());
  const auto images = images_of(events, "lr_finder");
  REQUIRE(images.size() == 2);
  for (const auto& [step, image] : images) {
    CHECK(step == 0);
    CHECK((image.width == 640 && image.height == 480 && image.colorspace == 3));
    const testing::DecodedPng png = testing::decode_png(image.encoded);
    REQUIRE((png.width == 640 && png.height == 480 && png.colour_type == 2));
    std::set<std::array<uint8_t, 3>> colours;
    for (size_t i = 0; i < png.pixels.size(); i += 3) {
      colours.insert({png.pixels[i], png.pixels[i + 1], png.pixels[i + 2]});
    }
    CHECK(colours.count({31, 119, 180}) == 1);  // the curve
    CHECK(colours.count({255, 0, 0}) == 1);     // the suggestion
    CHECK(colours.count({0, 0, 0}) == 1);       // frame and labels
  }
}

TEST_CASE("train_fashion --logger tensorboard --log-histograms 2 writes weights and gradients every 2 steps") {
  Scratch root("train_fashion");
  const testing::BinaryRun run = testing::run_built_binary(
      "train_fashion", "--model mlp --max-epochs 1 --limit-train-batches 5 --limit-val-batches 1 --batch-size 32 "
                       "--num-workers 0 --enable-progress-bar false --accelerator cpu --logger tensorboard "
                       "--log-histograms 2 --default-root-dir " + root.path.string());
  INFO("train_fashion printed: " << run.output);
  REQUIRE(run.exit_code == 0);
  const fs::path log_dir = root.path / "lightning_logs" / "version_0";
  CHECK_FALSE(fs::exists(log_dir / "metrics.csv"));  // TensorBoard instead of CSV
  const std::vector<testing::Event> events = testing::read_events(testing::only_event_file(log_dir));
  const std::map<std::string, std::vector<int64_t>> steps = histogram_steps(events);
  std::set<std::string> weights, grads;
  for (const auto& [tag, tag_steps] : steps) {
    INFO("tag " << tag);
    CHECK(tag_steps == std::vector<int64_t>{0, 2, 4});  // 5 optimizer steps: 0 .. 4
    if (tag.rfind("weights/", 0) == 0) weights.insert(tag.substr(8));
    if (tag.rfind("grads/", 0) == 0) grads.insert(tag.substr(6));
  }
  CHECK(weights.size() >= 2);  // an MLP's weights and biases
  CHECK(weights == grads);
  CHECK(weights.size() * 2 == steps.size());
  bool validated = false;
  for (const testing::Event& event : events) validated = validated || event.scalars.count("val_acc") > 0;
  CHECK(validated);
}

TEST_CASE("train_fashion refuses --log-histograms without --logger tensorboard, and a bad --logger, writing nothing") {
  for (const auto& [arguments, expected_words] : {
           std::pair<std::string, std::string>{"--log-histograms 2",
                                               "--log-histograms writes TensorBoard histograms: it needs --logger "
                                               "tensorboard"},
           {"--log-histograms 2 --logger csv", "it needs --logger tensorboard"},
           {"--logger wandb", "--logger"},
           {"--log-histograms -1 --logger tensorboard", "--log-histograms: must be 0 or more, got -1"}}) {
    const fs::path root = fs::temp_directory_path() / ("kiln_tensorboard_refused_" + std::to_string(::getpid()));
    fs::remove_all(root);
    const testing::BinaryRun run =
        testing::run_built_binary("train_fashion", arguments + " --default-root-dir " + root.string());
    INFO("train_fashion " << arguments << " printed: " << run.output);
    CHECK(run.exit_code != 0);
    CHECK(run.output.find(expected_words) != std::string::npos);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(root));
  }
}

TEST_CASE("train_gan --logger tensorboard: the 8x8 samples grid as the image samples at every epoch's end") {
  Scratch root("train_gan");
  // 4 batches accumulating 2: 2 steps of each optimizer, 4 global steps an epoch.
  const testing::BinaryRun run = testing::run_built_binary(
      "train_gan", "--max-epochs 2 --limit-train-batches 4 --accelerator cpu --num-workers 0 "
                   "--enable-progress-bar false --batch-size 64 --logger tensorboard --default-root-dir " +
                       root.path.string() + " --output " + (root.path / "samples.png").string());
  INFO("train_gan printed: " << run.output);
  REQUIRE(run.exit_code == 0);
  const fs::path log_dir = root.path / "lightning_logs" / "version_0";
  const std::vector<testing::Event> events = testing::read_events(testing::only_event_file(log_dir));
  const auto images = images_of(events, "samples");
  REQUIRE(images.size() == 2);
  CHECK(images[0].first == 4);
  CHECK(images[1].first == 8);
  std::vector<std::vector<uint8_t>> pixels;
  for (const auto& [step, image] : images) {
    // make_grid: 8 images of 28 + 2 padding per side, plus the last padding.
    CHECK((image.width == 242 && image.height == 242 && image.colorspace == 1));
    const testing::DecodedPng png = testing::decode_png(image.encoded);
    CHECK((png.width == 242 && png.height == 242 && png.colour_type == 0));
    CHECK(std::set<uint8_t>(png.pixels.begin(), png.pixels.end()).size() > 10);  // generated, not blank
    pixels.push_back(png.pixels);
  }
  CHECK(pixels[0] != pixels[1]);  // the generator trained between the epochs

  const std::string python =
      testing::require_python("tensorboard", "KILN_TENSORBOARD_PYTHON", "TensorBoard's own reader");
  if (python.empty()) return;
  const std::string script = (testing::source_root() / "scripts" / "check_tensorboard.py").string();
  const testing::BinaryRun check = testing::run_shell(python + " " + script + " " + log_dir.string() +
                                                      R"( '{"images": {"samples": [[4, 242, 242], [8, 242, 242]]}}')");
  INFO("check_tensorboard.py: " << check.output);
  CHECK(check.exit_code == 0);
  CHECK(check.output.find("tensorboard check: OK") != std::string::npos);
}
