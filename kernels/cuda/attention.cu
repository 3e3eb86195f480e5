// CUDA fused scaled dot-product attention, forward and backward (see kernels/attention.h).
//
// FlashAttention-2's schedule (Dao, 2023), written for kiln:
//  - Forward: one CTA of 4 warps per (64 query rows, b * H + h); each warp owns
//    16 query rows. The CTA walks the key blocks: S = Q K^T for its rows into
//    registers, an online softmax (running max m and sum l per row, the
//    accumulator rescaled by exp(m_old - m_new)), P to the warp's slice of
//    shared memory, O += P V. At the end out = O / l and lse = m + log l; a
//    row that saw no allowed key (m = -inf) gets out = 0 and lse = -inf.
//  - Backward, three kernels: (1) delta_i = dout_i . out_i (float32) into the
//    workspace; (2) one CTA per (64 keys, b * H + h) walks the query blocks,
//    recomputes p = exp(s - lse) and accumulates dV += P_dropped^T dO and
//    dK += dS^T Q in registers; (3) one CTA per (64 queries, b * H + h) walks
//    the key blocks and accumulates dQ += dS K. Every output element has one
//    owner: no atomics, and the result is the same bits on every run.
//  - Shapes: each warp computes 16-row tiles in the m16n8 accumulator layout
//    of mma.sync (lane = 4 * g + t holds rows g and g + 8, columns 8 n + 2 t
//    and 8 n + 2 t + 1 of every 8-column tile n). float16/bfloat16 tiles go
//    through tensor cores (mma.sync m16n8k16, float accumulators, P and dS
//    rounded to the input type as FlashAttention does); float32 tiles are
//    plain FMAs on CUDA cores in the same layout, summing k in order (no TF32),
//    so that every kernel below is written once for the three dtypes.
//  - Block sizes: 64 rows per CTA (4 warps x 16). Columns per step: 64 keys
//    (forward, dQ) and 64 queries (dK/dV), except 32 keys for float32 with
//    D >= 96 (shared memory: two CTAs per SM) and 32 queries in dK/dV for
//    D >= 96 (registers: dK and dV take D floats per thread). Shared memory
//    per CTA: 24-77 KiB for 16-bit, 44-108 KiB for float32 (the Layout
//    structs); above 48 KiB the launch opts in.
//  - Masking: s_ij = scale * q_i . k_j + mask_ij (mask read through strides),
//    -inf for j >= Tk, i >= Tq and, with is_causal, j > i. Causal CTAs never
//    load key blocks entirely above the diagonal (forward, dQ) nor query
//    blocks entirely below it (dK/dV). Rows past Tq and keys past Tk are
//    loaded as zeros and never written.
//  - Dropout: keep_ij from the Philox word ((b * H + h) * Tq + i) * Tk + j,
//    regenerated in the backward; kept probabilities scaled by 1 / (1 - p).
//  - Outputs are written with =; dq, dk and dv only when non-null. Nothing
//    here synchronizes or allocates; the workspace is delta (B * H * Tq floats).
//  - float16/bfloat16 problems go to the faster kernels of attention_tc*.cu
//    (after the delta kernel below, in the backward) unless
//    set_attention_cuda_kernels(reference) forces these, which stay as the
//    reference they are tested against.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/philox.h"
#include "kernels/random.h"

namespace kiln::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;                  // rows of one warp's tiles (the m of m16n8k16)
constexpr int kBlockRows = kWarps * kWarpRows;  // rows per CTA: queries (forward, dQ) or keys (dK/dV)

// Row padding in elements: rows stay 16-byte aligned and consecutive rows
// start 4 banks apart, so the fragment loads below are free of bank conflicts.
template <typename T>
constexpr int kPad = 16 / static_cast<int>(sizeof(T));

// Columns per step: keys in the forward and dQ kernels, queries in dK/dV.
template <typename T, int D>
constexpr int kKeyStep = (sizeof(T) == 4 && D >= 96) ? 32 : 64;
template <int D>
constexpr int kQueryStep = D >= 96 ? 32 : 64;

// The tensors and sizes (AttentionTensors, attention_common.cuh), then the scalars.
struct Params : AttentionTensors {
  float scale = 1.0f;
  float dropout_p = 0.0f, dropout_scale = 1.0f;  // dropout_scale = 1 / (1 - p)
  uint64_t seed = 0, offset = 0;
  const philox::ReplayState* replay = nullptr;  // a graph's seed and base offset, read at every replay
  bool causal = false, dropout = false;
  bool vector_loads = false;  // q, k, v and dout are 16-byte aligned
};

// ---------------------------------------------------------------- shared memory layouts
// Offsets in elements of T; (rows, D) tiles have row stride kLd, (rows, cols) tiles kLdCols.

template <typename T, int D>
struct ForwardLayout {
  static constexpr int kCols = kKeyStep<T, D>;
  static constexpr int kLd = D + kPad<T>, kLdCols = kCols + kPad<T>;
  static constexpr int q = 0;                       // (64, D) this CTA's queries
  static constexpr int k = q + kBlockRows * kLd;    // (kCols, D) keys of the step
  static constexpr int v = k + kCols * kLd;         // (kCols, D) values of the step
  static constexpr int p = v + kCols * kLd;         // (64, kCols) probabilities, 16 rows per warp
  static constexpr size_t kBytes = size_t{p + kBlockRows * kLdCols} * sizeof(T);
};

template <typename T, int D>
struct DqLayout {
  static constexpr int kCols = kKeyStep<T, D>;
  static constexpr int kLd = D + kPad<T>, kLdCols = kCols + kPad<T>;
  static constexpr int q = 0;                       // (64, D) this CTA's queries
  static constexpr int dout = q + kBlockRows * kLd;  // (64, D) their output gradients
  static constexpr int k = dout + kBlockRows * kLd;  // (kCols, D) keys of the step
  static constexpr int v = k + kCols * kLd;          // (kCols, D) values of the step
  static constexpr int ds = v + kCols * kLd;         // (64, kCols) dS, 16 rows per warp
  static constexpr size_t kBytes = size_t{ds + kBlockRows * kLdCols} * sizeof(T);
};

template <typename T, int D>
struct DkdvLayout {
  static constexpr int kCols = kQueryStep<D>;
  static constexpr int kLd = D + kPad<T>, kLdCols = kCols + kPad<T>;
  static constexpr int k = 0;                        // (64, D) this CTA's keys
  static constexpr int v = k + kBlockRows * kLd;     // (64, D) their values
  static constexpr int q = v + kBlockRows * kLd;     // (kCols, D) queries of the step
  static constexpr int dout = q + kCols * kLd;       // (kCols, D) their output gradients
  static constexpr int ds = dout + kCols * kLd;      // (64, kCols) P^T then dS^T, 16 rows per warp
  static constexpr size_t kRowBytes = size_t{ds + kBlockRows * kLdCols} * sizeof(T);  // 16-byte multiple
  static constexpr size_t kLse = kRowBytes;                          // bytes: (kCols) floats
  static constexpr size_t kDelta = kLse + kCols * sizeof(float);     // bytes: (kCols) floats
  static constexpr size_t kBytes = kDelta + kCols * sizeof(float);
};

constexpr size_t kMaxSmem = 227 * 1024;  // sm_90's opt-in limit per block
static_assert(DkdvLayout<float, 128>::kBytes <= kMaxSmem && DqLayout<float, 128>::kBytes <= kMaxSmem &&
              ForwardLayout<float, 128>::kBytes <= kMaxSmem && DqLayout<__half, 128>::kBytes <= kMaxSmem);

// ---------------------------------------------------------------- tile loads and stores

// Rows [row0, row0 + kRows) of a (rows, D) matrix of row stride src_ld (its
// D elements dense) into a shared tile with row stride ld; rows past `rows` become zeros (a NaN left in shared
// memory would survive a multiplication by p = 0).
template <int D, int kRows, typename T>
__device__ __forceinline__ void load_rows(T* tile, int ld, const T* src, int64_t src_ld, int64_t row0, int64_t rows,
                                          bool vector_loads) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16 bytes
  constexpr int kChunks = D / kVec;                         // 16-byte chunks per row
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = c % kChunks * kVec;
    T* to = tile + r * ld + col;
    if (row0 + r >= rows) {
      *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
    } else if (vector_loads) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(src + (row0 + r) * src_ld + col);
    } else {
      for (int e = 0; e < kVec; ++e) to[e] = src[(row0 + r) * src_ld + col + e];
    }
  }
}

// Two adjacent elements of a shared tile (the pair a lane holds in one row of an m16n8 tile).
template <typename T>
__device__ __forceinline__ void store_pair(T* at, float x, float y) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(at) = make_float2(x, y);
  } else if constexpr (std::is_same_v<T, __half>) {
    *reinterpret_cast<__half2*>(at) = __floats2half2_rn(x, y);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(x, y);
  }
}

// ---------------------------------------------------------------- warp tile products
// c (16, 8 NT) += a (16, K) * b^T or a * b, every operand in shared memory.
// The lane's outputs are c[n][0..3] = rows (g, g, g + 8, g + 8), columns
// (8 n + 2 t, 8 n + 2 t + 1, 8 n + 2 t, 8 n + 2 t + 1), g = lane / 4, t = lane % 4.

// One m16n8k16 tensor-core product d = a b + c: a 16x16 (row), b 16x8 (col).
// a[0..3]: (row g, k 2t..2t+1), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8);
// b[0..1]: (k 2t..2t+1, col g), (k 2t + 8.., g); low half = lower index.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 16-bit matrices, transposed: lane l names row l % 8 of matrix l / 8,
// and r[i] gets (row 2t, col g) and (row 2t + 1, col g) of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

template <typename T>
__device__ __forceinline__ uint32_t load_b32(const T* at) {
  return *reinterpret_cast<const uint32_t*>(at);
}

// The A fragment of rows 0..15, columns k0..k0 + 15 of a row-major tile.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int ld, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const T* at = tile + g * ld + k0 + 2 * t;
  a[0] = load_b32(at);
  a[1] = load_b32(at + 8 * ld);
  a[2] = load_b32(at + 8);
  a[3] = load_b32(at + 8 * ld + 8);
}

// c += a b^T: a (16, K) row-major, b (8 NT, K) row-major (keys or queries as rows).
template <int NT, int K, typename T>
__device__ __forceinline__ void gemm_nt(float (&c)[NT][4], const T* a, int lda, const T* b, int ldb) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  if constexpr (std::is_same_v<T, float>) {
    for (int k = 0; k < K; k += 4) {
      const float4 a0 = *reinterpret_cast<const float4*>(a + g * lda + k);
      const float4 a1 = *reinterpret_cast<const float4*>(a + (g + 8) * lda + k);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float4 b0 = *reinterpret_cast<const float4*>(b + (8 * n + 2 * t) * ldb + k);
        const float4 b1 = *reinterpret_cast<const float4*>(b + (8 * n + 2 * t + 1) * ldb + k);
        c[n][0] = fmaf(a0.w, b0.w, fmaf(a0.z, b0.z, fmaf(a0.y, b0.y, fmaf(a0.x, b0.x, c[n][0]))));
        c[n][1] = fmaf(a0.w, b1.w, fmaf(a0.z, b1.z, fmaf(a0.y, b1.y, fmaf(a0.x, b1.x, c[n][1]))));
        c[n][2] = fmaf(a1.w, b0.w, fmaf(a1.z, b0.z, fmaf(a1.y, b0.y, fmaf(a1.x, b0.x, c[n][2]))));
        c[n][3] = fmaf(a1.w, b1.w, fmaf(a1.z, b1.z, fmaf(a1.y, b1.y, fmaf(a1.x, b1.x, c[n][3]))));
      }
    }
  } else {
    for (int k = 0; k < K; k += 16) {
      uint32_t af[4];
      load_a(af, a, lda, k);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const T* row = b + (8 * n + g) * ldb + k + 2 * t;
        mma_m16n8k16<T>(c[n], af, load_b32(row), load_b32(row + 8));
      }
    }
  }
}

// c += a b: a (16, K) row-major, b (K, 8 NT) row-major (values, dO, Q or K as they lie).
template <int NT, int K, typename T>
__device__ __forceinline__ void gemm_nn(float (&c)[NT][4], const T* a, int lda, const T* b, int ldb) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  if constexpr (std::is_same_v<T, float>) {
    for (int k = 0; k < K; k += 4) {
      const float4 a0 = *reinterpret_cast<const float4*>(a + g * lda + k);
      const float4 a1 = *reinterpret_cast<const float4*>(a + (g + 8) * lda + k);
      const float a0k[4] = {a0.x, a0.y, a0.z, a0.w}, a1k[4] = {a1.x, a1.y, a1.z, a1.w};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const float2 bk = *reinterpret_cast<const float2*>(b + (k + kk) * ldb + 8 * n + 2 * t);
          c[n][0] = fmaf(a0k[kk], bk.x, c[n][0]);
          c[n][1] = fmaf(a0k[kk], bk.y, c[n][1]);
          c[n][2] = fmaf(a1k[kk], bk.x, c[n][2]);
          c[n][3] = fmaf(a1k[kk], bk.y, c[n][3]);
        }
      }
    }
  } else {
    static_assert(NT % 2 == 0, "ldmatrix.x4 covers two 8-column tiles");
    // Lane l points at row k + l % 8 + 8 (l / 8 % 2), column 8 (l / 16) of the pair:
    // matrices 0, 1 are b0, b1 of tile n; matrices 2, 3 those of tile n + 1.
    const int row = lane % 8 + 8 * (lane / 8 % 2), col = 8 * (lane / 16);
    for (int k = 0; k < K; k += 16) {
      uint32_t af[4];
      load_a(af, a, lda, k);
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, b + (k + row) * ldb + 8 * n + col);
        mma_m16n8k16<T>(c[n], af, bf[0], bf[1]);
        mma_m16n8k16<T>(c[n + 1], af, bf[2], bf[3]);
      }
    }
  }
}

// ---------------------------------------------------------------- scores and dropout

// s_ij = scale * q_i . k_j + mask_ij, or -inf where key j is not one of row i's.
__device__ __forceinline__ float score(const Params& p, int64_t mask_base, int64_t i, int64_t j, float dot) {
  if (i >= p.q_len || j >= p.kv_len || (p.causal && j > i)) return kNegInf;
  float s = dot * p.scale;
  if (p.mask != nullptr) s += p.mask[mask_base + i * p.mask_stride_q + j * p.mask_stride_k];
  return s;
}

// p = exp(s - lse), 0 for a row without keys (lse = -inf, where s - lse would be NaN).
__device__ __forceinline__ float probability(float s, float lse) { return lse == kNegInf ? 0.0f : expf(s - lse); }

// The keep bits of dropout_index's word (attention_common.cuh), seed and offset
// read at every draw. attention_tc's keep_one/keep_two, which take them once
// in a DropoutStream, would change this file's SASS (32 of 36 kernels).
__device__ __forceinline__ bool keep_one(const Params& p, uint64_t index) {
  return dropout_keep(philox::word_at(philox::seed_of(p.seed, p.replay), philox::offset_of(p.offset, p.replay), index),
                      p.dropout_p);
}

// keep(index) and keep(index + 1); one Philox block serves both unless index % 4 == 3.
__device__ __forceinline__ void keep_two(const Params& p, uint64_t index, bool& keep0, bool& keep1) {
  const uint64_t seed = philox::seed_of(p.seed, p.replay), offset = philox::offset_of(p.offset, p.replay);
  const philox::Uint4 words = philox::philox4x32(seed, offset + index / 4);
  const int at = static_cast<int>(index % 4);
  keep0 = dropout_keep(philox::lane(words, at), p.dropout_p);
  const uint32_t next = at == 3 ? philox::philox4x32(seed, offset + index / 4 + 1).x : philox::lane(words, at + 1);
  keep1 = dropout_keep(next, p.dropout_p);
}

// ---------------------------------------------------------------- forward

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(Params p) {
  using L = ForwardLayout<T, D>;
  constexpr int N = L::kCols, NT = N / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char attention_smem[];
  T* smem = reinterpret_cast<T*>(attention_smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  T* q_tile = smem + L::q;                                    // (64, D)
  T* k_tile = smem + L::k;                                    // (N, D)
  T* v_tile = smem + L::v;                                    // (N, D)
  T* p_tile = smem + L::p + warp * kWarpRows * L::kLdCols;    // (16, N) this warp's rows

  // Largest query block first: under causal masking it has the most keys.
  const int64_t q_blocks = ceil_div(p.q_len, kBlockRows);
  const int64_t bh = blockIdx.x / q_blocks;
  const int64_t q0 = (q_blocks - 1 - blockIdx.x % q_blocks) * kBlockRows;
  const int64_t mask_base = bh / p.heads * p.mask_stride_b + bh % p.heads * p.mask_stride_h;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads);  // (Tq, D)
  const T* k = static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads);  // (Tk, D)
  const T* v = static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads);  // (Tk, D)
  const int64_t rows[2] = {q0 + warp * kWarpRows + g, q0 + warp * kWarpRows + g + 8};

  load_rows<D, kBlockRows>(q_tile, L::kLd, q, p.q_layout.row, q0, p.q_len, p.vector_loads);

  float m[2] = {kNegInf, kNegInf};  // running max of each row
  float l[2] = {0.0f, 0.0f};        // this lane's part of the running sum of exp(s - m)
  float acc[DT][4] = {};            // (16, D) unnormalized output
  const int64_t k_end = p.causal && q0 + kBlockRows < p.kv_len ? q0 + kBlockRows : p.kv_len;
  for (int64_t k0 = 0; k0 < k_end; k0 += N) {
    __syncthreads();  // the previous step's K, V and P are no longer read
    load_rows<D, N>(k_tile, L::kLd, k, p.k_layout.row, k0, p.kv_len, p.vector_loads);
    load_rows<D, N>(v_tile, L::kLd, v, p.v_layout.row, k0, p.kv_len, p.vector_loads);
    __syncthreads();

    float s[NT][4] = {};  // (16, N) scores
    gemm_nt<NT, D>(s, q_tile + warp * kWarpRows * L::kLd, L::kLd, k_tile, L::kLd);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = score(p, mask_base, rows[e / 2], k0 + 8 * n + 2 * t + e % 2, s[n][e]);
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float block_max = kNegInf;
#pragma unroll
      for (int n = 0; n < NT; ++n) block_max = fmaxf(block_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      const float m_new = fmaxf(m[h], quad_max(block_max));
      // While a row has seen only -inf, subtract 0: exp(-inf - -inf) would be NaN.
      const float m_use = m_new == kNegInf ? 0.0f : m_new;
      const float alpha = expf(m[h] - m_use);  // 0 while m[h] = -inf; acc and l are 0 then
      m[h] = m_new;
      l[h] *= alpha;
#pragma unroll
      for (int n = 0; n < DT; ++n) {
        acc[n][2 * h] *= alpha;
        acc[n][2 * h + 1] *= alpha;
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float p0 = expf(s[n][2 * h] - m_use), p1 = expf(s[n][2 * h + 1] - m_use);
        l[h] += p0;
        l[h] += p1;
        if (p.dropout) {
          bool keep0, keep1;
          keep_two(p, dropout_index(p, bh, rows[h], k0 + 8 * n + 2 * t), keep0, keep1);
          p0 = keep0 ? p0 : 0.0f;
          p1 = keep1 ? p1 : 0.0f;
        }
        store_pair(p_tile + (g + 8 * h) * L::kLdCols + 8 * n + 2 * t, p0, p1);
      }
    }
    __syncwarp();  // the warp's P is in shared memory
    gemm_nn<DT, N>(acc, p_tile, L::kLdCols, v_tile, L::kLd);
  }

  T* out = static_cast<T*>(p.out) + head_offset(p.out_layout, bh, p.heads);  // (Tq, D)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(l[h]);
    if (rows[h] >= p.q_len) continue;
    const bool empty = m[h] == kNegInf;  // no allowed key: out = 0, lse = -inf
    const float inv = empty ? 0.0f : p.dropout_scale / sum;
    T* out_row = out + rows[h] * p.out_layout.row;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      out_row[8 * n + 2 * t] = from_acc<T>(acc[n][2 * h] * inv);
      out_row[8 * n + 2 * t + 1] = from_acc<T>(acc[n][2 * h + 1] * inv);
    }
    if (t == 0) p.lse_out[bh * p.q_len + rows[h]] = empty ? kNegInf : m[h] + logf(sum);
  }
}

// ---------------------------------------------------------------- backward

// delta_i = sum_d dout_id * out_id for the B * H * Tq query rows (row bh * Tq + i
// of delta); one warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads) attention_delta_kernel(const T* out, AttentionLayout out_layout,
                                                                   const T* dout, AttentionLayout dout_layout,
                                                                   float* delta, int64_t heads, int64_t q_len,
                                                                   int64_t rows, int D) {
  const int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp
  const int64_t bh = row / q_len, i = row % q_len;
  const T* out_row = out + head_offset(out_layout, bh, heads) + i * out_layout.row;
  const T* dout_row = dout + head_offset(dout_layout, bh, heads) + i * dout_layout.row;
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) sum += to_acc(dout_row[d]) * to_acc(out_row[d]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) delta[row] = sum;
}

// dK and dV of 64 keys: the warp's rows are keys j, the columns queries i.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_dkdv_kernel(Params p) {
  using L = DkdvLayout<T, D>;
  constexpr int N = L::kCols, NT = N / 8, DT = D / 8;
  static_assert(N / 8 * 4 <= 32, "one keep bit per score of the lane");
  static_assert(kBlockRows % N == 0, "query steps start on key block boundaries");
  extern __shared__ __align__(16) unsigned char attention_smem[];
  T* smem = reinterpret_cast<T*>(attention_smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  T* k_tile = smem + L::k;                                     // (64, D)
  T* v_tile = smem + L::v;                                     // (64, D)
  T* q_tile = smem + L::q;                                     // (N, D)
  T* do_tile = smem + L::dout;                                 // (N, D)
  T* ds_tile = smem + L::ds + warp * kWarpRows * L::kLdCols;   // (16, N) this warp's keys
  float* lse_tile = reinterpret_cast<float*>(attention_smem + L::kLse);      // (N)
  float* delta_tile = reinterpret_cast<float*>(attention_smem + L::kDelta);  // (N)

  const int64_t k_blocks = ceil_div(p.kv_len, kBlockRows);
  const int64_t bh = blockIdx.x / k_blocks;
  const int64_t k0 = blockIdx.x % k_blocks * kBlockRows;
  const int64_t mask_base = bh / p.heads * p.mask_stride_b + bh % p.heads * p.mask_stride_h;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads);           // (Tq, D)
  const T* dout = static_cast<const T*>(p.dout) + head_offset(p.dout_layout, bh, p.heads);  // (Tq, D)
  const float* lse = p.lse + bh * p.q_len;                           // (Tq)
  const float* delta = p.delta + bh * p.q_len;                       // (Tq)
  const int64_t keys[2] = {k0 + warp * kWarpRows + g, k0 + warp * kWarpRows + g + 8};

  load_rows<D, kBlockRows>(k_tile, L::kLd, static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads),
                           p.k_layout.row, k0, p.kv_len, p.vector_loads);
  load_rows<D, kBlockRows>(v_tile, L::kLd, static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads),
                           p.v_layout.row, k0, p.kv_len, p.vector_loads);

  float dk[DT][4] = {};  // (16, D) sum of dS^T Q, times scale at the end
  float dv[DT][4] = {};  // (16, D) sum of P_dropped^T dO
  // Causal: queries i < k0 see none of these keys (k0 is a multiple of N).
  for (int64_t q0 = p.causal ? k0 : 0; q0 < p.q_len; q0 += N) {
    __syncthreads();  // the previous step's tiles are no longer read
    load_rows<D, N>(q_tile, L::kLd, q, p.q_layout.row, q0, p.q_len, p.vector_loads);
    load_rows<D, N>(do_tile, L::kLd, dout, p.dout_layout.row, q0, p.q_len, p.vector_loads);
    for (int c = threadIdx.x; c < N; c += kThreads) {
      lse_tile[c] = q0 + c < p.q_len ? lse[q0 + c] : kNegInf;
      delta_tile[c] = q0 + c < p.q_len ? delta[q0 + c] : 0.0f;
    }
    __syncthreads();

    // P^T (16 keys, N queries), kept in registers; P^T with dropout to shared memory.
    float pt[NT][4] = {};
    gemm_nt<NT, D>(pt, k_tile + warp * kWarpRows * L::kLd, L::kLd, q_tile, L::kLd);
    uint32_t kept = 0xffffffffu;  // bit 4 n + e: keep of pt[n][e]
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * t + e % 2;
        const int64_t i = q0 + col, j = keys[e / 2];
        pt[n][e] = probability(score(p, mask_base, i, j, pt[n][e]), lse_tile[col]);
        if (p.dropout && !keep_one(p, dropout_index(p, bh, i, j))) kept &= ~(1u << (4 * n + e));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool keep0 = (kept >> (4 * n + 2 * h)) & 1u, keep1 = (kept >> (4 * n + 2 * h + 1)) & 1u;
        store_pair(ds_tile + (g + 8 * h) * L::kLdCols + 8 * n + 2 * t,
                   keep0 ? pt[n][2 * h] * p.dropout_scale : 0.0f, keep1 ? pt[n][2 * h + 1] * p.dropout_scale : 0.0f);
      }
    }
    __syncwarp();
    gemm_nn<DT, N>(dv, ds_tile, L::kLdCols, do_tile, L::kLd);
    __syncwarp();  // P^T is read; dS^T goes in its place

    // dP^T = V dO^T; dS^T = P^T * (dP^T through dropout - delta).
    float dpt[NT][4] = {};
    gemm_nt<NT, D>(dpt, v_tile + warp * kWarpRows * L::kLd, L::kLd, do_tile, L::kLd);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * t + e % 2;
        const float dp = ((kept >> (4 * n + e)) & 1u) != 0 ? dpt[n][e] * p.dropout_scale : 0.0f;
        ds[e] = pt[n][e] * (dp - delta_tile[col]);
      }
      store_pair(ds_tile + g * L::kLdCols + 8 * n + 2 * t, ds[0], ds[1]);
      store_pair(ds_tile + (g + 8) * L::kLdCols + 8 * n + 2 * t, ds[2], ds[3]);
    }
    __syncwarp();
    gemm_nn<DT, N>(dk, ds_tile, L::kLdCols, q_tile, L::kLd);
  }

  store_dkdv<T, D>(p, dk, dv, bh, keys[0], t);
}

// dQ of 64 queries: the warp's rows are queries i, the columns keys j.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_dq_kernel(Params p) {
  using L = DqLayout<T, D>;
  constexpr int N = L::kCols, NT = N / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char attention_smem[];
  T* smem = reinterpret_cast<T*>(attention_smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  T* q_tile = smem + L::q;                                     // (64, D)
  T* do_tile = smem + L::dout;                                 // (64, D)
  T* k_tile = smem + L::k;                                     // (N, D)
  T* v_tile = smem + L::v;                                     // (N, D)
  T* ds_tile = smem + L::ds + warp * kWarpRows * L::kLdCols;   // (16, N) this warp's queries

  const int64_t q_blocks = ceil_div(p.q_len, kBlockRows);
  const int64_t bh = blockIdx.x / q_blocks;
  const int64_t q0 = (q_blocks - 1 - blockIdx.x % q_blocks) * kBlockRows;
  const int64_t mask_base = bh / p.heads * p.mask_stride_b + bh % p.heads * p.mask_stride_h;
  const T* k = static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads);  // (Tk, D)
  const T* v = static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads);  // (Tk, D)
  const int64_t rows[2] = {q0 + warp * kWarpRows + g, q0 + warp * kWarpRows + g + 8};
  float lse[2], delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lse[h] = rows[h] < p.q_len ? p.lse[bh * p.q_len + rows[h]] : kNegInf;
    delta[h] = rows[h] < p.q_len ? p.delta[bh * p.q_len + rows[h]] : 0.0f;
  }

  load_rows<D, kBlockRows>(q_tile, L::kLd, static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads),
                           p.q_layout.row, q0, p.q_len, p.vector_loads);
  load_rows<D, kBlockRows>(do_tile, L::kLd, static_cast<const T*>(p.dout) + head_offset(p.dout_layout, bh, p.heads),
                           p.dout_layout.row, q0, p.q_len, p.vector_loads);

  float dq[DT][4] = {};  // (16, D) sum of dS K, times scale at the end
  const int64_t k_end = p.causal && q0 + kBlockRows < p.kv_len ? q0 + kBlockRows : p.kv_len;
  for (int64_t k0 = 0; k0 < k_end; k0 += N) {
    __syncthreads();  // the previous step's K, V and dS are no longer read
    load_rows<D, N>(k_tile, L::kLd, k, p.k_layout.row, k0, p.kv_len, p.vector_loads);
    load_rows<D, N>(v_tile, L::kLd, v, p.v_layout.row, k0, p.kv_len, p.vector_loads);
    __syncthreads();

    float s[NT][4] = {};   // (16, N) scores, then probabilities
    float dp[NT][4] = {};  // (16, N) dO V^T
    gemm_nt<NT, D>(s, q_tile + warp * kWarpRows * L::kLd, L::kLd, k_tile, L::kLd);
    gemm_nt<NT, D>(dp, do_tile + warp * kWarpRows * L::kLd, L::kLd, v_tile, L::kLd);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float ds[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t j = k0 + 8 * n + 2 * t;
        bool keep0 = true, keep1 = true;
        if (p.dropout) keep_two(p, dropout_index(p, bh, rows[h], j), keep0, keep1);
        const float p0 = probability(score(p, mask_base, rows[h], j, s[n][2 * h]), lse[h]);
        const float p1 = probability(score(p, mask_base, rows[h], j + 1, s[n][2 * h + 1]), lse[h]);
        const float dp0 = keep0 ? dp[n][2 * h] * p.dropout_scale : 0.0f;
        const float dp1 = keep1 ? dp[n][2 * h + 1] * p.dropout_scale : 0.0f;
        ds[2 * h] = p0 * (dp0 - delta[h]);
        ds[2 * h + 1] = p1 * (dp1 - delta[h]);
      }
      store_pair(ds_tile + g * L::kLdCols + 8 * n + 2 * t, ds[0], ds[1]);
      store_pair(ds_tile + (g + 8) * L::kLdCols + 8 * n + 2 * t, ds[2], ds[3]);
    }
    __syncwarp();
    gemm_nn<DT, N>(dq, ds_tile, L::kLdCols, k_tile, L::kLd);
  }

  store_dq<T, D>(p, dq, bh, rows[0], t);
}

// ---------------------------------------------------------------- host side

// Calls body.template operator()<T, D>() for the problem's dtype and head dim.
template <typename F>
void dispatch(const AttentionArgs& a, const char* op, F&& body) {
  KILN_CHECK(attention_cuda_supports(a.dtype, a.head_dim), op,
             ": the CUDA kernels take float32, float16 or bfloat16 with head_dim 32, 64, 96 or 128; got ", a.dtype,
             " with head_dim ", a.head_dim);
  switch (a.dtype) {
    case DType::f16: dispatch_head_dim<__half>(a.head_dim, body); break;
    case DType::bf16: dispatch_head_dim<__nv_bfloat16>(a.head_dim, body); break;
    default: dispatch_head_dim<float>(a.head_dim, body); break;
  }
}

void check_sizes(const AttentionArgs& a, const char* op) {
  KILN_CHECK(a.batch >= 0 && a.heads >= 0 && a.q_len >= 0 && a.kv_len >= 0, op, ": negative size (batch ", a.batch,
             ", heads ", a.heads, ", q_len ", a.q_len, ", kv_len ", a.kv_len, ")");
  KILN_CHECK(a.dropout_p >= 0.0f && a.dropout_p <= 1.0f, op, ": dropout_p must be in [0, 1], got ", a.dropout_p);
}

}  // namespace

namespace {
std::atomic<AttentionCudaKernels> cuda_kernels{AttentionCudaKernels::tensor_core};

// 16-bit problems of the head dims attention_tc.cu has go there unless the
// reference is forced, a row stride of the tiles it reads (q, k, v, and
// dout when given) exceeds its 32-bit tile indexing, or the scale is not
// positive (its forward takes the row max before scaling).
bool use_tensor_core_kernels(const AttentionArgs& a, const AttentionLayout* dout_layout = nullptr) {
  const auto fits = [&](const AttentionLayout& layout, int64_t len) {
    return resolved(layout, a.heads, len, a.head_dim).row <= attention_tc::kMaxRowStride;
  };
  return cuda_kernels.load(std::memory_order_relaxed) == AttentionCudaKernels::tensor_core &&
         attention_tc::supports(a.dtype, a.head_dim) && a.scale > 0.0 && fits(a.q_layout, a.q_len) &&
         fits(a.k_layout, a.kv_len) && fits(a.v_layout, a.kv_len) &&
         (dout_layout == nullptr || fits(*dout_layout, a.q_len));
}
}  // namespace

void set_attention_cuda_kernels(AttentionCudaKernels kernels) { cuda_kernels.store(kernels, std::memory_order_relaxed); }
AttentionCudaKernels attention_cuda_kernels() { return cuda_kernels.load(std::memory_order_relaxed); }

bool attention_cuda_supports(DType dtype, int64_t head_dim) {
  const bool dtype_ok = dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
  return dtype_ok && (head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128);
}

void attention_forward_cuda(const AttentionArgs& args, void* out, void* lse, cuda::Stream stream) {
  constexpr const char* op = "scaled_dot_product_attention";
  check_sizes(args, op);
  const int64_t heads = args.batch * args.heads;
  if (heads == 0 || args.q_len == 0) return;
  if (use_tensor_core_kernels(args)) {
    attention_tc::forward(args, out, lse, stream);
    return;
  }
  dispatch(args, op, [&]<typename T, int D>() {
    Params p = params_of<Params>(args);
    p.out = out;
    p.lse_out = static_cast<float*>(lse);
    launch(attention_forward_kernel<T, D>, heads * ceil_div(args.q_len, kBlockRows), kThreads,
           ForwardLayout<T, D>::kBytes, stream, p, "scaled_dot_product_attention forward");
  });
}

size_t attention_backward_workspace_bytes(const AttentionGradArgs& args) {
  const AttentionArgs& a = args.forward;
  return static_cast<size_t>(std::max<int64_t>(a.batch * a.heads * a.q_len, 0)) * sizeof(float);
}

void attention_backward_cuda(const AttentionGradArgs& args, void* workspace, cuda::Stream stream) {
  constexpr const char* op = "scaled_dot_product_attention backward";
  const AttentionArgs& a = args.forward;
  check_sizes(a, op);
  const int64_t heads = a.batch * a.heads, rows = heads * a.q_len;
  const bool want_kv = args.dk != nullptr || args.dv != nullptr;
  if (heads == 0 || (args.dq == nullptr && !want_kv)) return;
  KILN_CHECK(rows == 0 || workspace != nullptr, op, ": needs a workspace of ", attention_backward_workspace_bytes(args),
             " bytes");
  dispatch(a, op, [&]<typename T, int D>() {
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    const Params p = backward_params_of<Params>(args, static_cast<const float*>(workspace));
    if (rows > 0) {
      const int64_t blocks = ceil_div(rows, kWarps);
      KILN_CHECK(blocks <= INT32_MAX, op, ": ", rows, " rows exceed one launch");
      attention_delta_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, cuda_stream>>>(
          static_cast<const T*>(args.out), p.out_layout, static_cast<const T*>(args.dout), p.dout_layout,
          static_cast<float*>(workspace), a.heads, a.q_len, rows, D);
      cuda::check_last_launch("scaled_dot_product_attention backward (delta)");
    }
    if (use_tensor_core_kernels(a, &args.dout_layout)) {
      attention_tc::backward(args, static_cast<const float*>(workspace), stream);
      return;
    }
    if (want_kv && a.kv_len > 0) {
      launch(attention_dkdv_kernel<T, D>, heads * ceil_div(a.kv_len, kBlockRows), kThreads, DkdvLayout<T, D>::kBytes,
             stream, p, "scaled_dot_product_attention backward (dk, dv)");
    }
    if (args.dq != nullptr && a.q_len > 0) {
      launch(attention_dq_kernel<T, D>, heads * ceil_div(a.q_len, kBlockRows), kThreads, DqLayout<T, D>::kBytes,
             stream, p, "scaled_dot_product_attention backward (dq)");
    }
  });
}

}  // namespace kiln::kernels
