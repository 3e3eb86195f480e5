// Image transforms for float32 examples (C, H, W) (or (H, W), one channel):
// Normalize, RandomCrop (with padding), RandomHorizontalFlip, RandomErasing.
// Each runs on the CPU, one sample at a time inside the DataLoader's workers,
// and on the GPU, a batch at a time, in GPU-resident mode.
//
// Randomness is derived from (seed, epoch, sample index, the transform's
// position in its list) with Philox (kernels/transforms.h), so an augmented
// sample is the same whatever the number of workers, the thread timing, the
// batch it lands in or the device that computed it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "kernels/transforms.h"

namespace kiln {

class Dataset;

class Transform {
 public:
  virtual ~Transform() = default;
  virtual std::string name() const = 0;
  // One sample of `shape` ((C, H, W) or (H, W)) in place; `scratch` holds as
  // many floats as the sample. Does not allocate.
  virtual void apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float* scratch) const = 0;
  // A batch of `batch_shape` ((B, C, H, W) or (B, H, W)) in device memory, in
  // place, on `stream`; indices (B, device) are the samples' data set indices,
  // `scratch` (device) holds as many floats as the batch. Does not synchronize.
  virtual void apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed,
                          uint64_t epoch, uint32_t slot, float* scratch, cuda::Stream stream) const = 0;
};

using TransformList = std::vector<std::shared_ptr<const Transform>>;

// Applies `transforms` in order to one sample; transform i uses slot i.
void apply_transforms(const TransformList& transforms, float* sample, const Shape& shape, uint64_t seed,
                      uint64_t epoch, int64_t index, float* scratch);
// The same on a device batch.
void apply_transforms_cuda(const TransformList& transforms, float* batch, const Shape& batch_shape,
                           const int64_t* indices, uint64_t seed, uint64_t epoch, float* scratch, cuda::Stream stream);

// (x - mean[c]) / std[c] per channel (torchvision's Normalize).
class Normalize : public Transform {
 public:
  // Throws kiln::Error unless mean and std have the same nonzero length and every std is > 0.
  Normalize(std::vector<float> mean, std::vector<float> stddev);
  // Per-channel mean and (population) standard deviation of every input of
  // `dataset` (float32 (C, H, W) or (H, W)); exact and fast for uint8 dense data.
  static std::shared_ptr<Normalize> fit(const Dataset& dataset);
  std::string name() const override { return "Normalize"; }
  void apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float* scratch) const override;
  void apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed, uint64_t epoch,
                  uint32_t slot, float* scratch, cuda::Stream stream) const override;
  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& std() const { return std_; }

 private:
  std::vector<float> mean_, std_, inv_std_;
};

// Pads every side by `padding` pixels of `fill`, then crops a window of the
// original size at a random offset (torchvision's RandomCrop(size, padding)
// with size = the input size).
class RandomCrop : public Transform {
 public:
  explicit RandomCrop(int64_t padding, float fill = 0.0f);
  std::string name() const override { return "RandomCrop"; }
  void apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float* scratch) const override;
  void apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed, uint64_t epoch,
                  uint32_t slot, float* scratch, cuda::Stream stream) const override;

 private:
  int64_t padding_;
  float fill_;
};

// Mirrors left-right with probability p.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(float p = 0.5f);
  std::string name() const override { return "RandomHorizontalFlip"; }
  void apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float* scratch) const override;
  void apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed, uint64_t epoch,
                  uint32_t slot, float* scratch, cuda::Stream stream) const override;

 private:
  float p_;
};

// torchvision's RandomErasing: with probability p, sets a random box of area
// scale * H * W and aspect ratio in `ratio` to `value` (place it after Normalize).
class RandomErasing : public Transform {
 public:
  RandomErasing(float p = 0.5f, float scale_low = 0.02f, float scale_high = 0.33f, float ratio_low = 0.3f,
                float ratio_high = 3.3f, float value = 0.0f);
  std::string name() const override { return "RandomErasing"; }
  void apply(float* sample, const Shape& shape, const kernels::AugmentKey& key, float* scratch) const override;
  void apply_cuda(float* batch, const Shape& batch_shape, const int64_t* indices, uint64_t seed, uint64_t epoch,
                  uint32_t slot, float* scratch, cuda::Stream stream) const override;

 private:
  kernels::ErasingParams params_;
};

}  // namespace kiln
