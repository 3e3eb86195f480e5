// Trainer(profiler=...): Lightning's action names timed by "simple", the op
// profiler of "pytorch" on for the stage, and a report file per stage.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/dataloader.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// SGD without momentum; val_loss logged with log()'s default batch_size, 1.
const testing::RegressionOptions plain_sgd{.momentum = 0, .val_loss_weighted = false};

int64_t calls(const std::vector<ActionStats>& stats, const std::string& name) {
  for (const ActionStats& action : stats) {
    if (action.name == name) return action.calls;
  }
  return 0;
}

}  // namespace

TEST_CASE("Trainer: profiler \"simple\" times Lightning's actions and writes the report") {
  auto data = testing::regression_data(32, 0.01);
  fs::path root = testing::fresh_folder("trainer", "simple_profiler");
  testing::Regression module(plain_sgd);
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.max_epochs = 2;
  auto profiler = std::make_shared<SimpleProfiler>("", "perf");
  options.profiler_instance = profiler;
  DataLoader train(data, testing::seeded_loader_options(8));       // 4 batches
  DataLoader val(data, testing::seeded_loader_options(16, false));  // 2 batches
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  const std::vector<ActionStats> stats = profiler->stats();
  CHECK(calls(stats, "run_training_epoch") == 2);
  CHECK(calls(stats, "run_training_batch") == 8);
  CHECK(calls(stats, "[_TrainingEpochLoop].train_dataloader_next") == 8);
  CHECK(calls(stats, "[Strategy]SingleDeviceStrategy.training_step") == 8);
  CHECK(calls(stats, "[Strategy]SingleDeviceStrategy.backward") == 8);
  CHECK(calls(stats, "[LightningModule]Regression.optimizer_step") == 8);
  CHECK(calls(stats, "[LightningModule]Regression.optimizer_zero_grad") == 8);
  CHECK(calls(stats, "[Strategy]SingleDeviceStrategy.validation_step") == 4);
  CHECK(calls(stats, "[_EvaluationLoop].val_next") == 4);
  CHECK(calls(stats, "[LightningModule]Regression.on_fit_start") == 1);
  // The epoch encloses its batches.
  CHECK(stats.front().name == "run_training_epoch");
  std::ifstream in(fs::path(trainer.log_dir()) / "fit-perf.txt");
  std::stringstream report;
  report << in.rdbuf();
  INFO(report.str());
  CHECK(report.str().rfind("FIT Profiler Report", 0) == 0);
  CHECK(report.str().find("|  run_training_batch") != std::string::npos);
  fs::remove_all(root);
}

TEST_CASE("Trainer: profiler \"pytorch\" counts the ops of training, and \"advanced\" is refused") {
  auto data = testing::regression_data(32, 0.01);
  fs::path root = testing::fresh_folder("trainer", "op_profiler");
  testing::Regression module(plain_sgd);
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.max_epochs = 1;
  options.logger = false;
  options.profiler = "pytorch";
  DataLoader train(data, testing::seeded_loader_options(8));
  DataLoader val(data, testing::seeded_loader_options(16, false));
  Trainer trainer(options);
  trainer.fit(module, train, &val);
  auto& profiler = dynamic_cast<PyTorchProfiler&>(trainer.profiler());
  CHECK_FALSE(profiler.op_profiler().active());  // torn down when fit ended
  const std::vector<OpStats> ops = profiler.op_profiler().op_stats();
  INFO(profiler.op_profiler().table());
  bool found = false;
  for (const OpStats& op : ops) {
    if (op.name != "linear") continue;
    found = true;
    CHECK(op.forward_calls == 4);  // validation runs without grad: no nodes
    CHECK(op.backward_calls == 4);
  }
  CHECK(found);
  bool training_step_range = false;
  for (const RangeStats& range : profiler.op_profiler().range_stats()) {
    if (range.name == "[Strategy]SingleDeviceStrategy.training_step") training_step_range = range.calls == 4;
  }
  CHECK(training_step_range);

  TrainerOptions advanced = testing::quiet_trainer_options(root);
  advanced.profiler = "advanced";
  CHECK_THROWS_WITH(Trainer{advanced}, doctest::Contains("cProfile"));
  fs::remove_all(root);
}

TEST_CASE("Trainer: a fit left by an exception tears the profiler down") {
  struct Failing : testing::Regression {
    using testing::Regression::Regression;
    Tensor training_step(const Batch& batch, int64_t index) override {
      if (index == 2) KILN_THROW("training_step failed on purpose");
      return testing::Regression::training_step(batch, index);
    }
  } module(plain_sgd);
  auto data = testing::regression_data(32, 0.01);
  fs::path root = testing::fresh_folder("trainer", "profiler_exception");
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.max_epochs = 1;
  options.logger = false;
  options.profiler = "pytorch";
  DataLoader train(data, testing::seeded_loader_options(8));
  Trainer trainer(options);
  CHECK_THROWS_WITH_AS(trainer.fit(module, train), doctest::Contains("on purpose"), Error);
  auto& profiler = dynamic_cast<PyTorchProfiler&>(trainer.profiler());
  CHECK_FALSE(profiler.op_profiler().active());  // the op profiler does not stay on for the thread
  // And the next stage profiles afresh.
  testing::Regression healthy(plain_sgd);
  DataLoader val(data, testing::seeded_loader_options(16, false));
  trainer.validate(healthy, val);
  CHECK_FALSE(profiler.op_profiler().active());
  fs::remove_all(root);
}
