// Images out: an 8-bit grayscale PNG writer (zlib deflate, CRC-32 per chunk)
// and torchvision's make_grid / save_image for (N, 1, H, W) batches, so a
// generative model's samples can be looked at in any image viewer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "core/tensor.h"

namespace kiln {

// Writes `pixels` (height rows of width bytes, row-major, 0 black .. 255
// white) as an 8-bit grayscale PNG. Atomic: written to a temporary file beside
// `path` and renamed over it, so a reader never sees a partial image. Throws
// kiln::Error for a size below 1 or above 2^31 - 1, null pixels, or a path that
// cannot be written (naming the path and the reason).
void write_png_grayscale(const std::string& path, int64_t width, int64_t height, const uint8_t* pixels);

// torchvision.utils.make_grid's arguments and defaults.
struct ImageGridOptions {
  int64_t nrow = 8;     // images per row
  int64_t padding = 2;  // pixels between images and around the grid
  // Shift and scale into [0, 1] using value_range, or the min and max of the
  // batch when value_range is absent (e.g. value_range {-1, 1} for tanh outputs).
  bool normalize = false;
  std::optional<std::pair<double, double>> value_range;
  double pad_value = 0.0;
};

// Tiles images (N, 1, H, W) or (N, H, W) (any device, any floating dtype) into
// one float32 CPU image (1, ymaps * (H + padding) + padding, xmaps * (W +
// padding) + padding) with xmaps = min(nrow, N), ymaps = ceil(N / xmaps), as
// torchvision.utils.make_grid (which keeps one channel for grayscale here).
// Throws kiln::Error for other shapes, an empty batch, nrow < 1, padding < 0
// or an empty value_range. Synchronizes the device (copies to the host).
Tensor make_image_grid(const Tensor& images, const ImageGridOptions& options = {});

// make_image_grid, then values in [0, 1] to bytes as torchvision.utils.save_image
// (x * 255 + 0.5, clamped to [0, 255]), then write_png_grayscale.
void save_image(const Tensor& images, const std::string& path, const ImageGridOptions& options = {});

}  // namespace kiln
