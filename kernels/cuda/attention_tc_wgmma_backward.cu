// attention_tc's backward on Hopper's warpgroup matrix products (wgmma,
// sm_90a, compiled alone for that target as attention_tc_wgmma.cu is), for
// head dims 64 and 128 without dropout or an additive mask: the same two
// kernels, math and rounding points as attention_tc_backward.cu's (given the
// forward's lse and delta = dout . out per query row; each gradient row has
// one owning CTA, so results are deterministic), with each product a wgmma.
//  - Every tile lives once in shared memory in the 128-byte swizzled layout
//    (attention_tc_wgmma_common.cuh) and serves as a K-major operand (A of
//    K Q^T, V dO^T, Q K^T, dO V^T; B of the same) and as an MN-major B (dO
//    and Q for dV and dK, K for dQ), transposed by the hardware.
//  - P^T, dS^T and dS go from the score products to the next product as
//    register A fragments (pack_a), as in the mma.sync kernels.
//  - dK/dV: one warpgroup per 64 keys, query steps of 64 double-buffered
//    (Q, dO, lse, delta); dQ: one warpgroup per 64 queries, 64-key blocks
//    double-buffered (K, V).
// Not yet run on a GPU: selected by set_attention_wgmma_backward(true)
// (kernels/attention.h) until bench_attention has timed it against the
// mma.sync kernels and the [gpu] test has compared the gradients. Emulated
// (KILN_ATTENTION_WGMMA_BACKWARD=1 scripts/cuda_emu/run.sh, D 64 and 128): 0
// failures; mutants (dV from Q's tile, dQ from V's, dP^T from K, no wait
// before the stage is reused, the MN-major column blocks at half their
// distance) all fail. ptxas (CUDA 13.0, sm_90a): dK/dV 202 registers at D 64,
// 255 and a 16-byte spill at D 128 (dK and dV hold 128 of them); dQ 166 and 212.
#include "kernels/cuda/attention_tc_wgmma_common.cuh"

namespace kiln::kernels::attention_tc {

namespace {

// One warpgroup; kRows of its own (keys for dK/dV, queries for dQ) and steps
// of kCols of the other, double-buffered. Bytes from a 1024-byte-aligned base:
// the CTA's two tiles, then two stages of two tiles, then (dK/dV) each stage's
// lse and delta.
template <int D>
struct WgmmaBackwardShape {
  static_assert(D == 64 || D == 128, "wgmma products of N = D: 64 or 128");
  static constexpr int kThreads = 128;
  static constexpr int kRows = 64, kCols = 64;
  static constexpr int kOwnTile = kRows * D * 2, kStepTile = kCols * D * 2;
  static constexpr int kFirstStage = 2 * kOwnTile;  // after the CTA's two tiles
  static constexpr int kStageBytes = 2 * kStepTile;
  static constexpr int kFloats = kFirstStage + 2 * kStageBytes;  // stage s: lse at 2 kCols s, delta after
  static constexpr size_t kBytes = size_t{kFloats} + 2 * 2 * kCols * sizeof(float) + 1024;
};

// dK and dV of 64 keys: one CTA per (64 keys, b * H + h); warp w owns keys
// k0 + 16 w .. + 15 as rows of S^T, the columns are queries.
template <typename T, int D>
__global__ void __launch_bounds__(128, 1) attention_tc_wgmma_dkdv_kernel(Params p) {
  using S = WgmmaBackwardShape<D>;
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KN = N / 16;
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  unsigned char* base = aligned_smem_base(attention_tc_smem);
  unsigned char* k_tile = base;                 // (M, D) swizzled
  unsigned char* v_tile = base + S::kOwnTile;  // (M, D) swizzled
  float* floats = reinterpret_cast<float*>(base + S::kFloats);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  const int64_t k_blocks = ceil_div(p.kv_len, M);
  const int64_t bh = blockIdx.x / k_blocks;
  const int64_t k0 = blockIdx.x % k_blocks * M;
  const int64_t j0 = k0 + warp * 16;  // the warp's first key; the lane's are j0 + g and j0 + g + 8
  const T* q = static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads);
  const T* dout = static_cast<const T*>(p.dout) + head_offset(p.dout_layout, bh, p.heads);
  const float* lse = p.lse + bh * p.q_len;
  const float* delta = p.delta + bh * p.q_len;
  const int64_t i_begin = p.causal ? k0 : 0;  // causal: queries i < k0 see none of these keys
  const int64_t steps = i_begin < p.q_len ? ceil_div(p.q_len - i_begin, N) : 0;

  const auto stage = [&](int64_t step) { return base + S::kFirstStage + (step % 2) * S::kStageBytes; };
  const auto load_step = [&](int64_t step) {
    const int64_t i0 = i_begin + step * N;
    unsigned char* to = stage(step);
    load_swizzled_tile<N, D, S::kThreads>(to, q, p.q_layout.row, i0, p.q_len, p.vector_loads);
    load_swizzled_tile<N, D, S::kThreads>(to + S::kStepTile, dout, p.dout_layout.row, i0, p.q_len, p.vector_loads);
    float* stage_floats = floats + (step % 2) * 2 * N;
    load_floats<N, S::kThreads>(stage_floats, lse, i0, p.q_len);
    load_floats<N, S::kThreads>(stage_floats + N, delta, i0, p.q_len);
  };

  if (steps > 0) {  // else dK = dV = 0
    load_swizzled_tile<M, D, S::kThreads>(k_tile, static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads),
                                          p.k_layout.row, k0, p.kv_len, p.vector_loads);
    load_swizzled_tile<M, D, S::kThreads>(v_tile, static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads),
                                          p.v_layout.row, k0, p.kv_len, p.vector_loads);
    load_step(0);
  }
  cp_async_commit();

  // Per warp, as in the mma.sync kernel: masked while some of its keys are
  // after some query of the step (causal), from the step that crosses Tq on,
  // and throughout for keys past Tk. No step is skipped: with i_begin = k0 a
  // step always has queries that some key of the warpgroup sees.
  const int64_t masked_until = p.causal ? ceil_div(j0 + 15 - i_begin, N) : 0;
  const int64_t first_masked = (p.q_len - i_begin) / N;
  const bool all_masked = j0 + 16 > p.kv_len;
  float dk[DT][4] = {};  // (16, D) sum of dS^T Q, times scale at the end
  float dv[DT][4] = {};  // (16, D) sum of P^T dO
  for (int64_t step = 0; step < steps; ++step) {
    if (step + 1 < steps) load_step(step + 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();

    const int64_t i0 = i_begin + step * N;
    const unsigned char* q_step = stage(step);                 // (N, D)
    const unsigned char* do_step = q_step + S::kStepTile;      // (N, D)
    const float* lse_tile = floats + (step % 2) * 2 * N;       // (N)
    const float* delta_tile = lse_tile + N;                    // (N)
    const bool masked = all_masked || step < masked_until || step >= first_masked;

    // P^T (keys x queries) = K Q^T and dP^T = V dO^T, one batch.
    float pt[NT][4], ds[NT][4];
    wgmma_fence(pt, ds);
    issue_product_nt<T, D, N>(pt, k_tile, q_step);
    issue_product_nt<T, D, N>(ds, v_tile, do_step);
    wgmma_commit();
    wgmma_wait<0>(pt, ds);

    // P^T = exp2(scale log2(e) S^T - lse2 of the column); dS^T = P^T (dP^T - delta of the column).
    scores_log2<false, false>(pt, masked, p, 0, i0, j0, lane);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float2 column_lse = *reinterpret_cast<const float2*>(lse_tile + 8 * n + 2 * t);
      const float2 column_delta = *reinterpret_cast<const float2*>(delta_tile + 8 * n + 2 * t);
      const float lse2[2] = {lse_log2(column_lse.x), lse_log2(column_lse.y)};
      const float deltas[2] = {column_delta.x, column_delta.y};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pt[n][e] = exp2_approx(pt[n][e] - lse2[e % 2]);
        ds[n][e] = pt[n][e] * (ds[n][e] - deltas[e % 2]);
      }
    }
    uint32_t pf[KN][4], dsf[KN][4];
#pragma unroll
    for (int kk = 0; kk < KN; ++kk) {
      pack_a<T>(pf[kk], pt, kk);
      pack_a<T>(dsf[kk], ds, kk);
    }

    // dV += P^T dO and dK += dS^T Q: B = the step's dO and Q read MN-major.
    wgmma_fence(dv, dk, pf, dsf);
    issue_product_nn<T, N>(dv, pf, do_step);
    issue_product_nn<T, N>(dk, dsf, q_step);
    wgmma_commit();
    wgmma_wait<0>(dv, dk);  // the stage is read before the barrier below lets step + 2 load into it
    __syncthreads();
  }
  cp_async_wait<0>();

  store_dkdv<T, D>(p, dk, dv, bh, j0 + g, t);
}

// dQ of 64 queries: one CTA per (64 queries, b * H + h); warp w owns rows
// q0 + 16 w .. + 15, the columns are keys.
template <typename T, int D>
__global__ void __launch_bounds__(128, 1) attention_tc_wgmma_dq_kernel(Params p) {
  using S = WgmmaBackwardShape<D>;
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KN = N / 16;
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  unsigned char* base = aligned_smem_base(attention_tc_smem);
  unsigned char* q_tile = base;                   // (M, D) swizzled
  unsigned char* do_tile = base + S::kOwnTile;   // (M, D) swizzled
  const QueryCta cta = query_cta<M>(p);
  const int lane = cta.lane, g = cta.g, t = cta.t;
  const int64_t bh = cta.bh, q0 = cta.q0, r0 = cta.r0;
  const T* k = static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads);
  const T* v = static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads);
  float lse2[2], delta[2];
  query_rows_lse2_delta(p, bh, r0 + g, lse2, delta);
  const int64_t k_end = p.causal && q0 + M < p.kv_len ? q0 + M : p.kv_len;
  const int64_t blocks = ceil_div(k_end, N);

  const auto stage = [&](int64_t block) { return base + S::kFirstStage + (block % 2) * S::kStageBytes; };
  const auto load_kv = [&](int64_t block) {
    load_swizzled_kv_block<N, D, S::kThreads>(stage(block), S::kStepTile, k, v, block, p);
  };

  load_swizzled_tile<M, D, S::kThreads>(q_tile, static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads),
                                        p.q_layout.row, q0, p.q_len, p.vector_loads);
  load_swizzled_tile<M, D, S::kThreads>(do_tile,
                                        static_cast<const T*>(p.dout) + head_offset(p.dout_layout, bh, p.heads),
                                        p.dout_layout.row, q0, p.q_len, p.vector_loads);
  if (blocks > 0) load_kv(0);
  cp_async_commit();

  const QueryRowBlocks group_blocks = query_row_blocks<N, false, 64>(p, q0);  // the warpgroup's skips
  const QueryRowBlocks warp_blocks = query_row_blocks<N, false>(p, r0);       // the warp's masking
  float dq[DT][4] = {};  // (16, D) sum of dS K, times scale at the end
  for (int64_t block = 0; block < blocks; ++block) {
    if (block + 1 < blocks) load_kv(block + 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();

    if (block < group_blocks.first_skipped) {
      const int64_t k0 = block * N;
      const unsigned char* k_block = stage(block);              // (N, D)
      const unsigned char* v_block = k_block + S::kStepTile;    // (N, D)
      const bool masked = warp_blocks.all_masked || block >= warp_blocks.first_masked;
      float s[NT][4], ds[NT][4];  // (16, N): S = Q K^T, then P; dP = dO V^T, then dS
      wgmma_fence(s, ds);
      issue_product_nt<T, D, N>(s, q_tile, k_block);
      issue_product_nt<T, D, N>(ds, do_tile, v_block);
      wgmma_commit();
      wgmma_wait<0>(s, ds);
      scores_log2<false, true>(s, masked, p, 0, r0, k0, lane);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float prob = exp2_approx(s[n][e] - lse2[e / 2]);
          ds[n][e] = prob * (ds[n][e] - delta[e / 2]);
        }
      }
      uint32_t dsf[KN][4];
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) pack_a<T>(dsf[kk], ds, kk);
      // dQ += dS K: B(k = key, n = d) = K(key, d), K's block read MN-major.
      wgmma_fence(dq, dsf);
      issue_product_nn<T, N>(dq, dsf, k_block);
      wgmma_commit();
      wgmma_wait<0>(dq);
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  store_dq<T, D>(p, dq, bh, r0 + g, t);
}

}  // namespace

constexpr const char* kWgmmaBackwardWhat = "scaled_dot_product_attention backward (wgmma)";

void check_wgmma_backward(const Params& p) {
  KILN_CHECK(!p.dropout && p.mask == nullptr, kWgmmaBackwardWhat, ": no kernel for dropout or an additive mask");
  KILN_CHECK(wgmma_device(), kWgmmaBackwardWhat, ": needs a GPU of compute capability 9.0 (H100, H200)");
}

template <typename T, int D>
void launch_dkdv_wgmma(const Params& p, int64_t heads, cuda::Stream stream) {
  check_wgmma_backward(p);
  using S = WgmmaBackwardShape<D>;
  launch(attention_tc_wgmma_dkdv_kernel<T, D>, heads * ceil_div(p.kv_len, S::kRows), S::kThreads, S::kBytes, stream, p,
         kWgmmaBackwardWhat);
}

template <typename T, int D>
void launch_dq_wgmma(const Params& p, int64_t heads, cuda::Stream stream) {
  check_wgmma_backward(p);
  using S = WgmmaBackwardShape<D>;
  launch(attention_tc_wgmma_dq_kernel<T, D>, heads * ceil_div(p.q_len, S::kRows), S::kThreads, S::kBytes, stream, p,
         kWgmmaBackwardWhat);
}

#define KILN_WGMMA_BACKWARD_INSTANTIATE(T, D)                                         \
  template void launch_dkdv_wgmma<T, D>(const Params&, int64_t, cuda::Stream); \
  template void launch_dq_wgmma<T, D>(const Params&, int64_t, cuda::Stream);
KILN_WGMMA_BACKWARD_INSTANTIATE(__half, 64)
KILN_WGMMA_BACKWARD_INSTANTIATE(__half, 128)
KILN_WGMMA_BACKWARD_INSTANTIATE(__nv_bfloat16, 64)
KILN_WGMMA_BACKWARD_INSTANTIATE(__nv_bfloat16, 128)
#undef KILN_WGMMA_BACKWARD_INSTANTIATE

}  // namespace kiln::kernels::attention_tc
