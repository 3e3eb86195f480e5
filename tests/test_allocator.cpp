// The caching allocator (core/allocator.cpp), driven by a fake source of
// device memory so that rounding, caching, statistics and the out-of-memory
// path are tested without a GPU; then the real CUDA allocator on a GPU.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "core/allocator.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "tests/support/test_util.h"

namespace kiln {
namespace {

using doctest::Contains;

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// Host memory posing as device memory, with a byte budget: allocate() returns
// nullptr when the live bytes would exceed it, as cudaMalloc does.
struct FakeDeviceMemory : RawDeviceMemory {
  struct Shared {
    size_t budget = 0;
    size_t live_bytes = 0;
    int allocate_calls = 0;
    int failed_calls = 0;
    int release_calls = 0;
    std::set<void*> live;
    std::map<void*, size_t> sizes;
    // Fake events: handle -> whether the device has passed it.
    std::map<cuda::Event, bool> events;
    std::vector<cuda::Stream> recorded_on;
    uintptr_t next_event = 1;
    int waits = 0;
    int destroyed_events = 0;
    int queries = 0;
    bool capturing = false;  // as if the calling thread captured a CUDA graph
  };
  explicit FakeDeviceMemory(Shared* shared) : shared(shared) {}
  ~FakeDeviceMemory() override {
    for (void* pointer : shared->live) std::free(pointer);
    shared->live.clear();
  }
  void* allocate(size_t bytes) override {
    ++shared->allocate_calls;
    if (shared->live_bytes + bytes > shared->budget) {
      ++shared->failed_calls;
      return nullptr;
    }
    void* pointer = std::malloc(bytes);
    shared->live.insert(pointer);
    shared->sizes[pointer] = bytes;
    shared->live_bytes += bytes;
    return pointer;
  }
  void release(void* pointer) override {
    REQUIRE_FALSE(shared->capturing);
    ++shared->release_calls;
    REQUIRE(shared->live.erase(pointer) == 1);
    shared->live_bytes -= shared->sizes[pointer];
    std::free(pointer);
  }
  cuda::Event record_event(cuda::Stream stream) override {
    REQUIRE_FALSE(shared->capturing);
    cuda::Event event = reinterpret_cast<cuda::Event>(shared->next_event++);
    shared->events[event] = false;
    shared->recorded_on.push_back(stream);
    return event;
  }
  bool event_done(cuda::Event event) override {
    ++shared->queries;
    REQUIRE_FALSE(shared->capturing);
    return shared->events.at(event);
  }
  void wait_event(cuda::Event event) override {
    REQUIRE_FALSE(shared->capturing);
    ++shared->waits;
    shared->events.at(event) = true;
  }
  void destroy_event(cuda::Event event) override {
    ++shared->destroyed_events;
    REQUIRE(shared->events.erase(event) == 1);
  }
  bool capturing() const override { return shared->capturing; }
  Shared* shared;
};

// Distinct fake stream handles (never dereferenced).
cuda::Stream stream_a() { return reinterpret_cast<cuda::Stream>(uintptr_t{0x1000}); }
cuda::Stream stream_b() { return reinterpret_cast<cuda::Stream>(uintptr_t{0x2000}); }

struct Fixture {
  FakeDeviceMemory::Shared memory;
  CachingAllocator allocator;
  explicit Fixture(size_t budget = 1024 * MiB, bool caching = true)
      : allocator(make_source(memory, budget), "fake:0", caching) {}
  // Marks every fake event as passed by the device.
  void pass_events() {
    for (auto& [event, done] : memory.events) done = true;
  }
  static std::unique_ptr<RawDeviceMemory> make_source(FakeDeviceMemory::Shared& memory, size_t budget) {
    memory.budget = budget;
    return std::make_unique<FakeDeviceMemory>(&memory);
  }
};

}  // namespace

TEST_CASE("allocator: sizes round up to 512 B below 1 MiB and 2 MiB above") {
  CHECK(CachingAllocator::round_size(0) == 512);
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::round_size(1000 * KiB) == 1000 * KiB);
  CHECK(CachingAllocator::round_size(MiB - 1) == MiB);
  CHECK(CachingAllocator::round_size(MiB) == 2 * MiB);
  CHECK(CachingAllocator::round_size(2 * MiB) == 2 * MiB);
  CHECK(CachingAllocator::round_size(2 * MiB + 1) == 4 * MiB);
  CHECK(CachingAllocator::round_size(9 * MiB) == 10 * MiB);

  Fixture f;
  void* p = f.allocator.allocate(100, stream_a());
  CHECK(f.memory.sizes[p] == 512);  // the device sees the rounded size
  void* q = f.allocator.allocate(3 * MiB, stream_a());
  CHECK(f.memory.sizes[q] == 4 * MiB);
  CHECK(f.allocator.stats().allocated_bytes == 4 * MiB + 512);
  f.allocator.deallocate(p);
  f.allocator.deallocate(q);
}

TEST_CASE("allocator: a freed block is reused on the same stream, not across streams") {
  Fixture f;
  void* p = f.allocator.allocate(1000, stream_a());
  f.allocator.deallocate(p);
  void* same = f.allocator.allocate(900, stream_a());  // rounds to 1024 too
  CHECK(same == p);
  CHECK(f.memory.allocate_calls == 1);
  f.allocator.deallocate(same);

  void* other = f.allocator.allocate(1000, stream_b());
  CHECK(other != p);  // p is cached for stream a
  CHECK(f.memory.allocate_calls == 2);
  f.allocator.deallocate(other);

  SUBCASE("best fit: the smallest cached block that fits") {
    void* big = f.allocator.allocate(8 * KiB, stream_a());
    void* small = f.allocator.allocate(2 * KiB, stream_a());
    f.allocator.deallocate(big);
    f.allocator.deallocate(small);
    CHECK(f.allocator.allocate(1536, stream_a()) == small);
    CHECK(f.allocator.allocate(1536, stream_a()) == big);  // p (1024) is too small
  }
}

TEST_CASE("allocator: a large request does not take a cached block more than twice its size") {
  Fixture f;
  void* huge = f.allocator.allocate(10 * MiB, stream_a());
  f.allocator.deallocate(huge);
  void* large = f.allocator.allocate(4 * MiB, stream_a());  // 10 MiB > 2 x 4 MiB
  CHECK(large != huge);
  void* fits = f.allocator.allocate(6 * MiB, stream_a());  // 10 MiB <= 2 x 6 MiB
  CHECK(fits == huge);
  // Small requests may take any cached small block.
  void* s = f.allocator.allocate(4 * KiB, stream_a());
  f.allocator.deallocate(s);
  CHECK(f.allocator.allocate(512, stream_a()) == s);
}

TEST_CASE("allocator: a small request does not take a cached large block") {
  Fixture f;
  void* large = f.allocator.allocate(2 * MiB, stream_a());
  f.allocator.deallocate(large);
  void* small = f.allocator.allocate(512, stream_a());
  CHECK(small != large);  // the 2 MiB block stays for the next large request
  CHECK(f.memory.sizes[small] == 512);
  CHECK(f.allocator.allocate(2 * MiB, stream_a()) == large);
  CHECK(f.memory.allocate_calls == 2);
}

TEST_CASE("allocator: statistics, reset_peak and empty_cache") {
  Fixture f;
  AllocatorStats s = f.allocator.stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.reserved_bytes == 0);
  CHECK(s.peak_allocated_bytes == 0);

  void* a = f.allocator.allocate(2 * MiB, stream_a());
  void* b = f.allocator.allocate(4 * MiB, stream_a());
  void* c = f.allocator.allocate(1024, stream_a());
  s = f.allocator.stats();
  CHECK(s.allocated_bytes == 6 * MiB + 1024);
  CHECK(s.reserved_bytes == 6 * MiB + 1024);
  CHECK(s.peak_allocated_bytes == 6 * MiB + 1024);
  CHECK(s.device_malloc_calls == 3);
  CHECK(s.device_free_calls == 0);

  f.allocator.deallocate(b);
  s = f.allocator.stats();
  CHECK(s.allocated_bytes == 2 * MiB + 1024);
  CHECK(s.reserved_bytes == 6 * MiB + 1024);  // b is cached, not returned
  CHECK(s.peak_allocated_bytes == 6 * MiB + 1024);
  CHECK(f.memory.release_calls == 0);

  f.allocator.reset_peak();
  CHECK(f.allocator.stats().peak_allocated_bytes == 2 * MiB + 1024);
  void* d = f.allocator.allocate(3 * MiB, stream_a());  // reuses b (4 MiB)
  CHECK(d == b);
  s = f.allocator.stats();
  CHECK(s.device_malloc_calls == 3);
  CHECK(s.allocated_bytes == 6 * MiB + 1024);
  CHECK(s.peak_allocated_bytes == 6 * MiB + 1024);

  f.allocator.deallocate(a);
  f.allocator.deallocate(d);
  f.allocator.empty_cache();
  s = f.allocator.stats();
  CHECK(s.allocated_bytes == 1024);
  CHECK(s.reserved_bytes == 1024);
  CHECK(s.device_free_calls == 2);
  CHECK(f.memory.release_calls == 2);
  CHECK(f.memory.live.size() == 1);  // only c
  CHECK(f.memory.live.count(c) == 1);
  f.allocator.deallocate(c);
  f.allocator.empty_cache();
  CHECK(f.memory.live.empty());
  CHECK(f.allocator.stats().reserved_bytes == 0);
  CHECK(f.allocator.stats().oom_retries == 0);
}

TEST_CASE("allocator: out of memory empties the cache and retries once") {
  Fixture f(8 * MiB);
  void* a = f.allocator.allocate(4 * MiB, stream_a());
  void* b = f.allocator.allocate(4 * MiB, stream_a());
  f.allocator.deallocate(b);  // cached: the device is full
  CHECK(f.memory.live_bytes == 8 * MiB);

  SUBCASE("the freed cache makes room: success") {
    // On another stream b cannot be reused; the first device call fails, the
    // cache is emptied (b returned), the retry succeeds.
    void* c = f.allocator.allocate(4 * MiB, stream_b());
    CHECK(c != nullptr);
    AllocatorStats s = f.allocator.stats();
    CHECK(s.oom_retries == 1);
    CHECK(f.memory.failed_calls == 1);
    CHECK(f.memory.release_calls == 1);
    CHECK(s.device_malloc_calls == 4);  // a, b, failed c, retried c
    CHECK(s.reserved_bytes == 8 * MiB);
    CHECK(s.allocated_bytes == 8 * MiB);
    f.allocator.deallocate(c);
  }
  SUBCASE("still no room: OutOfMemoryError naming the bytes") {
    bool caught = false;
    try {
      (void)f.allocator.allocate(6 * MiB, stream_b());
    } catch (const OutOfMemoryError& error) {
      caught = true;
      const std::string message = error.what();
      CHECK(message.find("out of memory on fake:0") != std::string::npos);
      CHECK(message.find(std::to_string(6 * MiB) + " bytes") != std::string::npos);
      CHECK(message.find(std::to_string(4 * MiB) + " bytes allocated") != std::string::npos);
    }
    CHECK(caught);
    CHECK(f.allocator.stats().oom_retries == 1);
    CHECK(f.memory.failed_calls == 2);  // first try and the retry
    CHECK(f.memory.live_bytes == 4 * MiB);  // the cache was emptied on the way
    // OutOfMemoryError is a kiln::Error, and the allocator still works after it.
    CHECK_THROWS_AS(f.allocator.allocate(100 * MiB, stream_a()), Error);
    void* small = f.allocator.allocate(1 * KiB, stream_a());
    CHECK(small != nullptr);
    f.allocator.deallocate(small);
  }
  f.allocator.deallocate(a);
}

TEST_CASE("allocator: a block also used on another stream is reused only after that stream passed its work") {
  Fixture f;
  void* p = f.allocator.allocate(1000, stream_a());
  CHECK(f.allocator.record_stream(p, stream_b()));
  CHECK(f.allocator.record_stream(p, stream_b()));  // once per stream
  CHECK(f.allocator.record_stream(p, stream_a()));  // its own stream: nothing to wait for
  int local = 0;
  CHECK_FALSE(f.allocator.record_stream(&local, stream_b()));  // not this allocator's block
  f.allocator.deallocate(p);
  REQUIRE(f.memory.recorded_on == std::vector<cuda::Stream>{stream_b()});
  CHECK(f.allocator.stats().allocated_bytes == 0);
  CHECK(f.allocator.stats().reserved_bytes == 1024);

  // Stream b has not passed the free yet: p is not handed out again.
  void* q = f.allocator.allocate(1000, stream_a());
  CHECK(q != p);
  CHECK(f.memory.allocate_calls == 2);
  f.allocator.deallocate(q);  // never recorded elsewhere: cached at once

  f.pass_events();
  std::set<void*> reused{f.allocator.allocate(1000, stream_a()), f.allocator.allocate(1000, stream_a())};
  CHECK(reused == std::set<void*>{p, q});  // both from the cache
  CHECK(f.memory.allocate_calls == 2);
  CHECK(f.memory.destroyed_events == 1);
  CHECK(f.memory.waits == 0);  // reuse only queries events, it never waits
  for (void* block : reused) f.allocator.deallocate(block);

  SUBCASE("empty_cache waits for the other stream, then returns the block") {
    void* r = f.allocator.allocate(1000, stream_a());
    f.allocator.record_stream(r, stream_b());
    f.allocator.deallocate(r);
    f.allocator.empty_cache();
    CHECK(f.memory.waits == 1);
    CHECK(f.memory.live.empty());
    CHECK(f.allocator.stats().reserved_bytes == 0);
  }
  SUBCASE("out of memory waits for the other stream before emptying the cache") {
    Fixture g(2 * MiB);
    void* big = g.allocator.allocate(2 * MiB, stream_a());
    g.allocator.record_stream(big, stream_b());
    g.allocator.deallocate(big);
    void* again = g.allocator.allocate(2 * MiB, stream_b());  // the device is full until the block is released
    CHECK(again != nullptr);
    CHECK(g.memory.waits == 1);
    CHECK(g.allocator.stats().oom_retries == 1);
    g.allocator.deallocate(again);
  }
}

TEST_CASE("allocator: with caching off every request is its own exact-size allocation, released when freed") {
  Fixture f(1024 * MiB, /*caching=*/false);
  CHECK_FALSE(f.allocator.caching());
  void* p = f.allocator.allocate(100, stream_a());
  CHECK(f.memory.sizes.at(p) == 100);  // not rounded: a sanitizer sees byte 100 as out of bounds
  CHECK(f.allocator.stats().reserved_bytes == 100);
  f.allocator.deallocate(p);
  CHECK(f.memory.release_calls == 1);
  CHECK(f.memory.live.empty());
  CHECK(f.allocator.stats().reserved_bytes == 0);
  void* q = f.allocator.allocate(100, stream_a());
  CHECK(f.memory.allocate_calls == 2);  // no reuse
  void* empty_a = f.allocator.allocate(0, stream_a());
  void* empty_b = f.allocator.allocate(0, stream_a());
  CHECK(empty_a != empty_b);  // zero bytes still get distinct blocks
  CHECK(f.memory.sizes.at(empty_a) == 1);
  f.allocator.deallocate(empty_a);
  f.allocator.deallocate(empty_b);
  // Used on another stream: released only once that stream passed its work.
  f.allocator.record_stream(q, stream_b());
  f.allocator.deallocate(q);
  CHECK(f.memory.live.count(q) == 1);
  f.pass_events();
  void* r = f.allocator.allocate(8, stream_a());  // an allocation collects what awaited
  CHECK(f.memory.live.count(q) == 0);
  f.allocator.deallocate(r);
  CHECK(f.allocator.stats().reserved_bytes == 0);
  CHECK(f.allocator.stats().device_malloc_calls == f.allocator.stats().device_free_calls);
}

TEST_CASE("allocator: a CUDA graph's pool keeps its blocks to itself and stays through empty_cache") {
  Fixture f;
  // Common memory cached before the capture is not handed to the graph.
  void* common = f.allocator.allocate(1000, stream_a());
  f.allocator.deallocate(common);
  f.allocator.begin_pool(stream_b(), 7);
  void* in_graph = f.allocator.allocate(1000, stream_b());
  CHECK(in_graph != common);
  CHECK(f.allocator.stats().graph_pool_bytes == 1024);
  f.allocator.deallocate(in_graph);
  void* again = f.allocator.allocate(1000, stream_b());  // reused within the capture, in stream order
  CHECK(again == in_graph);
  f.allocator.end_pool(stream_b());
  f.allocator.deallocate(again);
  // After the capture the pool's block is not reused by common requests...
  void* after = f.allocator.allocate(1000, stream_b());
  CHECK(after != in_graph);
  f.allocator.deallocate(after);
  // ...and empty_cache keeps it: the graph's recorded kernels still use it.
  f.allocator.empty_cache();
  CHECK(f.memory.live.count(in_graph) == 1);
  CHECK(f.allocator.stats().graph_pool_bytes == 1024);
  // Releasing the pool returns its cached blocks; a live one goes when freed.
  f.allocator.begin_pool(stream_b(), 8);
  void* live = f.allocator.allocate(4096, stream_b());
  f.allocator.end_pool(stream_b());
  f.allocator.release_pool(7);
  f.allocator.release_pool(8);
  CHECK(f.memory.live.count(in_graph) == 0);
  CHECK(f.memory.live.count(live) == 1);
  f.allocator.deallocate(live);
  CHECK(f.memory.live.count(live) == 0);
  CHECK(f.allocator.stats().graph_pool_bytes == 0);
  CHECK(testing::error_of([&] { f.allocator.begin_pool(stream_b(), 8); }).find("was released") != std::string::npos);
  Fixture uncached(1024 * MiB, /*caching=*/false);
  CHECK(testing::error_of([&] { uncached.allocator.begin_pool(stream_a(), 9); }).find("needs the caching allocator") !=
        std::string::npos);
}

TEST_CASE("allocator: during a graph's capture nothing goes back to the device and no event is touched") {
  // The fake fails the case if release, record_event, event_done or wait_event runs while capturing.
  SUBCASE("a block of a released graph pool, freed during another capture, goes back after it") {
    Fixture f;
    f.allocator.begin_pool(stream_b(), 7);
    void* held = f.allocator.allocate(4096, stream_b());  // e.g. a graph's output someone still holds
    f.allocator.end_pool(stream_b());
    f.memory.capturing = true;
    f.allocator.release_pool(7);  // the first graph destroyed during a second one's capture
    f.allocator.deallocate(held);
    CHECK(f.memory.release_calls == 0);
    CHECK(f.memory.live.count(held) == 1);
    CHECK(testing::error_of([&] { f.allocator.empty_cache(); }).find("not while this thread captures") !=
          std::string::npos);
    f.memory.capturing = false;
    void* next = f.allocator.allocate(1000, stream_a());  // the first call after the capture
    CHECK(f.memory.live.count(held) == 0);
    CHECK(f.allocator.stats().graph_pool_bytes == 0);
    f.allocator.deallocate(next);
  }
  SUBCASE("a cached block of a pool released during a capture goes back after it") {
    Fixture f;
    f.allocator.begin_pool(stream_b(), 7);
    void* cached = f.allocator.allocate(4096, stream_b());
    f.allocator.deallocate(cached);
    f.allocator.end_pool(stream_b());
    f.memory.capturing = true;
    f.allocator.release_pool(7);
    CHECK(f.memory.live.count(cached) == 1);
    f.memory.capturing = false;
    f.allocator.empty_cache();
    CHECK(f.memory.live.count(cached) == 0);
    CHECK(f.allocator.stats().reserved_bytes == 0);
  }
  SUBCASE("with caching off a block freed during a capture is released after it") {
    Fixture f(1024 * MiB, /*caching=*/false);
    void* p = f.allocator.allocate(1000, stream_a());
    f.memory.capturing = true;
    f.allocator.deallocate(p);
    CHECK(f.memory.live.count(p) == 1);
    CHECK(f.memory.release_calls == 0);
    f.memory.capturing = false;
    void* q = f.allocator.allocate(1000, stream_a());
    CHECK(f.memory.release_calls == 1);  // p (q may have its address again)
    f.allocator.deallocate(q);
  }
  SUBCASE("a block used on another stream: its events are recorded and queried only after the capture") {
    Fixture f;
    void* earlier = f.allocator.allocate(1000, stream_a());
    f.allocator.record_stream(earlier, stream_b());
    f.allocator.deallocate(earlier);  // awaiting stream b, from before the capture
    void* p = f.allocator.allocate(1000, stream_a());
    f.allocator.record_stream(p, stream_b());
    const int queries = f.memory.queries;
    f.memory.capturing = true;
    f.allocator.deallocate(p);
    void* during = f.allocator.allocate(1000, stream_a());  // no event queried for `earlier`
    CHECK(during != earlier);
    CHECK(during != p);
    CHECK(f.memory.queries == queries);
    CHECK(f.memory.recorded_on.size() == 1);  // only earlier's, from before
    f.allocator.deallocate(during);
    f.memory.capturing = false;
    f.pass_events();
    void* after = f.allocator.allocate(1000, stream_a());
    CHECK(f.memory.recorded_on.size() == 2);  // p's event, recorded now
    f.allocator.deallocate(after);
    f.allocator.empty_cache();
    CHECK(f.memory.live.empty());
  }
  SUBCASE("out of memory during a capture throws without emptying the cache; after it the cache is emptied") {
    Fixture f(6 * MiB);  // 2 MiB cached + 1 KiB held + the 4 MiB block a 3 MiB request rounds to: too much
    void* cached = f.allocator.allocate(2 * MiB, stream_a());
    f.allocator.deallocate(cached);
    void* held = f.allocator.allocate(1000, stream_a());
    f.memory.capturing = true;
    f.allocator.begin_pool(stream_b(), 3);
    CHECK_THROWS_AS(f.allocator.allocate(3 * MiB, stream_b()), OutOfMemoryError);
    CHECK(testing::error_of([&] { (void)f.allocator.allocate(3 * MiB, stream_b()); })
              .find("during a CUDA graph's capture") != std::string::npos);
    CHECK(f.memory.release_calls == 0);
    CHECK(f.allocator.stats().oom_retries == 0);
    f.allocator.end_pool(stream_b());
    f.memory.capturing = false;
    void* big = f.allocator.allocate(3 * MiB, stream_b());
    CHECK(f.allocator.stats().oom_retries == 1);
    CHECK(f.memory.release_calls == 1);  // the cached block (big may have its address again)
    f.allocator.deallocate(big);
    f.allocator.deallocate(held);
  }
}

TEST_CASE("allocator: deallocating an unknown pointer is a bug, reported") {
  Fixture f;
  int local = 0;
  CHECK_THROWS_WITH_AS(f.allocator.deallocate(&local), Contains("unknown pointer"), Error);
}

TEST_CASE("allocator: CPU memory is 64-byte aligned and poisoning fills 0xFF") {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{1000}}) {
    std::shared_ptr<void> memory = allocate_cpu(bytes);
    CHECK(reinterpret_cast<uintptr_t>(memory.get()) % 64 == 0);
  }
  CHECK_FALSE(poison_allocations());
  set_poison_allocations(true);
  CHECK(poison_allocations());
  Tensor f = empty({17});
  Tensor u = empty({5}, {.dtype = DType::u8});
  Tensor h = empty({3}, {.dtype = DType::bf16});
  set_poison_allocations(false);
  for (float value : f.to_vector<float>()) CHECK(std::isnan(value));
  for (uint8_t value : u.to_vector<uint8_t>()) CHECK(value == 0xFF);
  for (float value : h.to_vector<float>()) CHECK(std::isnan(value));
  const auto* bytes = static_cast<const uint8_t*>(f.data_ptr());
  for (int i = 0; i < 17 * 4; ++i) CHECK(bytes[i] == 0xFF);
  // Off again: a fresh allocation is not poisoned by kiln (zeros() writes it).
  CHECK(zeros({4}).to_vector<float>() == std::vector<float>{0, 0, 0, 0});
}

TEST_CASE("allocator: CPU memory_stats count live tensor bytes and their peak; reset_peak_memory_stats") {
  const Device cpu = Device::cpu();
  const AllocatorStats before = memory_stats(cpu);
  {
    Tensor big = empty({1 << 20});      // 4 MiB
    Tensor odd = empty({3}, {.dtype = DType::u8});  // rounded up to 64 B
    const AllocatorStats during = memory_stats(cpu);
    CHECK(during.allocated_bytes - before.allocated_bytes == (size_t{4} << 20) + 64);
    // Blocks below 32 MiB go back to glibc's heap: nothing of them is kept aside.
    CHECK(during.reserved_bytes - during.allocated_bytes == before.reserved_bytes - before.allocated_bytes);
    CHECK(during.peak_allocated_bytes >= during.allocated_bytes);
    CHECK(during.device_malloc_calls - before.device_malloc_calls == 2);
  }
  const AllocatorStats after = memory_stats(cpu);
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.device_free_calls - before.device_free_calls == 2);
  CHECK(after.peak_allocated_bytes >= before.allocated_bytes + (size_t{4} << 20));  // the peak remembers
  reset_peak_memory_stats(cpu);
  CHECK(memory_stats(cpu).peak_allocated_bytes == after.allocated_bytes);
}

TEST_CASE("allocator: CPU blocks of 32 MiB or more are cached and reused, empty_cache returns them") {
  if (!cpu_caches_large_blocks()) {
    MESSAGE("skipped: large CPU blocks are not cached under AddressSanitizer");
    return;
  }
  const Device cpu = Device::cpu();
  empty_cache(cpu);
  const AllocatorStats before = memory_stats(cpu);
  CHECK(before.reserved_bytes == before.allocated_bytes);  // nothing cached after empty_cache
  void* first_address = nullptr;
  {
    Tensor big = empty({48 << 18});  // 48 MiB of float32: a (16, 1024, 768) activation
    first_address = big.data_ptr();
    CHECK(reinterpret_cast<uintptr_t>(first_address) % 64 == 0);
    big.fill_(1.5);
    CHECK(sum(big).item<double>() == 1.5 * (48 << 18));
  }
  const AllocatorStats freed = memory_stats(cpu);
  CHECK(freed.allocated_bytes == before.allocated_bytes);
  CHECK(freed.reserved_bytes - freed.allocated_bytes == size_t{48} << 20);  // kept for reuse
  {
    Tensor again = empty({47 << 18});  // rounds up to the same 2 MiB multiple: the cached block
    CHECK(again.data_ptr() == first_address);
    CHECK(memory_stats(cpu).reserved_bytes - memory_stats(cpu).allocated_bytes == 0);
  }
  empty_cache(cpu);
  CHECK(memory_stats(cpu).reserved_bytes == memory_stats(cpu).allocated_bytes);
}

TEST_CASE("allocator: without a GPU the CUDA allocator and runtime fail clearly") {
  if (cuda::is_available()) return;  // covered by the [gpu] case
  CHECK(cuda::device_count() == 0);
  CHECK_FALSE(cuda::is_pinned(nullptr));
  int local = 0;
  CHECK_FALSE(cuda::is_pinned(&local));
  CHECK_THROWS_WITH_AS(cuda_allocator(0), Contains("no CUDA device 0"), Error);
  CHECK_THROWS_AS(cuda::raw_malloc(16, 0), Error);
  CHECK_THROWS_AS(allocate_pinned(16), Error);
  CHECK_THROWS_AS(empty({2}, {.pinned = true}), Error);
  CHECK_NOTHROW((void)cuda::sync_counters());
  CHECK_THROWS_WITH_AS(cuda::DeviceGuard(0, "test guard"), Contains("test guard"), Error);
}

TEST_CASE("allocator: DeviceGuard switches to a device and back, and refuses a missing one [gpu]") {
  KILN_REQUIRE_GPU();
  const int count = cuda::device_count();
  CHECK_THROWS_WITH_AS(cuda::DeviceGuard(count, "test guard"), Contains("does not exist"), Error);
  const int before = cuda::current_device();
  for (int device = 0; device < count; ++device) {
    {
      cuda::DeviceGuard guard(device, "test guard");
      CHECK(cuda::current_device() == device);
    }
    CHECK(cuda::current_device() == before);
  }
}

TEST_CASE("allocator: the CUDA caching allocator reuses memory and keeps statistics [gpu]") {
  KILN_REQUIRE_GPU();
  CachingAllocator& allocator = cuda_allocator(0);
  allocator.empty_cache();
  const AllocatorStats before = allocator.stats();
  if (!allocator.caching()) {
    // KILN_NO_CUDA_MEMORY_CACHING (the GPU kit's memcheck): one cudaMalloc and
    // one cudaFree per tensor, of its exact size.
    { Tensor x = empty({1000, 1001}, {.device = Device::cuda(0)}); }
    { Tensor y = empty({1000, 1001}, {.device = Device::cuda(0)}); }
    const AllocatorStats after = allocator.stats();
    CHECK(after.device_malloc_calls == before.device_malloc_calls + 2);
    CHECK(after.device_free_calls == before.device_free_calls + 2);
    CHECK(after.peak_allocated_bytes >= 1000 * 1001 * 4);
    CHECK(after.reserved_bytes == before.reserved_bytes);
    return;
  }
  void* first = nullptr;
  {
    Tensor x = empty({1024, 1024}, {.device = Device::cuda(0)});  // 4 MiB
    first = x.data_ptr();
    const AllocatorStats during = allocator.stats();
    CHECK(during.allocated_bytes == before.allocated_bytes + 4 * MiB);
    CHECK(during.reserved_bytes == before.reserved_bytes + 4 * MiB);
    CHECK(during.device_malloc_calls == before.device_malloc_calls + 1);
    CHECK(during.peak_allocated_bytes >= during.allocated_bytes);
  }
  const AllocatorStats after = allocator.stats();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.reserved_bytes == before.reserved_bytes + 4 * MiB);  // cached
  {
    Tensor y = empty({1024, 1024}, {.device = Device::cuda(0)});
    CHECK(y.data_ptr() == first);  // same stream: reused, no cudaMalloc
    CHECK(allocator.stats().device_malloc_calls == after.device_malloc_calls);
  }
  allocator.empty_cache();
  CHECK(allocator.stats().reserved_bytes == before.reserved_bytes);
  CHECK(allocator.stats().device_free_calls > before.device_free_calls);

  // A request larger than the device throws OutOfMemoryError after one retry.
  const size_t too_big = cuda::device_total_memory(0) * 2;
  const uint64_t retries = allocator.stats().oom_retries;
  CHECK_THROWS_AS(allocator.allocate(too_big, cuda::current_stream(0)), OutOfMemoryError);
  CHECK(allocator.stats().oom_retries == retries + 1);
  // The runtime cleared the out-of-memory error: later launches check clean.
  CHECK_NOTHROW(cuda::check_last_launch("after out of memory"));
  CHECK(zeros({4}, {.device = Device::cuda(0)}).to_vector<float>() == std::vector<float>{0, 0, 0, 0});

  // Pinned host memory.
  std::shared_ptr<void> pinned = allocate_pinned(4096);
  CHECK(cuda::is_pinned(pinned.get()));
  const cuda::DeviceProperties properties = cuda::device_properties(0);
  CHECK(properties.multiprocessor_count > 0);
  CHECK(properties.l2_cache_bytes > 0);
  CHECK(std::strlen(properties.name) > 0);
  MESSAGE("GPU: " << std::string(properties.name) << ", " << properties.multiprocessor_count << " SMs, L2 "
                  << properties.l2_cache_bytes / MiB << " MiB, sm_" << properties.major << properties.minor);
}

TEST_CASE("allocator: record_stream keeps a freed block from reuse until the other stream passed it [gpu]") {
  KILN_REQUIRE_GPU();
  CachingAllocator allocator(cuda_device_memory(0), "cuda:0 (test)");
  const cuda::Stream a = cuda::create_stream(0), b = cuda::create_stream(0);
  // Stream b is held at a host function until the test lets it go.
  std::atomic<bool> go{false};
  const auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  cuda::launch_host_function(b, hold, &go);
  void* p = allocator.allocate(1 << 20, a);
  CHECK(allocator.record_stream(p, b));
  allocator.deallocate(p);
  void* q = allocator.allocate(1 << 20, a);
  CHECK(q != p);  // b has not passed the free
  go = true;
  cuda::stream_synchronize(b);
  allocator.deallocate(q);
  std::set<void*> reused{allocator.allocate(1 << 20, a), allocator.allocate(1 << 20, a)};
  CHECK(reused == std::set<void*>{p, q});
  CHECK(allocator.stats().device_malloc_calls == 2);
  for (void* block : reused) allocator.deallocate(block);
  allocator.empty_cache();
  CHECK(allocator.stats().reserved_bytes == 0);

  // Through a tensor, on the process's allocator: torch's Tensor.record_stream.
  // The tensor dies before its streams: freeing it records an event on b.
  {
    Tensor x = empty({256}, {.device = Device::cuda(0)});
    CHECK_NOTHROW(x.record_stream(b));
    CHECK_THROWS_WITH_AS(zeros({2}).record_stream(b), Contains("record_stream: expected a CUDA tensor"), Error);
  }
  cuda::stream_synchronize(b);
  cuda::destroy_stream(a);
  cuda::destroy_stream(b);
}

TEST_CASE("allocator: with caching off a CUDA allocator mallocs and frees each block [gpu]") {
  KILN_REQUIRE_GPU();
  CachingAllocator allocator(cuda_device_memory(0), "cuda:0 (test)", /*caching=*/false);
  const cuda::Stream stream = cuda::current_stream(0);
  void* p = allocator.allocate(100, stream);
  CHECK(allocator.stats().reserved_bytes == 100);
  cuda::memset_async(p, 0, 100, stream);
  allocator.deallocate(p);
  const AllocatorStats stats = allocator.stats();
  CHECK(stats.reserved_bytes == 0);
  CHECK(stats.device_malloc_calls == 1);
  CHECK(stats.device_free_calls == 1);
}

TEST_CASE("allocator: a thread that never chose a device takes the process's device [gpu]") {
  KILN_REQUIRE_GPU();
  // A data-loader worker or the NCCL watchdog on a rank that uses cuda:N must
  // not create a context on GPU 0 with its first CUDA call (meaningful with 2+ GPUs).
  const int before = cuda::current_device();
  const int device = cuda::device_count() - 1;
  cuda::set_device(device);
  int seen = -1, guarded = -1, after_guard = -1;
  bool pinned = false;
  std::thread worker([&] {
    std::shared_ptr<void> buffer = allocate_pinned(64);  // a pinned batch buffer, the worker's first CUDA call
    pinned = cuda::is_pinned(buffer.get());
    seen = cuda::current_device();
    {
      cuda::DeviceGuard guard(0, "test guard");
      guarded = cuda::current_device();
    }
    after_guard = cuda::current_device();  // restored to the process's device, not to CUDA's default 0
  });
  worker.join();
  cuda::set_device(before);
  CHECK(pinned);
  CHECK(seen == device);
  CHECK(guarded == 0);
  CHECK(after_guard == device);
}

}  // namespace kiln
