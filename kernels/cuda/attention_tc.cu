// CUDA fused attention for float16 and bfloat16 on tensor cores, with
// FlashAttention-2's register-resident schedule (Dao, 2023), written for kiln
// from the paper's description. The contract is kernels/attention.h's; the
// kernels of attention.cu stay as the reference (set_attention_cuda_kernels)
// and take every other problem (float32).
//
// STATUS: compiled for sm_90 with -Werror but NOT YET RUN ON A GPU. The [gpu]
// case "attention: the tensor-core kernels match the reference kernels and the
// CPU ..." of tests/test_attention.cpp is the check; bench_attention times both
// sets of kernels. ptxas (CUDA 13.0, sm_90), all 96 instantiations: no spills;
// registers per thread: forward 118-128 (D <= 64, no mask or dropout: two
// 256-thread CTAs per SM), 158-244 otherwise (one); dK/dV 165-252 and dQ
// 180-254 (128 threads: two CTAs per SM at D = 128).
//
// Same math and rounding points as attention.cu: scores and softmax in float,
// P and dS rounded to the input type before their products, dropout through
// the Philox word ((b * H + h) * Tq + i) * Tk + j of every score, no atomics
// (each dq, dk, dv element has one owning CTA, so results are deterministic).
// What is faster:
//  - The forward keeps Q's A fragments in registers for the whole key loop.
//  - P (forward) and P, dS (backward) never touch shared memory: the float
//    accumulators of two adjacent 8-column score tiles, packed pairwise to
//    16 bits, are the A fragment of the next product (pack_a).
//  - exp2f of scores premultiplied by scale * log2(e) (one FFMA per score
//    in the backward); lse stays in natural-log units.
//  - Masking is decided per warp and key (or query) block: only blocks that
//    cross Tq or Tk, touch the causal diagonal, or have an additive mask run
//    the per-element checks; blocks entirely above the diagonal are skipped.
//  - K/V (forward, dQ) and Q/dO/lse/delta (dK/dV) tiles are double-buffered
//    with cp.async: block j + 1 loads while block j is computed. Unaligned
//    inputs (vector_loads false) take plain loads through the same stages.
//  - Every B fragment, and the A fragments read from shared memory, come from
//    ldmatrix (x4: two 8-column tiles, or one 16x16 A tile, per instruction).
//  - Dropout and an additive mask get kernels of their own (template flags),
//    so the common kernel carries neither Philox's registers nor the mask's
//    loads; dropout keep bits are drawn before the score product, one Philox
//    block at a time.
// Shapes (constants in the *Shape structs; the tuning knobs):
//  - forward: 8 warps, 128 query rows per CTA (16 per warp), 64-key blocks.
//    128 rows halve the L2 traffic of K and V against 64-row CTAs.
//  - dK/dV: 4 warps, 64 keys per CTA, query steps of 64 (32 for D >= 96: dK
//    and dV take D / 2 float registers each per thread).
//  - dQ: 4 warps, 64 queries per CTA, 64-key steps.
//  Rows are padded by 16 bytes: each ldmatrix phase (8 rows of 16 bytes)
//  then touches all 32 banks once, for D = 32, 64, 96 and 128.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/philox.h"
#include "kernels/random.h"

namespace kiln::kernels::attention_tc {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kPosInf = __builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kPad = 8;  // elements: 16 bytes per row

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------- shapes and shared memory layouts
// Offsets in elements of the 16-bit type; every tile has row stride kLd = D + kPad.

template <int D>
struct ForwardShape {
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;  // queries per CTA
  static constexpr int kCols = 64;           // keys per block
  static constexpr int kMinBlocks = D <= 64 ? 2 : 1;
  static constexpr int kLd = D + kPad;
  static constexpr int q = 0;                           // (kRows, D)
  static constexpr int kv = q + kRows * kLd;            // stage s: K (kCols, D) at kv + s * kStage, V after it
  static constexpr int kStage = 2 * kCols * kLd;
  static constexpr size_t kBytes = size_t{kv + 2 * kStage} * 2;
};

template <int D>
struct DkdvShape {
  static constexpr int kWarps = 4, kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;        // keys per CTA
  static constexpr int kCols = D >= 96 ? 32 : 64;  // queries per step
  static constexpr int kMinBlocks = 1;
  static constexpr int kLd = D + kPad;
  static constexpr int k = 0;                           // (kRows, D)
  static constexpr int v = k + kRows * kLd;             // (kRows, D)
  static constexpr int qdo = v + kRows * kLd;           // stage s: Q (kCols, D) at qdo + s * kStage, dO after it
  static constexpr int kStage = 2 * kCols * kLd;
  static constexpr size_t kFloats = size_t{qdo + 2 * kStage} * 2;  // bytes; stage s: lse (kCols), delta (kCols)
  static constexpr size_t kBytes = kFloats + 2 * 2 * kCols * sizeof(float);
};

template <int D>
struct DqShape {
  static constexpr int kWarps = 4, kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;  // queries per CTA
  static constexpr int kCols = 64;           // keys per step
  static constexpr int kMinBlocks = 1;
  static constexpr int kLd = D + kPad;
  static constexpr int q = 0;                  // (kRows, D)
  static constexpr int dout = q + kRows * kLd;  // (kRows, D)
  static constexpr int kv = dout + kRows * kLd;  // stage s: K (kCols, D) at kv + s * kStage, V after it
  static constexpr int kStage = 2 * kCols * kLd;
  static constexpr size_t kBytes = size_t{kv + 2 * kStage} * 2;
};

constexpr size_t kMaxSmem = 227 * 1024;  // sm_90's opt-in limit per block
static_assert(ForwardShape<128>::kBytes <= kMaxSmem && DkdvShape<128>::kBytes <= kMaxSmem &&
              DqShape<128>::kBytes <= kMaxSmem && DkdvShape<64>::kBytes <= kMaxSmem);
static_assert(DkdvShape<128>::kFloats % 16 == 0, "the float region starts 16-byte aligned");

struct Params {
  const void* q = nullptr;     // (B, H, Tq, D)
  const void* k = nullptr;     // (B, H, Tk, D)
  const void* v = nullptr;     // (B, H, Tk, D)
  const void* dout = nullptr;  // (B, H, Tq, D), backward
  const float* mask = nullptr;  // additive, read through the strides below; or null
  int64_t mask_stride_b = 0, mask_stride_h = 0, mask_stride_q = 0, mask_stride_k = 0;
  void* out = nullptr;           // (B, H, Tq, D), forward
  float* lse_out = nullptr;      // (B, H, Tq), forward
  const float* lse = nullptr;    // (B, H, Tq), backward: the forward's
  const float* delta = nullptr;  // (B, H, Tq), backward: dout . out per row
  void* dq = nullptr;            // (B, H, Tq, D) or null
  void* dk = nullptr;            // (B, H, Tk, D) or null
  void* dv = nullptr;            // (B, H, Tk, D) or null
  int64_t heads = 0, q_len = 0, kv_len = 0;
  float scale = 1.0f;       // of the scores
  float scale_log2 = 1.0f;  // scale * log2(e)
  float dropout_p = 0.0f, dropout_scale = 1.0f;  // dropout_scale = 1 / (1 - p)
  uint64_t seed = 0, offset = 0;
  const philox::ReplayState* replay = nullptr;  // a graph's seed and base offset, read at every replay
  bool causal = false, dropout = false;
  bool vector_loads = false;  // q, k, v and dout are 16-byte aligned: cp.async
};

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

// c (16, 8 NT) += a (16, 16 KT; fragments in registers) b^T, b (8 NT, 16 KT) row-major in shared memory.
template <typename T, int NT, int KT>
__device__ __forceinline__ void mma_regs_nt(float (&c)[NT][4], const uint32_t (&a)[KT][4], const T* b, int ldb,
                                            int lane) {
  static_assert(NT % 2 == 0, "ldmatrix.x4 covers two 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t bf[4];
      load_b_n_rows(bf, b, ldb, 8 * n, 16 * kk, lane);
      mma<T>(c[n], a[kk], bf[0], bf[1]);
      mma<T>(c[n + 1], a[kk], bf[2], bf[3]);
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

// c (16, 8 NT) += a (16, 16 KT; fragments in registers) b, b (16 KT, 8 NT) row-major in shared memory.
template <typename T, int NT, int KT>
__device__ __forceinline__ void mma_regs_nn(float (&c)[NT][4], const uint32_t (&a)[KT][4], const T* b, int ldb,
                                            int lane) {
  static_assert(NT % 2 == 0, "ldmatrix.x4 covers two 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t bf[4];
      load_b_k_rows(bf, b, ldb, 16 * kk, 8 * n, lane);
      mma<T>(c[n], a[kk], bf[0], bf[1]);
      mma<T>(c[n + 1], a[kk], bf[2], bf[3]);
    }
  }
}

// ---------------------------------------------------------------- tile loads

// Rows [row0, row0 + kRows) of a dense (rows, D) matrix into a shared tile of
// row stride D + kPad, by all kThreads threads: cp.async when `async`, else
// plain loads and stores. Rows past `rows` become zeros with a plain store (a
// NaN left in shared memory would survive a multiplication by p = 0). Either
// way the tile is complete for every thread after this thread's
// cp_async_wait covering it and a __syncthreads().
template <int kRows, int D, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t row0, int64_t rows, bool async) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(kRows * kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int c = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = c / kChunks, col = c % kChunks * 8;
    T* to = tile + r * (D + kPad) + col;
    const int64_t row = row0 + r;
    if (row >= rows) {
      *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
    } else if (async) {
      cp_async_16(to, src + row * D + col);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) to[e] = src[row * D + col + e];
    }
  }
}

// kCount floats [i0, i0 + kCount) of `src` into shared memory, zeros past `count`.
template <int kCount, int kThreads>
__device__ __forceinline__ void load_floats(float* to, const float* src, int64_t i0, int64_t count) {
  for (int c = static_cast<int>(threadIdx.x); c < kCount; c += kThreads) {
    if (i0 + c < count) {
      cp_async_4(to + c, src + i0 + c);
    } else {
      to[c] = 0.0f;
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---------------------------------------------------------------- scores and dropout

// The masking of one warp's block of scores, in 32-bit coordinates local to
// the block: query qi = query0 + ql, key j = key0 + kl (ql and kl below 128).
struct BlockMask {
  int queries_left = 0;  // ql < queries_left: query in bounds (Tq - query0, clamped)
  int keys_left = 0;     // kl < keys_left: key in bounds (Tk - key0, clamped)
  int diagonal = 0;      // causal: kl - ql <= diagonal (query0 - key0, clamped); without causal always true
  const float* mask = nullptr;  // the additive mask at (query0, key0), or null
  int64_t stride_q = 0, stride_k = 0;
};

// Clamped to [-256, 256]: beyond, a 128 x 128 block is all on one side.
__device__ __forceinline__ int clamp_offset(int64_t x) { return x < -256 ? -256 : x > 256 ? 256 : static_cast<int>(x); }

__device__ __forceinline__ BlockMask block_mask(const Params& p, int64_t mask_base, int64_t query0, int64_t key0) {
  BlockMask b;
  b.queries_left = clamp_offset(p.q_len - query0);
  b.keys_left = clamp_offset(p.kv_len - key0);
  b.diagonal = p.causal ? clamp_offset(query0 - key0) : 256;
  if (p.mask != nullptr && b.queries_left > 0 && b.keys_left > 0) {
    b.mask = p.mask + mask_base + query0 * p.mask_stride_q + key0 * p.mask_stride_k;
  }
  b.stride_q = p.mask_stride_q;
  b.stride_k = p.mask_stride_k;
  return b;
}

// Score of (query0 + ql, key0 + kl) in log2 units, for blocks that need
// masking: -inf where the key is not one of the query's (key >= Tk, query
// >= Tq, causal key > query), else (scale * dot + mask) * log2(e). The mask
// is read only in bounds.
template <bool kMask>
__device__ __forceinline__ float masked_score(const BlockMask& b, float scale_log2, int ql, int kl, float dot) {
  if (ql >= b.queries_left || kl >= b.keys_left || kl - ql > b.diagonal) return kNegInf;
  float x = dot * scale_log2;
  if constexpr (kMask) x = fmaf(b.mask[ql * b.stride_q + kl * b.stride_k], kLog2e, x);
  return x;
}

// Masks the (16, 8 NT) scores s of a warp (masked_score), or scales them
// when the block needs no masking, into log2 units. rows_are_queries: the
// rows are queries (forward, dQ), else keys (dK/dV).
template <bool kMask, bool kRowsAreQueries, int NT>
__device__ __forceinline__ void scores_log2(float (&s)[NT][4], bool masked, const Params& p, int64_t mask_base,
                                            int64_t query0, int64_t key0, int lane) {
  const int g = lane / 4, t = lane % 4;
  if (masked) {
    const BlockMask b = block_mask(p, mask_base, query0, key0);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = 8 * n + 2 * t + e % 2;
        s[n][e] = kRowsAreQueries ? masked_score<kMask>(b, p.scale_log2, row, col, s[n][e])
                                  : masked_score<kMask>(b, p.scale_log2, col, row, s[n][e]);
      }
    }
  } else {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= p.scale_log2;
    }
  }
}

// lse in log2 units for p = exp2(x - lse2); +inf for a row without keys
// (lse = -inf), so that its p is 0 and never exp2(-inf + inf) = NaN.
__device__ __forceinline__ float lse_log2(float lse) { return lse == kNegInf ? kPosInf : lse * kLog2e; }

// The Philox stream of a launch: seed and offset read once (a graph's replay state lives in device memory).
struct DropoutStream {
  uint64_t seed = 0, offset = 0;
  float p = 0.0f;
};

__device__ __forceinline__ DropoutStream dropout_stream(const Params& p) {
  DropoutStream stream;
  if (p.dropout) {
    stream.seed = philox::seed_of(p.seed, p.replay);
    stream.offset = philox::offset_of(p.offset, p.replay);
    stream.p = p.dropout_p;
  }
  return stream;
}

// Dropout word of score (i, j) of head bh: ((b * H + h) * Tq + i) * Tk + j (attention.h).
__device__ __forceinline__ uint64_t dropout_index(const Params& p, int64_t bh, int64_t i, int64_t j) {
  return (static_cast<uint64_t>(bh) * p.q_len + i) * p.kv_len + j;
}

__device__ __forceinline__ bool keep_one(const DropoutStream& s, uint64_t index) {
  return dropout_keep(philox::word_at(s.seed, s.offset, index), s.p);
}

// keep(index) and keep(index + 1); one Philox block serves both unless index % 4 == 3.
__device__ __forceinline__ void keep_two(const DropoutStream& s, uint64_t index, bool& keep0, bool& keep1) {
  const philox::Uint4 words = philox::philox4x32(s.seed, s.offset + index / 4);
  const int at = static_cast<int>(index % 4);
  keep0 = dropout_keep(philox::lane(words, at), s.p);
  const uint32_t next = at == 3 ? philox::philox4x32(s.seed, s.offset + index / 4 + 1).x : philox::lane(words, at + 1);
  keep1 = dropout_keep(next, s.p);
}

// Keep bits of a lane's (16, 8 NT) block of scores, bit 4 n + e for element
// (row g + 8 (e / 2), col 8 n + 2 t + e % 2). Rows are queries: the words of
// row h are row_index[h] + col (adjacent columns, adjacent words). Not
// unrolled over n: one Philox block at a time keeps the registers free.
template <int NT>
__device__ __forceinline__ uint32_t keep_bits_query_rows(const DropoutStream& s, const uint64_t (&row_index)[2]) {
  static_assert(NT * 4 <= 32, "one bit per score of the lane");
  uint32_t kept = 0;
#pragma unroll 1
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      bool keep0, keep1;
      keep_two(s, row_index[h] + 8 * n, keep0, keep1);
      kept |= (keep0 ? 1u : 0u) << (4 * n + 2 * h);
      kept |= (keep1 ? 1u : 0u) << (4 * n + 2 * h + 1);
    }
  }
  return kept;
}

// The same with keys as rows and queries as columns (dK/dV): element (row
// kr, col qc) has word index0 + qc * Tk + kr, adjacent columns Tk words apart.
template <int NT>
__device__ __forceinline__ uint32_t keep_bits_key_rows(const DropoutStream& s, uint64_t index0, int64_t kv_len,
                                                       int lane) {
  static_assert(NT * 4 <= 32, "one bit per score of the lane");
  const int g = lane / 4, t = lane % 4;
  uint32_t kept = 0;
#pragma unroll 1
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint64_t index = index0 + static_cast<uint64_t>(8 * n + 2 * t + e % 2) * kv_len + (g + 8 * (e / 2));
      kept |= (keep_one(s, index) ? 1u : 0u) << (4 * n + e);
    }
  }
  return kept;
}

__device__ __forceinline__ bool kept_bit(uint32_t kept, int bit) { return ((kept >> bit) & 1u) != 0; }

// ---------------------------------------------------------------- block schedule

// Which key blocks of a warp's 16 query rows (r0..r0+15) need the
// per-element masking, and which it skips, as key block indices (blocks of
// kCols keys from key 0): computed once, so the loop compares one int.
struct QueryRowBlocks {
  int64_t first_masked;   // blocks >= this cross Tk or touch the causal diagonal
  int64_t first_skipped;  // blocks >= this lie above the diagonal (causal): every key after every row
  bool all_masked;        // an additive mask, or rows past Tq
};

template <int kCols, bool kMask>
__device__ __forceinline__ QueryRowBlocks query_row_blocks(const Params& p, int64_t r0) {
  QueryRowBlocks b;
  // k0 + kCols > Tk  <=>  block >= Tk / kCols.
  b.first_masked = p.kv_len / kCols;
  b.first_skipped = INT64_MAX;
  if (p.causal) {
    // Some key after some row: k0 + kCols - 1 > r0  <=>  block >= (r0 + 1) / kCols.
    b.first_masked = (r0 + 1) / kCols < b.first_masked ? (r0 + 1) / kCols : b.first_masked;
    // Every key after every row: k0 > r0 + 15  <=>  block >= (r0 + 15) / kCols + 1.
    b.first_skipped = (r0 + 15) / kCols + 1;
  }
  b.all_masked = kMask || r0 + 16 > p.q_len;
  return b;
}

// ---------------------------------------------------------------- forward

// One CTA per (128 queries, b * H + h); warp w owns rows q0 + 16 w .. + 15.
// kDropout = p.dropout, kMask = (p.mask != null): kernels of their own keep
// the Philox code and the mask loads out of the common kernel's registers.
template <typename T, int D, bool kDropout, bool kMask>
__global__ void __launch_bounds__(ForwardShape<D>::kThreads, kDropout || kMask ? 1 : ForwardShape<D>::kMinBlocks)
    attention_tc_forward_kernel(Params p) {
  using S = ForwardShape<D>;
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KD = D / 16, KN = N / 16, LD = S::kLd;
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  T* smem = reinterpret_cast<T*>(attention_tc_smem);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  // Largest query block first: under causal masking it has the most keys.
  const int64_t q_blocks = ceil_div(p.q_len, M);
  const int64_t bh = blockIdx.x / q_blocks;
  const int64_t q0 = (q_blocks - 1 - blockIdx.x % q_blocks) * M;
  const int64_t r0 = q0 + warp * 16;  // the warp's first row; the lane's are r0 + g and r0 + g + 8
  const int64_t mask_base = bh / p.heads * p.mask_stride_b + bh % p.heads * p.mask_stride_h;
  const T* q = static_cast<const T*>(p.q) + bh * p.q_len * D;   // (Tq, D)
  const T* k = static_cast<const T*>(p.k) + bh * p.kv_len * D;  // (Tk, D)
  const T* v = static_cast<const T*>(p.v) + bh * p.kv_len * D;  // (Tk, D)
  // Causal: row i sees keys j <= i, so the CTA needs keys below q0 + M.
  const int64_t k_end = p.causal && q0 + M < p.kv_len ? q0 + M : p.kv_len;
  const int64_t blocks = ceil_div(k_end, N);
  const DropoutStream dropout = dropout_stream(p);

  auto load_kv = [&](int64_t block) {
    T* stage = smem + S::kv + (block % 2) * S::kStage;
    load_tile<N, D, S::kThreads>(stage, k, block * N, p.kv_len, p.vector_loads);
    load_tile<N, D, S::kThreads>(stage + N * LD, v, block * N, p.kv_len, p.vector_loads);
  };

  // Group 1: Q; group 2: K/V block 0 (empty when there are no keys).
  load_tile<M, D, S::kThreads>(smem + S::q, q, q0, p.q_len, p.vector_loads);
  cp_async_commit();
  if (blocks > 0) load_kv(0);
  cp_async_commit();
  cp_async_wait<1>();  // Q is in
  __syncthreads();
  uint32_t qf[KD][4];  // (16, D): the warp's rows of Q as A fragments, for the whole loop
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) load_a(qf[kk], smem + S::q + warp * 16 * LD, LD, 16 * kk, lane);

  const QueryRowBlocks schedule = query_row_blocks<N, kMask>(p, r0);
  float m[2] = {kNegInf, kNegInf};  // running max of rows g, g + 8 (log2 units)
  float l[2] = {0.0f, 0.0f};        // this lane's part of the running sum of exp2(x - m)
  float acc[DT][4] = {};            // (16, D) unnormalized output
  for (int64_t block = 0; block < blocks; ++block) {
    // Block + 1 loads while this one is computed. The stage it overwrites was
    // last read in block - 1, before that iteration's closing __syncthreads().
    if (block + 1 < blocks) load_kv(block + 1);
    cp_async_commit();   // possibly empty: one group per iteration keeps the count below right
    cp_async_wait<1>();  // all but the newest group: this block's K/V are in (this thread's copies)
    __syncthreads();     // ... and every thread's

    // Warp-uniform: the warp's rows r0..r0+15 against keys k0..k0+N-1.
    if (block < schedule.first_skipped) {
      const int64_t k0 = block * N;
      const T* k_tile = smem + S::kv + (block % 2) * S::kStage;  // (N, D)
      const T* v_tile = k_tile + N * LD;                         // (N, D)
      uint32_t kept = 0;  // bit 4 n + e: keep of s[n][e]; first, before s holds registers
      if constexpr (kDropout) {
        const uint64_t row_index[2] = {dropout_index(p, bh, r0 + g, k0 + 2 * t), dropout_index(p, bh, r0 + g + 8, k0 + 2 * t)};
        kept = keep_bits_query_rows<NT>(dropout, row_index);
      }
      float s[NT][4] = {};  // (16, N) scores, then probabilities
      mma_regs_nt<T, NT, KD>(s, qf, k_tile, LD, lane);
      const bool masked = schedule.all_masked || block >= schedule.first_masked;
      scores_log2<kMask, true>(s, masked, p, mask_base, r0, k0, lane);

#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float block_max = kNegInf;
#pragma unroll
        for (int n = 0; n < NT; ++n) block_max = fmaxf(block_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        const float m_new = fmaxf(m[h], quad_max(block_max));
        // While a row has seen only -inf, subtract 0: exp2(-inf - -inf) would be NaN.
        const float m_use = m_new == kNegInf ? 0.0f : m_new;
        const float alpha = exp2f(m[h] - m_use);  // 0 while m[h] = -inf; acc and l are 0 then
        m[h] = m_new;
        l[h] *= alpha;
#pragma unroll
        for (int n = 0; n < DT; ++n) {
          acc[n][2 * h] *= alpha;
          acc[n][2 * h + 1] *= alpha;
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          s[n][2 * h] = exp2f(s[n][2 * h] - m_use);
          s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - m_use);
          l[h] += s[n][2 * h] + s[n][2 * h + 1];
          if constexpr (kDropout) {  // the sum counts every probability; the product only the kept ones
            if (!kept_bit(kept, 4 * n + 2 * h)) s[n][2 * h] = 0.0f;
            if (!kept_bit(kept, 4 * n + 2 * h + 1)) s[n][2 * h + 1] = 0.0f;
          }
        }
      }

      uint32_t pf[KN][4];  // (16, N) P as A fragments (pack_a)
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) pack_a<T>(pf[kk], s, kk);
      mma_regs_nn<T, DT, KN>(acc, pf, v_tile, LD, lane);
    }
    __syncthreads();  // every warp is done with this stage before block + 2 loads into it
  }
  cp_async_wait<0>();  // no copy may be in flight when the CTA exits (the last group is empty unless blocks = 0)

  T* out = static_cast<T*>(p.out) + bh * p.q_len * D;  // (Tq, D)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(l[h]);
    const int64_t row = r0 + g + 8 * h;
    if (row >= p.q_len) continue;
    const bool empty = m[h] == kNegInf;  // no allowed key: out = 0, lse = -inf
    const float inv = empty ? 0.0f : p.dropout_scale / sum;
    T* out_row = out + row * D;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      out_row[8 * n + 2 * t] = from_acc<T>(acc[n][2 * h] * inv);
      out_row[8 * n + 2 * t + 1] = from_acc<T>(acc[n][2 * h + 1] * inv);
    }
    // lse = ln(sum_j exp(s_ij)) = (m + log2(sum)) ln 2, m in log2 units.
    if (t == 0) p.lse_out[bh * p.q_len + row] = empty ? kNegInf : m[h] * kLn2 + logf(sum);
  }
}

// ---------------------------------------------------------------- backward

// dK and dV of 64 keys: one CTA per (64 keys, b * H + h); warp w owns keys
// k0 + 16 w .. + 15 as rows, the columns are queries i.
template <typename T, int D, bool kDropout, bool kMask>
__global__ void __launch_bounds__(DkdvShape<D>::kThreads, kDropout ? 1 : DkdvShape<D>::kMinBlocks)
    attention_tc_dkdv_kernel(Params p) {
  using S = DkdvShape<D>;
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KD = D / 16, KN = N / 16, LD = S::kLd;
  static_assert(NT * 4 <= 32, "one keep bit per score of the lane");
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  T* smem = reinterpret_cast<T*>(attention_tc_smem);
  float* floats = reinterpret_cast<float*>(attention_tc_smem + S::kFloats);  // stage s: lse at 2 N s, delta after
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  const int64_t k_blocks = ceil_div(p.kv_len, M);
  const int64_t bh = blockIdx.x / k_blocks;
  const int64_t k0 = blockIdx.x % k_blocks * M;
  const int64_t j0 = k0 + warp * 16;  // the warp's first key; the lane's are j0 + g and j0 + g + 8
  const int64_t mask_base = bh / p.heads * p.mask_stride_b + bh % p.heads * p.mask_stride_h;
  const T* q = static_cast<const T*>(p.q) + bh * p.q_len * D;        // (Tq, D)
  const T* dout = static_cast<const T*>(p.dout) + bh * p.q_len * D;  // (Tq, D)
  const float* lse = p.lse + bh * p.q_len;                           // (Tq)
  const float* delta = p.delta + bh * p.q_len;                       // (Tq)
  // Causal: queries i < k0 see none of these keys.
  const int64_t i_begin = p.causal ? k0 : 0;
  const int64_t steps = i_begin < p.q_len ? ceil_div(p.q_len - i_begin, N) : 0;
  const DropoutStream dropout = dropout_stream(p);

  auto load_step = [&](int64_t step) {
    const int64_t i0 = i_begin + step * N;
    T* stage = smem + S::qdo + (step % 2) * S::kStage;
    load_tile<N, D, S::kThreads>(stage, q, i0, p.q_len, p.vector_loads);
    load_tile<N, D, S::kThreads>(stage + N * LD, dout, i0, p.q_len, p.vector_loads);
    float* stage_floats = floats + (step % 2) * 2 * N;
    load_floats<N, S::kThreads>(stage_floats, lse, i0, p.q_len);
    load_floats<N, S::kThreads>(stage_floats + N, delta, i0, p.q_len);
  };

  // Group 1: this CTA's K and V with query step 0 (nothing when no query sees these keys: dK = dV = 0).
  if (steps > 0) {
    load_tile<M, D, S::kThreads>(smem + S::k, static_cast<const T*>(p.k) + bh * p.kv_len * D, k0, p.kv_len,
                                 p.vector_loads);
    load_tile<M, D, S::kThreads>(smem + S::v, static_cast<const T*>(p.v) + bh * p.kv_len * D, k0, p.kv_len,
                                 p.vector_loads);
    load_step(0);
  }
  cp_async_commit();

  // Warp-uniform step schedule (queries i0 = i_begin + step N against keys j0..j0+15):
  //  - skipped while every key is after every query, j0 > i0 + N - 1;
  //  - masked while some key is after some query (j0 + 15 > i0), from the
  //    step that crosses Tq (i0 + N > Tq) on, and throughout with an
  //    additive mask or keys past Tk.
  int64_t skipped_until = 0, masked_until = 0;
  if (p.causal) {
    skipped_until = j0 - N + 1 - i_begin > 0 ? ceil_div(j0 - N + 1 - i_begin, N) : 0;
    masked_until = ceil_div(j0 + 15 - i_begin, N);  // j0 >= i_begin = k0
  }
  const int64_t first_masked = (p.q_len - i_begin) / N;
  const bool all_masked = kMask || j0 + 16 > p.kv_len;
  const T* k_warp = smem + S::k + warp * 16 * LD;  // (16, D) the warp's keys
  const T* v_warp = smem + S::v + warp * 16 * LD;  // (16, D) their values
  float dk[DT][4] = {};  // (16, D) sum of dS^T Q, times scale at the end
  float dv[DT][4] = {};  // (16, D) sum of P_dropped^T dO
  for (int64_t step = 0; step < steps; ++step) {
    if (step + 1 < steps) load_step(step + 1);  // into the stage step - 1 read (closing barrier below)
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    if (step >= skipped_until) {
      const int64_t i0 = i_begin + step * N;
      const T* q_tile = smem + S::qdo + (step % 2) * S::kStage;  // (N, D)
      const T* do_tile = q_tile + N * LD;                        // (N, D)
      const float* lse_tile = floats + (step % 2) * 2 * N;       // (N)
      const float* delta_tile = lse_tile + N;                    // (N)
      const bool masked = all_masked || step < masked_until || step >= first_masked;

      // Keep bits first, while only dK and dV hold registers.
      uint32_t kept = 0xffffffffu;  // bit 4 n + e: keep of pt[n][e]
      if constexpr (kDropout) kept = keep_bits_key_rows<NT>(dropout, dropout_index(p, bh, i0, j0), p.kv_len, lane);

      // P^T (16 keys, N queries) = exp2(scale log2(e) K Q^T - lse2 of the column).
      float pt[NT][4] = {};
      mma_smem_nt<T, NT, KD>(pt, k_warp, LD, q_tile, LD, lane);
      scores_log2<kMask, false>(pt, masked, p, mask_base, i0, j0, lane);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 column_lse = *reinterpret_cast<const float2*>(lse_tile + 8 * n + 2 * t);
        const float lse2[2] = {lse_log2(column_lse.x), lse_log2(column_lse.y)};
#pragma unroll
        for (int e = 0; e < 4; ++e) pt[n][e] = exp2f(pt[n][e] - lse2[e % 2]);
      }

      // dV += P_dropped^T dO.
      {
        float pd[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) pd[n][e] = kept_bit(kept, 4 * n + e) ? pt[n][e] * p.dropout_scale : 0.0f;
        }
        uint32_t pf[KN][4];
#pragma unroll
        for (int kk = 0; kk < KN; ++kk) pack_a<T>(pf[kk], pd, kk);
        mma_regs_nn<T, DT, KN>(dv, pf, do_tile, LD, lane);
      }

      // dP^T = V dO^T; dS^T = P^T * (dP^T through dropout - delta of the column); dK += dS^T Q.
      float ds[NT][4] = {};
      mma_smem_nt<T, NT, KD>(ds, v_warp, LD, do_tile, LD, lane);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 column_delta = *reinterpret_cast<const float2*>(delta_tile + 8 * n + 2 * t);
        const float deltas[2] = {column_delta.x, column_delta.y};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float dp = kept_bit(kept, 4 * n + e) ? ds[n][e] * p.dropout_scale : 0.0f;
          ds[n][e] = pt[n][e] * (dp - deltas[e % 2]);
        }
      }
      uint32_t dsf[KN][4];
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) pack_a<T>(dsf[kk], ds, kk);
      mma_regs_nn<T, DT, KN>(dk, dsf, q_tile, LD, lane);
    }
    __syncthreads();  // every warp is done with this stage before step + 2 loads into it
  }
  cp_async_wait<0>();  // no copy may be in flight when the CTA exits

  T* dk_out = static_cast<T*>(p.dk);
  T* dv_out = static_cast<T*>(p.dv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t key = j0 + g + 8 * h;
    if (key >= p.kv_len) continue;
    const int64_t at = (bh * p.kv_len + key) * D;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (dk_out != nullptr) dk_out[at + 8 * n + 2 * t + e] = from_acc<T>(dk[n][2 * h + e] * p.scale);
        if (dv_out != nullptr) dv_out[at + 8 * n + 2 * t + e] = from_acc<T>(dv[n][2 * h + e]);
      }
    }
  }
}

// dQ of 64 queries: one CTA per (64 queries, b * H + h); warp w owns rows
// q0 + 16 w .. + 15, the columns are keys j.
template <typename T, int D, bool kDropout, bool kMask>
__global__ void __launch_bounds__(DqShape<D>::kThreads, kDropout ? 1 : DqShape<D>::kMinBlocks)
    attention_tc_dq_kernel(Params p) {
  using S = DqShape<D>;
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KD = D / 16, KN = N / 16, LD = S::kLd;
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  T* smem = reinterpret_cast<T*>(attention_tc_smem);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  const int64_t q_blocks = ceil_div(p.q_len, M);
  const int64_t bh = blockIdx.x / q_blocks;
  const int64_t q0 = (q_blocks - 1 - blockIdx.x % q_blocks) * M;
  const int64_t r0 = q0 + warp * 16;  // the warp's first row; the lane's are r0 + g and r0 + g + 8
  const int64_t mask_base = bh / p.heads * p.mask_stride_b + bh % p.heads * p.mask_stride_h;
  const T* k = static_cast<const T*>(p.k) + bh * p.kv_len * D;  // (Tk, D)
  const T* v = static_cast<const T*>(p.v) + bh * p.kv_len * D;  // (Tk, D)
  // Rows past Tq and rows without keys get lse2 = +inf: p = 0 on every path.
  float lse2[2], delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = r0 + g + 8 * h;
    lse2[h] = row < p.q_len ? lse_log2(p.lse[bh * p.q_len + row]) : kPosInf;
    delta[h] = row < p.q_len ? p.delta[bh * p.q_len + row] : 0.0f;
  }
  const int64_t k_end = p.causal && q0 + M < p.kv_len ? q0 + M : p.kv_len;
  const int64_t blocks = ceil_div(k_end, N);
  const DropoutStream dropout = dropout_stream(p);

  auto load_kv = [&](int64_t block) {
    T* stage = smem + S::kv + (block % 2) * S::kStage;
    load_tile<N, D, S::kThreads>(stage, k, block * N, p.kv_len, p.vector_loads);
    load_tile<N, D, S::kThreads>(stage + N * LD, v, block * N, p.kv_len, p.vector_loads);
  };

  // Group 1: this CTA's Q and dO with K/V block 0.
  load_tile<M, D, S::kThreads>(smem + S::q, static_cast<const T*>(p.q) + bh * p.q_len * D, q0, p.q_len,
                               p.vector_loads);
  load_tile<M, D, S::kThreads>(smem + S::dout, static_cast<const T*>(p.dout) + bh * p.q_len * D, q0, p.q_len,
                               p.vector_loads);
  if (blocks > 0) load_kv(0);
  cp_async_commit();

  const QueryRowBlocks schedule = query_row_blocks<N, kMask>(p, r0);
  const T* q_warp = smem + S::q + warp * 16 * LD;      // (16, D)
  const T* do_warp = smem + S::dout + warp * 16 * LD;  // (16, D)
  float dq[DT][4] = {};  // (16, D) sum of dS K, times scale at the end
  for (int64_t block = 0; block < blocks; ++block) {
    if (block + 1 < blocks) load_kv(block + 1);  // into the stage block - 1 read (closing barrier below)
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    if (block < schedule.first_skipped) {
      const int64_t k0 = block * N;
      const T* k_tile = smem + S::kv + (block % 2) * S::kStage;  // (N, D)
      const T* v_tile = k_tile + N * LD;                         // (N, D)
      const bool masked = schedule.all_masked || block >= schedule.first_masked;
      uint32_t kept = 0xffffffffu;  // bit 4 n + e: keep of s[n][e]; first, before s and ds hold registers
      if constexpr (kDropout) {
        const uint64_t row_index[2] = {dropout_index(p, bh, r0 + g, k0 + 2 * t), dropout_index(p, bh, r0 + g + 8, k0 + 2 * t)};
        kept = keep_bits_query_rows<NT>(dropout, row_index);
      }
      float s[NT][4] = {};   // (16, N) scores, then probabilities
      float ds[NT][4] = {};  // (16, N) dO V^T, then dS
      mma_smem_nt<T, NT, KD>(s, q_warp, LD, k_tile, LD, lane);
      mma_smem_nt<T, NT, KD>(ds, do_warp, LD, v_tile, LD, lane);
      scores_log2<kMask, true>(s, masked, p, mask_base, r0, k0, lane);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool keep0 = kept_bit(kept, 4 * n + 2 * h), keep1 = kept_bit(kept, 4 * n + 2 * h + 1);
          const float p0 = exp2f(s[n][2 * h] - lse2[h]), p1 = exp2f(s[n][2 * h + 1] - lse2[h]);
          const float dp0 = keep0 ? ds[n][2 * h] * p.dropout_scale : 0.0f;
          const float dp1 = keep1 ? ds[n][2 * h + 1] * p.dropout_scale : 0.0f;
          ds[n][2 * h] = p0 * (dp0 - delta[h]);
          ds[n][2 * h + 1] = p1 * (dp1 - delta[h]);
        }
      }
      uint32_t dsf[KN][4];  // (16, N) dS as A fragments
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) pack_a<T>(dsf[kk], ds, kk);
      mma_regs_nn<T, DT, KN>(dq, dsf, k_tile, LD, lane);  // B(k = key, n = d) = K(key, d)
    }
    __syncthreads();  // every warp is done with this stage before block + 2 loads into it
  }
  cp_async_wait<0>();  // no copy may be in flight when the CTA exits (Q and dO when there are no keys)

  T* dq_out = static_cast<T*>(p.dq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = r0 + g + 8 * h;
    if (row >= p.q_len) continue;
    const int64_t at = (bh * p.q_len + row) * D;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      dq_out[at + 8 * n + 2 * t] = from_acc<T>(dq[n][2 * h] * p.scale);
      dq_out[at + 8 * n + 2 * t + 1] = from_acc<T>(dq[n][2 * h + 1] * p.scale);
    }
  }
}

// ---------------------------------------------------------------- host side

template <typename T, int D>
struct ForwardKernel {
  template <bool kDropout, bool kMask>
  struct Of {
    static constexpr auto kernel = attention_tc_forward_kernel<T, D, kDropout, kMask>;
  };
};
template <typename T, int D>
struct DkdvKernel {
  template <bool kDropout, bool kMask>
  struct Of {
    static constexpr auto kernel = attention_tc_dkdv_kernel<T, D, kDropout, kMask>;
  };
};
template <typename T, int D>
struct DqKernel {
  template <bool kDropout, bool kMask>
  struct Of {
    static constexpr auto kernel = attention_tc_dq_kernel<T, D, kDropout, kMask>;
  };
};

template <typename Kernel>
void launch(Kernel kernel, int64_t blocks, int threads, size_t smem, cuda::Stream stream, const Params& p,
            const char* what) {
  KILN_CHECK(blocks <= INT32_MAX, what, ": ", blocks, " thread blocks exceed one launch (at most ", INT32_MAX, ")");
  if (smem > 48 * 1024) {  // above the default limit: opt in (per device, so on every launch)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), smem, static_cast<cudaStream_t>(stream)>>>(p);
  cuda::check_last_launch(what);
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// The instantiation of a kernel template for the problem's dropout and mask.
template <template <bool, bool> class Kernels>
auto pick(const Params& p) {
  if (p.dropout) return p.mask != nullptr ? Kernels<true, true>::kernel : Kernels<true, false>::kernel;
  return p.mask != nullptr ? Kernels<false, true>::kernel : Kernels<false, false>::kernel;
}

Params params_of(const AttentionArgs& a) {
  Params p;
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.mask = a.mask.data;
  p.mask_stride_b = a.mask.stride_b;
  p.mask_stride_h = a.mask.stride_h;
  p.mask_stride_q = a.mask.stride_q;
  p.mask_stride_k = a.mask.stride_k;
  p.heads = a.heads;
  p.q_len = a.q_len;
  p.kv_len = a.kv_len;
  p.scale = static_cast<float>(a.scale);
  p.scale_log2 = static_cast<float>(a.scale * 1.4426950408889634);
  p.dropout = a.dropout_p > 0.0f;
  p.dropout_p = a.dropout_p;
  // p = 1 drops everything: the output is 0, not 0 * inf.
  p.dropout_scale = !p.dropout ? 1.0f : a.dropout_p < 1.0f ? 1.0f / (1.0f - a.dropout_p) : 0.0f;
  p.seed = a.seed;
  p.offset = a.offset;
  p.replay = a.replay;
  p.causal = a.causal;
  p.vector_loads = aligned16(a.q) && aligned16(a.k) && aligned16(a.v);
  return p;
}

// Calls body.template operator()<T, D>() for the problem's dtype and head dim.
template <typename F>
void dispatch(const AttentionArgs& a, const char* op, F&& body) {
  KILN_ASSERT(supports(a.dtype, a.head_dim), op, ": the tensor-core kernels got ", a.dtype, " with head_dim ",
              a.head_dim);
  auto by_dim = [&]<typename T>() {
    switch (a.head_dim) {
      case 32: body.template operator()<T, 32>(); break;
      case 64: body.template operator()<T, 64>(); break;
      case 96: body.template operator()<T, 96>(); break;
      default: body.template operator()<T, 128>(); break;
    }
  };
  if (a.dtype == DType::f16) {
    by_dim.template operator()<__half>();
  } else {
    by_dim.template operator()<__nv_bfloat16>();
  }
}

}  // namespace

bool supports(DType dtype, int64_t head_dim) {
  return (dtype == DType::f16 || dtype == DType::bf16) &&
         (head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128);
}

void forward(const AttentionArgs& args, void* out, void* lse, cuda::Stream stream) {
  const int64_t heads = args.batch * args.heads;
  if (heads == 0 || args.q_len == 0) return;
  dispatch(args, "scaled_dot_product_attention", [&]<typename T, int D>() {
    using S = ForwardShape<D>;
    Params p = params_of(args);
    p.out = out;
    p.lse_out = static_cast<float*>(lse);
    launch(pick<ForwardKernel<T, D>::template Of>(p), heads * ceil_div(args.q_len, S::kRows), S::kThreads, S::kBytes, stream, p,
           "scaled_dot_product_attention forward (tensor cores)");
  });
}

void backward(const AttentionGradArgs& args, const float* delta, cuda::Stream stream) {
  const AttentionArgs& a = args.forward;
  const int64_t heads = a.batch * a.heads;
  if (heads == 0) return;
  dispatch(a, "scaled_dot_product_attention backward", [&]<typename T, int D>() {
    Params p = params_of(a);
    p.dout = args.dout;
    p.lse = static_cast<const float*>(args.lse);
    p.delta = delta;
    p.dq = args.dq;
    p.dk = args.dk;
    p.dv = args.dv;
    p.vector_loads = p.vector_loads && aligned16(args.dout);
    if ((args.dk != nullptr || args.dv != nullptr) && a.kv_len > 0) {
      using S = DkdvShape<D>;
      launch(pick<DkdvKernel<T, D>::template Of>(p), heads * ceil_div(a.kv_len, S::kRows), S::kThreads, S::kBytes, stream, p,
             "scaled_dot_product_attention backward (dk, dv; tensor cores)");
    }
    if (args.dq != nullptr && a.q_len > 0) {
      using S = DqShape<D>;
      launch(pick<DqKernel<T, D>::template Of>(p), heads * ceil_div(a.q_len, S::kRows), S::kThreads, S::kBytes, stream, p,
             "scaled_dot_product_attention backward (dq; tensor cores)");
    }
  });
}

}  // namespace kiln::kernels::attention_tc
