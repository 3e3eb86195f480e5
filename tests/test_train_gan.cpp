// train_gan end to end: a short run exits 0, steps each optimizer once per
// accumulation (and at the epoch's last batch), logs g_loss and d_loss to
// metrics.csv and writes a samples PNG that a strict reader accepts; bad flags
// exit non-zero with a one-line reason and touch nothing.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/png_reader.h"
#include "tests/support/run_binary.h"

namespace fs = std::filesystem;

namespace {

using Run = kiln::testing::BinaryRun;
using kiln::testing::built_binary;

// `launcher` (may be empty) + train_gan + arguments.
Run run_train_gan(const std::string& arguments, const std::string& launcher = "") {
  return kiln::testing::run_built_binary("train_gan", arguments, launcher);
}

// A folder under /tmp, absent at first and removed again when the test case
// ends, failed checks included.
struct ScratchRoot {
  fs::path path;
  explicit ScratchRoot(const std::string& name)
      : path(fs::temp_directory_path() / ("kiln_gan_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~ScratchRoot() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  ScratchRoot(const ScratchRoot&) = delete;
  ScratchRoot& operator=(const ScratchRoot&) = delete;
};

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream stream(line);
  std::string field;
  while (std::getline(stream, field, ',')) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

// The only metrics.csv under `root`.
fs::path find_metrics(const fs::path& root) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.path().filename() == "metrics.csv") found.push_back(entry.path());
  }
  REQUIRE(found.size() == 1);
  return found.front();
}

const char* kQuickRun = " --accelerator cpu --num-workers 0 --enable-progress-bar false --batch-size 64";

}  // namespace

TEST_CASE("train_gan trains, logs g_loss and d_loss, and writes an 8x8 grid of samples") {
  const ScratchRoot scratch("run");
  const fs::path& root = scratch.path;
  fs::create_directories(root);
  const fs::path samples = root / "samples.png";
  Run run = run_train_gan(std::string(kQuickRun) + " --limit-train-batches 20 --log-every-n-steps 5" +
                          " --default-root-dir " + root.string() + " --output " + samples.string());
  INFO("train_gan printed: " << run.output);
  REQUIRE(run.exit_code == 0);
  // 20 batches, accumulating 2: 10 steps of each optimizer, each counted as a global step.
  CHECK(run.output.find("(20 optimizer steps") != std::string::npos);

  REQUIRE(fs::exists(samples));
  kiln::testing::PngImage image;
  REQUIRE_NOTHROW(image = kiln::testing::read_png(samples.string()));
  // make_grid: 8 images of 28 + 2 padding per side, plus the last padding.
  CHECK(image.width == 8 * 30 + 2);
  CHECK(image.height == 8 * 30 + 2);
  CHECK(image.pixels[0] == 0);  // padding (pad_value 0)
  // Generated pixels (inside the first image) differ from one another.
  std::set<uint8_t> first_image;
  for (int64_t y = 2; y < 30; ++y) {
    for (int64_t x = 2; x < 30; ++x) first_image.insert(image.pixels[static_cast<size_t>(y * image.width + x)]);
  }
  CHECK(first_image.size() > 10);

  std::ifstream metrics(find_metrics(root));
  std::string header;
  REQUIRE(std::getline(metrics, header));
  const std::vector<std::string> columns = split_csv_line(header);
  const auto g_column = std::find(columns.begin(), columns.end(), "g_loss");
  const auto d_column = std::find(columns.begin(), columns.end(), "d_loss");
  REQUIRE(g_column != columns.end());
  REQUIRE(d_column != columns.end());
  int rows = 0;
  for (std::string line; std::getline(metrics, line);) {
    const std::vector<std::string> fields = split_csv_line(line);
    REQUIRE(fields.size() == columns.size());
    const double g_loss = std::stod(fields[static_cast<size_t>(g_column - columns.begin())]);
    const double d_loss = std::stod(fields[static_cast<size_t>(d_column - columns.begin())]);
    // Binary cross-entropies: positive and finite (d_loss sums a real and a fake term).
    CHECK((std::isfinite(g_loss) && g_loss > 0));
    CHECK((std::isfinite(d_loss) && d_loss > 0));
    ++rows;
  }
  // Steps 2, 4, ..., 20 cross the multiples of 5 four times.
  CHECK(rows == 4);
}

TEST_CASE("train_gan steps at the epoch's last batch when it ends an accumulation early") {
  const ScratchRoot scratch("last_batch");
  const fs::path& root = scratch.path;
  fs::create_directories(root);
  // 5 batches, accumulating 2: steps after batches 2, 4 and 5 (the last), so 3 per optimizer.
  Run run = run_train_gan(std::string(kQuickRun) + " --limit-train-batches 5 --default-root-dir " + root.string() +
                          " --output " + (root / "samples.png").string());
  INFO("train_gan printed: " << run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("(6 optimizer steps") != std::string::npos);
}

TEST_CASE("train_gan trains data-parallel on two processes (kiln-run, Gloo), rank 0 writing the files") {
  const ScratchRoot scratch("ddp");
  const fs::path& root = scratch.path;
  fs::create_directories(root);
  const std::string launcher = built_binary("kiln-run") + " --nproc-per-node 2 --master-port 0 -- ";
  // 6 batches per rank, accumulating 2: 3 steps of each optimizer on every rank.
  Run run = run_train_gan(std::string(kQuickRun) + " --strategy ddp --devices 2 --limit-train-batches 6" +
                              " --default-root-dir " + root.string() + " --output " + (root / "samples.png").string(),
                          "OMP_NUM_THREADS=1 " + launcher);
  INFO("kiln-run train_gan printed: " << run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("[rank 0] g_loss") != std::string::npos);
  CHECK(run.output.find("[rank 1] g_loss") != std::string::npos);
  size_t step_reports = 0;
  for (size_t at = run.output.find("(6 optimizer steps"); at != std::string::npos;
       at = run.output.find("(6 optimizer steps", at + 1)) {
    ++step_reports;
  }
  CHECK(step_reports == 2);
  CHECK_NOTHROW(kiln::testing::read_png((root / "samples.png").string()));
  CHECK(run.output.find("samples written") == run.output.rfind("samples written"));  // once: rank 0
}

TEST_CASE("train_gan refuses bad flags with a one-line reason and touches nothing") {
  auto check_refused = [](const std::string& arguments, const std::string& expected_words) {
    const ScratchRoot scratch("refused");
    Run run = run_train_gan(arguments + " --default-root-dir " + scratch.path.string());
    INFO("train_gan " << arguments << " printed: " << run.output);
    CHECK(run.exit_code != 0);
    CHECK(run.output.find(expected_words) != std::string::npos);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(scratch.path));
  };
  check_refused("--batch-size -5", "--batch-size");
  check_refused("--accumulate 0", "--accumulate");
  check_refused("--no-such-flag", "no-such-flag");
  check_refused("--output /nonexistent/folder/samples.png", "--output");
  check_refused("--data-dir /nonexistent/fashion", "apt-get install dataset-fashion-mnist");
}
