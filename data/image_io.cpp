// PNG files through data/png_encode.h's encoder, written atomically.
#include "data/image_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "data/png_encode.h"
#include "kernels/error.h"

namespace kiln {

namespace {

// Writes `bytes` to a temporary file beside `path`, then renames it over `path`.
void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "write_png_grayscale: cannot create '", temporary, "' to write '", path,
             "': ", std::strerror(errno));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t count = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) {
      const std::string reason = std::strerror(errno);
      ::close(fd);
      ::unlink(temporary.c_str());
      KILN_THROW("write_png_grayscale: cannot write '", temporary, "': ", reason);
    }
    written += static_cast<size_t>(count);
  }
  if (::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    KILN_THROW("write_png_grayscale: cannot write '", temporary, "': ", reason);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    KILN_THROW("write_png_grayscale: cannot rename '", temporary, "' to '", path, "': ", reason);
  }
}

}  // namespace

void write_png_grayscale(const std::string& path, int64_t width, int64_t height, const uint8_t* pixels) {
  constexpr int64_t largest = std::numeric_limits<int32_t>::max();  // PNG sizes are 31-bit
  KILN_CHECK(width >= 1 && height >= 1 && width <= largest && height <= largest,
             "write_png_grayscale: image size ", width, "x", height, " for '", path,
             "' is invalid (each side must be in [1, 2^31 - 1])");
  KILN_CHECK(pixels != nullptr, "write_png_grayscale: pixels of the ", width, "x", height, " image for '", path,
             "' are null");
  KILN_CHECK(!path.empty(), "write_png_grayscale: the path is empty");
  write_file_atomically(path, encode_png(pixels, width, height, /*channels=*/1));
}

Tensor make_image_grid(const Tensor& images, const ImageGridOptions& options) {
  KILN_CHECK(images.defined(), "make_image_grid: the images tensor is undefined");
  const bool with_channel = images.dim() == 4;
  KILN_CHECK((with_channel && images.size(1) == 1) || images.dim() == 3,
             "make_image_grid: expected grayscale images (N, 1, H, W) or (N, H, W), got ",
             shape_str(images.shape()));
  KILN_CHECK(is_floating(images.dtype()), "make_image_grid: expected floating images, got ",
             dtype_name(images.dtype()));
  const int64_t count = images.size(0), height = images.size(-2), width = images.size(-1);
  KILN_CHECK(count >= 1 && height >= 1 && width >= 1, "make_image_grid: the batch ", shape_str(images.shape()),
             " is empty");
  KILN_CHECK(options.nrow >= 1, "make_image_grid: nrow must be >= 1, got ", options.nrow);
  KILN_CHECK(options.padding >= 0, "make_image_grid: padding must be >= 0, got ", options.padding);

  std::vector<float> values = images.detach().to(Device::cpu(), DType::f32).contiguous().to_vector<float>();
  if (options.normalize) {
    double low, high;
    if (options.value_range) {
      std::tie(low, high) = *options.value_range;
      KILN_CHECK(high > low, "make_image_grid: value_range (", low, ", ", high, ") is empty");
    } else {
      const auto [smallest, largest] = std::minmax_element(values.begin(), values.end());
      low = *smallest;
      high = *largest;
    }
    // torchvision: clamp to the range, then (x - low) / max(high - low, 1e-5).
    const double scale = 1.0 / std::max(high - low, 1e-5);
    for (float& value : values) {
      value = static_cast<float>((std::clamp(static_cast<double>(value), low, high) - low) * scale);
    }
  }

  const int64_t columns = std::min(options.nrow, count);
  const int64_t rows = (count + columns - 1) / columns;
  // In checked arithmetic: a padding near 2^63 would wrap the grid round to a few pixels that the
  // images are then written far outside of.
  int64_t cell_height = 0, cell_width = 0, grid_height = 0, grid_width = 0, grid_pixels = 0;
  const bool overflows = __builtin_add_overflow(height, options.padding, &cell_height) ||
                         __builtin_add_overflow(width, options.padding, &cell_width) ||
                         __builtin_mul_overflow(rows, cell_height, &grid_height) ||
                         __builtin_add_overflow(grid_height, options.padding, &grid_height) ||
                         __builtin_mul_overflow(columns, cell_width, &grid_width) ||
                         __builtin_add_overflow(grid_width, options.padding, &grid_width) ||
                         __builtin_mul_overflow(grid_height, grid_width, &grid_pixels);
  KILN_CHECK(!overflows, "make_image_grid: padding ", options.padding, " around ", count, " images of ", height, "x",
             width, " makes a grid too large to address");
  Tensor grid = full({1, grid_height, grid_width}, options.pad_value);  // (1, grid_height, grid_width)
  float* out = grid.data<float>();
  for (int64_t index = 0; index < count; ++index) {
    const int64_t top = (index / columns) * cell_height + options.padding;
    const int64_t left = (index % columns) * cell_width + options.padding;
    const float* image = values.data() + index * height * width;  // (H, W)
    for (int64_t y = 0; y < height; ++y) {
      std::copy_n(image + y * width, width, out + (top + y) * grid_width + left);
    }
  }
  return grid;
}

void save_image(const Tensor& images, const std::string& path, const ImageGridOptions& options) {
  Tensor grid = make_image_grid(images, options);  // (1, H', W') float32
  const int64_t height = grid.size(1), width = grid.size(2);
  const float* values = grid.data<float>();
  std::vector<uint8_t> pixels(static_cast<size_t>(height * width));
  for (size_t i = 0; i < pixels.size(); ++i) {
    // torchvision: mul(255).add_(0.5).clamp_(0, 255) then truncate to uint8.
    const float scaled = std::clamp(values[i] * 255.0f + 0.5f, 0.0f, 255.0f);
    pixels[i] = static_cast<uint8_t>(std::isnan(scaled) ? 0.0f : scaled);
  }
  write_png_grayscale(path, width, height, pixels.data());
}

}  // namespace kiln
