// Data augmentation kernels on float32 images (C, H, W): random crop with
// padding, horizontal flip, normalize, random erasing; and the row gather that
// builds a batch from a GPU-resident data set.
//
// Randomness is counter-based: the words for transform `slot` of sample
// `index` in epoch `epoch` are Philox(seed, counter = (index, epoch, slot,
// draw)). So a sample's augmentation depends on nothing but (seed, epoch,
// index): not on the worker that made it, the batch it landed in, thread
// timing, or whether it ran on the CPU or the GPU. The decisions below are
// shared by both backends; CPU kernels take one sample, CUDA kernels a batch
// (B, C, H, W) whose row b is sample indices[b] (device memory).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"
#include "kernels/philox.h"

namespace kiln::kernels {

struct AugmentKey {
  uint64_t seed;
  uint64_t epoch;
  int64_t index;  // the sample's index in the data set
  uint32_t slot;  // the transform's position in its pipeline
};

KILN_HOST_DEVICE inline philox::Uint4 augment_words(const AugmentKey& key, uint32_t draw) {
  const uint64_t high = (key.epoch << 32) | (static_cast<uint64_t>(key.slot & 0xFFFFu) << 16) | (draw & 0xFFFFu);
  return philox::philox4x32(key.seed, static_cast<uint64_t>(key.index), high);
}

// An integer in [0, n) from a 32-bit word (multiply-shift; n < 2^32).
KILN_HOST_DEVICE inline int64_t word_below(uint32_t word, int64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(word) * static_cast<uint64_t>(n)) >> 32);
}

// Top-left corner of the crop window in the padded image, each in [0, 2 * padding].
struct CropOffset {
  int64_t top, left;
};
KILN_HOST_DEVICE inline CropOffset crop_offset(const AugmentKey& key, int64_t padding) {
  philox::Uint4 words = augment_words(key, 0);
  return {word_below(words.x, 2 * padding + 1), word_below(words.y, 2 * padding + 1)};
}

KILN_HOST_DEVICE inline bool flip_decision(const AugmentKey& key, float p) {
  return philox::uniform_float(augment_words(key, 0).x) < p;
}

// torchvision's RandomErasing: with probability p, up to 10 attempts to draw a
// box of area in [scale_low, scale_high] * H * W and log aspect ratio in
// [log_ratio_low, log_ratio_high] that fits; height 0 means no erasing.
// Geometry in double so that host and device round the box alike.
struct ErasingParams {
  float p = 0.5f;
  float scale_low = 0.02f, scale_high = 0.33f;
  float log_ratio_low = -1.2039728f, log_ratio_high = 1.1939225f;  // log(0.3), log(3.3)
  float value = 0.0f;
};
struct ErasingBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};
KILN_HOST_DEVICE inline ErasingBox erasing_box(const AugmentKey& key, int64_t height, int64_t width,
                                               const ErasingParams& params) {
  ErasingBox box;
  if (!(philox::uniform_float(augment_words(key, 0).x) < params.p)) return box;
  const double area = static_cast<double>(height) * static_cast<double>(width);
  for (uint32_t attempt = 1; attempt <= 10; ++attempt) {
    philox::Uint4 words = augment_words(key, attempt);
    const double scale = params.scale_low + (static_cast<double>(params.scale_high) - params.scale_low) *
                                                static_cast<double>(philox::uniform_float(words.x));
    const double log_ratio = params.log_ratio_low + (static_cast<double>(params.log_ratio_high) - params.log_ratio_low) *
                                                        static_cast<double>(philox::uniform_float(words.y));
    const double aspect = ::exp(log_ratio);
    const auto h = static_cast<int64_t>(::rint(::sqrt(area * scale * aspect)));
    const auto w = static_cast<int64_t>(::rint(::sqrt(area * scale / aspect)));
    if (!(h < height && w < width) || h <= 0 || w <= 0) continue;
    box.top = word_below(words.z, height - h + 1);
    box.left = word_below(words.w, width - w + 1);
    box.height = h;
    box.width = w;
    return box;
  }
  return box;
}

// Normalize parameters for the device, passed by value (up to 16 channels).
constexpr int kMaxNormalizeChannels = 16;
struct NormalizeParams {
  int channels = 0;
  float mean[kMaxNormalizeChannels] = {};
  float inv_std[kMaxNormalizeChannels] = {};
};

// ---------------------------------------------------------------- CPU, one sample (C, H, W)
// Pads by `padding` with `fill` and crops H x W back at the drawn offset;
// `scratch` holds C * H * W floats.
void random_crop_cpu(float* sample, int64_t channels, int64_t height, int64_t width, int64_t padding, float fill,
                     const AugmentKey& key, float* scratch);
void horizontal_flip_cpu(float* sample, int64_t channels, int64_t height, int64_t width, float p,
                         const AugmentKey& key);
// (x - mean[c]) * inv_std[c] over planes of `plane` elements.
void normalize_cpu(float* sample, int64_t channels, int64_t plane, const float* mean, const float* inv_std);
void random_erasing_cpu(float* sample, int64_t channels, int64_t height, int64_t width, const ErasingParams& params,
                        const AugmentKey& key);

// ---------------------------------------------------------------- CUDA, a batch (B, C, H, W) in place
// `indices` (B, int64, device): the data set index of each row. `scratch`
// (device) holds B * C * H * W floats.
void random_crop_cuda(float* batch, float* scratch, int64_t batch_size, int64_t channels, int64_t height,
                      int64_t width, int64_t padding, float fill, const int64_t* indices, uint64_t seed,
                      uint64_t epoch, uint32_t slot, cuda::Stream stream);
void horizontal_flip_cuda(float* batch, int64_t batch_size, int64_t channels, int64_t height, int64_t width, float p,
                          const int64_t* indices, uint64_t seed, uint64_t epoch, uint32_t slot, cuda::Stream stream);
void normalize_cuda(float* batch, int64_t batch_size, int64_t plane, const NormalizeParams& params,
                    cuda::Stream stream);
void random_erasing_cuda(float* batch, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
                         const ErasingParams& params, const int64_t* indices, uint64_t seed, uint64_t epoch,
                         uint32_t slot, cuda::Stream stream);

// dst row b = src row indices[b] converted to dst_dtype and multiplied by
// `scale` (rows of row_numel elements). src: uint8, int32, int64 or float32;
// dst: float32, int32 or int64. Throws kiln::Error for other dtypes.
void gather_rows_cuda(const void* src, DType src_dtype, int64_t row_numel, const int64_t* indices, int64_t count,
                      void* dst, DType dst_dtype, float scale, cuda::Stream stream);

}  // namespace kiln::kernels
