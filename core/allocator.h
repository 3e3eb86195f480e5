// Memory for tensors. CPU memory is 64-byte aligned; pinned host memory comes
// from cudaHostAlloc; CUDA memory from a caching allocator so that steady
// training does no cudaMalloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/device.h"
#include "kernels/cuda/runtime.h"

namespace kiln {

// 64-byte-aligned host memory; throws OutOfMemoryError when none is left.
std::shared_ptr<void> allocate_cpu(size_t bytes);
// Page-locked host memory; throws when CUDA is off, OutOfMemoryError when none is left.
std::shared_ptr<void> allocate_pinned(size_t bytes);
// Device memory from the caching allocator of `device`, associated with `stream`.
std::shared_ptr<void> allocate_cuda(size_t bytes, int device, cuda::Stream stream);

// Source of raw device memory. The real one calls cudaMalloc/cudaFree; tests
// substitute a fake to drive the caching logic and the OOM path without a GPU.
struct RawDeviceMemory {
  virtual ~RawDeviceMemory() = default;
  virtual void* allocate(size_t bytes) = 0;  // nullptr when out of memory
  virtual void release(void* pointer) = 0;
};

struct AllocatorStats {
  size_t allocated_bytes = 0;       // in live blocks handed out
  size_t reserved_bytes = 0;        // obtained from the device (live + cached)
  size_t peak_allocated_bytes = 0;  // since construction or reset_peak()
  uint64_t device_malloc_calls = 0; // calls to RawDeviceMemory::allocate
  uint64_t device_free_calls = 0;
  uint64_t oom_retries = 0;         // times the cache was emptied to retry
};

// A size-binned, stream-aware caching allocator. Blocks are rounded up (512 B
// below 1 MiB, 2 MiB above), cached on free and reused for a later request on
// the same stream with the smallest cached block that fits (best fit) and is
// not more than twice the request when the request is large; a small request
// (below 1 MiB) reuses only small blocks. On failure it
// empties the cache and retries once, then throws OutOfMemoryError.
class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawDeviceMemory> source, std::string device_name);
  ~CachingAllocator();

  void* allocate(size_t bytes, cuda::Stream stream);
  void deallocate(void* pointer);
  // Returns every cached (unused) block to the device.
  void empty_cache();
  AllocatorStats stats() const;
  void reset_peak();

  static size_t round_size(size_t bytes);

 private:
  struct Block {
    void* pointer;
    size_t size;
    cuda::Stream stream;
  };
  void release_cached_locked();

  std::unique_ptr<RawDeviceMemory> source_;
  std::string device_name_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::multimap<size_t, Block> cached_;  // by size
  AllocatorStats stats_;
};

// Test switch: fill every new allocation with 0xFF bytes (NaN for floats) so
// that a kernel that leaves an output element unwritten is caught.
void set_poison_allocations(bool enabled);
bool poison_allocations();

// The allocator of a CUDA device (created on first use).
CachingAllocator& cuda_allocator(int device);

// Tensor memory of `device` (torch.cuda.memory_stats / reset_peak_memory_stats):
// the caching allocator's statistics for CUDA; for the CPU, the bytes that
// allocate_cpu handed out and has not got back (rounded to 64 B; all threads
// of the process), its peak, and its calls, with reserved = allocated (no cache).
AllocatorStats memory_stats(Device device);
// The peak becomes what is allocated now.
void reset_peak_memory_stats(Device device);

}  // namespace kiln
