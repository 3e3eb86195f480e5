// data/image_io: PNGs that a strict, independent reader accepts pixel for
// pixel; make_image_grid's layout and normalization as torchvision's
// make_grid; bad input refused with a kiln::Error that names the problem.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/ops.h"
#include "data/image_io.h"
#include "kernels/error.h"
#include "tests/support/png_reader.h"

using namespace kiln;
using doctest::Contains;
namespace fs = std::filesystem;

namespace {

// An empty folder under /tmp, removed when the test case ends (failed checks included).
struct ScratchFolder {
  fs::path path;
  explicit ScratchFolder(const std::string& name)
      : path(fs::temp_directory_path() / ("kiln_image_io_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchFolder() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
};

// Every byte value somewhere, in a non-square image so that swapped sides show.
std::vector<uint8_t> gradient(int64_t width, int64_t height) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 37 + i / 7) % 256);
  return pixels;
}

}  // namespace

TEST_CASE("write_png_grayscale writes a PNG that reads back pixel for pixel") {
  const ScratchFolder scratch("roundtrip");
  const fs::path& folder = scratch.path;
  const fs::path path = folder / "gradient.png";
  const int64_t width = 61, height = 23;
  const std::vector<uint8_t> pixels = gradient(width, height);
  write_png_grayscale(path.string(), width, height, pixels.data());

  const testing::PngImage image = testing::read_png(path.string());
  CHECK(image.width == width);
  CHECK(image.height == height);
  CHECK(image.bit_depth == 8);
  CHECK(image.color_type == 0);
  CHECK(image.chunk_types == std::vector<std::string>{"IHDR", "IDAT", "IEND"});
  CHECK(image.pixels == pixels);
  // The temporary file was renamed, not left behind.
  CHECK(std::distance(fs::directory_iterator(folder), fs::directory_iterator()) == 1);

  // A second write replaces the first whole.
  const std::vector<uint8_t> black(3 * 2, 0);
  write_png_grayscale(path.string(), 3, 2, black.data());
  const testing::PngImage replaced = testing::read_png(path.string());
  CHECK(replaced.width == 3);
  CHECK(replaced.pixels == black);
}

TEST_CASE("the PNG reader catches a corrupted file (so the round trip can fail)") {
  const ScratchFolder scratch("corrupt");
  const fs::path& folder = scratch.path;
  const fs::path path = folder / "small.png";
  const std::vector<uint8_t> pixels = gradient(4, 4);
  write_png_grayscale(path.string(), 4, 4, pixels.data());
  std::vector<uint8_t> bytes = testing::read_png(path.string()).pixels;
  REQUIRE(bytes == pixels);
  std::ifstream file(path, std::ios::binary);
  std::vector<uint8_t> raw((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  raw[20] ^= 0x01;  // inside IHDR's width: the chunk's CRC no longer matches
  CHECK_THROWS_WITH_AS(testing::parse_png(raw), Contains("CRC mismatch in chunk IHDR"), std::runtime_error);
}

TEST_CASE("write_png_grayscale refuses bad sizes, null pixels and unwritable paths") {
  const ScratchFolder scratch("refused");
  const fs::path& folder = scratch.path;
  const std::string path = (folder / "x.png").string();
  const std::vector<uint8_t> pixels(16, 7);
  CHECK_THROWS_WITH_AS(write_png_grayscale(path, 0, 4, pixels.data()), Contains("image size 0x4"), Error);
  CHECK_THROWS_WITH_AS(write_png_grayscale(path, 4, -1, pixels.data()), Contains("image size 4x-1"), Error);
  CHECK_THROWS_WITH_AS(write_png_grayscale(path, int64_t{1} << 31, 1, pixels.data()), Contains("is invalid"), Error);
  CHECK_THROWS_WITH_AS(write_png_grayscale(path, 4, 4, nullptr), Contains("are null"), Error);
  CHECK(fs::is_empty(folder));

  const std::string unwritable = (folder / "no_such_folder" / "x.png").string();
  CHECK_THROWS_WITH_AS(write_png_grayscale(unwritable, 4, 4, pixels.data()),
                       Contains(("cannot create '" + unwritable + ".tmp.").c_str()), Error);
  CHECK_THROWS_WITH_AS(write_png_grayscale(unwritable, 4, 4, pixels.data()), Contains("No such file or directory"),
                       Error);
  // A folder in the way of the rename: the temporary file is cleaned up.
  fs::create_directories(folder / "taken.png" / "inside");
  CHECK_THROWS_WITH_AS(write_png_grayscale((folder / "taken.png").string(), 4, 4, pixels.data()),
                       Contains("cannot rename"), Error);
  CHECK(std::distance(fs::directory_iterator(folder), fs::directory_iterator()) == 1);
}

TEST_CASE("make_image_grid tiles images as torchvision's make_grid") {
  // Three 2x3 images, image i filled with i + 1 and its pixel (y, x) adding y * 0.1 + x * 0.01.
  const int64_t count = 3, height = 2, width = 3;
  std::vector<float> values;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t y = 0; y < height; ++y) {
      for (int64_t x = 0; x < width; ++x) values.push_back(static_cast<float>(i + 1 + y * 0.1 + x * 0.01));
    }
  }
  const Tensor images = tensor(values, {count, 1, height, width});
  ImageGridOptions options;
  options.nrow = 2;
  options.padding = 1;
  options.pad_value = -5;
  const Tensor grid = make_image_grid(images, options);
  // xmaps = min(nrow, N) = 2, ymaps = ceil(3 / 2) = 2.
  const int64_t grid_height = 2 * (height + 1) + 1, grid_width = 2 * (width + 1) + 1;
  REQUIRE(grid.shape() == Shape{1, grid_height, grid_width});
  CHECK(grid.dtype() == DType::f32);
  const std::vector<float> out = grid.to_vector<float>();
  for (int64_t gy = 0; gy < grid_height; ++gy) {
    for (int64_t gx = 0; gx < grid_width; ++gx) {
      INFO("grid pixel (" << gy << ", " << gx << ")");
      const int64_t row = gy / (height + 1), column = gx / (width + 1);
      const int64_t y = gy % (height + 1) - 1, x = gx % (width + 1) - 1;  // -1: the padding line
      const int64_t index = row * 2 + column;
      const bool in_image = y >= 0 && x >= 0 && gy < grid_height - 1 && gx < grid_width - 1 && index < count;
      const float expected = in_image ? values[static_cast<size_t>((index * height + y) * width + x)] : -5.0f;
      CHECK(out[static_cast<size_t>(gy * grid_width + gx)] == doctest::Approx(expected));
    }
  }
  // (N, H, W) is the same layout.
  CHECK(make_image_grid(images.view({count, height, width}), options).to_vector<float>() == out);
}

TEST_CASE("make_image_grid normalizes with value_range, or with the batch's min and max") {
  const Tensor images = tensor(std::vector<float>{-1.0f, 0.0f, 1.0f, 3.0f}, {1, 1, 2, 2});
  ImageGridOptions options;
  options.padding = 0;
  options.normalize = true;
  options.value_range = std::make_pair(-1.0, 1.0);
  std::vector<float> out = make_image_grid(images, options).to_vector<float>();
  CHECK(out == std::vector<float>{0.0f, 0.5f, 1.0f, 1.0f});  // 3 is clamped to the range
  options.value_range.reset();
  out = make_image_grid(images, options).to_vector<float>();
  CHECK(out[0] == doctest::Approx(0.0));
  CHECK(out[1] == doctest::Approx(0.25));
  CHECK(out[3] == doctest::Approx(1.0));
}

TEST_CASE("save_image writes torchvision's bytes for [-1, 1] samples") {
  const ScratchFolder scratch("save");
  const fs::path& folder = scratch.path;
  const fs::path path = folder / "samples.png";
  const Tensor images = tensor(std::vector<float>{-1.0f, -0.5f, 0.0f, 1.0f, 0.25f, 2.0f}, {2, 1, 1, 3});
  ImageGridOptions options;
  options.normalize = true;
  options.value_range = std::make_pair(-1.0, 1.0);
  options.padding = 1;
  save_image(images, path.string(), options);
  const testing::PngImage image = testing::read_png(path.string());
  REQUIRE(image.width == 2 * 4 + 1);
  REQUIRE(image.height == 3);
  // Row 1 holds the pixels; x -> (x + 1) / 2 -> * 255 + 0.5, truncated.
  auto byte_of = [](float x) { return static_cast<uint8_t>((x + 1.0f) / 2.0f * 255.0f + 0.5f); };
  const std::vector<uint8_t> middle(image.pixels.begin() + 9, image.pixels.begin() + 18);
  CHECK(middle == std::vector<uint8_t>{0, byte_of(-1), byte_of(-0.5f), byte_of(0), 0, byte_of(1), byte_of(0.25f),
                                       byte_of(1), 0});
  CHECK(middle[3] == 128);
}

TEST_CASE("make_image_grid refuses colour, empty batches and bad options") {
  CHECK_THROWS_WITH_AS(make_image_grid(zeros({2, 3, 4, 4})), Contains("grayscale images (N, 1, H, W)"), Error);
  CHECK_THROWS_WITH_AS(make_image_grid(zeros({2, 3, 4, 4})), Contains("[2, 3, 4, 4]"), Error);
  CHECK_THROWS_WITH_AS(make_image_grid(zeros({0, 1, 4, 4})), Contains("is empty"), Error);
  CHECK_THROWS_WITH_AS(make_image_grid(zeros({2, 1, 4, 4}, {.dtype = DType::u8})), Contains("floating"), Error);
  CHECK_THROWS_WITH_AS(make_image_grid(zeros({2, 1, 4, 4}), ImageGridOptions{.nrow = 0}), Contains("nrow"), Error);
  ImageGridOptions empty_range;
  empty_range.normalize = true;
  empty_range.value_range = std::make_pair(1.0, 1.0);
  CHECK_THROWS_WITH_AS(make_image_grid(zeros({2, 1, 4, 4}), empty_range), Contains("value_range"), Error);
}
