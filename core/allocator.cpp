#include "core/allocator.h"

#include <sys/mman.h>

#include <atomic>
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/graph.h"
#include "kernels/error.h"

namespace kiln {

namespace {
// glibc returns large blocks to the kernel on free (mmap threshold, heap
// trim), so every training step would fault its activations in again: 15-20 ms
// of a FashionCNN CPU step. Keeping freed memory in the heap makes the next
// step reuse it, like the CUDA caching allocator does on the device.
constexpr size_t kHeapLimit = size_t{32} << 20;  // glibc's largest mmap threshold on 64-bit
void keep_freed_host_memory() {
  static const bool configured = [] {
    mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapLimit));
    mallopt(M_TRIM_THRESHOLD, -1);
    return true;
  }();
  (void)configured;
}

// Blocks of kHeapLimit bytes or more, which glibc would mmap and munmap every
// time: a (16, 1024, 768) float32 activation is 48 MiB, and faulting its
// 12,288 pages in cost more than the kernel writing it (layer_norm forward at
// 17% of memcpy bandwidth, 43% in bfloat16 whose output stayed in the heap).
// They come from a CachingAllocator over mmap instead (2 MiB granularity,
// best fit, cached on free, the cache emptied and the request retried when
// the system has no memory left), asking for transparent huge pages on fresh
// mappings: 512 times fewer faults when a block is new. Sanitizer builds keep
// aligned_alloc, whose blocks AddressSanitizer guards.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheLargeHostBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang's spelling
constexpr bool kCacheLargeHostBlocks = false;
#else
constexpr bool kCacheLargeHostBlocks = true;
#endif
#else
constexpr bool kCacheLargeHostBlocks = true;
#endif

struct HostPages : RawDeviceMemory {
  void* allocate(size_t bytes) override {
    void* pointer = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pointer == MAP_FAILED) return nullptr;
    (void)madvise(pointer, bytes, MADV_HUGEPAGE);  // a hint: without THP the pages stay 4 KiB
    sizes_[pointer] = bytes;  // under the allocator's lock
    return pointer;
  }
  void release(void* pointer) override {
    const auto it = sizes_.find(pointer);
    if (it == sizes_.end()) return;
    munmap(pointer, it->second);
    sizes_.erase(it);
  }
  // Host memory has no streams: nothing to wait for.
  cuda::Event record_event(cuda::Stream) override { return nullptr; }
  bool event_done(cuda::Event) override { return true; }
  void wait_event(cuda::Event) override {}
  void destroy_event(cuda::Event) override {}

 private:
  std::unordered_map<void*, size_t> sizes_;
};

CachingAllocator& large_host_blocks() {
  // Leaked on purpose: tensors in static objects may be freed after main().
  static auto* allocator = new CachingAllocator(std::make_unique<HostPages>(), "cpu", /*caching=*/true);
  return *allocator;
}

// allocate_cpu's counters (process-wide; relaxed: they are statistics, not
// synchronization). Constant-initialized: no guard on the allocation path, and
// a tensor freed during static destruction still finds them.
struct CpuCounters {
  std::atomic<size_t> allocated{0}, peak{0};
  std::atomic<uint64_t> allocations{0}, frees{0};
};
constinit CpuCounters cpu_counters;

void count_allocation(size_t bytes) {
  cpu_counters.allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t now = cpu_counters.allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = cpu_counters.peak.load(std::memory_order_relaxed);
  while (now > peak && !cpu_counters.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void count_free(size_t bytes) {
  cpu_counters.allocated.fetch_sub(bytes, std::memory_order_relaxed);
  cpu_counters.frees.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

std::shared_ptr<void> allocate_cpu(size_t bytes) {
  keep_freed_host_memory();
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (kCacheLargeHostBlocks && rounded >= kHeapLimit) {
    CachingAllocator& large = large_host_blocks();
    void* pointer = large.allocate(rounded, nullptr);  // page-aligned; throws OutOfMemoryError
    count_allocation(rounded);
    return std::shared_ptr<void>(pointer, [rounded, &large](void* p) {
      large.deallocate(p);
      count_free(rounded);
    });
  }
  void* pointer = std::aligned_alloc(64, rounded);
  if (pointer == nullptr) {
    throw OutOfMemoryError("out of host memory allocating " + std::to_string(bytes) + " bytes", __FILE__, __LINE__);
  }
  count_allocation(rounded);
  return std::shared_ptr<void>(pointer, [rounded](void* p) {
    std::free(p);
    count_free(rounded);
  });
}

AllocatorStats memory_stats(Device device) {
  if (device.is_cuda()) return cuda_allocator(device.index).stats();
  AllocatorStats stats;
  stats.allocated_bytes = cpu_counters.allocated.load(std::memory_order_relaxed);
  // Freed heap memory is glibc's; freed large blocks stay in their cache.
  const AllocatorStats large = large_host_blocks().stats();
  stats.reserved_bytes = stats.allocated_bytes + (large.reserved_bytes - large.allocated_bytes);
  stats.peak_allocated_bytes = cpu_counters.peak.load(std::memory_order_relaxed);
  stats.device_malloc_calls = cpu_counters.allocations.load(std::memory_order_relaxed);
  stats.device_free_calls = cpu_counters.frees.load(std::memory_order_relaxed);
  return stats;
}

bool cpu_caches_large_blocks() { return kCacheLargeHostBlocks; }

void empty_cache(Device device) {
  if (device.is_cuda()) {
    cuda_allocator(device.index).empty_cache();
  } else {
    large_host_blocks().empty_cache();
  }
}

void reset_peak_memory_stats(Device device) {
  if (device.is_cuda()) {
    cuda_allocator(device.index).reset_peak();
    return;
  }
  cpu_counters.peak.store(cpu_counters.allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

std::shared_ptr<void> allocate_pinned(size_t bytes) {
  void* pointer = cuda::host_alloc_pinned(bytes == 0 ? 64 : bytes);
  if (pointer == nullptr) {
    throw OutOfMemoryError("out of pinned host memory allocating " + std::to_string(bytes) + " bytes", __FILE__,
                           __LINE__);
  }
  return std::shared_ptr<void>(pointer, [](void* p) { cuda::host_free_pinned(p); });
}

std::shared_ptr<void> allocate_cuda(size_t bytes, int device, cuda::Stream stream) {
  CachingAllocator& allocator = cuda_allocator(device);
  void* pointer = allocator.allocate(bytes, stream);
  return std::shared_ptr<void>(pointer, [&allocator](void* p) { allocator.deallocate(p); });
}

namespace {
std::atomic<bool> poison{false};
}
void set_poison_allocations(bool enabled) { poison.store(enabled); }
bool poison_allocations() { return poison.load(); }

// ---------------------------------------------------------------- caching allocator

CachingAllocator::CachingAllocator(std::unique_ptr<RawDeviceMemory> source, std::string device_name, bool caching)
    : source_(std::move(source)), device_name_(std::move(device_name)), caching_(caching) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks may outlive the allocator at process exit; return only the
  // cache (blocks awaiting other streams are left to the driver's teardown).
  try {
    std::lock_guard lock(mutex_);
    release_cached_locked();
  } catch (...) {
  }
}

size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t small = 512, large = 2u << 20, large_threshold = 1u << 20;
  if (bytes == 0) return small;
  if (bytes < large_threshold) return (bytes + small - 1) / small * small;
  return (bytes + large - 1) / large * large;
}

void* CachingAllocator::allocate(size_t bytes, cuda::Stream stream) {
  // Without caching, exactly the bytes asked for (at least one: every block
  // needs its own address), so that a sanitizer sees the end of the tensor.
  const size_t size = caching_ ? round_size(bytes) : std::max<size_t>(bytes, 1);
  std::lock_guard lock(mutex_);
  const bool capturing = source_->capturing();
  if (!capturing) {
    flush_deferred_locked();
    if (!awaiting_.empty()) collect_awaiting_locked(/*wait=*/false);
  }
  const auto pool_entry = stream_pools_.find(stream);
  const uint64_t pool = pool_entry == stream_pools_.end() ? 0 : pool_entry->second;
  // Best fit among cached blocks of the same stream. A large request does not
  // take a block more than twice its size (it would strand the rest), and a
  // small one (< 1 MiB) takes only small blocks: otherwise a 512-byte request
  // could take a cached multi-GiB block and force the next large request
  // into cudaMalloc (PyTorch keeps the two pools apart for the same reason).
  for (auto it = cached_.lower_bound(size); it != cached_.end(); ++it) {
    if (size >= (1u << 20) && it->first > 2 * size) break;
    if (size < (1u << 20) && it->first >= (1u << 20)) break;
    if (it->second.stream != stream || it->second.pool != pool) continue;
    Block block = it->second;
    cached_.erase(it);
    live_.emplace(block.pointer, block);
    stats_.allocated_bytes += block.size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return block.pointer;
  }
  ++stats_.device_malloc_calls;
  void* pointer = source_->allocate(size);
  if (pointer == nullptr && capturing) {
    throw OutOfMemoryError(detail::concat("out of memory on ", device_name_, " during a CUDA graph's capture: tried ",
                                          "to allocate ", bytes, " bytes (", stats_.allocated_bytes, " bytes ",
                                          "allocated by kiln, ", stats_.reserved_bytes, " reserved; the cache ",
                                          "cannot be returned to the device during a capture)"),
                           __FILE__, __LINE__);
  }
  if (pointer == nullptr) {
    // Free what the cache holds (after the streams blocks await) and retry once.
    ++stats_.oom_retries;
    collect_awaiting_locked(/*wait=*/true);
    release_cached_locked();
    ++stats_.device_malloc_calls;
    pointer = source_->allocate(size);
  }
  if (pointer == nullptr) {
    throw OutOfMemoryError(detail::concat("out of memory on ", device_name_, ": tried to allocate ", bytes,
                                          " bytes (", stats_.allocated_bytes, " bytes allocated by kiln, ",
                                          stats_.reserved_bytes, " reserved)"),
                           __FILE__, __LINE__);
  }
  Block block{pointer, size, stream, {}, pool};
  live_.emplace(pointer, block);
  stats_.reserved_bytes += size;
  if (pool != 0) stats_.graph_pool_bytes += size;
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return pointer;
}

void CachingAllocator::deallocate(void* pointer) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(pointer);
  KILN_ASSERT(it != live_.end(), "CachingAllocator::deallocate: unknown pointer");
  Block block = std::move(it->second);
  live_.erase(it);
  stats_.allocated_bytes -= block.size;
  if (source_->capturing()) {
    if (block.other_streams.empty() && cacheable_locked(block)) {
      retire_locked(std::move(block));
    } else {
      deferred_.push_back(std::move(block));
    }
    return;
  }
  flush_deferred_locked();
  put_back_locked(std::move(block));
}

void CachingAllocator::put_back_locked(Block block) {
  if (block.other_streams.empty()) {
    retire_locked(std::move(block));
    return;
  }
  // Reusable on its own stream only once every other stream that used it has
  // passed the work queued there until now.
  AwaitingBlock awaiting{std::move(block), {}};
  for (cuda::Stream other : awaiting.block.other_streams) awaiting.events.push_back(source_->record_event(other));
  awaiting_.push_back(std::move(awaiting));
}

bool CachingAllocator::record_stream(void* pointer, cuda::Stream stream) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(pointer);
  if (it == live_.end()) return false;
  Block& block = it->second;
  if (stream != block.stream &&
      std::find(block.other_streams.begin(), block.other_streams.end(), stream) == block.other_streams.end()) {
    block.other_streams.push_back(stream);
  }
  return true;
}

bool CachingAllocator::cacheable_locked(const Block& block) const {
  return caching_ && !(block.pool != 0 && released_pools_.count(block.pool) != 0);
}

void CachingAllocator::retire_locked(Block block) {
  if (cacheable_locked(block)) {
    block.other_streams.clear();
    cached_.emplace(block.size, std::move(block));
    return;
  }
  release_block_locked(block);
}

void CachingAllocator::release_block_locked(const Block& block) {
  source_->release(block.pointer);
  ++stats_.device_free_calls;
  stats_.reserved_bytes -= block.size;
  if (block.pool != 0) stats_.graph_pool_bytes -= block.size;
}

void CachingAllocator::begin_pool(cuda::Stream stream, uint64_t pool) {
  std::lock_guard lock(mutex_);
  KILN_CHECK(pool != 0, "begin_pool: pool 0 is the common pool");
  KILN_CHECK(caching_, "a CUDA graph on ", device_name_, " needs the caching allocator, and caching is off ",
             "(KILN_NO_CUDA_MEMORY_CACHING is set)");
  KILN_CHECK(released_pools_.count(pool) == 0, "begin_pool: pool ", pool, " was released");
  stream_pools_[stream] = pool;
}

void CachingAllocator::end_pool(cuda::Stream stream) {
  std::lock_guard lock(mutex_);
  stream_pools_.erase(stream);
}

void CachingAllocator::release_pool(uint64_t pool) {
  std::lock_guard lock(mutex_);
  if (pool == 0) return;
  released_pools_.insert(pool);
  const bool capturing = source_->capturing();
  for (auto it = cached_.begin(); it != cached_.end();) {
    if (it->second.pool == pool) {
      if (capturing) {
        deferred_.push_back(it->second);  // released after the capture
      } else {
        release_block_locked(it->second);
      }
      it = cached_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocator::collect_awaiting_locked(bool wait) {
  std::vector<AwaitingBlock> still_awaiting;
  for (AwaitingBlock& awaiting : awaiting_) {
    bool done = true;
    for (cuda::Event event : awaiting.events) {
      if (wait) {
        source_->wait_event(event);
      } else if (!source_->event_done(event)) {
        done = false;
        break;
      }
    }
    if (!done) {
      still_awaiting.push_back(std::move(awaiting));
      continue;
    }
    for (cuda::Event event : awaiting.events) source_->destroy_event(event);
    retire_locked(std::move(awaiting.block));
  }
  awaiting_ = std::move(still_awaiting);
}

void CachingAllocator::flush_deferred_locked() {
  std::vector<Block> blocks = std::move(deferred_);
  deferred_.clear();
  for (Block& block : blocks) put_back_locked(std::move(block));
}

void CachingAllocator::release_cached_locked() {
  // A graph's cached blocks stay: its recorded kernels still use them.
  for (auto it = cached_.begin(); it != cached_.end();) {
    if (it->second.pool == 0) {
      release_block_locked(it->second);
      it = cached_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  KILN_CHECK(!source_->capturing(), "empty_cache on ", device_name_, ": not while this thread captures a CUDA ",
             "graph (nothing can be returned to the device during a capture)");
  flush_deferred_locked();
  collect_awaiting_locked(/*wait=*/true);
  release_cached_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

namespace {
struct CudaDeviceMemory : RawDeviceMemory {
  explicit CudaDeviceMemory(int device) : device(device) {}
  void* allocate(size_t bytes) override { return cuda::raw_malloc(bytes, device); }
  void release(void* pointer) override { cuda::raw_free(pointer, device); }
  cuda::Event record_event(cuda::Stream stream) override {
    cuda::Event event = cuda::create_event(device, /*timing=*/false);
    cuda::record_event(event, stream);
    return event;
  }
  bool event_done(cuda::Event event) override { return cuda::event_query(event); }
  void wait_event(cuda::Event event) override { cuda::event_synchronize(event); }
  void destroy_event(cuda::Event event) override { cuda::destroy_event(event); }
  bool capturing() const override { return cuda::capturing(); }
  int device;
};

// KILN_NO_CUDA_MEMORY_CACHING=1 (any value but "" and "0") turns caching off.
bool cuda_caching_enabled() {
  const char* value = std::getenv("KILN_NO_CUDA_MEMORY_CACHING");
  return value == nullptr || *value == '\0' || std::string(value) == "0";
}
}  // namespace

std::unique_ptr<RawDeviceMemory> cuda_device_memory(int device) { return std::make_unique<CudaDeviceMemory>(device); }

CachingAllocator& cuda_allocator(int device) {
  static std::mutex mutex;
  // Leaked on purpose: tensors in static objects may be freed after main().
  static auto* allocators = new std::vector<std::unique_ptr<CachingAllocator>>();
  std::lock_guard lock(mutex);
  KILN_CHECK(device >= 0 && device < cuda::device_count(), "cuda_allocator: no CUDA device ", device, " (",
             cuda::device_count(), " available)");
  if (allocators->size() <= static_cast<size_t>(device)) allocators->resize(device + 1);
  auto& slot = (*allocators)[device];
  if (!slot) {
    slot = std::make_unique<CachingAllocator>(std::make_unique<CudaDeviceMemory>(device), "cuda:" + std::to_string(device),
                                              cuda_caching_enabled());
  }
  return *slot;
}

}  // namespace kiln
