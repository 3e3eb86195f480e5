// What attention_tc's kernels share (attention_tc.cu has the design): the
// launch parameters, the tile shapes and shared-memory layouts, tile loads,
// score masking, dropout keep bits, the block schedule, a forward or dQ CTA's
// place in the grid, and the choice of a kernel's instantiation; what they
// share with attention.cu's is in attention_common.cuh. Params and the launchers are
// declared in the named namespace, because attention_tc.cu calls the
// launchers that attention_tc_forward.cu and attention_tc_backward.cu define;
// everything else is internal to each translation unit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_tc_ptx.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/philox.h"
#include "kernels/random.h"

namespace kiln::kernels::attention_tc {

// The tensors and sizes (AttentionTensors), then the scalars.
struct Params : AttentionTensors {
  float scale = 1.0f;       // of the scores
  float scale_log2 = 1.0f;  // scale * log2(e)
  float dropout_p = 0.0f, dropout_scale = 1.0f;  // dropout_scale = 1 / (1 - p)
  uint64_t seed = 0, offset = 0;
  const philox::ReplayState* replay = nullptr;  // a graph's seed and base offset, read at every replay
  bool causal = false, dropout = false;
  bool vector_loads = false;  // q, k, v and dout are 16-byte aligned: cp.async
};

// Launch one kernel of attention_tc for a dtype T (__half, __nv_bfloat16) and
// head dim D (32, 64, 96, 128) on `heads` = B * H heads, its instantiation
// picked by p.dropout and p.mask; p.q_len (forward, dQ) or p.kv_len (dK/dV)
// must be positive. Defined in attention_tc_forward.cu (forward) and
// attention_tc_backward.cu (dK/dV, dQ) for every T and D.
template <typename T, int D>
void launch_forward(const Params& p, int64_t heads, cuda::Stream stream);
template <typename T, int D>
void launch_dkdv(const Params& p, int64_t heads, cuda::Stream stream);
template <typename T, int D>
void launch_dq(const Params& p, int64_t heads, cuda::Stream stream);

// The forward on Hopper's wgmma (attention_tc_wgmma.cu, sm_90a) for D = 64
// and 128 without dropout or a mask, in one of its CTA shapes (`variant`,
// attention_tc_forward.cu's candidates); throws on another GPU.
template <typename T, int D>
void launch_forward_wgmma(const Params& p, int64_t heads, int variant, cuda::Stream stream);
// Its warp-specialized kernel (attention_tc_wgmma_pingpong.cu) with `consumers`
// consumer warpgroups: 2 (variant 5), or 3 for D = 64 (variant 6).
template <typename T, int D>
void launch_forward_wgmma_pingpong(const Params& p, int64_t heads, int consumers, cuda::Stream stream);

// The backward's two kernels on wgmma (attention_tc_wgmma_backward.cu, sm_90a)
// for D = 64 and 128 without dropout or a mask; throw on another GPU.
template <typename T, int D>
void launch_dkdv_wgmma(const Params& p, int64_t heads, cuda::Stream stream);
template <typename T, int D>
void launch_dq_wgmma(const Params& p, int64_t heads, cuda::Stream stream);

// The explicit instantiations of a launcher that attention_tc.cu's dispatch needs.
#define KILN_ATTENTION_TC_INSTANTIATE(launcher)                                     \
  template void launcher<__half, 32>(const Params&, int64_t, cuda::Stream);         \
  template void launcher<__half, 64>(const Params&, int64_t, cuda::Stream);         \
  template void launcher<__half, 96>(const Params&, int64_t, cuda::Stream);         \
  template void launcher<__half, 128>(const Params&, int64_t, cuda::Stream);        \
  template void launcher<__nv_bfloat16, 32>(const Params&, int64_t, cuda::Stream);  \
  template void launcher<__nv_bfloat16, 64>(const Params&, int64_t, cuda::Stream);  \
  template void launcher<__nv_bfloat16, 96>(const Params&, int64_t, cuda::Stream);  \
  template void launcher<__nv_bfloat16, 128>(const Params&, int64_t, cuda::Stream);

namespace {

constexpr float kPosInf = __builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kPad = 8;  // elements: 16 bytes per row

// ---------------------------------------------------------------- shapes and shared memory layouts
// Offsets in elements of the 16-bit type; every tile has row stride kLd = D + kPad.

// The forward's default: 8 warps of one 16-row group each, 64-key blocks.
// The other warp counts, row groups per warp, key blocks and occupancy
// targets are bench_attention's tuning candidates ("tuning candidates" in
// attention_tc_forward.cu).
template <int D, int kWarpsPerCta = 8, int kKeysPerBlock = 64, int kMinCtas = (D <= 64 ? 2 : 1), int kGroups = 1>
struct ForwardShape {
  static constexpr int kWarps = kWarpsPerCta, kThreads = kWarps * 32;
  static constexpr int kRowGroups = kGroups;      // 16-row groups per warp
  static constexpr int kWarpRows = 16 * kGroups;  // queries per warp
  static constexpr int kRows = kWarps * kWarpRows;  // queries per CTA
  static constexpr int kCols = kKeysPerBlock;     // keys per block
  static constexpr int kMinBlocks = kMinCtas;
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

// ---------------------------------------------------------------- tile loads

// A thread's chunks of load_tile: rows r < rows_left of the (kRows, D)
// source `first` (row stride ld32) copied, the others zeroed.
template <int kRows, int D, int kThreads, bool kAsync, typename T>
__device__ __forceinline__ void load_tile_chunks(T* tile, const T* first, int ld32, int rows_left) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(kRows * kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int c = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = c / kChunks, col = c % kChunks * 8;
    T* to = tile + r * (D + kPad) + col;
    if (r >= rows_left) {
      *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
    } else if constexpr (kAsync) {
      cp_async_16(to, first + r * ld32 + col);
    } else {
      const T* from = first + r * ld32 + col;
#pragma unroll
      for (int e = 0; e < 8; ++e) to[e] = from[e];
    }
  }
}

// Rows [row0, row0 + kRows) of a (rows, D) matrix of row stride `ld` (its
// D elements dense) into a shared tile of row stride D + kPad, by all
// kThreads threads: cp.async when `async`, else plain loads and stores. Rows
// past `rows` become zeros with a plain store (a NaN left in shared memory
// would survive a multiplication by p = 0). Either way the tile is complete
// for every thread after this thread's cp_async_wait covering it and a
// __syncthreads().
template <int kRows, int D, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t ld, int64_t row0, int64_t rows, bool async) {
  // Offsets within the tile's rows in 32 bits (r * ld + col < 2^31: the host
  // sends row strides above attention_tc::kMaxRowStride to attention.cu's
  // kernels), rows left in [0, kRows], and one branch on `async` per tile:
  // ptxas's allocation of the D = 64 forward at its 128-register budget is
  // fickle, and this form spills nothing where 64-bit offsets spilled 36
  // bytes, one branch per chunk 60, and first + (r * ld32 + col) 40.
  const T* first = src + row0 * ld;
  const int ld32 = static_cast<int>(ld);
  const int rows_left = rows - row0 <= 0 ? 0 : rows - row0 >= kRows ? kRows : static_cast<int>(rows - row0);
  if (async) {
    load_tile_chunks<kRows, D, kThreads, true>(tile, first, ld32, rows_left);
  } else {
    load_tile_chunks<kRows, D, kThreads, false>(tile, first, ld32, rows_left);
  }
}

// Key block `block` (keys block N .. + N - 1, N = S::kCols) of K and V into
// stage block % 2 of shape S's double buffer: K at S::kv + stage * S::kStage,
// V N rows after it (the forward's and dQ's K/V stages); k and v are the head's first rows.
template <typename S, int D, typename T>
__device__ __forceinline__ void load_kv_block(T* smem, const T* k, const T* v, int64_t block, const Params& p) {
  constexpr int N = S::kCols;
  T* stage = smem + S::kv + (block % 2) * S::kStage;
  load_tile<N, D, S::kThreads>(stage, k, p.k_layout.row, block * N, p.kv_len, p.vector_loads);
  load_tile<N, D, S::kThreads>(stage + N * S::kLd, v, p.v_layout.row, block * N, p.kv_len, p.vector_loads);
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

// Score of (query0 + ql, key0 + kl), for blocks that need masking: -inf
// where the key is not one of the query's (key >= Tk, query >= Tq, causal key
// > query), else dot * factor, plus the additive mask * log2(e) if any. The
// mask is read only in bounds.
template <bool kMask>
__device__ __forceinline__ float masked_score(const BlockMask& b, float factor, int ql, int kl, float dot) {
  if (ql >= b.queries_left || kl >= b.keys_left || kl - ql > b.diagonal) return kNegInf;
  float x = dot * factor;
  if constexpr (kMask) x = fmaf(b.mask[ql * b.stride_q + kl * b.stride_k], kLog2e, x);
  return x;
}

// masked_score over the (16, 8 NT) scores s of a warp. rows_are_queries: the
// rows are queries (forward, dQ), else keys (dK/dV).
template <bool kMask, bool kRowsAreQueries, int NT>
__device__ __forceinline__ void mask_scores(float (&s)[NT][4], float factor, const Params& p, int64_t mask_base,
                                            int64_t query0, int64_t key0, int lane) {
  const int g = lane / 4, t = lane % 4;
  const BlockMask b = block_mask(p, mask_base, query0, key0);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 8 * n + 2 * t + e % 2;
      s[n][e] = kRowsAreQueries ? masked_score<kMask>(b, factor, row, col, s[n][e])
                                : masked_score<kMask>(b, factor, col, row, s[n][e]);
    }
  }
}

// The scores s into log2 units (times scale log2(e)), masked (mask_scores)
// when the block needs it.
template <bool kMask, bool kRowsAreQueries, int NT>
__device__ __forceinline__ void scores_log2(float (&s)[NT][4], bool masked, const Params& p, int64_t mask_base,
                                            int64_t query0, int64_t key0, int lane) {
  if (masked) {
    mask_scores<kMask, kRowsAreQueries>(s, p.scale_log2, p, mask_base, query0, key0, lane);
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

// dropout_index (attention_common.cuh) gives a score's word.
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

// x through dropout: x * dropout_scale where keep bit `bit` is set, else 0;
// without dropout x itself (a multiplication by a runtime 1 the compiler
// could not drop was one FMUL per score).
template <bool kDropout>
__device__ __forceinline__ float through_dropout(float x, uint32_t kept, int bit, float dropout_scale) {
  if constexpr (kDropout) return kept_bit(kept, bit) ? x * dropout_scale : 0.0f;
  return x;
}

// ---------------------------------------------------------------- the forward's online softmax

// One key block of the forward's online softmax for a lane's rows g and g + 8
// of a 16-row group (h = 0, 1): s (16, 8 NT), its scores times to_log2 in
// log2 units, becomes P = exp2(s to_log2 - m_new), zeroed where dropout drops
// it; m (log2 units) and the lane's part l of each row's sum move on, and
// alpha gets the factor that rescales the row's output accumulators. Returns
// whether some alpha of this lane is not 1.
template <bool kDropout, int NT>
__device__ __forceinline__ bool online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               float to_log2, uint32_t kept) {
  bool rescale = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float block_max = kNegInf;
#pragma unroll
    for (int n = 0; n < NT; ++n) block_max = fmaxf(block_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    const float m_new = fmaxf(m[h], quad_max(block_max) * to_log2);
    // While a row has seen only -inf, subtract 0: exp2(-inf - -inf) would be NaN.
    const float m_use = m_new == kNegInf ? 0.0f : m_new;
    alpha[h] = exp2_approx(m[h] - m_use);  // 0 while m = -inf; acc and l are 0 then
    rescale = rescale || alpha[h] != 1.0f;
    m[h] = m_new;
    l[h] *= alpha[h];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      s[n][2 * h] = exp2_approx(fmaf(s[n][2 * h], to_log2, -m_use));
      s[n][2 * h + 1] = exp2_approx(fmaf(s[n][2 * h + 1], to_log2, -m_use));
      l[h] += s[n][2 * h] + s[n][2 * h + 1];
      if constexpr (kDropout) {  // the sum counts every probability; the product only the kept ones
        if (!kept_bit(kept, 4 * n + 2 * h)) s[n][2 * h] = 0.0f;
        if (!kept_bit(kept, 4 * n + 2 * h + 1)) s[n][2 * h + 1] = 0.0f;
      }
    }
  }
  return rescale;
}

// After online_softmax, a warp's output accumulators acc (16, 8 DT) times
// alpha, skipped when no lane of the warp rescales (a multiplication by 1
// changes no bit), and its probabilities s (16, 8 NT) packed into A fragments
// pf for O += P V (one warp's rows: the wgmma kernels' warpgroup products).
template <typename T, int DT, int NT, int KN>
__device__ __forceinline__ void rescale_output_and_pack_p(float (&acc)[DT][4], const float (&alpha)[2], bool rescale,
                                                          const float (&s)[NT][4], uint32_t (&pf)[KN][4]) {
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int n = 0; n < DT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] *= alpha[e / 2];
    }
  }
#pragma unroll
  for (int kk = 0; kk < KN; ++kk) pack_a<T>(pf[kk], s, kk);
}

// The forward's epilogue for a lane's rows row0 + g, row0 + g + 8 of a
// 16-row group: out (=) from the unnormalized accumulators acc (16, 8 DT)
// and lse (=) from m and l; rows past Tq are not written.
template <typename T, int DT>
__device__ __forceinline__ void store_output_rows(T* out, const float (&acc)[DT][4], const float (&m)[2],
                                                  const float (&l)[2], int64_t row0, int64_t bh, const Params& p, int g,
                                                  int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(l[h]);
    const int64_t row = row0 + g + 8 * h;
    if (row >= p.q_len) continue;
    const bool empty = m[h] == kNegInf;  // no allowed key: out = 0, lse = -inf
    const float inv = empty ? 0.0f : p.dropout_scale / sum;
    T* out_row = out + row * p.out_layout.row;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      out_row[8 * n + 2 * t] = from_acc<T>(acc[n][2 * h] * inv);
      out_row[8 * n + 2 * t + 1] = from_acc<T>(acc[n][2 * h + 1] * inv);
    }
    // lse = ln(sum_j exp(s_ij)) = (m + log2(sum)) ln 2, m in log2 units.
    if (t == 0) p.lse_out[bh * p.q_len + row] = empty ? kNegInf : m[h] * kLn2 + logf(sum);
  }
}

// ---------------------------------------------------------------- dQ's rows

// lse in log2 units and delta of a lane's query rows row and row + 8 of head
// bh (the dQ kernels'); rows past Tq get lse2 = +inf and delta 0, so that
// their p is 0 on every path, as for rows without keys.
__device__ __forceinline__ void query_rows_lse2_delta(const Params& p, int64_t bh, int64_t row, float (&lse2)[2],
                                                      float (&delta)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool in_bounds = row + 8 * h < p.q_len;
    lse2[h] = in_bounds ? lse_log2(p.lse[bh * p.q_len + row + 8 * h]) : kPosInf;
    delta[h] = in_bounds ? p.delta[bh * p.q_len + row + 8 * h] : 0.0f;
  }
}

// ---------------------------------------------------------------- block schedule

// Which key blocks of a warp's kWarpRows query rows (r0 ..) need the
// per-element masking, and which it skips, as key block indices (blocks of
// kCols keys from key 0): computed once, so the loop compares one int.
struct QueryRowBlocks {
  int64_t first_masked;   // blocks >= this cross Tk or touch the causal diagonal
  int64_t first_skipped;  // blocks >= this lie above the diagonal (causal): every key after every row
  bool all_masked;        // an additive mask, or rows past Tq
};

template <int kCols, bool kMask, int kWarpRows = 16>
__device__ __forceinline__ QueryRowBlocks query_row_blocks(const Params& p, int64_t r0) {
  QueryRowBlocks b;
  // k0 + kCols > Tk  <=>  block >= Tk / kCols.
  b.first_masked = p.kv_len / kCols;
  b.first_skipped = INT64_MAX;
  if (p.causal) {
    // Some key after some row: k0 + kCols - 1 > r0  <=>  block >= (r0 + 1) / kCols.
    b.first_masked = (r0 + 1) / kCols < b.first_masked ? (r0 + 1) / kCols : b.first_masked;
    // Every key after every row: k0 > r0 + kWarpRows - 1  <=>  block >= (r0 + kWarpRows - 1) / kCols + 1.
    b.first_skipped = (r0 + kWarpRows - 1) / kCols + 1;
  }
  b.all_masked = kMask || r0 + kWarpRows > p.q_len;
  return b;
}

// ---------------------------------------------------------------- CTA prologue

// The place of a forward or dQ CTA in the grid: one CTA per (kRows queries,
// head bh = b * H + h), a head's last query block first (under causal
// masking it has the most keys); warp w owns queries r0 = q0 + kWarpRows w
// .. + kWarpRows - 1, and lane l (g = l / 4, t = l % 4) the rows r0 + g and
// r0 + g + 8 of each 16-row group.
struct QueryCta {
  int warp, lane, g, t;
  int64_t bh;         // b * H + h
  int64_t q0;         // the CTA's first query
  int64_t r0;         // the warp's first query
  int64_t mask_base;  // the additive mask's offset for head bh
};

template <int kRows, int kWarpRows = 16>
__device__ __forceinline__ QueryCta query_cta(const Params& p) {
  QueryCta c;
  c.warp = static_cast<int>(threadIdx.x) / 32;
  c.lane = static_cast<int>(threadIdx.x) % 32;
  c.g = c.lane / 4;
  c.t = c.lane % 4;
  const int64_t q_blocks = ceil_div(p.q_len, kRows);
  c.bh = blockIdx.x / q_blocks;
  c.q0 = (q_blocks - 1 - blockIdx.x % q_blocks) * kRows;
  c.r0 = c.q0 + c.warp * kWarpRows;
  c.mask_base = c.bh / p.heads * p.mask_stride_b + c.bh % p.heads * p.mask_stride_h;
  return c;
}

// ---------------------------------------------------------------- host side

// The instantiation of a kernel template for the problem's dropout and mask:
// kernels(std::bool_constant<kDropout>, std::bool_constant<kMask>) returns it.
template <typename Kernels>
auto pick(const Params& p, Kernels kernels) {
  using Yes = std::true_type;
  using No = std::false_type;
  if (p.dropout) return p.mask != nullptr ? kernels(Yes{}, Yes{}) : kernels(Yes{}, No{});
  return p.mask != nullptr ? kernels(No{}, Yes{}) : kernels(No{}, No{});
}

}  // namespace
}  // namespace kiln::kernels::attention_tc
