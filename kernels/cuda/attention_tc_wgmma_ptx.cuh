// Inline-PTX wrappers for attention_tc_wgmma.cu: Hopper's warpgroup matrix
// product (wgmma.mma_async, sm_90a) with A in registers and B in shared
// memory through a matrix descriptor, and the async-proxy fence.
// scripts/cuda_emu/gen.py replaces everything from the "wgmma wrappers"
// marker to the "wgmma end" marker with emulations (emu_wgmma.inc): keep both
// markers and keep everything between them a pure wrapper (make_descriptor,
// after them, is plain arithmetic the emulation runs as written).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/check.h"

namespace kiln::kernels::attention_tc {
namespace {

// ---------------------------------------------------------------- wgmma wrappers
//
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} (PTX ISA,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): the 128 threads
// of a warpgroup (4 consecutive warps, the first a multiple of 4) compute
// D (64 x N, float) = A (64 x 16) B (16 x N) + (accumulate ? D : 0).
//  - D: warp w of the warpgroup holds rows 16 w .. 16 w + 15 exactly as
//    mma.sync.m16n8k16 holds its C (attention_tc_ptx.cuh), 8 columns per
//    d[n][0..3]: d[n][0], d[n][1] = (row g, cols 8n + 2t, +1), d[n][2], d[n][3]
//    = (row g + 8, same cols).
//  - A in registers: warp w holds rows 16 w .. + 15 as mma.sync's A fragment,
//    so P goes from one product to the next through pack_a as before.
//  - B through a descriptor (make_descriptor): 128-byte swizzled tiles, K-major
//    (B(k, n) at n's row, k contiguous: K for S = Q K^T) or, with trans_b,
//    MN-major (B(k, n) at k's row, n contiguous: V for O = P V).
// The product runs asynchronously: wgmma_fence(D and A arrays) before the
// first product of a batch whose registers (D or A) other instructions wrote,
// wgmma_commit() after the batch, and wgmma_wait<0>(D arrays) before D is read
// or the shared tiles are overwritten.

// Whether the current device runs this file's sm_90a code: compute capability 9.0 exactly. Asked
// once per device (a launcher calls it at every launch, dozens of times per GPT-2 step).
inline bool wgmma_device() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  static std::atomic<signed char> known[64] = {};  // per device: 0 not yet asked, 1 yes, -1 no
  if (device >= 0 && device < 64) {
    const signed char answer = known[device].load(std::memory_order_relaxed);
    if (answer != 0) return answer > 0;
  }
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
  const bool sm90 = major == 9 && minor == 0;
  if (device >= 0 && device < 64) known[device].store(sm90 ? 1 : -1, std::memory_order_relaxed);
  return sm90;
}

// A warp-specialized kernel's setmaxnreg split assumes ptxas gave it exactly
// `expected` registers per thread at launch (its __launch_bounds__ allow that
// many): with fewer in the pool, setmaxnreg.inc would wait forever. So a build
// that gave another count (other flags, another ptxas) is refused instead of
// launched. The caller asks once per kernel.
template <typename Kernel>
void require_kernel_registers(Kernel kernel, int expected, const char* what) {
  cudaFuncAttributes attributes{};
  KILN_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  KILN_CHECK(attributes.numRegs == expected, what, ": the kernel was built with ", attributes.numRegs,
             " registers per thread, but its setmaxnreg split needs exactly ", expected,
             " (rebuild kernels/cuda/attention_tc_wgmma_pingpong.cu with the project's flags)");
}

__device__ __forceinline__ uint32_t wgmma_smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Pins registers for the compiler (CUTLASS's warpgroup_fence_operand): an
// empty asm that reads and writes each one, so that no ordinary instruction on
// them moves across the wgmma.fence or wgmma.wait_group beside it. The asm that
// issues a product names its D and A registers, but the fence and the wait
// name none: unpinned, the compiler may sink a write of acc below
// wgmma.fence or hoist a read of s above the wait that completes it
// (undefined in PTX; ptxas then serializes the products, C7515).
template <typename R, int N>
__device__ __forceinline__ void pin_registers(R (&r)[N][4]) {
  static_assert(std::is_same_v<R, float> || std::is_same_v<R, uint32_t>, "D (float) or A (packed 16-bit pairs)");
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (std::is_same_v<R, float>) {
        asm volatile("" : "+f"(r[n][e])::"memory");
      } else {
        asm volatile("" : "+r"(r[n][e])::"memory");
      }
    }
  }
}

// wgmma_fence(registers...) before a batch: names every D and register-A array
// the batch uses (ordinary writes to them land before the fence);
// wgmma_wait<N>(registers...): names the D arrays of the products it completes
// (their reads stay after it). The emulator checks both lists.
template <typename... Registers>
__device__ __forceinline__ void wgmma_fence(Registers&... registers) {
  (pin_registers(registers), ...);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kInFlight, typename... Registers>
__device__ __forceinline__ void wgmma_wait(Registers&... registers) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kInFlight) : "memory");
  (pin_registers(registers), ...);
}

// Orders this thread's generic-proxy writes to shared memory (stores and
// cp.async) before the async proxy's reads (wgmma) that follow a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define KILN_WGMMA_D8(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define KILN_WGMMA_D64 \
  KILN_WGMMA_D8(0), KILN_WGMMA_D8(1), KILN_WGMMA_D8(2), KILN_WGMMA_D8(3), KILN_WGMMA_D8(4), KILN_WGMMA_D8(5), \
      KILN_WGMMA_D8(6), KILN_WGMMA_D8(7)
#define KILN_WGMMA_D128                                                                                         \
  KILN_WGMMA_D64, KILN_WGMMA_D8(8), KILN_WGMMA_D8(9), KILN_WGMMA_D8(10), KILN_WGMMA_D8(11), KILN_WGMMA_D8(12), \
      KILN_WGMMA_D8(13), KILN_WGMMA_D8(14), KILN_WGMMA_D8(15)
#define KILN_WGMMA_REGS32                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KILN_WGMMA_REGS64                                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "      \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
  "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// One product: "d, {a}, b-desc, p (scale-d), 1, 1, trans-b" after the shape and types.
#define KILN_WGMMA_ASM(shape, type, d_regs, a0, desc, scale, trans)                          \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " scale ", 0;\n"                                           \
  "wgmma.mma_async.sync.aligned." shape ".f32." type "." type " " d_regs ", {" a0 "}, " desc \
  ", p, 1, 1, " trans ";\n}\n"

// d (64 x N) = a (64 x 16, this thread's fragment) b (16 x N, descriptor) + (accumulate ? d : 0), N = 8 NT (64 or 128).
template <typename T, int NT, bool kTransB>
__device__ __forceinline__ void wgmma(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  static_assert(NT == 8 || NT == 16, "N is 64 or 128");
  const int scale = accumulate ? 1 : 0;
  if constexpr (NT == 8 && std::is_same_v<T, __half>) {
    asm volatile(KILN_WGMMA_ASM("m64n64k16", "f16", KILN_WGMMA_REGS32, "%32, %33, %34, %35", "%36", "%37", "%38")
                 : KILN_WGMMA_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale), "n"(kTransB ? 1 : 0));
  } else if constexpr (NT == 8) {
    asm volatile(KILN_WGMMA_ASM("m64n64k16", "bf16", KILN_WGMMA_REGS32, "%32, %33, %34, %35", "%36", "%37", "%38")
                 : KILN_WGMMA_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale), "n"(kTransB ? 1 : 0));
  } else if constexpr (std::is_same_v<T, __half>) {
    asm volatile(KILN_WGMMA_ASM("m64n128k16", "f16", KILN_WGMMA_REGS64, "%64, %65, %66, %67", "%68", "%69", "%70")
                 : KILN_WGMMA_D128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale), "n"(kTransB ? 1 : 0));
  } else {
    asm volatile(KILN_WGMMA_ASM("m64n128k16", "bf16", KILN_WGMMA_REGS64, "%64, %65, %66, %67", "%68", "%69", "%70")
                 : KILN_WGMMA_D128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale), "n"(kTransB ? 1 : 0));
  }
}

// The same with A through a descriptor too (A K-major: A(m, k) at m's row, k
// contiguous, in the layout of B's K-major tiles): "d, a-desc, b-desc, p, 1, 1, 0, 0".
#define KILN_WGMMA_SS_ASM(shape, type, d_regs, a_desc, b_desc, scale)                        \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " scale ", 0;\n"                                          \
  "wgmma.mma_async.sync.aligned." shape ".f32." type "." type " " d_regs ", " a_desc ", " b_desc \
  ", p, 1, 1, 0, 0;\n}\n"

// d (64 x N) = a (64 x 16, descriptor) b (16 x N, descriptor) + (accumulate ? d : 0), both K-major.
template <typename T, int NT>
__device__ __forceinline__ void wgmma_ss(float (&d)[NT][4], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(NT == 8 || NT == 16, "N is 64 or 128");
  const int scale = accumulate ? 1 : 0;
  if constexpr (NT == 8 && std::is_same_v<T, __half>) {
    asm volatile(KILN_WGMMA_SS_ASM("m64n64k16", "f16", KILN_WGMMA_REGS32, "%32", "%33", "%34")
                 : KILN_WGMMA_D64
                 : "l"(a), "l"(b), "r"(scale));
  } else if constexpr (NT == 8) {
    asm volatile(KILN_WGMMA_SS_ASM("m64n64k16", "bf16", KILN_WGMMA_REGS32, "%32", "%33", "%34")
                 : KILN_WGMMA_D64
                 : "l"(a), "l"(b), "r"(scale));
  } else if constexpr (std::is_same_v<T, __half>) {
    asm volatile(KILN_WGMMA_SS_ASM("m64n128k16", "f16", KILN_WGMMA_REGS64, "%64", "%65", "%66")
                 : KILN_WGMMA_D128
                 : "l"(a), "l"(b), "r"(scale));
  } else {
    asm volatile(KILN_WGMMA_SS_ASM("m64n128k16", "bf16", KILN_WGMMA_REGS64, "%64", "%65", "%66")
                 : KILN_WGMMA_D128
                 : "l"(a), "l"(b), "r"(scale));
  }
}

// ---- the warp-specialized forward's synchronization (attention_tc_wgmma_pingpong.cu)

// mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions:
// mbarrier"): a 64-bit shared object whose phase completes when `count`
// arrivals have been made; waiters name the phase by its parity.
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(wgmma_smem_address(barrier)), "r"(count) : "memory");
}
// One arrival (release semantics at CTA scope).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   wgmma_smem_address(barrier))
               : "memory");
}
// Waits (acquire semantics) until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  const uint32_t address = wgmma_smem_address(barrier);
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(address), "r"(parity)
                 : "memory");
  } while (done == 0);
}

// Named barrier `id` (1-15; 0 is __syncthreads) of `threads` threads:
// bar.sync arrives and waits, bar.arrive only arrives.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// setmaxnreg (sm_90a): a warpgroup gives up (dec) or claims (inc) registers,
// so that a producer warpgroup's spare registers go to the consumers.
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

#undef KILN_WGMMA_SS_ASM
#undef KILN_WGMMA_ASM
#undef KILN_WGMMA_REGS64
#undef KILN_WGMMA_REGS32
#undef KILN_WGMMA_D128
#undef KILN_WGMMA_D64
#undef KILN_WGMMA_D8

// ---------------------------------------------------------------- wgmma end

// The matrix descriptor of a 128-byte-swizzled shared tile starting at
// `start` (its swizzle pattern 1024-byte aligned: base offset 0):
// `leading` and `stride` bytes as the PTX ISA's "leading dimension byte
// offset" and "stride dimension byte offset" for the tile's major-ness.
__device__ __forceinline__ uint64_t make_descriptor(const void* start, uint32_t leading, uint32_t stride) {
  const uint64_t encode_mask = 0x3FFFF;
  return ((wgmma_smem_address(start) & encode_mask) >> 4) | ((leading & encode_mask) >> 4) << 16 |
         ((stride & encode_mask) >> 4) << 32 | uint64_t{1} << 62;
}

}  // namespace
}  // namespace kiln::kernels::attention_tc
