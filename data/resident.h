// GPU-resident data for the DataLoader: the whole data set (Dataset::dense())
// lives on the device; a batch is a gather of rows by the epoch's order
// (uploaded once per epoch, without synchronizing), a conversion to the
// layout's dtypes and the transforms' device kernels, all on the current
// stream: no host work per step beyond the launches.
#pragma once

#include <deque>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"

namespace kiln {

class ResidentData {
 public:
  // Uploads dense() (synchronous, once). Throws kiln::Error when the data set
  // has no dense() data, the device is unavailable, or a dtype is unsupported.
  ResidentData(const Dataset& dataset, const ExampleLayout& layout, Device device, int64_t batch_size,
               TransformList transforms, uint64_t augment_seed);
  ~ResidentData();
  ResidentData(const ResidentData&) = delete;
  ResidentData& operator=(const ResidentData&) = delete;

  // Uploads an epoch's order (asynchronously, from pinned memory).
  void set_order(const std::vector<int64_t>& indices);
  // Rows [start, start + count) of the current order, augmented for `epoch`.
  Batch batch(uint64_t epoch, int64_t start, int64_t count);
  void set_seed(uint64_t augment_seed) { augment_seed_ = augment_seed; }

 private:
  ExampleLayout layout_;
  Device device_;
  TransformList transforms_;
  uint64_t augment_seed_;
  Tensor inputs_, targets_;  // (N, ...) on the device
  float input_scale_ = 1.0f;
  Tensor order_;             // (num_samples) int64 on the device
  Tensor scratch_;           // (batch_size, ...input) float32 on the device
  // Pinned staging of uploaded orders, kept until their copy has completed.
  std::deque<std::pair<Tensor, cuda::Event>> staging_;
};

}  // namespace kiln
