// Recycled host buffers for batches. A buffer holds one batch's inputs and
// targets (pinned or pageable); the batch's tensors share it, and it returns
// to its pool when the last of them is gone, so steady iteration neither
// allocates (pinned allocation costs milliseconds) nor faults in new pages.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "data/dataset.h"

namespace kiln {

class BatchBufferPool;

// A buffer being filled; returns to the pool if dropped before finish().
class BatchBuffer {
 public:
  BatchBuffer(std::shared_ptr<BatchBufferPool> pool, void* block);
  BatchBuffer(BatchBuffer&& other) noexcept;
  BatchBuffer(const BatchBuffer&) = delete;
  BatchBuffer& operator=(const BatchBuffer&) = delete;
  BatchBuffer& operator=(BatchBuffer&&) = delete;
  ~BatchBuffer();

  void* input() const;   // batch_size examples of layout.input, contiguous
  void* target() const;  // batch_size examples of layout.target, contiguous
  // The first `count` examples as a Batch whose tensors own the buffer.
  Batch finish(int64_t count) &&;

 private:
  std::shared_ptr<BatchBufferPool> pool_;
  void* block_;
};

class BatchBufferPool : public std::enable_shared_from_this<BatchBufferPool> {
 public:
  // Keeps at most `max_free` idle buffers (more are freed when returned).
  BatchBufferPool(const ExampleLayout& layout, int64_t batch_size, bool pinned, size_t max_free);
  ~BatchBufferPool();
  BatchBufferPool(const BatchBufferPool&) = delete;
  BatchBufferPool& operator=(const BatchBufferPool&) = delete;

  // A free buffer, or a new one; throws OutOfMemoryError when none can be had.
  BatchBuffer acquire();
  bool pinned() const { return pinned_; }
  size_t buffers_created() const;

 private:
  friend class BatchBuffer;
  void release(void* block);
  void free_block(void* block) const;

  ExampleLayout layout_;
  bool pinned_;
  size_t max_free_;
  size_t target_offset_, block_bytes_;
  mutable std::mutex mutex_;
  std::vector<void*> free_;
  size_t created_ = 0;
};

}  // namespace kiln
