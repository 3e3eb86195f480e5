// CPU augmentation kernels: one float32 sample (C, H, W) at a time; the
// DataLoader's workers run them in parallel across samples. Invariant: the
// result depends only on the sample and its AugmentKey (see transforms.h).
#include "kernels/transforms.h"

#include <algorithm>
#include <cstring>

namespace kiln::kernels {

void random_crop_cpu(float* sample, int64_t channels, int64_t height, int64_t width, int64_t padding, float fill,
                     const AugmentKey& key, float* scratch) {
  if (padding == 0) return;  // the only window of an unpadded image is the image
  const CropOffset offset = crop_offset(key, padding);
  const int64_t dy = offset.top - padding, dx = offset.left - padding;  // source = output + (dy, dx)
  // Columns of the output that read inside the source: [x0, x1).
  const int64_t x0 = std::clamp<int64_t>(-dx, 0, width), x1 = std::clamp<int64_t>(width - dx, 0, width);
  for (int64_t c = 0; c < channels; ++c) {
    const float* in = sample + c * height * width;  // (H, W)
    float* out = scratch + c * height * width;      // (H, W)
    for (int64_t y = 0; y < height; ++y) {
      float* row = out + y * width;
      const int64_t source_y = y + dy;
      if (source_y < 0 || source_y >= height) {
        std::fill(row, row + width, fill);
        continue;
      }
      std::fill(row, row + x0, fill);
      if (x1 > x0) std::memcpy(row + x0, in + source_y * width + x0 + dx, sizeof(float) * (x1 - x0));
      std::fill(row + std::max(x0, x1), row + width, fill);
    }
  }
  std::memcpy(sample, scratch, sizeof(float) * channels * height * width);
}

void horizontal_flip_cpu(float* sample, int64_t channels, int64_t height, int64_t width, float p,
                         const AugmentKey& key) {
  if (!flip_decision(key, p)) return;
  for (int64_t row = 0; row < channels * height; ++row) std::reverse(sample + row * width, sample + (row + 1) * width);
}

void normalize_cpu(float* sample, int64_t channels, int64_t plane, const float* mean, const float* inv_std) {
  for (int64_t c = 0; c < channels; ++c) {
    float* values = sample + c * plane;
    const float m = mean[c], s = inv_std[c];
    for (int64_t i = 0; i < plane; ++i) values[i] = (values[i] - m) * s;
  }
}

void random_erasing_cpu(float* sample, int64_t channels, int64_t height, int64_t width, const ErasingParams& params,
                        const AugmentKey& key) {
  const ErasingBox box = erasing_box(key, height, width, params);
  if (box.height == 0) return;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t y = box.top; y < box.top + box.height; ++y) {
      float* row = sample + (c * height + y) * width + box.left;
      std::fill(row, row + box.width, params.value);
    }
  }
}

}  // namespace kiln::kernels
