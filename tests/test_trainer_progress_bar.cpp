// The Trainer's progress bar (trainer/progress_bar.h): what it prints during
// fit (epoch, batch, rate, eta and exactly the metrics logged with
// prog_bar=true, with their values), and that it prints nothing when disabled
// and on ranks other than 0.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "tests/support/run_binary.h"
#include "tests/support/captured_stderr.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using testing::CapturedStderr;

// Logs train_loss (prog_bar), train_mae (not), val_loss (prog_bar) and
// val_mae (not), and keeps every training loss to compare with the bar.
struct BarModule : testing::Regression {
  Tensor training_step(const Batch& batch, int64_t) override {
    Tensor loss = mean_squared_error(batch);
    log("train_loss", loss, std::nullopt, std::nullopt, /*prog_bar=*/true);
    log("train_mae", mean(abs(sub(model().forward(batch.input), batch.target))));
    losses.push_back(loss.item<double>());
    return loss;
  }
  void validation_step(const Batch& batch, int64_t) override {
    log("val_loss", mean_squared_error(batch), std::nullopt, std::nullopt, /*prog_bar=*/true, batch.size());
    log("val_mae", mean(abs(sub(model().forward(batch.input), batch.target))));
  }
  std::vector<double> losses;
};

// The val_loss of each validation, as the bar shows it from then on.
struct ValLossRecorder : Callback {
  std::string name() const override { return "ValLossRecorder"; }
  void on_validation_end(Trainer& trainer, TrainModule&) override {
    values.push_back(trainer.callback_metrics().at("val_loss"));
  }
  std::vector<double> values;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string fixed4(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.4f", value);
  return text;
}

}  // namespace

TEST_CASE("progress bar: one line per batch of a 10-batch epoch off a terminal, with epoch, batch, rate, eta and the prog_bar metrics") {
  const fs::path root = testing::fresh_folder("progress_bar", "lines");
  BarModule module;
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.enable_progress_bar = true;
  options.max_epochs = 2;
  options.log_every_n_steps = 1;  // the bar's step values are the logged ones
  options.logger = false;
  options.enable_checkpointing = false;
  auto val_losses = std::make_shared<ValLossRecorder>();
  options.callbacks = {val_losses};
  DataLoader loader(testing::regression_data(160, 0.01), testing::seeded_loader_options(16));  // 10 batches
  DataLoader val(testing::regression_data(32, 0.01), testing::seeded_loader_options(16));
  Trainer trainer(options);
  std::string text;
  {
    CapturedStderr captured(root / "stderr.txt");
    trainer.fit(module, loader, &val);
    text = captured.text();
  }
  INFO(text);
  const std::vector<std::string> lines = lines_of(text);
  REQUIRE(lines.size() == 20);  // a tenth of 10 batches is every batch; a file is not a terminal: no '\r'
  CHECK(text.find('\r') == std::string::npos);
  const std::regex pattern(R"(Epoch (\d+): (\d+)/10 \[([0-9.]+) it/s, eta (\d+)s\]((?: \w+=-?[0-9.]+)*))");
  for (size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(lines[i]);
    std::smatch match;
    REQUIRE(std::regex_match(lines[i], match, pattern));
    const int64_t epoch = static_cast<int64_t>(i / 10), batch = static_cast<int64_t>(i % 10) + 1;
    CHECK(std::stoll(match[1].str()) == epoch);
    CHECK(std::stoll(match[2].str()) == batch);
    CHECK(std::stod(match[3].str()) > 0);
    if (batch == 10) CHECK(match[4].str() == "0");  // nothing left of the epoch
    // Exactly the prog_bar metrics: the loss of this very batch, and from the
    // second epoch on the first epoch's val_loss; never train_mae or val_mae.
    std::string expected = " train_loss=" + fixed4(module.losses[i]);
    if (epoch == 1) expected = expected + " val_loss=" + fixed4(val_losses->values.at(0));
    CHECK(match[5].str() == expected);
  }
  REQUIRE(val_losses->values.size() == 2);
  CHECK(val_losses->values[0] != val_losses->values[1]);  // so the lines above show the first one
  CHECK(trainer.progress_bar_metrics().size() == 2);
  CHECK(trainer.progress_bar_metrics().count("val_mae") == 0);
  fs::remove_all(root);
}

TEST_CASE("progress bar: enable_progress_bar=false prints nothing") {
  const fs::path root = testing::fresh_folder("progress_bar", "disabled");
  BarModule module;
  TrainerOptions options = testing::quiet_trainer_options(root);
  options.enable_progress_bar = false;
  options.max_epochs = 2;
  options.log_every_n_steps = 1;
  options.logger = false;
  options.enable_checkpointing = false;
  DataLoader loader(testing::regression_data(160, 0.01), testing::seeded_loader_options(16));
  DataLoader val(testing::regression_data(32, 0.01), testing::seeded_loader_options(16));
  Trainer trainer(options);
  std::string text;
  {
    CapturedStderr captured(root / "stderr.txt");
    trainer.fit(module, loader, &val);
    text = captured.text();
  }
  CHECK(text.empty());
  CHECK(module.losses.size() == 20);  // it did train
  CHECK(trainer.progress_bar_metrics().count("train_loss") == 1);  // the values exist, unprinted
  fs::remove_all(root);
}

TEST_CASE("progress bar: under ddp only rank 0 prints it (train_fashion on 2 processes under kiln-run)") {
  const fs::path root = testing::fresh_folder("progress_bar", "ddp");
  const std::string launcher = testing::built_binary("kiln-run") + " --nproc-per-node 2 --master-port 0 -- ";
  const testing::BinaryRun run = testing::run_built_binary(
      "train_fashion",
      "--strategy ddp --devices 2 --accelerator cpu --max-epochs 1 --limit-train-batches 10 --limit-val-batches 2 "
      "--batch-size 32 --log-every-n-steps 1 --enable-progress-bar true --default-root-dir " + root.string(),
      "OMP_NUM_THREADS=1 " + launcher);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  int rank0_bar_lines = 0, rank1_lines = 0;
  for (const std::string& line : lines_of(run.output)) {
    if (line.rfind("[rank 0] Epoch 0: ", 0) == 0) ++rank0_bar_lines;
    if (line.rfind("[rank 1] ", 0) == 0) {
      ++rank1_lines;
      CHECK_MESSAGE(line.find("Epoch 0:") == std::string::npos, line);
    }
  }
  CHECK(rank0_bar_lines == 10);
  CHECK(rank1_lines > 0);  // rank 1 ran and printed its own lines, but no bar
  fs::remove_all(root);
}
