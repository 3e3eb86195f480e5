// Every run's training curves (trainer/training_curves.h): the picture in the
// log folder holds each logged loss, accuracy and learning rate as a line of
// the right number of points, drawn in the order of the values; it is written
// when fit ends and with every checkpoint; train_fashion prints its path.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_binary.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Point {
  double x, y;
};

// The points of each series (data-series="name"): polylines, or a lone dot.
std::map<std::string, std::vector<Point>> series_points(const std::string& svg) {
  std::map<std::string, std::vector<Point>> series;
  const std::regex line(R"re(<polyline[^>]*data-series="([^"]+)" points="([^"]*)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), line); it != std::sregex_iterator(); ++it) {
    std::istringstream points((*it)[2].str());
    std::string pair;
    while (points >> pair) {
      const size_t comma = pair.find(',');
      series[(*it)[1].str()].push_back({std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
    }
  }
  const std::regex dot(R"re(<circle cx="([^"]+)" cy="([^"]+)"[^>]*data-series="([^"]+)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), dot); it != std::sregex_iterator(); ++it) {
    series[(*it)[3].str()].push_back({std::stod((*it)[1].str()), std::stod((*it)[2].str())});
  }
  return series;
}

TrainerOptions logged_options(const fs::path& root) {
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.max_epochs = 2;
  options.log_every_n_steps = 1;
  options.enable_checkpointing = false;
  return options;
}

}  // namespace

TEST_CASE("training curves: the log folder gets every loss and the learning rate as lines, in the values' order") {
  const fs::path root = testing::fresh_folder("curves", "fit");
  testing::RegressionOptions regression;
  regression.record_losses = true;
  regression.make_scheduler = testing::step_lr(3, 0.5);  // a learning rate that changes
  testing::Regression module(regression);
  DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));  // 4 batches
  DataLoader val(testing::regression_data(32, 0.01), testing::seeded_loader_options(16));
  Trainer trainer(logged_options(root));
  trainer.fit(module, loader, &val);
  const fs::path path = trainer.training_curves_path();
  CHECK(path == fs::path(trainer.log_dir()) / "training_curves.svg");
  REQUIRE(fs::exists(path));
  const std::string svg = read_text(path);
  CHECK(svg.rfind("<?xml", 0) == 0);
  for (const char* title : {">Loss<", ">Accuracy<", ">Learning rate<"}) CHECK(svg.find(title) != std::string::npos);
  CHECK(svg.find(">no data<") != std::string::npos);  // nothing logged an accuracy
  const auto series = series_points(svg);
  REQUIRE(series.count("train_loss") == 1);
  REQUIRE(series.count("val_loss") == 1);
  REQUIRE(series.count("lr-SGD") == 1);
  const std::vector<Point>& train = series.at("train_loss");
  REQUIRE(train.size() == 8);  // every step logged
  CHECK(series.at("val_loss").size() == 2);  // one validation per epoch
  REQUIRE(module.losses.size() == 8);
  for (size_t i = 1; i < train.size(); ++i) {
    CAPTURE(i);
    CHECK(train[i].x > train[i - 1].x);  // steps go right
    // A larger loss is drawn higher (a smaller SVG y).
    if (module.losses[i] > module.losses[i - 1]) CHECK(train[i].y < train[i - 1].y);
    if (module.losses[i] < module.losses[i - 1]) CHECK(train[i].y > train[i - 1].y);
  }
  // StepLR halves the rate every 3 steps: the line steps down.
  const std::vector<Point>& rates = series.at("lr-SGD");
  CHECK(rates.front().y < rates.back().y);
  fs::remove_all(root);
}

namespace {

// The picture's train_loss points as each batch ends (0: no picture yet).
struct PictureProbe : Callback {
  std::string name() const override { return "PictureProbe"; }
  void on_train_batch_end(Trainer& trainer, TrainModule&, int64_t) override {
    const std::string path = trainer.training_curves_path();
    points_at_step[trainer.global_step()] =
        fs::exists(path) ? series_points(read_text(path))["train_loss"].size() : 0;
  }
  std::map<int64_t, size_t> points_at_step;
};

}  // namespace

TEST_CASE("training curves: written with every checkpoint, so a run in progress has its picture") {
  const fs::path root = testing::fresh_folder("curves", "checkpoint");
  auto probe = std::make_shared<PictureProbe>();
  TrainerOptions options = logged_options(root);
  // The probe runs before the checkpoint callback in each batch's hooks.
  options.callbacks = {probe, std::make_shared<testing::SaveCheckpointAtStep>(3, (root / "step3.safetensors").string())};
  testing::Regression module;
  DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));
  Trainer trainer(options);
  trainer.fit(module, loader);
  CHECK(probe->points_at_step.at(3) == 0);  // nothing before the first checkpoint
  CHECK(probe->points_at_step.at(4) == 3);  // the checkpoint at step 3 drew steps 1-3
  CHECK(probe->points_at_step.at(8) == 3);
  CHECK(series_points(read_text(trainer.training_curves_path()))["train_loss"].size() == 8);  // and the end of fit
  fs::remove_all(root);
}

TEST_CASE("training curves: none without a log folder (logger=false)") {
  const fs::path root = testing::fresh_folder("curves", "no_logger");
  TrainerOptions options = logged_options(root);
  options.logger = false;
  testing::Regression module;
  DataLoader loader(testing::regression_data(64, 0.01), testing::seeded_loader_options(16));
  Trainer trainer(options);
  trainer.fit(module, loader);
  CHECK(trainer.training_curves_path().empty());
  for (const auto& entry : fs::recursive_directory_iterator(root)) CHECK(entry.path().extension() != ".svg");
  fs::remove_all(root);
}

TEST_CASE("train_fashion prints where its training curves are, with validation accuracy and the OneCycle rate") {
  const fs::path root = testing::fresh_folder("curves", "cli");
  const testing::BinaryRun run = testing::run_built_binary(
      "train_fashion", "--max-epochs 1 --limit-train-batches 6 --limit-val-batches 1 --batch-size 32 "
                       "--log-every-n-steps 2 --val-check-interval 3 --enable-progress-bar false --default-root-dir " +
                           root.string());
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  std::smatch match;
  REQUIRE(std::regex_search(run.output, match, std::regex("training curves in (\\S+training_curves\\.svg)")));
  const fs::path path = match[1].str();
  CHECK(path.parent_path() == root / "lightning_logs" / "version_0");
  const auto series = series_points(read_text(path));
  CHECK(series.count("train_loss") == 1);
  CHECK(series.count("val_acc") == 1);
  CHECK(series.count("val_loss") == 1);
  REQUIRE(series.count("lr-AdamW") == 1);
  CHECK(series.at("lr-AdamW").size() >= 3);
  fs::remove_all(root);
}
