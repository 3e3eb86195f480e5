// Host emulation of what attention_tc*.cu's kernels use from CUDA: one OS
// thread per CUDA thread, __syncthreads as a barrier, warp shuffles and the
// PTX fragment instructions through per-warp exchange buffers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "emu_fragments.h"

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __global__
#define __global__
#undef __shared__
#define __shared__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline

#define EMU_REQUIRE(cond, ...)                                                                   \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "EMU FAILURE %s:%d: %s " __VA_OPT__("(%s)") "\n", __FILE__, __LINE__, \
                   #cond __VA_OPT__(, ) __VA_ARGS__);                                            \
      std::abort();                                                                              \
    }                                                                                            \
  } while (0)

inline thread_local uint3 threadIdx, blockIdx;

// Device intrinsics native_types.cuh uses, on the host.
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

namespace emu {
struct Warp {
  std::barrier<> bar{32};
  const void* addr[32];
  float f[32];
  uint32_t a[32][4];
  uint32_t b[32][2];
};
// wgmma's operands as each of a warpgroup's 128 threads issued them (emu_wgmma.inc).
constexpr int kWgmmaSlots = 16;  // products issued before one wait
struct WgmmaOp {
  uint32_t a[128][4];
  uint64_t a_desc[128];  // A K-major in shared memory (wgmma_ss), when a_from_smem
  bool a_from_smem[128];
  uint64_t desc[128];
  bool accumulate[128], trans[128];
  int n[128];
};
struct WarpGroup {
  std::barrier<> bar{128};
  WgmmaOp ops[kWgmmaSlots];
};
struct WgmmaPending {  // a thread's own part of a product: its accumulators
  float* d;
  int n;
  bool half;
  const uint32_t* a = nullptr;  // its A fragment's registers (A from registers), checked unchanged at the wait
};
// An mbarrier's state (emu_wgmma.inc), kept beside shared memory by its address.
struct MBarrier {
  int expected = 0, pending = 0;
  uint32_t phase = 0;  // completed phases
};
struct Cta {
  explicit Cta(int threads) : bar(threads) {}
  std::barrier<> bar;
  Warp warps[16];
  WarpGroup groups[4];
  std::mutex mutex;  // guards named and mbarriers
  std::unique_ptr<std::barrier<>> named[16];
  int named_threads[16] = {};
  std::condition_variable mbarrier_changed;
  std::map<const void*, MBarrier> mbarriers;
};
struct Copy {
  void* to;
  const void* from;
  int bytes;
};
inline thread_local Cta* cta = nullptr;
inline thread_local std::vector<std::vector<Copy>> groups;  // committed, not yet waited
inline thread_local std::vector<Copy> open_group;
inline bool eager = false;  // perform copies at issue (else at the wait that covers them)
inline unsigned char* smem_begin = nullptr;
inline size_t smem_bytes = 0;
// EMU_COPY_DELAY_US: a wait that performs copies first sleeps a random 0 to twice this long, so
// that a reader not ordered after that wait (by the copier's wait and a barrier) reads too early
// here more often; only in threads from EMU_COPY_DELAY_FROM on (e.g. 256: shape 12's producer).
inline long environment_number(const char* name) { return std::getenv(name) ? std::atol(std::getenv(name)) : 0; }
inline const long copy_delay_us = environment_number("EMU_COPY_DELAY_US");
inline const long copy_delay_from = environment_number("EMU_COPY_DELAY_FROM");
// Copies issued and not yet performed, per 16 bytes of shared memory: the tensor cores' and
// ldmatrix's reads of such bytes fail (read_landed), whether or not the stale bytes differ.
inline std::atomic<int> copies_in_flight[232448 / 16];
inline std::atomic<int>& in_flight(const void* to) {
  return copies_in_flight[(static_cast<const unsigned char*>(to) - smem_begin) / 16];
}
inline void read_landed(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (const unsigned char* chunk = c; chunk < c + bytes; chunk += 16) {
    EMU_REQUIRE(in_flight(chunk).load() == 0, "shared memory read before the cp.async writing it was waited for");
  }
}
inline std::atomic<long> mma_count{0}, ldmatrix_count{0}, copy_count{0}, wgmma_count{0}, wgmma_fence_count{0};
inline thread_local std::vector<WgmmaPending> wgmma_pending;  // issued, not yet waited
inline thread_local std::vector<size_t> wgmma_group_ends;      // wgmma_pending.size() at each commit not yet waited for
// The register arrays named at this thread's last wgmma_fence (byte ranges of the arrays).
inline thread_local std::vector<std::pair<const char*, const char*>> wgmma_fenced;

inline Warp& warp() { return cta->warps[threadIdx.x / 32]; }
inline WarpGroup& warp_group() { return cta->groups[threadIdx.x / 128]; }
inline int lane() { return static_cast<int>(threadIdx.x % 32); }
inline void require_smem(const void* p, size_t bytes, size_t align) {
  auto* c = static_cast<const unsigned char*>(p);
  EMU_REQUIRE(c >= smem_begin && c + bytes <= smem_begin + smem_bytes);
  EMU_REQUIRE(reinterpret_cast<uintptr_t>(p) % align == 0);
}
}  // namespace emu

inline void __syncthreads() { emu::cta->bar.arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned mask, float x, int lane_mask) {
  EMU_REQUIRE(mask == 0xffffffffu);
  emu::Warp& w = emu::warp();
  w.f[emu::lane()] = x;
  w.bar.arrive_and_wait();
  const float y = w.f[emu::lane() ^ lane_mask];
  w.bar.arrive_and_wait();
  return y;
}
// Whether any lane of the warp passes a nonzero predicate (full mask only).
inline int __any_sync(unsigned mask, int predicate) {
  EMU_REQUIRE(mask == 0xffffffffu);
  emu::Warp& w = emu::warp();
  w.f[emu::lane()] = predicate != 0 ? 1.0f : 0.0f;
  w.bar.arrive_and_wait();
  bool any = false;
  for (int l = 0; l < 32; ++l) any = any || w.f[l] != 0.0f;
  w.bar.arrive_and_wait();
  return any ? 1 : 0;
}
