// Inline-PTX wrappers for attention_tc's kernels (mma.sync m16n8k16,
// ldmatrix, cp.async; sm_80+) and the fragment helpers built on them.
// scripts/cuda_emu/gen.py replaces everything from the "PTX wrappers" marker
// to the "fragments" marker with emulations (emu_ptx.inc): keep both markers
// and keep the fragment helpers free of inline PTX.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kiln::kernels::attention_tc {
namespace {

// ---------------------------------------------------------------- PTX wrappers
//
// Fragment layouts of mma.sync.m16n8k16 with 16-bit A/B and float C/D (PTX
// ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), for lane
// l, g = l / 4, t = l % 4; a 32-bit register holds two 16-bit elements, the
// lower column (or k) index in the low half:
//   A (16 x 16, row-major):  a[0] = (row g,     cols 2t, 2t+1)
//                            a[1] = (row g + 8, cols 2t, 2t+1)
//                            a[2] = (row g,     cols 2t+8, 2t+9)
//                            a[3] = (row g + 8, cols 2t+8, 2t+9)
//   B (16 x 8, "col"):       b[0] = (k 2t, 2t+1;   col g)
//                            b[1] = (k 2t+8, 2t+9; col g)
//   C, D (16 x 8, float):    c[0], c[1] = (row g, cols 2t, 2t+1); c[2], c[3] = (row g + 8, cols 2t, 2t+1)
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8i .. 8i+7 give the
// addresses of rows 0..7 of 8x8 matrix i (16 contiguous bytes each); register
// r[i] of lane l receives matrix i's (row g, cols 2t, 2t+1). With .trans it
// receives (rows 2t, 2t+1; col g) instead: the matrix transposed.

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row))
               : "memory");
}

// d = a b + d. Not volatile: a pure function of its operands, which the
// compiler may schedule freely.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 2^x on the SFU (ex2.approx.ftz.f32), one instruction. exp2f is the same
// MUFU.EX2 behind a guard for subnormal results (a compare and two
// predicated multiplies per call: 3 of the softmax's ~9 instructions per
// score); here a result below 2^-126 is 0 instead, which no probability
// or rescaling factor of attention can tell apart. 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 16 bytes global -> shared without passing through registers (sm_80+). The
// copies of a thread form groups (commit); wait_group<n> returns once at most
// the n most recent groups of this thread are still in flight. Other threads'
// copies are visible only after a __syncthreads() that follows their wait.
__device__ __forceinline__ void cp_async_16(void* to, const void* from) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(to)), "l"(from) : "memory");
}
__device__ __forceinline__ void cp_async_4(void* to, const void* from) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_address(to)), "l"(from) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kInFlight>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight) : "memory");
}

// ---------------------------------------------------------------- fragments

// A fragment of the 16 x 16 tile at (rows 0..15, cols k0..k0+15) of a row-major
// shared tile. Matrix i = rows 8 (i % 2).., cols k0 + 8 (i / 2): then r[i] is
// a[i] above. Lane l points at row l % 16, column k0 + 8 (l / 16).
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int ld, int k0, int lane) {
  ldmatrix_x4(a, tile + (lane % 16) * ld + k0 + 8 * (lane / 16));
}

// B fragments of two 8-column tiles n0..n0+7, n0+8..n0+15 and k0..k0+15 from a
// shared tile stored with n as rows and k as columns (K for S = Q K^T: B(k, n)
// = K(n, k)). Matrix i = rows n0 + 8 (i / 2).., cols k0 + 8 (i % 2): r[0], r[1]
// are b[0], b[1] of tile n0, r[2], r[3] those of tile n0 + 8. Lane l points at
// row n0 + l % 8 + 8 (l / 16), column k0 + 8 (l / 8 % 2).
template <typename T>
__device__ __forceinline__ void load_b_n_rows(uint32_t (&b)[4], const T* tile, int ld, int n0, int k0, int lane) {
  ldmatrix_x4(b, tile + (n0 + lane % 8 + 8 * (lane / 16)) * ld + k0 + 8 * (lane / 8 % 2));
}

// The same fragments from a shared tile stored with k as rows and n as columns
// (V for O = P V: B(k, n) = V(k, n)), transposed by ldmatrix. Matrix i = rows
// k0 + 8 (i % 2).., cols n0 + 8 (i / 2); .trans gives lane l (rows 2t, 2t+1;
// col g) of it, which is b[i % 2] of tile n0 + 8 (i / 2). Lane l points at row
// k0 + l % 8 + 8 (l / 8 % 2), column n0 + 8 (l / 16).
template <typename T>
__device__ __forceinline__ void load_b_k_rows(uint32_t (&b)[4], const T* tile, int ld, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * ld + n0 + 8 * (lane / 16));
}

template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float low, float high) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 pair = __floats2half2_rn(low, high);  // .x = low: the low 16 bits
    memcpy(&bits, &pair, sizeof(bits));
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    memcpy(&bits, &pair, sizeof(bits));
  }
  return bits;
}

// The A fragment of columns 16 kk .. 16 kk + 15 of a (16, 8 NT) float
// accumulator, rounded to T. Accumulator tile n = 2 kk holds (row g, cols
// 2t, 2t+1) in c[n][0..1] and (row g + 8, same cols) in c[n][2..3]; tile
// 2 kk + 1 the same 8 columns further: exactly the (row, col) pairs of a[0],
// a[1] and a[2], a[3] of the A layout above. So P and dS go from one product
// to the next without leaving the lane.
template <typename T, int NT>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&c)[NT][4], int kk) {
  a[0] = pack_pair<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack_pair<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack_pair<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack_pair<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// For each of G row groups r: c[r] (16, 8 NT) += a[r] (16, 16 KT; fragments
// in registers) b^T, b (8 NT, 16 KT) row-major in shared memory: each B
// fragment is loaded once for all G groups.
template <typename T, int G, int NT, int KT>
__device__ __forceinline__ void mma_regs_nt(float (&c)[G][NT][4], const uint32_t (&a)[G][KT][4], const T* b, int ldb,
                                            int lane) {
  static_assert(NT % 2 == 0, "ldmatrix.x4 covers two 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t bf[4];
      load_b_n_rows(bf, b, ldb, 8 * n, 16 * kk, lane);
#pragma unroll
      for (int r = 0; r < G; ++r) {
        mma<T>(c[r][n], a[r][kk], bf[0], bf[1]);
        mma<T>(c[r][n + 1], a[r][kk], bf[2], bf[3]);
      }
    }
  }
}

// c (16, 8 NT) += a (16, 16 KT) b^T, a and b row-major in shared memory.
template <typename T, int NT, int KT>
__device__ __forceinline__ void mma_smem_nt(float (&c)[NT][4], const T* a, int lda, const T* b, int ldb, int lane) {
  static_assert(NT % 2 == 0, "ldmatrix.x4 covers two 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint32_t af[4];
    load_a(af, a, lda, 16 * kk, lane);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t bf[4];
      load_b_n_rows(bf, b, ldb, 8 * n, 16 * kk, lane);
      mma<T>(c[n], af, bf[0], bf[1]);
      mma<T>(c[n + 1], af, bf[2], bf[3]);
    }
  }
}

// For each of G row groups r: c[r] (16, 8 NT) += a[r] (16, 16 KT; fragments
// in registers) b, b (16 KT, 8 NT) row-major in shared memory: each B
// fragment is loaded once for all G groups.
template <typename T, int G, int NT, int KT>
__device__ __forceinline__ void mma_regs_nn(float (&c)[G][NT][4], const uint32_t (&a)[G][KT][4], const T* b, int ldb,
                                            int lane) {
  static_assert(NT % 2 == 0, "ldmatrix.x4 covers two 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t bf[4];
      load_b_k_rows(bf, b, ldb, 16 * kk, 8 * n, lane);
#pragma unroll
      for (int r = 0; r < G; ++r) {
        mma<T>(c[r][n], a[r][kk], bf[0], bf[1]);
        mma<T>(c[r][n + 1], a[r][kk], bf[2], bf[3]);
      }
    }
  }
}

// The same for one row group.
template <typename T, int NT, int KT>
__device__ __forceinline__ void mma_regs_nn(float (&c)[NT][4], const uint32_t (&a)[KT][4], const T* b, int ldb,
                                            int lane) {
  mma_regs_nn<T, 1, NT, KT>(reinterpret_cast<float (&)[1][NT][4]>(c), reinterpret_cast<const uint32_t (&)[1][KT][4]>(a),
                            b, ldb, lane);
}

}  // namespace
}  // namespace kiln::kernels::attention_tc
