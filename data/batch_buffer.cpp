#include "data/batch_buffer.h"

#include <cstdlib>

#include "kernels/cuda/runtime.h"

namespace kiln {

namespace {
size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

Shape batch_shape(int64_t count, const Shape& example) {
  Shape shape{count};
  shape.insert(shape.end(), example.begin(), example.end());
  return shape;
}
}  // namespace

BatchBuffer::BatchBuffer(std::shared_ptr<BatchBufferPool> pool, void* block) : pool_(std::move(pool)), block_(block) {}

BatchBuffer::BatchBuffer(BatchBuffer&& other) noexcept : pool_(std::move(other.pool_)), block_(other.block_) {
  other.block_ = nullptr;
}

BatchBuffer::~BatchBuffer() {
  if (block_ != nullptr) pool_->release(block_);
}

void* BatchBuffer::input() const { return block_; }
void* BatchBuffer::target() const { return static_cast<char*>(block_) + pool_->target_offset_; }

Batch BatchBuffer::finish(int64_t count) && {
  // One lease shared by both tensors: the block goes back when both are gone.
  std::shared_ptr<void> lease(block_, [pool = pool_](void* block) { pool->release(block); });
  block_ = nullptr;
  const ExampleLayout& layout = pool_->layout_;
  Batch batch;
  batch.input = from_blob(lease.get(), batch_shape(count, layout.input.shape), layout.input.dtype, Device::cpu(),
                          [lease](void*) {});
  batch.target = from_blob(static_cast<char*>(lease.get()) + pool_->target_offset_,
                           batch_shape(count, layout.target.shape), layout.target.dtype, Device::cpu(),
                           [lease](void*) {});
  return batch;
}

BatchBufferPool::BatchBufferPool(const ExampleLayout& layout, int64_t batch_size, bool pinned, size_t max_free)
    : layout_(layout), pinned_(pinned), max_free_(max_free) {
  target_offset_ = align64(layout.input.nbytes() * static_cast<size_t>(batch_size));
  block_bytes_ = std::max<size_t>(align64(target_offset_ + layout.target.nbytes() * static_cast<size_t>(batch_size)), 64);
}

BatchBufferPool::~BatchBufferPool() {
  for (void* block : free_) free_block(block);
}

void BatchBufferPool::free_block(void* block) const {
  if (pinned_) {
    cuda::host_free_pinned(block);
  } else {
    std::free(block);
  }
}

BatchBuffer BatchBufferPool::acquire() {
  void* block = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      block = free_.back();
      free_.pop_back();
    } else {
      ++created_;
    }
  }
  if (block == nullptr) {
    block = pinned_ ? cuda::host_alloc_pinned(block_bytes_) : std::aligned_alloc(64, block_bytes_);
    if (block == nullptr) {
      throw OutOfMemoryError(detail::concat("DataLoader: out of ", pinned_ ? "pinned " : "", "host memory for a ",
                                            block_bytes_, "-byte batch buffer"),
                             __FILE__, __LINE__);
    }
  }
  return BatchBuffer(shared_from_this(), block);
}

void BatchBufferPool::release(void* block) {
  {
    std::lock_guard lock(mutex_);
    if (free_.size() < max_free_) {
      free_.push_back(block);
      return;
    }
  }
  free_block(block);
}

size_t BatchBufferPool::buffers_created() const {
  std::lock_guard lock(mutex_);
  return created_;
}

}  // namespace kiln
