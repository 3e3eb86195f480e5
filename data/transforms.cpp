#include "data/transforms.h"

#include <cmath>

#include "data/dataset.h"

namespace kiln {

namespace {

struct Image {
  int64_t channels, height, width;
};

// (C, H, W) or (H, W) -> C, H, W.
Image image_of(const Shape& shape, const char* op) {
  KILN_CHECK(shape.size() == 2 || shape.size() == 3, op, ": expected a sample of shape (C, H, W) or (H, W), got ",
             shape_str(shape));
  if (shape.size() == 2) return {1, shape[0], shape[1]};
  return {shape[0], shape[1], shape[2]};
}

// (B, C, H, W) or (B, H, W) -> B and the sample's image.
std::pair<int64_t, Image> batch_of(const Shape& shape, const char* op) {
  KILN_CHECK(shape.size() == 3 || shape.size() == 4, op, ": expected a batch of shape (B, C, H, W) or (B, H, W), got ",
             shape_str(shape));
  return {shape[0], image_of(Shape(shape.begin() + 1, shape.end()), op)};
}

}  // namespace

void apply_transforms(const TransformList& transforms, float* sample, const Shape& shape, uint64_t seed,
                      uint64_t epoch, int64_t index, float* scratch) {
  for (size_t slot = 0; slot < transforms.size(); ++slot) {
    transforms[slot]->apply(sample, shape, kernels::AugmentKey{seed, epoch, index, static_cast<uint32_t>(slot)},
                            scratch);
  }
}

void apply_transforms_cuda(const TransformList& transforms, float* batch, const Shape& batch_shape,
                           const int64_t* indices, uint64_t seed, uint64_t epoch, float* scratch, cuda::Stream stream) {
  for (size_t slot = 0; slot < transforms.size(); ++slot) {
    transforms[slot]->apply_cuda(batch, batch_shape, indices, seed, epoch, static_cast<uint32_t>(slot), scratch, stream);
  }
}

// ---------------------------------------------------------------- Normalize

Normalize::Normalize(std::vector<float> mean, std::vector<float> stddev)
    : mean_(std::move(mean)), std_(std::move(stddev)) {
  KILN_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: mean and std need the same nonzero length, got ",
             mean_.size(), " and ", std_.size());
  for (float s : std_) {
    KILN_CHECK(s > 0.0f && std::isfinite(s), "Normalize: every std must be positive and finite, got ", s);
    inv_std_.push_back(1.0f / s);
  }
}

std::shared_ptr<Normalize> Normalize::fit(const Dataset& dataset) {
  const ExampleLayout layout = dataset.layout();
  KILN_CHECK(layout.input.dtype == DType::f32, "Normalize::fit: expected float32 inputs, ", dataset.name(), " has ",
             dtype_name(layout.input.dtype));
  const Image image = image_of(layout.input.shape, "Normalize::fit");
  const int64_t n = dataset.size(), plane = image.height * image.width;
  KILN_CHECK(n > 0, "Normalize::fit: ", dataset.name(), " is empty");
  std::vector<double> sum(image.channels, 0.0), sum_squares(image.channels, 0.0);
  std::optional<DenseData> dense = dataset.dense();
  if (dense && dense->inputs.dtype() == DType::u8) {
    // Exact: a histogram of the 256 byte values per channel.
    std::vector<std::vector<int64_t>> histogram(image.channels, std::vector<int64_t>(256, 0));
    const uint8_t* bytes = dense->inputs.data<uint8_t>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < image.channels; ++c) {
        const uint8_t* values = bytes + (i * image.channels + c) * plane;
        for (int64_t k = 0; k < plane; ++k) ++histogram[c][values[k]];
      }
    }
    for (int64_t c = 0; c < image.channels; ++c) {
      for (int v = 0; v < 256; ++v) {
        const double x = v * static_cast<double>(dense->input_scale);
        sum[c] += histogram[c][v] * x;
        sum_squares[c] += histogram[c][v] * x * x;
      }
    }
  } else {
    std::vector<float> input(static_cast<size_t>(layout.input.numel()));
    std::vector<unsigned char> target(layout.target.nbytes() + 1);
    for (int64_t i = 0; i < n; ++i) {
      dataset.get_into(i, input.data(), target.data());
      for (int64_t c = 0; c < image.channels; ++c) {
        double s = 0.0, s2 = 0.0;
        for (int64_t k = 0; k < plane; ++k) {
          const double x = input[c * plane + k];
          s += x;
          s2 += x * x;
        }
        sum[c] += s;
        sum_squares[c] += s2;
      }
    }
  }
  std::vector<float> means(image.channels), stddevs(image.channels);
  const double count = static_cast<double>(n) * plane;
  for (int64_t c = 0; c < image.channels; ++c) {
    const double m = sum[c] / count;
    means[c] = static_cast<float>(m);
    stddevs[c] = static_cast<float>(std::sqrt(std::max(sum_squares[c] / count - m * m, 0.0)));
    KILN_CHECK(stddevs[c] > 0.0f, "Normalize::fit: channel ", c, " of ", dataset.name(),
               " is constant (std 0); it cannot be normalized");
  }
  return std::make_shared<Normalize>(std::move(means), std::move(stddevs));
}

void Normalize::apply(float* sample, const Shape& shape, const kernels::AugmentKey&, float*) const {
  const Image image = image_of(shape, "Normalize");
  KILN_CHECK(image.channels == static_cast<int64_t>(mean_.size()), "Normalize: ", mean_.size(),
             " channel statistics for a sample of shape ", shape_str(shape));
  kernels::normalize_cpu(sample, image.channels, image.height * image.width, mean_.data(), inv_std_.data());
}

void Normalize::apply_cuda(float* batch, const Shape& batch_shape, const int64_t*, uint64_t, uint64_t, uint32_t,
                           float*, cuda::Stream stream) const {
  const auto [batch_size, image] = batch_of(batch_shape, "Normalize");
  KILN_CHECK(image.channels == static_cast<int64_t>(mean_.size()), "Normalize: ", mean_.size(),
             " channel statistics for a batch of shape ", shape_str(batch_shape));
  KILN_CHECK(image.channels <= kernels::kMaxNormalizeChannels, "Normalize: the GPU path supports up to ",
             kernels::kMaxNormalizeChannels, " channels, got ", image.channels);
  kernels::NormalizeParams params;
  params.channels = static_cast<int>(image.channels);
  for (int64_t c = 0; c < image.channels; ++c) {
    params.mean[c] = mean_[c];
    params.inv_std[c] = inv_std_[c];
  }
  kernels::normalize_cuda(batch, batch_size, image.height * image.width, params, stream);
}

// ---------------------------------------------------------------- RandomCrop

RandomCrop::RandomCrop(int64_t padding, float fill) : padding_(padding), fill_(fill) {
  KILN_CHECK(padding >= 0, "RandomCrop: padding must be >= 0, got ", padding);
}

void RandomCrop::apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float* scratch) const {
  const Image image = image_of(shape, "RandomCrop");
  kernels::random_crop_cpu(sample, image.channels, image.height, image.width, padding_, fill_, key, scratch);
}

void RandomCrop::apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed,
                            uint64_t epoch, uint32_t slot, float* scratch, cuda::Stream stream) const {
  const auto [batch_size, image] = batch_of(batch_shape, "RandomCrop");
  kernels::random_crop_cuda(batch, scratch, batch_size, image.channels, image.height, image.width, padding_, fill_,
                            indices, seed, epoch, slot, stream);
}

// ---------------------------------------------------------------- RandomHorizontalFlip

RandomHorizontalFlip::RandomHorizontalFlip(float p) : p_(p) {
  KILN_CHECK(p >= 0.0f && p <= 1.0f, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

void RandomHorizontalFlip::apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float*) const {
  const Image image = image_of(shape, "RandomHorizontalFlip");
  kernels::horizontal_flip_cpu(sample, image.channels, image.height, image.width, p_, key);
}

void RandomHorizontalFlip::apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed,
                                      uint64_t epoch, uint32_t slot, float*, cuda::Stream stream) const {
  const auto [batch_size, image] = batch_of(batch_shape, "RandomHorizontalFlip");
  kernels::horizontal_flip_cuda(batch, batch_size, image.channels, image.height, image.width, p_, indices, seed, epoch,
                                slot, stream);
}

// ---------------------------------------------------------------- RandomErasing

RandomErasing::RandomErasing(float p, float scale_low, float scale_high, float ratio_low, float ratio_high,
                             float value) {
  KILN_CHECK(p >= 0.0f && p <= 1.0f, "RandomErasing: p must be in [0, 1], got ", p);
  KILN_CHECK(scale_low > 0.0f && scale_low <= scale_high && scale_high <= 1.0f,
             "RandomErasing: expected 0 < scale_low <= scale_high <= 1, got (", scale_low, ", ", scale_high, ")");
  KILN_CHECK(ratio_low > 0.0f && ratio_low <= ratio_high, "RandomErasing: expected 0 < ratio_low <= ratio_high, got (",
             ratio_low, ", ", ratio_high, ")");
  params_.p = p;
  params_.scale_low = scale_low;
  params_.scale_high = scale_high;
  params_.log_ratio_low = std::log(ratio_low);
  params_.log_ratio_high = std::log(ratio_high);
  params_.value = value;
}

void RandomErasing::apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float*) const {
  const Image image = image_of(shape, "RandomErasing");
  kernels::random_erasing_cpu(sample, image.channels, image.height, image.width, params_, key);
}

void RandomErasing::apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed,
                               uint64_t epoch, uint32_t slot, float*, cuda::Stream stream) const {
  const auto [batch_size, image] = batch_of(batch_shape, "RandomErasing");
  kernels::random_erasing_cuda(batch, batch_size, image.channels, image.height, image.width, params_, indices, seed,
                               epoch, slot, stream);
}

}  // namespace kiln
