// Memory for tensors. CPU memory is 64-byte aligned (blocks of 32 MiB or more
// come from a caching allocator over mmap, page-aligned); pinned host memory
// comes from cudaHostAlloc; CUDA memory from a caching allocator so that
// steady training does no cudaMalloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

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
  // Stream order, for blocks used on other streams (record_stream): an event
  // recorded on `stream` behind the work queued there so far; whether the
  // device has passed it (never waits); waiting for it; destroying it.
  virtual cuda::Event record_event(cuda::Stream stream) = 0;
  virtual bool event_done(cuda::Event event) = 0;
  virtual void wait_event(cuda::Event event) = 0;
  virtual void destroy_event(cuda::Event event) = 0;
  // Whether the calling thread is capturing a CUDA graph. Then nothing may go
  // back to the device and no event may be queried, recorded or waited for:
  // each would break the capture (cudaFree synchronizes, and an event
  // recorded on a capturing stream is a node of the graph, not an event).
  virtual bool capturing() const { return false; }
};

struct AllocatorStats {
  size_t allocated_bytes = 0;       // in live blocks handed out
  size_t reserved_bytes = 0;        // obtained from the device (live + cached + awaiting other streams)
  size_t peak_allocated_bytes = 0;  // since construction or reset_peak()
  uint64_t device_malloc_calls = 0; // calls to RawDeviceMemory::allocate
  uint64_t device_free_calls = 0;
  uint64_t oom_retries = 0;         // times the cache was emptied to retry
  size_t graph_pool_bytes = 0;      // of reserved_bytes: held by CUDA graphs' pools (live and cached)
};

// A size-binned, stream-aware caching allocator. Blocks are rounded up (512 B
// below 1 MiB, 2 MiB above), cached on free and reused for a later request on
// the same stream with the smallest cached block that fits (best fit) and is
// not more than twice the request when the request is large; a small request
// (below 1 MiB) reuses only small blocks. On failure it
// empties the cache and retries once, then throws OutOfMemoryError.
// A block also used on another stream (record_stream) returns to the cache
// only once that stream has passed the work queued on it before the free.
// With caching off (KILN_NO_CUDA_MEMORY_CACHING=1 for the CUDA allocators, as
// PYTORCH_NO_CUDA_MEMORY_CACHING does for torch's) every request is its own
// device allocation of exactly the bytes asked for, released when freed: what
// compute-sanitizer's memcheck needs to see an overrun past the end.
// A CUDA graph's memory is a pool of its own (begin_pool .. end_pool around
// its capture): blocks allocated for it are reused only by it, never
// returned by empty_cache, and released with release_pool when the graph
// goes, so its replays allocate nothing and touch memory nobody else holds.
// While the calling thread captures a graph the allocator makes no device call
// but cudaMalloc: a block freed then that must go back to the device (its
// graph released, or caching off) or wait for other streams is set aside and
// handled at the first call outside a capture; out of memory then throws
// OutOfMemoryError without emptying the cache; empty_cache is refused.
class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawDeviceMemory> source, std::string device_name, bool caching = true);
  ~CachingAllocator();

  void* allocate(size_t bytes, cuda::Stream stream);
  void deallocate(void* pointer);
  // Marks the live block at `pointer` (a pointer allocate returned) as used by
  // `stream` too (torch's Tensor.record_stream). Returns false, doing nothing,
  // when the pointer is not one of this allocator's live blocks.
  bool record_stream(void* pointer, cuda::Stream stream);
  // Returns every cached (unused) block to the device, after waiting for the
  // streams that blocks awaiting reuse were recorded on.
  void empty_cache();
  AllocatorStats stats() const;
  void reset_peak();
  bool caching() const { return caching_; }

  // From now until end_pool(stream), requests on `stream` come from pool
  // `pool` (nonzero, a graph's id), and so do the frees of its blocks.
  // Throws kiln::Error with caching off (a graph needs its memory to stay).
  void begin_pool(cuda::Stream stream, uint64_t pool);
  void end_pool(cuda::Stream stream);
  // Returns the pool's cached blocks to the device; its live blocks are
  // returned when they are freed.
  void release_pool(uint64_t pool);

  static size_t round_size(size_t bytes);

 private:
  struct Block {
    void* pointer;
    size_t size;
    cuda::Stream stream;
    std::vector<cuda::Stream> other_streams;  // from record_stream
    uint64_t pool = 0;                         // 0: the common pool; else a graph's
  };
  // A freed block that other streams may still use, with one event per stream.
  struct AwaitingBlock {
    Block block;
    std::vector<cuda::Event> events;
  };
  // Returns the cached blocks of the common pool (never a graph's) to the device.
  void release_cached_locked();
  void release_block_locked(const Block& block);
  // Frees (caching off) or caches a block nothing uses any more.
  void retire_locked(Block block);
  // Retires the awaiting blocks whose events have all passed; with `wait`, all of them.
  void collect_awaiting_locked(bool wait);
  // A freed block nothing uses on its own stream: retired, or, used on other
  // streams too, set awaiting them (an event recorded on each).
  void put_back_locked(Block block);
  // put_back_locked for the blocks freed during a capture.
  void flush_deferred_locked();
  // Whether a block nothing uses any more stays cached (else it goes back to the device).
  bool cacheable_locked(const Block& block) const;

  std::unique_ptr<RawDeviceMemory> source_;
  std::string device_name_;
  bool caching_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::multimap<size_t, Block> cached_;  // by size
  std::vector<AwaitingBlock> awaiting_;
  std::vector<Block> deferred_;  // freed during a capture; see the class comment
  std::unordered_map<cuda::Stream, uint64_t> stream_pools_;  // streams capturing into a graph's pool
  std::set<uint64_t> released_pools_;
  AllocatorStats stats_;
};

// Test switch: fill every new allocation with 0xFF bytes (NaN for floats) so
// that a kernel that leaves an output element unwritten is caught.
void set_poison_allocations(bool enabled);
bool poison_allocations();

// The allocator of a CUDA device (created on first use; caching unless
// KILN_NO_CUDA_MEMORY_CACHING is set to anything but "" or "0").
CachingAllocator& cuda_allocator(int device);
// cudaMalloc/cudaFree and CUDA events on `device`: the source behind
// cuda_allocator, for an allocator of one's own.
std::unique_ptr<RawDeviceMemory> cuda_device_memory(int device);

// Tensor memory of `device` (torch.cuda.memory_stats / reset_peak_memory_stats):
// the caching allocator's statistics for CUDA; for the CPU, the bytes that
// allocate_cpu handed out and has not got back (rounded to 64 B; all threads
// of the process), its peak, and its calls; reserved adds the freed blocks
// of 32 MiB or more that allocate_cpu keeps for reuse (smaller freed blocks
// stay in glibc's heap, not counted).
AllocatorStats memory_stats(Device device);
// The peak becomes what is allocated now.
void reset_peak_memory_stats(Device device);
// Returns the cached, unused memory of `device` to the system
// (torch.cuda.empty_cache; on the CPU, the large blocks' cache).
void empty_cache(Device device);
// Whether allocate_cpu caches blocks of 32 MiB or more (not under AddressSanitizer).
bool cpu_caches_large_blocks();

}  // namespace kiln
