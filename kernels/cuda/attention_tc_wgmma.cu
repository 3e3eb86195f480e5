// attention_tc's forward on Hopper's warpgroup matrix products (wgmma,
// sm_90a; this file alone is compiled for that target, see
// kernels/CMakeLists.txt), for head dims 64 and 128 without dropout or an
// additive mask: the same algorithm, rounding points and outputs as
// attention_tc_forward.cu's kernel, with each warpgroup's two products per
// key block as wgmma instead of mma.sync.
//  - A CTA of W warpgroups owns 64 W queries; warp w of a warpgroup owns 16
//    of them, as in the mma.sync kernel (same fragments, masking, online
//    softmax and epilogue: attention_tc_common.cuh).
//  - S = Q K^T: Q's A fragments stay in registers (ldmatrix once, as
//    before); K is B, read by the tensor cores straight from its 128-byte
//    swizzled tile (no ldmatrix, no fragment registers for B).
//  - O += P V: P from registers (pack_a, as before); V is B in the same
//    swizzled layout as K, read MN-major (transposed by the hardware).
//  - K/V blocks double-buffered with cp.async, as before.
// Not yet run on a GPU: candidate forward shapes 7-11 (set_attention_forward_shape),
// the default only once bench_attention has timed them and the [gpu] test
// has checked them against the default shape. Emulated (scripts/cuda_emu/run.sh
// with KILN_ATTENTION_FORWARD_SHAPE=7 to 11 on head dims 64 and 128): 0
// failures; mutants (no swizzle in the tile stores, a 16-byte K step, V's 8-key
// groups 2048 bytes apart, V's column blocks at half their distance, S read
// before its wgmma_wait) all fail. ptxas (CUDA 13.0, sm_90a), no spills, as
// (warpgroups, keys per block): D 64 (2, 128) 197 registers (1 CTA/SM),
// (2, 64) 124 (2), (1, 128) 218 (2), (1, 64) 116 under a 4-CTA bound (4),
// shape 11 (2, 64, the next block's scores ahead) 196 (1); D 128 217, 196,
// 233, 222, 255.
// Shape 11 issues the next block's S = Q K^T before this block's softmax, as
// FlashAttention-3 does (its other half, warpgroups that take turns, is not
// here: the CTA's barrier per block keeps its warpgroups in step, so their
// softmaxes leave the tensor cores idle unless another CTA fills them; shape
// 12, attention_tc_wgmma_pingpong.cu, has both halves).
#include <cuda_runtime_api.h>

#include "kernels/cuda/attention_tc_wgmma_common.cuh"

namespace kiln::kernels::attention_tc {

namespace {

// W warpgroups of 64 query rows each; key blocks of kKeys; 16-bit elements.
// Shared memory (bytes, from a 1024-byte-aligned base): Q (rows padded as
// the mma.sync kernel's, read by ldmatrix), then two (three) stages of K and V
// tiles, each (kCols, D) in swizzled_offset's layout.
// kOverlap: the next block's S = Q K^T is issued before this block's
// softmax, so the tensor cores compute it meanwhile (three K/V stages: the
// block whose V is read, the next whose K is read, the one after loading).
template <int D, int kWarpGroupsPerCta, int kKeys, int kMinCtas = 1, bool kOverlapScores = false>
struct WgmmaForwardShape {
  static_assert(D == 64 || D == 128, "wgmma products of N = D: 64 or 128");
  static_assert(kKeys == 64 || kKeys == 128, "wgmma products of N = keys: 64 or 128");
  static constexpr int kWarpGroups = kWarpGroupsPerCta, kWarps = 4 * kWarpGroups, kThreads = 32 * kWarps;
  static constexpr int kRows = 64 * kWarpGroups;  // queries per CTA
  static constexpr int kCols = kKeys;             // keys per block
  static constexpr int kMinBlocks = kMinCtas;     // CTAs per SM that the register budget must allow
  static constexpr int kLd = D + kPad;            // Q's row stride in elements
  static constexpr int kTileBytes = kCols * D * 2;
  static constexpr int kKv = (kRows * kLd * 2 + 1023) / 1024 * 1024;  // the K/V stages: 1024-byte aligned
  static constexpr int kStageBytes = 2 * kTileBytes;                  // K, then V
  static constexpr bool kOverlap = kOverlapScores;
  static constexpr int kStages = kOverlap ? 3 : 2;
  static constexpr size_t kBytes = size_t{kKv} + kStages * kStageBytes + 1024;  // + the base's alignment
};

// One CTA per (S::kRows queries, b * H + h), as the mma.sync forward's
// kernel without dropout or a mask. Warpgroup-uniform: which key blocks a
// warpgroup computes (the products are the warpgroup's); per warp, as
// before: which blocks need the per-element masking, and the rescaling.
template <typename T, int D, typename S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks) attention_tc_wgmma_forward_kernel(Params p) {
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KD = D / 16, KN = N / 16, LD = S::kLd;
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  unsigned char* base = aligned_smem_base(attention_tc_smem);
  T* q_tile = reinterpret_cast<T*>(base);
  const QueryCta cta = query_cta<M>(p);
  const int warp = cta.warp, lane = cta.lane, g = cta.g, t = cta.t;
  const int64_t bh = cta.bh, q0 = cta.q0, r0 = cta.r0, mask_base = cta.mask_base;
  const int64_t group_r0 = q0 + 64 * (warp / 4);  // the warpgroup's first query
  const T* q = static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads);
  const T* k = static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads);
  const T* v = static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads);
  const int64_t k_end = p.causal && q0 + M < p.kv_len ? q0 + M : p.kv_len;
  const int64_t blocks = ceil_div(k_end, N);

  const auto stage = [&](int64_t block) { return base + S::kKv + (block % S::kStages) * S::kStageBytes; };
  const auto load_kv = [&](int64_t block) {
    load_swizzled_kv_block<N, D, S::kThreads>(stage(block), S::kTileBytes, k, v, block, p);
  };

  // Group 1: Q; group 2: K/V block 0 (empty when there are no keys); with
  // the overlap, group 3: block 1.
  load_tile<M, D, S::kThreads>(q_tile, q, p.q_layout.row, q0, p.q_len, p.vector_loads);
  cp_async_commit();
  if (blocks > 0) load_kv(0);
  cp_async_commit();
  if constexpr (S::kOverlap) {
    if (blocks > 1) load_kv(1);
    cp_async_commit();
    cp_async_wait<1>();  // Q and block 0 are in
    fence_proxy_async();
  } else {
    cp_async_wait<1>();  // Q is in
  }
  __syncthreads();
  uint32_t qf[KD][4];  // the warp's 16 rows of Q as A fragments, for the whole loop
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) load_a(qf[kk], q_tile + warp * 16 * LD, LD, 16 * kk, lane);

  const QueryRowBlocks group_blocks = query_row_blocks<N, false, 64>(p, group_r0);
  const QueryRowBlocks warp_blocks = query_row_blocks<N, false>(p, r0);
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  float acc[DT][4] = {};  // (16, D): the warp's unnormalized output

  // S = Q K^T of a block into s (issued; wgmma_wait before s is read).
  const auto issue_scores = [&](float (&s)[NT][4], int64_t block) { issue_product_nt_rs<T, N>(s, qf, stage(block)); };
  // A block's scores s (waited for) through the online softmax into P (pf, the
  // caller's: the tensor cores read it until the wait), then O += P V issued
  // (wgmma_wait before acc is read or the stage reused).
  const auto softmax_and_issue_pv = [&](float (&s)[NT][4], uint32_t (&pf)[KN][4], int64_t block) {
    if (warp_blocks.all_masked || block >= warp_blocks.first_masked) {
      mask_scores<false, true>(s, 1.0f, p, mask_base, r0, block * N, lane);
    }
    float alpha[2];
    const bool rescale = online_softmax<false>(s, m, l, alpha, p.scale_log2, 0u);
    rescale_output_and_pack_p<T>(acc, alpha, rescale, s, pf);
    wgmma_fence(acc, pf);  // acc and pf were last written by ordinary instructions
    issue_product_nn<T, N>(acc, pf, stage(block) + S::kTileBytes);
  };

  if constexpr (!S::kOverlap) {
    for (int64_t block = 0; block < blocks; ++block) {
      if (block + 1 < blocks) load_kv(block + 1);
      cp_async_commit();
      cp_async_wait<1>();   // this block's K/V are in (this thread's copies)
      fence_proxy_async();  // ... and visible to the tensor cores' reads after the barrier
      __syncthreads();
      if (block < group_blocks.first_skipped) {
        float s[NT][4];      // (16, N): scores, then probabilities
        uint32_t pf[KN][4];  // (16, N): P as A fragments
        wgmma_fence(s, qf);  // s was last written by ordinary instructions
        issue_scores(s, block);
        wgmma_commit();
        wgmma_wait<0>(s);
        softmax_and_issue_pv(s, pf, block);
        wgmma_commit();
        wgmma_wait<0>(acc, pf);  // the stage is read before the barrier below lets block + 2 load into it
      }
      __syncthreads();
    }
  } else {
    float s[NT][4];  // (16, N): block's scores, issued one block ahead
    if (blocks > 0 && group_blocks.first_skipped > 0) {
      wgmma_fence(s, qf);
      issue_scores(s, 0);
      wgmma_commit();
      wgmma_wait<0>(s);
    }
    for (int64_t block = 0; block < blocks; ++block) {
      // Block + 2 loads into the stage block - 1 used (closing barrier below).
      if (block + 2 < blocks) load_kv(block + 2);
      cp_async_commit();
      cp_async_wait<1>();  // block + 1's K/V are in
      fence_proxy_async();
      __syncthreads();
      float s_next[NT][4];  // block + 1's scores, computed while this block's softmax runs
      if (block + 1 < blocks && block + 1 < group_blocks.first_skipped) {
        wgmma_fence(s_next, qf);
        issue_scores(s_next, block + 1);
        wgmma_commit();
      }
      uint32_t pf[KN][4];  // (16, N): this block's P as A fragments
      if (block < group_blocks.first_skipped) {
        softmax_and_issue_pv(s, pf, block);
        wgmma_commit();
      }
      wgmma_wait<0>(s_next, acc, pf);  // s_next and acc are complete, and the stages read
      __syncthreads();
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = s_next[n][e];
      }
    }
  }
  cp_async_wait<0>();

  T* out = static_cast<T*>(p.out) + head_offset(p.out_layout, bh, p.heads);
  store_output_rows<T>(out, acc, m, l, r0, bh, p, g, t);
}

constexpr const char* kWgmmaForwardWhat = "scaled_dot_product_attention forward (wgmma)";

template <typename T, int D, typename S>
void launch_wgmma_shape(const Params& p, int64_t heads, cuda::Stream stream) {
  launch(attention_tc_wgmma_forward_kernel<T, D, S>, heads * ceil_div(p.q_len, S::kRows), S::kThreads, S::kBytes,
         stream, p, kWgmmaForwardWhat);
}

}  // namespace

template <typename T, int D>
void launch_forward_wgmma(const Params& p, int64_t heads, int variant, cuda::Stream stream) {
  KILN_CHECK(!p.dropout && p.mask == nullptr, kWgmmaForwardWhat, ": no kernel for dropout or an additive mask");
  KILN_CHECK(wgmma_device(), kWgmmaForwardWhat, ": needs a GPU of compute capability 9.0 (H100, H200)");
  switch (variant) {
    case 0: return launch_wgmma_shape<T, D, WgmmaForwardShape<D, 2, 128>>(p, heads, stream);
    case 1: return launch_wgmma_shape<T, D, WgmmaForwardShape<D, 2, 64>>(p, heads, stream);
    case 2: return launch_wgmma_shape<T, D, WgmmaForwardShape<D, 1, 128>>(p, heads, stream);
    case 3: return launch_wgmma_shape<T, D, WgmmaForwardShape<D, 1, 64, D == 64 ? 4 : 1>>(p, heads, stream);
    case 4: return launch_wgmma_shape<T, D, WgmmaForwardShape<D, 2, 64, 1, true>>(p, heads, stream);
    case 5: return launch_forward_wgmma_pingpong<T, D>(p, heads, 2, stream);
    default: return launch_forward_wgmma_pingpong<T, D>(p, heads, 3, stream);
  }
}

template void launch_forward_wgmma<__half, 64>(const Params&, int64_t, int, cuda::Stream);
template void launch_forward_wgmma<__half, 128>(const Params&, int64_t, int, cuda::Stream);
template void launch_forward_wgmma<__nv_bfloat16, 64>(const Params&, int64_t, int, cuda::Stream);
template void launch_forward_wgmma<__nv_bfloat16, 128>(const Params&, int64_t, int, cuda::Stream);

}  // namespace kiln::kernels::attention_tc
