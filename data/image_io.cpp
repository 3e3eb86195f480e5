// PNG layout (RFC 2083): the 8-byte signature, then chunks of [length (4,
// big-endian), type (4), data, CRC-32 of type + data]. IHDR holds width,
// height, bit depth 8, colour type 0 (grayscale); IDAT holds the zlib stream
// of every row prefixed by its filter byte (0: none); IEND closes the file.
#include "data/image_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/error.h"

namespace kiln {

namespace {

void append_u32(std::vector<uint8_t>& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

void append_chunk(std::vector<uint8_t>& out, const char (&type)[5], const std::vector<uint8_t>& data) {
  append_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  // The CRC covers the type and the data, not the length.
  const uLong crc = ::crc32(0L, out.data() + type_start, static_cast<uInt>(out.size() - type_start));
  append_u32(out, static_cast<uint32_t>(crc));
}

std::vector<uint8_t> encode_png(int64_t width, int64_t height, const uint8_t* pixels) {
  std::vector<uint8_t> ihdr;
  append_u32(ihdr, static_cast<uint32_t>(width));
  append_u32(ihdr, static_cast<uint32_t>(height));
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});  // bit depth 8, grayscale, deflate, filter set 0, no interlace

  const size_t row_bytes = static_cast<size_t>(width) + 1;
  std::vector<uint8_t> rows(row_bytes * static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) {
    uint8_t* row = rows.data() + static_cast<size_t>(y) * row_bytes;
    row[0] = 0;  // filter: none
    std::memcpy(row + 1, pixels + static_cast<size_t>(y) * static_cast<size_t>(width), static_cast<size_t>(width));
  }
  uLongf compressed_size = ::compressBound(static_cast<uLong>(rows.size()));
  std::vector<uint8_t> idat(compressed_size);
  const int status = ::compress2(idat.data(), &compressed_size, rows.data(), static_cast<uLong>(rows.size()),
                                 Z_DEFAULT_COMPRESSION);
  KILN_CHECK(status == Z_OK, "write_png_grayscale: zlib compress2 failed with status ", status, " for a ", width,
             "x", height, " image");
  idat.resize(compressed_size);

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  append_chunk(png, "IHDR", ihdr);
  append_chunk(png, "IDAT", idat);
  append_chunk(png, "IEND", {});
  return png;
}

// Writes `bytes` to a temporary file beside `path`, then renames it over `path`.
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
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
  write_file_atomically(path, encode_png(width, height, pixels));
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
  const int64_t cell_height = height + options.padding, cell_width = width + options.padding;
  const int64_t grid_height = rows * cell_height + options.padding;
  const int64_t grid_width = columns * cell_width + options.padding;
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
