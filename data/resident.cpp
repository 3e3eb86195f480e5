#include "data/resident.h"

#include <cstring>

#include "kernels/transforms.h"

namespace kiln {

namespace {
Shape with_batch(int64_t count, const Shape& example) {
  Shape shape{count};
  shape.insert(shape.end(), example.begin(), example.end());
  return shape;
}
}  // namespace

ResidentData::ResidentData(const Dataset& dataset, const ExampleLayout& layout, Device device, int64_t batch_size,
                           TransformList transforms, uint64_t augment_seed)
    : layout_(layout), device_(device), transforms_(std::move(transforms)), augment_seed_(augment_seed) {
  KILN_CHECK(device.is_cuda(), "DataLoader: GPU-resident mode needs a cuda device, got ", device);
  KILN_CHECK(device.index < cuda::device_count(), "DataLoader: GPU-resident mode on ", device, ": no such device (",
             cuda::device_count(), " available",
             cuda::compiled_with_cuda() ? "" : "; kiln was built without CUDA", ")");
  std::optional<DenseData> dense = dataset.dense();
  KILN_CHECK(dense.has_value(), "DataLoader: GPU-resident mode needs a data set held in memory (Dataset::dense()); ",
             dataset.name(), " has none");
  KILN_CHECK(layout.input.dtype == DType::f32, "DataLoader: GPU-resident mode makes float32 inputs; ", dataset.name(),
             " has ", dtype_name(layout.input.dtype));
  const DType target = layout.target.dtype;
  KILN_CHECK(target == DType::f32 || target == DType::i32 || target == DType::i64,
             "DataLoader: GPU-resident mode supports float32, int32 and int64 targets; ", dataset.name(), " has ",
             dtype_name(target));
  auto readable = [](const Tensor& t) {
    const DType d = t.dtype();
    return (d == DType::u8 || d == DType::i32 || d == DType::i64 || d == DType::f32) ? t : t.to(DType::f32);
  };
  Tensor inputs = readable(dense->inputs).contiguous(), targets = readable(dense->targets).contiguous();
  KILN_CHECK(inputs.dim() >= 1 && inputs.numel() == inputs.size(0) * layout.input.numel() &&
                 targets.numel() == targets.size(0) * layout.target.numel() && inputs.size(0) == targets.size(0),
             "DataLoader: ", dataset.name(), "'s dense() data ", shape_str(inputs.shape()), " and ",
             shape_str(targets.shape()), " do not match its layout");
  inputs_ = inputs.to(device);  // once; synchronous
  targets_ = targets.to(device);
  input_scale_ = dense->input_scale;
  scratch_ = empty(with_batch(batch_size, layout.input.shape), {.dtype = DType::f32, .device = device});
}

ResidentData::~ResidentData() {
  for (auto& [pinned, event] : staging_) {
    try {
      cuda::event_synchronize(event);  // the pinned buffer must outlive its copy
      cuda::destroy_event(event);
    } catch (...) {
    }
  }
}

void ResidentData::set_order(const std::vector<int64_t>& indices) {
  // Drop staging buffers whose copies have completed (a query, not a wait).
  while (!staging_.empty() && cuda::event_query(staging_.front().second)) {
    cuda::destroy_event(staging_.front().second);
    staging_.pop_front();
  }
  const auto n = static_cast<int64_t>(indices.size());
  Tensor pinned = empty({n}, {.dtype = DType::i64, .pinned = true});
  if (n > 0) std::memcpy(pinned.data_ptr(), indices.data(), sizeof(int64_t) * indices.size());
  // Reusing the old order's block is ordered on the stream by the caching allocator.
  order_ = empty({n}, {.dtype = DType::i64, .device = device_});
  order_.copy_(pinned, /*non_blocking=*/true);
  cuda::Event done = cuda::create_event(device_.index, /*timing=*/false);
  cuda::record_event(done, cuda::current_stream(device_.index));
  staging_.emplace_back(std::move(pinned), done);
}

Batch ResidentData::batch(uint64_t epoch, int64_t start, int64_t count) {
  KILN_ASSERT(order_.defined() && start >= 0 && start + count <= order_.numel(), "ResidentData::batch: rows [", start,
              ", ", start + count, ") outside the order");
  const cuda::DeviceScope scope(device_.index, "GPU-resident batch");
  const cuda::Stream stream = scope.stream;
  const int64_t* rows = order_.data<int64_t>() + start;
  Batch batch;
  batch.input = empty(with_batch(count, layout_.input.shape), {.dtype = DType::f32, .device = device_});
  batch.target = empty(with_batch(count, layout_.target.shape), {.dtype = layout_.target.dtype, .device = device_});
  kernels::gather_rows_cuda(inputs_.data_ptr(), inputs_.dtype(), layout_.input.numel(), rows, count,
                            batch.input.data_ptr(), DType::f32, input_scale_, stream);
  kernels::gather_rows_cuda(targets_.data_ptr(), targets_.dtype(), layout_.target.numel(), rows, count,
                            batch.target.data_ptr(), layout_.target.dtype, 1.0f, stream);
  if (!transforms_.empty()) {
    apply_transforms_cuda(transforms_, batch.input.data<float>(), batch.input.shape(), rows, augment_seed_, epoch,
                          scratch_.data<float>(), stream);
  }
  return batch;
}

}  // namespace kiln
