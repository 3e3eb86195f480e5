// attention_tc's backward kernels (the design is in attention_tc.cu), given
// the forward's lse and delta = dout . out per query row: dK/dV of 64 keys
// per CTA (Q, dO, lse and delta double-buffered), and dQ of 64 queries per CTA
// (K/V double-buffered). Each writes (=) only the gradient rows it owns, so
// there are no atomics and results are deterministic.
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/attention_tc_common.cuh"

namespace kiln::kernels::attention_tc {

namespace {

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
  // Written out rather than folded into a helper like query_cta: that helper,
  // generalized to key rows, changed the SASS of this kernel's dropout variants.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  const int64_t k_blocks = ceil_div(p.kv_len, M);
  const int64_t bh = blockIdx.x / k_blocks;
  const int64_t k0 = blockIdx.x % k_blocks * M;
  const int64_t j0 = k0 + warp * 16;  // the warp's first key; the lane's are j0 + g and j0 + g + 8
  const int64_t mask_base = bh / p.heads * p.mask_stride_b + bh % p.heads * p.mask_stride_h;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads);           // (Tq, D)
  const T* dout = static_cast<const T*>(p.dout) + head_offset(p.dout_layout, bh, p.heads);  // (Tq, D)
  const float* lse = p.lse + bh * p.q_len;                           // (Tq)
  const float* delta = p.delta + bh * p.q_len;                       // (Tq)
  // Causal: queries i < k0 see none of these keys.
  const int64_t i_begin = p.causal ? k0 : 0;
  const int64_t steps = i_begin < p.q_len ? ceil_div(p.q_len - i_begin, N) : 0;
  const DropoutStream dropout = dropout_stream(p);

  auto load_step = [&](int64_t step) {
    const int64_t i0 = i_begin + step * N;
    T* stage = smem + S::qdo + (step % 2) * S::kStage;
    load_tile<N, D, S::kThreads>(stage, q, p.q_layout.row, i0, p.q_len, p.vector_loads);
    load_tile<N, D, S::kThreads>(stage + N * LD, dout, p.dout_layout.row, i0, p.q_len, p.vector_loads);
    float* stage_floats = floats + (step % 2) * 2 * N;
    load_floats<N, S::kThreads>(stage_floats, lse, i0, p.q_len);
    load_floats<N, S::kThreads>(stage_floats + N, delta, i0, p.q_len);
  };

  // Group 1: this CTA's K and V with query step 0 (nothing when no query sees these keys: dK = dV = 0).
  if (steps > 0) {
    load_tile<M, D, S::kThreads>(smem + S::k, static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads),
                                 p.k_layout.row, k0, p.kv_len, p.vector_loads);
    load_tile<M, D, S::kThreads>(smem + S::v, static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads),
                                 p.v_layout.row, k0, p.kv_len, p.vector_loads);
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
        for (int e = 0; e < 4; ++e) pt[n][e] = exp2_approx(pt[n][e] - lse2[e % 2]);
      }

      // dV += P_dropped^T dO.
      {
        float pd[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) pd[n][e] = through_dropout<kDropout>(pt[n][e], kept, 4 * n + e, p.dropout_scale);
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
          const float dp = through_dropout<kDropout>(ds[n][e], kept, 4 * n + e, p.dropout_scale);
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

  store_dkdv<T, D>(p, dk, dv, bh, j0 + g, t);
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
  const QueryCta cta = query_cta<M>(p);
  const int warp = cta.warp, lane = cta.lane, g = cta.g, t = cta.t;
  const int64_t bh = cta.bh, q0 = cta.q0, r0 = cta.r0, mask_base = cta.mask_base;
  const T* k = static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads);  // (Tk, D)
  const T* v = static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads);  // (Tk, D)
  float lse2[2], delta[2];
  query_rows_lse2_delta(p, bh, r0 + g, lse2, delta);
  const int64_t k_end = p.causal && q0 + M < p.kv_len ? q0 + M : p.kv_len;
  const int64_t blocks = ceil_div(k_end, N);
  const DropoutStream dropout = dropout_stream(p);

  auto load_kv = [&](int64_t block) { load_kv_block<S, D>(smem, k, v, block, p); };

  // Group 1: this CTA's Q and dO with K/V block 0.
  load_tile<M, D, S::kThreads>(smem + S::q, static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads),
                               p.q_layout.row, q0, p.q_len, p.vector_loads);
  load_tile<M, D, S::kThreads>(smem + S::dout, static_cast<const T*>(p.dout) + head_offset(p.dout_layout, bh, p.heads),
                               p.dout_layout.row, q0, p.q_len, p.vector_loads);
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
          const float p0 = exp2_approx(s[n][2 * h] - lse2[h]), p1 = exp2_approx(s[n][2 * h + 1] - lse2[h]);
          const float dp0 = through_dropout<kDropout>(ds[n][2 * h], kept, 4 * n + 2 * h, p.dropout_scale);
          const float dp1 = through_dropout<kDropout>(ds[n][2 * h + 1], kept, 4 * n + 2 * h + 1, p.dropout_scale);
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

  store_dq<T, D>(p, dq, bh, r0 + g, t);
}

bool wgmma_backward_from_environment() {
  const char* value = std::getenv("KILN_ATTENTION_WGMMA_BACKWARD");
  return value != nullptr && std::string_view(value) == "1";
}
std::atomic<bool> wgmma_backward{wgmma_backward_from_environment()};

// Whether a problem of head dim 64 or 128 goes to attention_tc_wgmma_backward.cu's kernels.
bool use_wgmma_backward(const Params& p) {
  return !p.dropout && p.mask == nullptr && wgmma_backward.load(std::memory_order_relaxed);
}

}  // namespace

template <typename T, int D>
void launch_dkdv(const Params& p, int64_t heads, cuda::Stream stream) {
  if constexpr (D == 64 || D == 128) {
    if (use_wgmma_backward(p)) return launch_dkdv_wgmma<T, D>(p, heads, stream);
  }
  using S = DkdvShape<D>;
  const auto kernels = []<bool kDropout, bool kMask>(std::bool_constant<kDropout>, std::bool_constant<kMask>) {
    return attention_tc_dkdv_kernel<T, D, kDropout, kMask>;
  };
  launch(pick(p, kernels), heads * ceil_div(p.kv_len, S::kRows), S::kThreads, S::kBytes, stream, p,
         "scaled_dot_product_attention backward (dk, dv; tensor cores)");
}

template <typename T, int D>
void launch_dq(const Params& p, int64_t heads, cuda::Stream stream) {
  if constexpr (D == 64 || D == 128) {
    if (use_wgmma_backward(p)) return launch_dq_wgmma<T, D>(p, heads, stream);
  }
  using S = DqShape<D>;
  const auto kernels = []<bool kDropout, bool kMask>(std::bool_constant<kDropout>, std::bool_constant<kMask>) {
    return attention_tc_dq_kernel<T, D, kDropout, kMask>;
  };
  launch(pick(p, kernels), heads * ceil_div(p.q_len, S::kRows), S::kThreads, S::kBytes, stream, p,
         "scaled_dot_product_attention backward (dq; tensor cores)");
}

KILN_ATTENTION_TC_INSTANTIATE(launch_dkdv)
KILN_ATTENTION_TC_INSTANTIATE(launch_dq)

}  // namespace kiln::kernels::attention_tc

namespace kiln::kernels {

void set_attention_wgmma_backward(bool on) { attention_tc::wgmma_backward.store(on, std::memory_order_relaxed); }
bool attention_wgmma_backward() { return attention_tc::wgmma_backward.load(std::memory_order_relaxed); }

}  // namespace kiln::kernels
