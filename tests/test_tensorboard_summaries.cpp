// TensorBoard images and histograms: TensorBoardLogger::log_image (a PNG in a
// Summary.Image) and log_histogram (TensorFlow's default buckets) read back by
// the reader written from the specification (tests/support/tensorboard_reader.h)
// and by TensorBoard's own EventAccumulator (scripts/check_tensorboard.py), bad
// input refused, and the line-plot rasterizer the LR finder's image uses.
// In training: test_tensorboard_training.cpp.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/python_checks.h"
#include "tests/support/tensorboard_reader.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/plot_raster.h"
#include "trainer/tensorboard_logger.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A scratch folder, removed when the case ends.
struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& name) : path(testing::fresh_folder("tensorboard", name)) {}
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

// The events after the file_version header.
std::vector<testing::Event> logged_events(TensorBoardLogger& logger) {
  logger.save();
  std::vector<testing::Event> events = testing::read_events(logger.event_file());
  REQUIRE(!events.empty());
  CHECK(events.front().file_version == "brain.Event:2");
  events.erase(events.begin());
  return events;
}

// The one image of an event.
testing::ImageSummary only_image(const testing::Event& event) {
  REQUIRE(event.images.size() == 1);
  CHECK(event.histograms.empty());
  CHECK(event.scalars.empty());
  return event.images.front();
}

// ---------------------------------------------------------------- TensorFlow's default buckets, from their definition

// e_k = 1e-12 * 1.1^k for k = 0 .. kLargest, the last below 1e20.
constexpr int64_t kLargest = 773;

// Where `limit` stands among the sorted default limits [-e_K .. -e_0, 0, e_0 .. e_K, DBL_MAX].
int64_t default_position(double limit) {
  if (limit == 0) return kLargest + 1;
  if (limit == DBL_MAX) return 2 * kLargest + 3;
  const double magnitude = std::abs(limit);
  const auto k = static_cast<int64_t>(std::lround(std::log(magnitude / 1e-12) / std::log(1.1)));
  INFO("bucket limit " << limit);
  REQUIRE(k >= 0);
  REQUIRE(k <= kLargest);
  REQUIRE(std::abs(magnitude - 1e-12 * std::pow(1.1, static_cast<double>(k))) <= 1e-9 * magnitude);
  return limit < 0 ? kLargest - k : kLargest + 2 + k;
}

// `histogram` against the `values` it was made of: the statistics; limits
// that are TensorFlow's defaults, increasing; counts that add up to num; no two
// empty buckets in a row (runs are merged); every non-empty bucket one default
// bucket wide; every value counted in the bucket [limit[i - 1], limit[i]) that
// holds it.
void check_histogram(const testing::HistogramSummary& histogram, const std::vector<double>& values) {
  double low = values.front(), high = values.front(), sum = 0, squares = 0;
  for (double value : values) {
    low = std::min(low, value);
    high = std::max(high, value);
    sum += value;
    squares += value * value;
  }
  CHECK(histogram.min == low);
  CHECK(histogram.max == high);
  CHECK(histogram.num == static_cast<double>(values.size()));
  CHECK(histogram.sum == doctest::Approx(sum).epsilon(1e-12));
  CHECK(histogram.sum_squares == doctest::Approx(squares).epsilon(1e-12));
  const std::vector<double>& limits = histogram.bucket_limit;
  REQUIRE(limits.size() == histogram.bucket.size());
  REQUIRE(!limits.empty());
  double total = 0;
  for (size_t i = 0; i < limits.size(); ++i) {
    const int64_t position = default_position(limits[i]);
    total += histogram.bucket[i];
    if (i == 0) {
      if (histogram.bucket[0] > 0) CHECK(position == 0);
      continue;
    }
    CHECK(limits[i - 1] < limits[i]);
    CHECK_FALSE((histogram.bucket[i - 1] == 0 && histogram.bucket[i] == 0));
    if (histogram.bucket[i] > 0) CHECK(position - default_position(limits[i - 1]) == 1);
  }
  CHECK(total == static_cast<double>(values.size()));
  std::vector<double> counted(limits.size(), 0.0);
  for (double value : values) {
    size_t bucket = 0;
    while (bucket < limits.size() && !(value < limits[bucket])) ++bucket;
    INFO("value " << value);
    REQUIRE(bucket < limits.size());
    CHECK((bucket == 0 || limits[bucket - 1] <= value));
    counted[bucket] += 1;
  }
  CHECK(counted == histogram.bucket);
}

std::string number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// "[step, min, max, num, sum]" of `values` at `step`, for check_tensorboard.py.
std::string expected_histogram(int64_t step, const std::vector<double>& values) {
  double low = values.front(), high = values.front(), sum = 0;
  for (double value : values) {
    low = std::min(low, value);
    high = std::max(high, value);
    sum += value;
  }
  return "[" + std::to_string(step) + ", " + number(low) + ", " + number(high) + ", " +
         std::to_string(values.size()) + ", " + number(sum) + "]";
}

}  // namespace

TEST_CASE("log_image writes a Summary.Image holding a PNG of the pixels, grayscale or RGB") {
  Scratch root("image_pixels");
  TensorBoardLogger logger(root.path.string());
  std::vector<uint8_t> gray(5 * 3), rgb(4 * 2 * 3);  // (3, 5) and (2, 4, 3)
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 17);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(255 - i * 9);
  logger.log_image("gray", 5, 3, 1, gray.data(), 0);
  logger.log_image("colour/rgb", 4, 2, 3, rgb.data(), 12);

  const std::vector<testing::Event> events = logged_events(logger);
  REQUIRE(events.size() == 2);
  const testing::ImageSummary first = only_image(events[0]), second = only_image(events[1]);
  CHECK(events[0].step == 0);
  CHECK(events[1].step == 12);
  CHECK(first.tag == "gray");
  CHECK((first.width == 5 && first.height == 3 && first.colorspace == 1));
  CHECK(second.tag == "colour/rgb");
  CHECK((second.width == 4 && second.height == 2 && second.colorspace == 3));
  const testing::DecodedPng gray_png = testing::decode_png(first.encoded);
  CHECK((gray_png.width == 5 && gray_png.height == 3 && gray_png.colour_type == 0));
  CHECK(gray_png.pixels == gray);
  const testing::DecodedPng rgb_png = testing::decode_png(second.encoded);
  CHECK((rgb_png.width == 4 && rgb_png.height == 2 && rgb_png.colour_type == 2));
  CHECK(rgb_png.pixels == rgb);
}

TEST_CASE("log_image from a tensor follows torch's add_image: CHW by default, x * 255 clipped and truncated") {
  Scratch root("image_tensor");
  TensorBoardLogger logger(root.path.string());
  // (C=3, H=1, W=2): pixel (0, 0) is (0.5, -0.1, 1.0), pixel (0, 1) is (1.2, NaN, 0).
  const Tensor chw = tensor<float>({0.5f, 1.2f, -0.1f, kNaN, 1.0f, 0.0f}, {3, 1, 2});
  logger.log_image("chw", chw, 1);
  logger.log_image("hwc", chw.permute({1, 2, 0}).contiguous(), 2, "HWC");
  logger.log_image("hw", tensor<float>({0.0f, 0.25f, 0.999f, 1.0f}, {2, 2}), 3, "HW");
  logger.log_image("one_channel", tensor<float>({0.1f, 0.2f}, {1, 1, 2}), 4);
  logger.log_image("uint8", tensor<float>({7, 200, 255, 0, 1, 2}, {1, 2, 3}).to(DType::u8), 5, "HWC");
  logger.log_image("float64", tensor<double>({0.5, 0.75}, {1, 1, 2}), 6);

  const std::vector<testing::Event> events = logged_events(logger);
  REQUIRE(events.size() == 6);
  auto pixels_of = [&](size_t index, int64_t width, int64_t height, int64_t colorspace) {
    const testing::ImageSummary image = only_image(events[index]);
    CHECK(events[index].step == static_cast<int64_t>(index) + 1);
    CHECK((image.width == width && image.height == height && image.colorspace == colorspace));
    const testing::DecodedPng png = testing::decode_png(image.encoded);
    CHECK((png.width == width && png.height == height && png.colour_type == (colorspace == 1 ? 0 : 2)));
    return png.pixels;
  };
  // 0.5 * 255 = 127.5 truncates to 127; 1.2 and -0.1 clip; NaN gives 0.
  CHECK(pixels_of(0, 2, 1, 3) == std::vector<uint8_t>{127, 0, 255, 255, 0, 0});
  CHECK(pixels_of(1, 2, 1, 3) == std::vector<uint8_t>{127, 0, 255, 255, 0, 0});
  CHECK(pixels_of(2, 2, 2, 1) == std::vector<uint8_t>{0, 63, 254, 255});
  CHECK(pixels_of(3, 2, 1, 1) == std::vector<uint8_t>{25, 51});
  CHECK(pixels_of(4, 2, 1, 3) == std::vector<uint8_t>{7, 200, 255, 0, 1, 2});  // uint8 as it is
  CHECK(pixels_of(5, 2, 1, 1) == std::vector<uint8_t>{127, 191});
}

TEST_CASE("log_histogram: min, max, num, sum, sum_squares and TensorFlow's default buckets") {
  Scratch root("histogram");
  TensorBoardLogger logger(root.path.string());
  // Both signs, zeros, values at and beside bucket limits, the smallest bucket
  // (1e-12), one past the largest finite limit (1e30), and a spread of normals.
  std::vector<double> values = {-3.5, -1e-13, 0.0, 0.0, 1e-12, 1.1e-12, 0.5, 0.5, 2.0, 1e30, -1e25, 7.25};
  for (double normal : testing::random_values(500, 17)) values.push_back(normal);
  logger.log_histogram("mixed", values, 3);
  logger.log_histogram("one value", std::vector<double>{42.0}, 4);
  const std::vector<float> floats = {0.25f, -1.5f, 3.0f, 0.0f, 1e-3f, 65504.0f};
  const Tensor matrix = tensor<float>(floats, {2, 3});
  logger.log_histogram("float32", matrix, 5);
  logger.log_histogram("bfloat16", matrix.to(DType::bf16), 6);  // checked against the values bfloat16 keeps
  logger.log_histogram("int64", tensor<float>({-2, 5, 5, 9}, {4}).to(DType::i64), 7);
  logger.log_histogram("float64 view", tensor<double>({1, 2, 3, 4, 5, 6}, {2, 3}).permute({1, 0}), 8);

  const std::vector<testing::Event> events = logged_events(logger);
  REQUIRE(events.size() == 6);
  for (size_t i = 0; i < events.size(); ++i) {
    CHECK(events[i].step == static_cast<int64_t>(i) + 3);
    REQUIRE(events[i].histograms.size() == 1);
    CHECK(events[i].images.empty());
  }
  CHECK(events[0].histograms[0].tag == "mixed");
  check_histogram(events[0].histograms[0], values);
  check_histogram(events[1].histograms[0], {42.0});
  CHECK(events[1].histograms[0].bucket.size() == 3);  // the empty run below, 42's bucket, the empty run above
  check_histogram(events[2].histograms[0], std::vector<double>(floats.begin(), floats.end()));
  const std::vector<double> bf16 = matrix.to(DType::bf16).to(DType::f64).to_vector<double>();
  check_histogram(events[3].histograms[0], bf16);
  check_histogram(events[4].histograms[0], {-2, 5, 5, 9});
  check_histogram(events[5].histograms[0], {1, 4, 2, 5, 3, 6});  // the view's order
}

TEST_CASE("log_image and log_histogram refuse bad input with a kiln::Error naming it, and write nothing") {
  Scratch root("refused");
  TensorBoardLogger logger(root.path.string());
  auto image_error = [&](const Tensor& image, const std::string& dataformats = "CHW") {
    return testing::error_of([&] { logger.log_image("picture", image, 0, dataformats); });
  };
  CHECK(image_error(Tensor()).find("log_image('picture'): the image tensor is undefined") != std::string::npos);
  CHECK(image_error(zeros({3, 0, 4})).find("the image of shape [3, 0, 4] is empty") != std::string::npos);
  CHECK(image_error(zeros({1, 3, 4, 4})).find("dataformats CHW needs a 3-d tensor, got shape [1, 3, 4, 4]") !=
        std::string::npos);
  CHECK(image_error(zeros({2, 4, 4})).find("expected 1 (grayscale) or 3 (RGB) channels, got 2") != std::string::npos);
  CHECK(image_error(zeros({4, 4, 4}), "HWC").find("got 4 in shape [4, 4, 4] (HWC)") != std::string::npos);
  CHECK(image_error(zeros({3, 4, 4}, {.dtype = DType::i64})).find("floating image (values in [0, 1]) or uint8, got") !=
        std::string::npos);
  CHECK(image_error(zeros({3, 4, 4}), "NCHW").find("dataformats must be \"CHW\", \"HWC\" or \"HW\", got 'NCHW'") !=
        std::string::npos);
  const std::vector<uint8_t> pixels(16, 0);
  CHECK(testing::error_of([&] { logger.log_image("", 4, 4, 1, pixels.data(), 0); }).find("the tag is empty") !=
        std::string::npos);
  CHECK(testing::error_of([&] { logger.log_image("p", 0, 4, 1, pixels.data(), 0); })
            .find("the image is 0x4; each side must be at least 1") != std::string::npos);
  CHECK(testing::error_of([&] { logger.log_image("p", 2, 2, 4, pixels.data(), 0); })
            .find("expected 1 (grayscale) or 3 (RGB) channels, got 4") != std::string::npos);
  CHECK(testing::error_of([&] { logger.log_image("p", 2, 2, 1, nullptr, 0); }).find("the pixels are null") !=
        std::string::npos);

  auto histogram_error = [&](const Tensor& values) {
    return testing::error_of([&] { logger.log_histogram("weights", values, 0); });
  };
  CHECK(histogram_error(Tensor()).find("log_histogram('weights'): the tensor is undefined") != std::string::npos);
  CHECK(histogram_error(zeros({2, 0})).find("the tensor of shape [2, 0] is empty") != std::string::npos);
  CHECK(histogram_error(tensor<float>({1, kNaN, kInf, 2, -kInf}, {5}))
            .find("3 of the 5 values are NaN or infinite; a histogram needs finite values") != std::string::npos);
  CHECK(histogram_error(zeros({3}).to(DType::b8)).find("expected a numeric tensor, got bool") != std::string::npos);
  CHECK(testing::error_of([&] { logger.log_histogram("w", std::vector<double>{}, 0); }).find("no values") !=
        std::string::npos);
  CHECK(testing::error_of([&] { logger.log_histogram("", std::vector<double>{1.0}, 0); })
            .find("the tag is empty") != std::string::npos);
  CHECK(logged_events(logger).empty());  // nothing half-written
}

TEST_CASE("TensorBoard's own reader reads kiln's images and histograms, and its check can fail") {
  const fs::path script = testing::source_root() / "scripts" / "check_tensorboard.py";
  REQUIRE(fs::exists(script));
  const std::string python =
      testing::require_python("tensorboard", "KILN_TENSORBOARD_PYTHON", "TensorBoard's own reader");
  if (python.empty()) return;
  Scratch root("reader");
  const std::vector<double> early = testing::random_values(300, 5), late = testing::random_values(40, 6);
  {
    TensorBoardLogger logger(root.path.string());
    std::vector<uint8_t> gray(7 * 3, 128);
    logger.log_image("gray", 7, 3, 1, gray.data(), 0);
    logger.log_image("rgb", rand({3, 4, 6}), 10);
    logger.log_image("rgb", rand({3, 4, 6}), 20);
    logger.log_histogram("weights/w", early, 10);
    logger.log_histogram("weights/w", late, 20);
    logger.log_metrics({{"loss", 0.5}}, 20, 0);
  }
  const std::string run_dir = (root.path / "lightning_logs" / "version_0").string();
  auto check = [&](const std::string& rgb_entries) {
    const std::string expected = R"({"scalars": {"loss": [[20, 0.5]]}, "images": {"gray": [[0, 7, 3]], "rgb": )" +
                                 rgb_entries + R"(}, "histograms": {"weights/w": [)" + expected_histogram(10, early) +
                                 ", " + expected_histogram(20, late) + "]}}";
    return testing::run_shell(python + " " + script.string() + " " + run_dir + " '" + expected + "'");
  };
  const testing::BinaryRun run = check("[[10, 6, 4], [20, 6, 4]]");
  MESSAGE("check_tensorboard.py:\n" << run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("tensorboard check: OK") != std::string::npos);
  CHECK(run.output.find("histogram weights/w: step 10 num 300") != std::string::npos);
  // Width and height swapped: the reader's answer is compared, not just printed.
  const testing::BinaryRun wrong = check("[[10, 4, 6], [20, 4, 6]]");
  CHECK(wrong.exit_code == 1);
  CHECK(wrong.output.find("MISMATCH image rgb") != std::string::npos);
}

TEST_CASE("rasterize_line_plot: the curve in blue (higher loss higher), the marker as a red dot, a black frame") {
  // The plot area of plot_raster.cpp (as plot_svg.cpp's): x in [80, 620], y in [40, 420].
  LinePlot plot;
  plot.log_x = true;
  for (int i = 0; i <= 20; ++i) {
    plot.x.push_back(1e-6 * std::pow(10.0, i / 4.0));  // log10 x from -6 to -1
    plot.y.push_back((i - 10) * (i - 10));            // 100 at both ends, 0 at i = 10
  }
  plot.marker = 10;
  // With 5% margins, log10 x in [-6.25, -0.75] and y in [-5, 105].
  auto px = [](int i) { return 80 + (-6.0 + i / 4.0 + 6.25) / 5.5 * 540; };
  auto py = [](double y) { return 420 - (y + 5) / 110 * 380; };

  const RgbImage image = rasterize_line_plot(plot);
  REQUIRE(image.width == 640);
  REQUIRE(image.height == 480);
  REQUIRE(image.pixels.size() == 640u * 480u * 3u);
  auto pixel = [&](int64_t x, int64_t y) {
    const uint8_t* p = image.pixels.data() + (y * 640 + x) * 3;
    return std::array<int, 3>{p[0], p[1], p[2]};
  };
  const std::array<int, 3> blue{31, 119, 180}, red{255, 0, 0}, black{0, 0, 0}, white{255, 255, 255};
  CHECK(pixel(5, 5) == white);
  CHECK(pixel(80, 230) == black);
  CHECK(pixel(620, 230) == black);
  CHECK(pixel(350, 40) == black);
  CHECK(pixel(350, 420) == black);
  // The topmost blue pixel of a column, or -1.
  auto curve_row = [&](int64_t x) {
    for (int64_t y = 41; y < 420; ++y) {
      if (pixel(x, y) == blue) return y;
    }
    return int64_t{-1};
  };
  auto row_at = [&](int i) { return curve_row(static_cast<int64_t>(std::lround(px(i)))); };
  CHECK(row_at(2) < row_at(6));  // y = 64, 16, 1: a higher loss is drawn higher
  CHECK(row_at(6) < row_at(9));
  CHECK(std::abs(static_cast<double>(row_at(9)) - py(1)) <= 3);
  CHECK(std::abs(static_cast<double>(row_at(15)) - py(25)) <= 3);
  // The red dot sits at the marked point (i = 10, y = 0).
  double red_x = 0, red_y = 0, red_count = 0;
  for (int64_t y = 0; y < 480; ++y) {
    for (int64_t x = 0; x < 640; ++x) {
      if (pixel(x, y) != red) continue;
      red_x += static_cast<double>(x);
      red_y += static_cast<double>(y);
      red_count += 1;
    }
  }
  REQUIRE(red_count > 20);
  CHECK(std::abs(red_x / red_count - px(10)) <= 2);
  CHECK(std::abs(red_y / red_count - py(0)) <= 2);
  // Tick labels: black pixels under the frame and left of it.
  int label_pixels = 0;
  for (int64_t y = 428; y < 440; ++y) {
    for (int64_t x = 60; x < 640; ++x) label_pixels += pixel(x, y) == black;
  }
  CHECK(label_pixels > 50);

  // A NaN breaks the curve: no blue between the neighbours of point 5.
  plot.y[5] = std::nan("");
  const RgbImage broken = rasterize_line_plot(plot);
  auto broken_blue = [&](int64_t x) {
    for (int64_t y = 41; y < 420; ++y) {
      const uint8_t* p = broken.pixels.data() + (y * 640 + x) * 3;
      if (p[0] == 31 && p[1] == 119 && p[2] == 180) return true;
    }
    return false;
  };
  CHECK(broken_blue(static_cast<int64_t>(px(3))));
  for (auto x = static_cast<int64_t>(px(4)) + 3; x < static_cast<int64_t>(px(6)) - 1; ++x) {
    INFO("column " << x);
    CHECK_FALSE(broken_blue(x));
  }

  LinePlot mismatched;
  mismatched.x = {1, 2};
  mismatched.y = {1};
  CHECK(testing::error_of([&] { rasterize_line_plot(mismatched); }).find("2 x values but 1 y values") !=
        std::string::npos);
  mismatched.y = {1, 2};
  mismatched.marker = 2;
  CHECK(testing::error_of([&] { rasterize_line_plot(mismatched); }).find("marker index 2 is outside the 2 points") !=
        std::string::npos);
}

TEST_CASE("log_image and log_histogram read CUDA tensors [gpu]") {
  KILN_REQUIRE_GPU();
  Scratch root("cuda");
  TensorBoardLogger logger(root.path.string());
  const Tensor host = tensor<float>({0.0f, 0.5f, 1.0f, 0.25f, 0.75f, 0.125f}, {1, 2, 3});
  logger.log_image("cuda", host.to(Device::cuda()), 1);
  logger.log_histogram("cuda", host.to(Device::cuda(), DType::f16), 2);
  const std::vector<testing::Event> events = logged_events(logger);
  REQUIRE(events.size() == 2);
  CHECK(testing::decode_png(only_image(events[0]).encoded).pixels == std::vector<uint8_t>{0, 127, 255, 63, 191, 31});
  REQUIRE(events[1].histograms.size() == 1);
  check_histogram(events[1].histograms[0], {0.0, 0.5, 1.0, 0.25, 0.75, 0.125});
}
