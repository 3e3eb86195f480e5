// train_gan end to end: a short run exits 0, steps each optimizer once per
// accumulation (and at the epoch's last batch), logs g_loss and d_loss to
// metrics.csv and writes a samples PNG that a strict reader accepts; a few
// hundred steps of the default recipe move the samples from noise to
// Fashion-MNIST's statistics; a run stopped at an epoch's end and resumed
// with --ckpt-path last ends where an uninterrupted run does; bad flags exit
// non-zero with a one-line reason and touch nothing.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/fashion_mnist.h"
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

// Quiet, on the CPU, the data in the main thread; and one epoch (the default is 5).
const std::string kQuiet = " --accelerator cpu --num-workers 0 --enable-progress-bar false --batch-size 64";
const std::string kQuickRun = " --max-epochs 1" + kQuiet;

constexpr int64_t kSide = 28;
constexpr int64_t kPixels = kSide * kSide;
constexpr double kBackground = 0.1;  // a pixel darker than this (in [0, 1]) counts as background
// The quality check's run: 500 batches of 64, two per step of each optimizer
// (about 12 s under load on 2 cores). Measured with seed 42: the mean-image
// distance falls from noise's 0.24 to 0.11 (0.09 after 600 batches, 0.06 after
// 3 epochs), the background fraction rises from 0 to 0.25 (the data's: 0.55).
constexpr int kQualityBatches = 500;
// Samples "close to the data": their mean image is nearer the data's than
// this fraction of uniform noise's distance...
constexpr double kCloseToData = 0.6;
// ...and at least this fraction of the data's share of background pixels.
constexpr double kBackgroundShare = 0.3;

// Images in [0, 1], each kPixels values, row-major.
using Images = std::vector<std::vector<double>>;

// The 64 images of train_gan's 8x8 grid (make_grid: 2 pixels of padding
// before each image), mapped back from bytes to [0, 1].
Images images_in_grid(const kiln::testing::PngImage& grid) {
  Images images;
  for (int64_t row = 0; row < 8; ++row) {
    for (int64_t column = 0; column < 8; ++column) {
      std::vector<double> image(kPixels);
      for (int64_t y = 0; y < kSide; ++y) {
        for (int64_t x = 0; x < kSide; ++x) {
          const int64_t at = (2 + row * 30 + y) * grid.width + 2 + column * 30 + x;
          image[static_cast<size_t>(y * kSide + x)] = grid.pixels[static_cast<size_t>(at)] / 255.0;
        }
      }
      images.push_back(std::move(image));
    }
  }
  return images;
}

// How a set of images looks, in numbers that tell garments from noise.
struct ImageStatistics {
  std::vector<double> mean_image;  // per-pixel mean over the images
  double background_fraction = 0;  // of all pixels, below kBackground
  double pixel_spread = 0;         // per-pixel standard deviation over the images, averaged: 0 for one image repeated
};

ImageStatistics statistics_of(const Images& images) {
  ImageStatistics stats;
  stats.mean_image.assign(kPixels, 0.0);
  std::vector<double> square_mean(kPixels, 0.0);
  int64_t background = 0;
  for (const auto& image : images) {
    for (size_t i = 0; i < image.size(); ++i) {
      stats.mean_image[i] += image[i] / static_cast<double>(images.size());
      square_mean[i] += image[i] * image[i] / static_cast<double>(images.size());
      background += image[i] < kBackground;
    }
  }
  for (size_t i = 0; i < square_mean.size(); ++i) {
    const double variance = square_mean[i] - stats.mean_image[i] * stats.mean_image[i];
    stats.pixel_spread += std::sqrt(std::max(0.0, variance)) / kPixels;
  }
  stats.background_fraction = static_cast<double>(background) / static_cast<double>(images.size() * kPixels);
  return stats;
}

// Mean absolute difference of two mean images.
double mean_image_distance(const ImageStatistics& a, const ImageStatistics& b) {
  double total = 0;
  for (size_t i = 0; i < a.mean_image.size(); ++i) total += std::abs(a.mean_image[i] - b.mean_image[i]);
  return total / static_cast<double>(a.mean_image.size());
}

// The first `count` Fashion-MNIST training images.
Images fashion_images(int64_t count) {
  kiln::FashionMNIST data;
  const uint8_t* bytes = data.images().data<uint8_t>();
  Images images;
  for (int64_t n = 0; n < count; ++n) {
    images.emplace_back(bytes + n * kPixels, bytes + (n + 1) * kPixels);
    for (double& pixel : images.back()) pixel /= 255.0;
  }
  return images;
}

// `count` images of uniform noise in [0, 1].
Images uniform_noise(int64_t count) {
  std::mt19937 engine(7);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Images images(static_cast<size_t>(count), std::vector<double>(kPixels));
  for (auto& image : images) {
    for (double& pixel : image) pixel = uniform(engine);
  }
  return images;
}

}  // namespace

TEST_CASE("train_gan trains, logs g_loss and d_loss, and writes an 8x8 grid of samples") {
  const ScratchRoot scratch("run");
  const fs::path& root = scratch.path;
  fs::create_directories(root);
  const fs::path samples = root / "samples.png";
  Run run = run_train_gan(kQuickRun + " --limit-train-batches 20 --log-every-n-steps 5" +
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
  Run run = run_train_gan(kQuickRun + " --limit-train-batches 5 --default-root-dir " + root.string() +
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
  Run run = run_train_gan(kQuickRun + " --strategy ddp --devices 2 --limit-train-batches 6" +
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

TEST_CASE("train_gan's samples move from noise to Fashion-MNIST's statistics within a few hundred steps") {
  const ScratchRoot scratch("quality");
  fs::create_directories(scratch.path);
  // The default recipe (seed 42): its samples after `batches` batches (two
  // per optimizer step), and their statistics.
  auto samples_after = [&](int batches) {
    const fs::path samples = scratch.path / ("samples_" + std::to_string(batches) + ".png");
    Run run = run_train_gan(kQuickRun + " --limit-train-batches " +
                            std::to_string(batches) + " --default-root-dir " + scratch.path.string() + " --output " +
                            samples.string());
    INFO("train_gan printed: " << run.output);
    REQUIRE(run.exit_code == 0);
    return statistics_of(images_in_grid(kiln::testing::read_png(samples.string())));
  };
  const ImageStatistics data = statistics_of(fashion_images(2000));
  const ImageStatistics noise = statistics_of(uniform_noise(64));
  const ImageStatistics untrained = samples_after(2);
  const ImageStatistics trained = samples_after(kQualityBatches);
  const double noise_distance = mean_image_distance(noise, data);
  const double untrained_distance = mean_image_distance(untrained, data);
  const double trained_distance = mean_image_distance(trained, data);
  INFO("mean-image distance to the data: noise " << noise_distance << ", untrained " << untrained_distance
                                                 << ", trained " << trained_distance);
  INFO("background fraction: data " << data.background_fraction << ", noise " << noise.background_fraction
                                    << ", untrained " << untrained.background_fraction << ", trained "
                                    << trained.background_fraction);
  INFO("pixel spread: data " << data.pixel_spread << ", trained " << trained.pixel_spread);
  // The check tells noise from garments: the untrained generator's samples
  // are as far from the data's mean image as uniform noise is...
  CHECK(untrained_distance > kCloseToData * noise_distance);
  // ...and the trained ones are much closer to it,
  CHECK(trained_distance < kCloseToData * noise_distance);
  // with a good share of the dark background that the data has (55% of its
  // pixels) and noise and the untrained generator lack,
  CHECK(untrained.background_fraction < kBackgroundShare * data.background_fraction);
  CHECK(trained.background_fraction > kBackgroundShare * data.background_fraction);
  // and no collapse to one image: the samples differ at least half as much as garments do.
  CHECK(trained.pixel_spread > 0.5 * data.pixel_spread);
}

TEST_CASE("train_gan stopped at an epoch's end and resumed with --ckpt-path last ends as an uninterrupted run") {
  const ScratchRoot scratch("resume");
  const fs::path uninterrupted = scratch.path / "uninterrupted", resumed = scratch.path / "resumed";
  fs::create_directories(uninterrupted);
  fs::create_directories(resumed);
  // 4 batches per epoch, accumulating 2: each epoch steps each optimizer twice, 4 global steps.
  const std::string common = kQuiet + " --limit-train-batches 4";
  auto train = [&](const fs::path& root, const std::string& arguments) {
    Run run = run_train_gan(common + arguments + " --default-root-dir " + root.string() + " --output " +
                            (root / "samples.png").string());
    INFO("train_gan" << arguments << " printed: " << run.output);
    CHECK(run.exit_code == 0);
    return run.output;
  };
  // The epoch-end checkpoints (epoch=E-step=S.safetensors) in `root`'s newest log version.
  auto checkpoints = [](const fs::path& root, const std::string& version) {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(root / "lightning_logs" / version / "checkpoints")) {
      names.insert(entry.path().filename().string());
    }
    return names;
  };

  CHECK(train(uninterrupted, " --max-epochs 2").find("(8 optimizer steps") != std::string::npos);
  CHECK(train(resumed, " --max-epochs 1").find("(4 optimizer steps") != std::string::npos);
  CHECK(checkpoints(resumed, "version_0") == std::set<std::string>{"epoch=0-step=4.safetensors", "last.safetensors"});
  const std::vector<uint8_t> first_part_samples = kiln::testing::read_png((resumed / "samples.png").string()).pixels;
  const std::string resumed_output = train(resumed, " --max-epochs 2 --ckpt-path last");
  CHECK(resumed_output.find("(8 optimizer steps") != std::string::npos);
  // Both runs end with the checkpoint of epoch 1, global step 8 (the resumed
  // run logs into a new version folder, as Lightning).
  const std::set<std::string> expected{"epoch=1-step=8.safetensors", "last.safetensors"};
  CHECK(checkpoints(uninterrupted, "version_0") == expected);
  CHECK(checkpoints(resumed, "version_1") == expected);
  // Resume is exact (weights, optimizer moments, BatchNorm statistics, RNG
  // and loader states): the final samples are the same image, and not the
  // first part's.
  const std::vector<uint8_t> resumed_samples = kiln::testing::read_png((resumed / "samples.png").string()).pixels;
  CHECK(resumed_samples == kiln::testing::read_png((uninterrupted / "samples.png").string()).pixels);
  CHECK(resumed_samples != first_part_samples);
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
