// Host emulation of the CUDA C++ that kiln's plain kernel files use (inline
// PTX only in wrappers that gen_cu.py --emulate removes and the driver defines
// with the fragment emulations below, as attention.cu's; attention_tc*.cu have
// their own harness, prelude.h): include this, then a file rewritten by gen_cu.py. A launch runs its CTAs one after
// another, each CTA's threads as OS threads: __syncthreads is a CTA barrier,
// warp shuffles go through a per-warp exchange buffer (full-mask shuffles
// with a lane that has left the kernel, or with lanes that disagree on the
// offset, fail), atomics are std::atomic_ref, __shared__ arrays are static
// storage NaN-poisoned at each CTA's first touch. Buffers from emu::Buffer sit
// between guard pages with canary slack (checked after every launch), so an
// access out of bounds shows.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>
#include <math.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "emu_fragments.h"

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __global__
#define __global__
#undef __shared__
#define __shared__ __shared__  // gen_cu.py rewrites every __shared__; one left over fails to compile
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __forceinline__
#define __forceinline__ inline

#define EMU_REQUIRE(cond, ...)                                                                         \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::fprintf(stderr, "EMU FAILURE %s:%d: %s " __VA_OPT__("(%s)") "\n", __FILE__, __LINE__, #cond \
                   __VA_OPT__(, ) __VA_ARGS__);                                                        \
      std::abort();                                                                                    \
    }                                                                                                  \
  } while (0)

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;

namespace emu {

struct Warp {
  explicit Warp(int lanes) : size(lanes), bar(lanes) {}
  const int size;  // lanes present: 32 but in a partial last warp
  std::barrier<> bar;
  std::atomic<int> exited{0};
  alignas(16) unsigned char slot[32][16];
  int delta[32];
  // The operands of ldmatrix and mma.sync (emulated fragment instructions, below).
  const void* fragment_rows[32];
  uint32_t fragment_a[32][4], fragment_b[32][2];
};

struct Cta {
  Cta(int threads, size_t dynamic_bytes) : bar(threads), dynamic(dynamic_bytes + 16, 0xff), dynamic_bytes(dynamic_bytes) {
    for (int first = 0; first < threads; first += 32) warps.push_back(std::make_unique<Warp>(std::min(32, threads - first)));
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::mutex mutex;
  std::set<const void*> poisoned;  // static __shared__ arrays already NaN-filled for this CTA
  std::vector<unsigned char> dynamic;
  size_t dynamic_bytes;  // what the launch asked for (dynamic has 16 bytes of slack for alignment)
};

inline thread_local Cta* cta = nullptr;
inline thread_local int linear_thread = 0;

inline Warp& warp() { return *cta->warps[linear_thread / 32]; }
inline int lane() { return linear_thread % 32; }

// ---------------------------------------------------------------- guarded buffers

// One mapping: [guard page][canary slack][data][canary slack < align + misalign][guard page].
struct Guarded {
  unsigned char* region;
  size_t region_bytes;
  unsigned char* data;
  size_t bytes;
  std::string name;
};
inline std::mutex guarded_mutex;
inline std::vector<Guarded> guarded;
constexpr unsigned char kCanary = 0xa5;

inline const bool guard_front = std::getenv("EMU_GUARD_FRONT") != nullptr && *std::getenv("EMU_GUARD_FRONT") != 0;

inline size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

inline void on_fault(int, siginfo_t* info, void*) {
  const auto* at = static_cast<const unsigned char*>(info->si_addr);
  char text[512];
  int n = std::snprintf(text, sizeof text, "EMU FAILURE: memory fault at %p", info->si_addr);
  for (const Guarded& g : guarded) {
    if (at >= g.region && at < g.region + g.region_bytes) {
      n += std::snprintf(text + n, sizeof text - n, ": buffer '%s', byte offset %ld (size %zu)", g.name.c_str(),
                         static_cast<long>(at - g.data), g.bytes);
    }
  }
  if (info->si_addr == nullptr) {
    n += std::snprintf(text + n, sizeof text - n, " (on x86 a general protection fault, e.g. an aligned 16-byte "
                                                  "access to an address that is not 16-byte aligned)");
  }
  std::snprintf(text + n, sizeof text - n, "\n");
  (void)!write(2, text, std::strlen(text));
  _exit(3);
}

inline void install_fault_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, nullptr);
  sigaction(SIGBUS, &action, nullptr);
}

// `bytes` of device-like memory whose address is `misalign` bytes past an
// `align`-byte boundary (16, or a larger power of two up to 64), filled with
// `fill` (0xff: NaN in every float type).
inline void* guarded_alloc(size_t bytes, size_t misalign, unsigned char fill, const std::string& name,
                           size_t align = 16) {
  EMU_REQUIRE(align >= 16 && align <= 64 && (align & (align - 1)) == 0);
  const size_t page = page_size();
  const size_t body = (bytes + 64 + misalign + page - 1) / page * page;
  auto* region = static_cast<unsigned char*>(
      mmap(nullptr, body + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  EMU_REQUIRE(region != MAP_FAILED);
  mprotect(region, page, PROT_NONE);
  mprotect(region + page + body, page, PROT_NONE);
  std::memset(region + page, kCanary, body);
  // The data ends at the guard page after it (within align - 1 + misalign bytes), or with
  // EMU_GUARD_FRONT set starts right after the guard page before it (+ misalign).
  const uintptr_t end = reinterpret_cast<uintptr_t>(region + page + body);
  const uintptr_t start = guard_front ? reinterpret_cast<uintptr_t>(region + page) + misalign
                                      : ((end - bytes - misalign) & ~uintptr_t{align - 1}) + misalign;
  auto* data = reinterpret_cast<unsigned char*>(start);
  std::memset(data, fill, bytes);
  std::lock_guard lock(guarded_mutex);
  guarded.push_back({region, body + 2 * page, data, bytes, name});
  return data;
}

inline void guarded_free(void* data) {
  std::lock_guard lock(guarded_mutex);
  for (size_t i = 0; i < guarded.size(); ++i) {
    if (guarded[i].data == data) {
      munmap(guarded[i].region, guarded[i].region_bytes);
      guarded.erase(guarded.begin() + static_cast<long>(i));
      return;
    }
  }
  EMU_REQUIRE(false, "guarded_free of an unknown pointer");
}

// Every canary byte intact, i.e. no buffer written outside its bounds.
inline void check_canaries(const char* after) {
  const size_t page = page_size();
  std::lock_guard lock(guarded_mutex);
  for (const Guarded& g : guarded) {
    const unsigned char* first = g.region + page;
    const unsigned char* last = g.region + g.region_bytes - page;
    for (const unsigned char* p = first; p < last; ++p) {
      if (p == g.data) p += g.bytes;
      if (p < last && *p != kCanary) {
        std::fprintf(stderr, "EMU FAILURE: after %s, buffer '%s' was written at byte offset %ld (size %zu)\n", after,
                     g.name.c_str(), static_cast<long>(p - g.data), g.bytes);
        std::abort();
      }
    }
  }
}

// A typed guarded buffer of n elements.
template <typename T>
struct Buffer {
  T* data = nullptr;
  size_t n = 0;
  Buffer() = default;
  Buffer(size_t count, const std::string& name, size_t misalign = 0, unsigned char fill = 0xff, size_t align = 16)
      : n(count) {
    data = static_cast<T*>(guarded_alloc(count * sizeof(T), misalign, fill, name, align));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data != nullptr) guarded_free(data);
  }
  T& operator[](size_t i) { return data[i]; }
  const T& operator[](size_t i) const { return data[i]; }
};

// ---------------------------------------------------------------- shared memory

inline void shared_poison(void* array, size_t bytes) {
  std::lock_guard lock(cta->mutex);
  if (cta->poisoned.insert(array).second) std::memset(array, 0xff, bytes);
}
inline void* dynamic_shared() { return cta->dynamic.data() + (16 - reinterpret_cast<uintptr_t>(cta->dynamic.data()) % 16) % 16; }

// ---------------------------------------------------------------- launch

struct Config {
  Config(dim3 g, dim3 b, size_t shared = 0, cudaStream_t s = nullptr) : grid(g), block(b), dynamic_shared(shared) {
    (void)s;
  }
  dim3 grid, block;
  size_t dynamic_shared;
};

inline std::string last_error;  // what check_last_launch throws (an invalid configuration)

// Dynamic shared memory over 48 KB needs cudaFuncSetAttribute's opt-in first (up to sm_90's 227 KB).
// The emulated launch sees a lambda, not the kernel: the last opt-in of any kernel stands for it.
inline std::atomic<size_t> opted_in_shared{0};
inline size_t shared_limit() { return std::min<size_t>(std::max<size_t>(48 * 1024, opted_in_shared.load()), 227 * 1024); }
inline std::atomic<long> launches{0}, ctas{0};
inline bool trace = std::getenv("EMU_TRACE") != nullptr;

template <typename Kernel, typename... Args>
void launch(const Config& c, const char* name, Kernel kernel, Args&&... args) {
  // nvcc rejects kernel parameters over 32764 bytes (CUDA >= 12.1, Volta and newer; optim.cu's
  // multi-tensor metas are passed by value); the arguments' sizes stand for the parameters' here.
  static_assert((size_t{0} + ... + sizeof(std::decay_t<Args>)) <= 32764, "kernel parameters over 32764 bytes");
  const unsigned long threads = static_cast<unsigned long>(c.block.x) * c.block.y * c.block.z;
  const unsigned long blocks = static_cast<unsigned long>(c.grid.x) * c.grid.y * c.grid.z;
  if (trace) {
    std::fprintf(stderr, "launch %s grid (%u, %u, %u) block (%u, %u, %u) smem %zu\n", name, c.grid.x, c.grid.y,
                 c.grid.z, c.block.x, c.block.y, c.block.z, c.dynamic_shared);
  }
  // What the runtime rejects (cudaErrorInvalidConfiguration), left for check_last_launch.
  if (threads == 0 || threads > 1024 || c.block.z > 64 || blocks == 0 || c.grid.x > 2147483647u || c.grid.y > 65535 ||
      c.grid.z > 65535 || c.dynamic_shared > shared_limit()) {
    last_error = std::string("invalid configuration for ") + name;
    return;
  }
  ++launches;
  ctas += static_cast<long>(blocks);
  std::tuple<std::decay_t<Args>...> values(std::forward<Args>(args)...);
  std::barrier<> all(static_cast<std::ptrdiff_t>(threads));
  std::unique_ptr<Cta> current;
  std::vector<std::thread> pool;
  for (unsigned long t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto tid = static_cast<unsigned>(t);
      threadIdx = make_uint3(tid % c.block.x, tid / c.block.x % c.block.y, tid / (c.block.x * c.block.y));
      blockDim = c.block;
      gridDim = c.grid;
      linear_thread = static_cast<int>(t);
      for (unsigned long b = 0; b < blocks; ++b) {
        all.arrive_and_wait();
        if (t == 0) current = std::make_unique<Cta>(static_cast<int>(threads), c.dynamic_shared);
        all.arrive_and_wait();
        const auto bid = static_cast<unsigned>(b);
        blockIdx = make_uint3(bid % c.grid.x, bid / c.grid.x % c.grid.y, bid / (c.grid.x * c.grid.y));
        cta = current.get();
        std::apply(kernel, values);  // a copy of the arguments per thread, as by-value kernel parameters are
        // A thread that has left no longer holds up __syncthreads (as on the hardware); a warp
        // shuffle that needs it fails instead.
        Warp& w = warp();
        ++w.exited;
        w.bar.arrive_and_drop();
        cta->bar.arrive_and_drop();
      }
    });
  }
  for (auto& t : pool) t.join();
  check_canaries(name);
}

// ---------------------------------------------------------------- warp shuffles

enum class Shuffle { index, up, down, bfly };

template <typename T>
T shuffle(unsigned mask, T value, int arg, int width, Shuffle kind) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16);
  Warp& w = warp();
  const int l = lane();
  const unsigned present = w.size == 32 ? 0xffffffffu : (1u << w.size) - 1;
  EMU_REQUIRE((mask & present) == present, "a shuffle whose mask leaves out lanes of the warp");
  EMU_REQUIRE(width > 0 && width <= 32 && (width & (width - 1)) == 0);
  std::memcpy(w.slot[l], &value, sizeof(T));
  w.delta[l] = arg;
  w.bar.arrive_and_wait();
  EMU_REQUIRE(w.exited.load() == 0, "a full-mask shuffle after a lane of the warp returned");
  if (kind != Shuffle::index) EMU_REQUIRE(w.delta[0] == arg, "lanes of one shuffle disagree (divergence?)");
  const int base = l / width * width;
  int from = l;
  switch (kind) {
    case Shuffle::index: from = base + (arg % width + width) % width; break;
    case Shuffle::up: from = l - arg >= base ? l - arg : l; break;
    case Shuffle::down: from = l + arg < base + width ? l + arg : l; break;
    case Shuffle::bfly: from = (l ^ arg) < base + width ? l ^ arg : l; break;
  }
  EMU_REQUIRE(from < w.size, "a shuffle reads a lane the partial warp does not have");
  T result;
  std::memcpy(&result, w.slot[from], sizeof(T));
  w.bar.arrive_and_wait();
  return result;
}

// ---------------------------------------------------------------- fragment instructions
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 and mma.sync.aligned.m16n8k16
// (f16/bf16, float accumulators) for a kernel file whose inline-PTX wrappers
// gen_cu.py --emulate removed: the driver defines the wrappers with these.
// Every lane of a full warp must take part; ldmatrix rows must be 16-byte
// aligned rows of the CTA's dynamic shared memory.
inline std::atomic<long> mma_count{0}, ldmatrix_count{0};

inline void require_full_warp(const char* what) {
  Warp& w = warp();
  EMU_REQUIRE(w.size == 32 && w.exited.load() == 0, what);
}

inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  Warp& w = warp();
  const int l = lane();
  const auto* begin = static_cast<const unsigned char*>(dynamic_shared());
  const auto* at = static_cast<const unsigned char*>(row);
  EMU_REQUIRE(at >= begin && at + 16 <= begin + cta->dynamic_bytes &&
                  reinterpret_cast<uintptr_t>(row) % 16 == 0,
              "ldmatrix: a row outside dynamic shared memory or not 16-byte aligned");
  w.fragment_rows[l] = row;
  w.bar.arrive_and_wait();
  require_full_warp("ldmatrix without every lane of the warp");
  emu_fragments::ldmatrix(r, w.fragment_rows, l, trans);
  w.bar.arrive_and_wait();
  ++ldmatrix_count;
}

template <typename T>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Warp& w = warp();
  const int l = lane();
  for (int i = 0; i < 4; ++i) w.fragment_a[l][i] = a[i];
  w.fragment_b[l][0] = b0;
  w.fragment_b[l][1] = b1;
  w.bar.arrive_and_wait();
  require_full_warp("mma.sync without every lane of the warp");
  emu_fragments::mma<T>(d, w.fragment_a, w.fragment_b, l);
  w.bar.arrive_and_wait();
  ++mma_count;
}

}  // namespace emu

// The opt-in for dynamic shared memory over 48 KB (see emu::shared_limit); other attributes are not emulated.
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel*, cudaFuncAttribute attribute, int value) {
  EMU_REQUIRE(attribute == cudaFuncAttributeMaxDynamicSharedMemorySize, "an attribute the emulation does not know");
  EMU_REQUIRE(value >= 0 && value <= 227 * 1024, "an opt-in above sm_90's 227 KB per block");
  emu::opted_in_shared = static_cast<size_t>(value);
  return cudaSuccess;
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int lane, int width = 32) { return emu::shuffle(mask, v, lane, width, emu::Shuffle::index); }
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) { return emu::shuffle(mask, v, static_cast<int>(d), width, emu::Shuffle::up); }
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) { return emu::shuffle(mask, v, static_cast<int>(d), width, emu::Shuffle::down); }
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) { return emu::shuffle(mask, v, m, width, emu::Shuffle::bfly); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  emu::warp().bar.arrive_and_wait();
}
inline void __syncthreads() { emu::cta->bar.arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---------------------------------------------------------------- atomics

template <typename T>
T atomicAdd(T* address, T value) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    std::atomic_ref<uint16_t> bits(*reinterpret_cast<uint16_t*>(address));
    uint16_t old = bits.load();
    for (;;) {
      T sum = T(float(std::bit_cast<T>(old)) + float(value));
      if (bits.compare_exchange_weak(old, std::bit_cast<uint16_t>(sum))) return std::bit_cast<T>(old);
    }
  } else {
    return std::atomic_ref<T>(*address).fetch_add(value);
  }
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);
  return compare;  // the old value either way
}
template <typename T>
T atomicExch(T* address, T value) { return std::atomic_ref<T>(*address).exchange(value); }
template <typename T>
T atomicMax(T* address, T value) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old < value && !a.compare_exchange_weak(old, value)) {}
  return old;
}
template <typename T>
T atomicMin(T* address, T value) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (value < old && !a.compare_exchange_weak(old, value)) {}
  return old;
}

// ---------------------------------------------------------------- intrinsics without host versions

inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
template <typename T>
T __ldg(const T* p) { return *p; }
// Cache-hinted stores: plain stores here.
template <typename T>
void __stwb(T* p, T value) { *p = value; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float x, float y) { return x / y; }
// CUDA's device min/max: integer overloads (mixed types compare in their common type) and
// fminf/fmaxf for floating point.
template <typename A, typename B>
  requires(std::is_integral_v<A> && std::is_integral_v<B>)
std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <typename A, typename B>
  requires(std::is_integral_v<A> && std::is_integral_v<B>)
std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
// Rounded once (round to nearest even): the host's own float/double multiply, as __fmul_rn/__dmul_rn
// promise on the device. The emulated code is built for baseline x86-64, which has no FMA instruction
// (GCC's C++ modes, -std=c++20 included, do allow contraction); the CPU kernel objects a driver links
// are built for x86-64-v3 as the project builds them, where GCC does contract a * b + c into an FMA.
inline float __fmul_rn(float x, float y) { return x * y; }
inline double __dmul_rn(double x, double y) { return x * y; }

// ---------------------------------------------------------------- cub (indexing.cu's sort)

// DeviceRadixSort::SortPairs as its contract says, on the host (the emulated
// device memory is host memory): a stable sort of the pairs by the key bits
// [begin_bit, end_bit); a null temp storage asks for its size. Not CUB's
// algorithm: the kernels around the sort are what the drivers check.
namespace cub {
struct DeviceRadixSort {
  template <typename K, typename V, typename N>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, N count, int begin_bit = 0, int end_bit = int(sizeof(K) * 8),
                               cudaStream_t = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 256;
      return cudaSuccess;
    }
    EMU_REQUIRE(temp_bytes >= 256, "cub::DeviceRadixSort::SortPairs: temp storage smaller than it asked for");
    const int width = end_bit - begin_bit;
    const auto bits = [&](K key) {
      const K shifted = static_cast<K>(key >> begin_bit);
      return width >= int(sizeof(K) * 8) ? shifted : static_cast<K>(shifted & ((K(1) << width) - 1));
    };
    std::vector<int64_t> order(static_cast<size_t>(count));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return bits(keys_in[a]) < bits(keys_in[b]); });
    std::vector<K> keys(order.size());
    std::vector<V> values(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      keys[i] = keys_in[order[i]];
      values[i] = values_in[order[i]];
    }
    std::copy(keys.begin(), keys.end(), keys_out);
    std::copy(values.begin(), values.end(), values_out);
    return cudaSuccess;
  }
};

// DeviceSegmentedRadixSort::SortPairs / SortPairsDescending (sort.cu's topk) as documented: each
// segment [begin[s], end[s]) stably sorted by CUB's radix order of the key bits [begin_bit, end_bit):
// floating keys (float, double, __half, __nv_bfloat16) sign-magnitude twiddled, so -NaN < -inf <
// ... < +inf < +NaN, with -0.0 and +0.0 equal (CUB's ProcessFloatMinusZero); signed integers with
// the sign bit flipped. Not CUB's algorithm; a null temp storage asks for its size.
struct DeviceSegmentedRadixSort {
  template <typename K>
  static uint64_t radix_bits(K key) {
    constexpr int bits = int(sizeof(K) * 8);
    uint64_t u = 0;
    std::memcpy(&u, &key, sizeof(K));
    const uint64_t high = uint64_t{1} << (bits - 1), all = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    if constexpr (std::is_floating_point_v<K> || std::is_same_v<K, __half> || std::is_same_v<K, __nv_bfloat16>) {
      if (u == high) u = 0;  // -0.0 as +0.0
      return (u & high) ? (~u & all) : (u | high);
    } else if constexpr (std::is_signed_v<K>) {
      return u ^ high;
    } else {
      return u;
    }
  }
  template <typename K, typename V, typename B, typename E>
  static cudaError_t sort(bool descending, void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                          const V* values_in, V* values_out, int count, int segments, B begin, E end, int begin_bit,
                          int end_bit) {
    if (temp == nullptr) {
      temp_bytes = 256;
      return cudaSuccess;
    }
    EMU_REQUIRE(temp_bytes >= 256, "cub::DeviceSegmentedRadixSort: temp storage smaller than it asked for");
    const int width = end_bit - begin_bit;
    const auto bits = [&](K key) {
      const uint64_t shifted = radix_bits(key) >> begin_bit;
      return width >= 64 ? shifted : shifted & ((uint64_t{1} << width) - 1);
    };
    for (int s = 0; s < segments; ++s) {
      const int64_t first = begin[s], last = end[s];
      EMU_REQUIRE(0 <= first && first <= last && last <= count, "cub::DeviceSegmentedRadixSort: a segment out of range");
      std::vector<int64_t> order(static_cast<size_t>(last - first));
      for (size_t i = 0; i < order.size(); ++i) order[i] = first + static_cast<int64_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return descending ? bits(keys_in[b]) < bits(keys_in[a]) : bits(keys_in[a]) < bits(keys_in[b]);
      });
      std::vector<K> keys(order.size());
      std::vector<V> values(order.size());
      for (size_t i = 0; i < order.size(); ++i) {
        keys[i] = keys_in[order[i]];
        values[i] = values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), keys_out + first);
      std::copy(values.begin(), values.end(), values_out + first);
    }
    return cudaSuccess;
  }
  template <typename K, typename V, typename B, typename E>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, int count, int segments, B begin, E end, int begin_bit = 0,
                               int end_bit = int(sizeof(K) * 8), cudaStream_t = nullptr) {
    return sort(false, temp, temp_bytes, keys_in, keys_out, values_in, values_out, count, segments, begin, end,
                begin_bit, end_bit);
  }
  template <typename K, typename V, typename B, typename E>
  static cudaError_t SortPairsDescending(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                                         const V* values_in, V* values_out, int count, int segments, B begin, E end,
                                         int begin_bit = 0, int end_bit = int(sizeof(K) * 8), cudaStream_t = nullptr) {
    return sort(true, temp, temp_bytes, keys_in, keys_out, values_in, values_out, count, segments, begin, end,
                begin_bit, end_bit);
  }
};
}  // namespace cub

// A template overload that takes the __device__ variable itself, as cuda_runtime.h's does.
template <typename T>
cudaError_t cudaGetSymbolAddress(void** address, const T& symbol) {
  *address = const_cast<T*>(&symbol);
  return cudaSuccess;
}
