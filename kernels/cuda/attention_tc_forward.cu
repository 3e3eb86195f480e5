// attention_tc's forward kernel (the design is in attention_tc.cu): out and
// lse of 128 queries per CTA, 8 warps of 16 query rows each, K/V blocks of 64
// keys double-buffered with cp.async. Writes out (=) and lse (=) of every
// query row; reads nothing it writes.
#include <atomic>
#include <cstdlib>

#include "kernels/cuda/attention_tc_common.cuh"

namespace kiln::kernels::attention_tc {

namespace {

// ---------------------------------------------------------------- forward

// One CTA per (S::kRows queries, b * H + h); warp w owns G = S::kRowGroups
// groups of 16 rows, r0 = q0 + 16 G w .. + 16 G - 1. Every K and V fragment
// a warp loads serves its G groups (more independent work per warp, fewer
// shared-memory reads per product).
// kDropout = p.dropout, kMask = (p.mask != null): kernels of their own keep
// the Philox code and the mask loads out of the common kernel's registers.
template <typename T, int D, typename S, bool kDropout, bool kMask>
__global__ void __launch_bounds__(S::kThreads, kDropout || kMask ? 1 : S::kMinBlocks)
    attention_tc_forward_kernel(Params p) {
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KD = D / 16, KN = N / 16, LD = S::kLd;
  constexpr int G = S::kRowGroups;
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  T* smem = reinterpret_cast<T*>(attention_tc_smem);
  const QueryCta cta = query_cta<M, S::kWarpRows>(p);
  const int warp = cta.warp, lane = cta.lane, g = cta.g, t = cta.t;
  const int64_t bh = cta.bh, q0 = cta.q0, r0 = cta.r0, mask_base = cta.mask_base;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads);  // (Tq, D)
  const T* k = static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads);  // (Tk, D)
  const T* v = static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads);  // (Tk, D)
  // Causal: row i sees keys j <= i, so the CTA needs keys below q0 + M.
  const int64_t k_end = p.causal && q0 + M < p.kv_len ? q0 + M : p.kv_len;
  const int64_t blocks = ceil_div(k_end, N);
  const DropoutStream dropout = dropout_stream(p);

  auto load_kv = [&](int64_t block) { load_kv_block<S, D>(smem, k, v, block, p); };

  // Group 1: Q; group 2: K/V block 0 (empty when there are no keys).
  load_tile<M, D, S::kThreads>(smem + S::q, q, p.q_layout.row, q0, p.q_len, p.vector_loads);
  cp_async_commit();
  if (blocks > 0) load_kv(0);
  cp_async_commit();
  cp_async_wait<1>();  // Q is in
  __syncthreads();
  uint32_t qf[G][KD][4];  // (16, D) per group: the warp's rows of Q as A fragments, for the whole loop
#pragma unroll
  for (int r = 0; r < G; ++r) {
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) load_a(qf[r][kk], smem + S::q + (warp * G + r) * 16 * LD, LD, 16 * kk, lane);
  }

  // Per warp: blocks are skipped only when above all its rows, and masked
  // when any of its rows needs it (a group's fully masked block gives p = 0).
  const QueryRowBlocks schedule = query_row_blocks<N, kMask, S::kWarpRows>(p, r0);
  // Per group: the running max of rows g, g + 8 (log2 units), and this
  // lane's part of the running sum of exp2(x - m).
  float m[G][2], l[G][2];
#pragma unroll
  for (int r = 0; r < G; ++r) {
    m[r][0] = m[r][1] = kNegInf;
    l[r][0] = l[r][1] = 0.0f;
  }
  float acc[G][DT][4] = {};  // (16, D) per group: unnormalized output
  for (int64_t block = 0; block < blocks; ++block) {
    // Block + 1 loads while this one is computed. The stage it overwrites was
    // last read in block - 1, before that iteration's closing __syncthreads().
    if (block + 1 < blocks) load_kv(block + 1);
    cp_async_commit();   // possibly empty: one group per iteration keeps the count below right
    cp_async_wait<1>();  // all but the newest group: this block's K/V are in (this thread's copies)
    __syncthreads();     // ... and every thread's

    // Warp-uniform: the warp's rows against keys k0..k0+N-1.
    if (block < schedule.first_skipped) {
      const int64_t k0 = block * N;
      const T* k_tile = smem + S::kv + (block % 2) * S::kStage;  // (N, D)
      const T* v_tile = k_tile + N * LD;                         // (N, D)
      uint32_t kept[G] = {};  // bit 4 n + e: keep of s[r][n][e]; first, before s holds registers
      if constexpr (kDropout) {
#pragma unroll
        for (int r = 0; r < G; ++r) {
          const int64_t row = r0 + 16 * r + g;
          const uint64_t row_index[2] = {dropout_index(p, bh, row, k0 + 2 * t),
                                         dropout_index(p, bh, row + 8, k0 + 2 * t)};
          kept[r] = keep_bits_query_rows<NT>(dropout, row_index);
        }
      }
      float s[G][NT][4] = {};  // (16, N) per group: scores, then probabilities
      mma_regs_nt<T, G, NT, KD>(s, qf, k_tile, LD, lane);
      // Without an additive mask the scores stay raw dot products (masked
      // ones -inf): their max times scale log2(e) is the max in log2 units
      // (the host sends only positive scales here), and one FFMA per score
      // then scales and subtracts it. With one, every block is masked and
      // goes to log2 units first, the mask added in those units.
      const bool masked = kMask || schedule.all_masked || block >= schedule.first_masked;
      if (masked) {
#pragma unroll
        for (int r = 0; r < G; ++r) {
          mask_scores<kMask, true>(s[r], kMask ? p.scale_log2 : 1.0f, p, mask_base, r0 + 16 * r, k0, lane);
        }
      }
      const float to_log2 = kMask ? 1.0f : p.scale_log2;  // s * to_log2 is in log2 units

      float alpha[G][2];    // the rescaling of acc for each row
      bool rescale = false;  // some alpha of this lane is not 1
#pragma unroll
      for (int r = 0; r < G; ++r) {
        const bool group_rescale = online_softmax<kDropout>(s[r], m[r], l[r], alpha[r], to_log2, kept[r]);
        rescale = rescale || group_rescale;
      }

      // Once a row's max has settled, most blocks leave it: skip the (16, D)
      // rescaling when no lane of the warp has an alpha other than 1 (a
      // multiplication by 1 changes no bit).
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int r = 0; r < G; ++r) {
#pragma unroll
          for (int n = 0; n < DT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][n][e] *= alpha[r][e / 2];
          }
        }
      }

      uint32_t pf[G][KN][4];  // (16, N) per group: P as A fragments (pack_a)
#pragma unroll
      for (int r = 0; r < G; ++r) {
#pragma unroll
        for (int kk = 0; kk < KN; ++kk) pack_a<T>(pf[r][kk], s[r], kk);
      }
      mma_regs_nn<T, G, DT, KN>(acc, pf, v_tile, LD, lane);
    }
    __syncthreads();  // every warp is done with this stage before block + 2 loads into it
  }
  cp_async_wait<0>();  // no copy may be in flight when the CTA exits (the last group is empty unless blocks = 0)

  T* out = static_cast<T*>(p.out) + head_offset(p.out_layout, bh, p.heads);  // (Tq, D)
#pragma unroll
  for (int r = 0; r < G; ++r) store_output_rows<T>(out, acc[r], m[r], l[r], r0 + 16 * r, bh, p, g, t);
}

constexpr const char* kForwardWhat = "scaled_dot_product_attention forward (tensor cores)";

// ---------------------------------------------------------------- tuning candidates

// The forward's CTA shapes that bench_attention times for head dim 64 without
// dropout or a mask (GPT-2's attention), index 0 the default. What each
// trades, per CTA: more warps share one K/V tile (less L2 traffic) but wait
// at the same barriers; 128-key blocks halve the barriers and the online
// softmax's rescaling per key but double the score registers (so fewer CTAs
// fit). Until a GPU has timed them, 0 is used unless set_attention_forward_shape
// (or KILN_ATTENTION_FORWARD_SHAPE, read at start-up: the CPU emulator's way
// in) picks another. Once timed, the winner becomes ForwardShape's default
// and the others go.
// Shapes 5 and 6 give each warp two 16-row groups (FlashAttention-2's
// 32 rows per warp): each K and V fragment serves both, so per 64 products
// the loop issues half the ldmatrix and, for shape 6, 340 instructions (308
// when the warp skips the rescaling) against the default's 427 (395): SASS
// of the aligned, unmasked path; 565 before exp2_approx and the FFMA.
// ptxas (CUDA 13.0, sm_90), none spills: the default D = 64 kernel uses all
// 128 registers its 2 CTAs per SM allow; shape 4, the same kernel at one CTA
// per SM, 160; shapes 5 and 6, 245 and 241.
using ForwardShape64Warps8Keys128 = ForwardShape<64, 8, 128, 1>;
using ForwardShape64Warps4Keys128 = ForwardShape<64, 4, 128, 2>;
using ForwardShape64Warps4Keys64 = ForwardShape<64, 4, 64, 3>;
using ForwardShape64Warps8Keys64OneCta = ForwardShape<64, 8, 64, 1>;
using ForwardShape64Warps4Rows32 = ForwardShape<64, 4, 64, 2, 2>;
using ForwardShape64Warps8Rows32 = ForwardShape<64, 8, 64, 1, 2>;
// Shapes 7 to 11 run attention_tc_wgmma.cu's kernel (Hopper's wgmma, sm_90a),
// shapes 12 and 13 attention_tc_wgmma_pingpong.cu's (FlashAttention-3's
// schedule; 13, with three consumer warpgroups, for D = 64 only),
// for head dims 64 and 128: W warpgroups of 64 rows, K and V read by the
// tensor cores from swizzled shared tiles. One warpgroup per CTA leaves
// several independent CTAs per SM, whose softmaxes and products interleave.
constexpr int kFirstWgmmaShape = 7, kThreeConsumerShape = 13;

// Whether candidate shape `shape` has a kernel for head dim D.
bool shape_applies(int shape, int64_t D) {
  if (shape == kThreeConsumerShape) return D == 64;
  if (shape >= kFirstWgmmaShape) return D == 64 || D == 128;
  return shape == 0 || D == 64;
}
constexpr const char* kForwardShapeNames[] = {
    "8 warps, 64-key blocks, 2 CTAs/SM (default)", "8 warps, 128-key blocks, 1 CTA/SM",
    "4 warps, 128-key blocks, 2 CTAs/SM", "4 warps, 64-key blocks, 3 CTAs/SM",
    "8 warps, 64-key blocks, 1 CTA/SM", "4 warps of 32 rows, 64-key blocks, 2 CTAs/SM",
    "8 warps of 32 rows, 64-key blocks, 1 CTA/SM", "wgmma: 2 warpgroups, 128-key blocks (sm_90a)",
    "wgmma: 2 warpgroups, 64-key blocks (sm_90a)", "wgmma: 1 warpgroup, 128-key blocks (sm_90a)",
    "wgmma: 1 warpgroup, 64-key blocks (sm_90a)",
    "wgmma: 2 warpgroups, 64-key blocks, the next block's scores during the softmax (sm_90a)",
    "wgmma: a producer and 2 consumer warpgroups taking turns, 128/64-key blocks at D 64/128 (sm_90a)",
    "wgmma: a producer and 3 consumer warpgroups taking turns, 64-key blocks, D 64 only (sm_90a)"};
constexpr int kForwardShapes = sizeof(kForwardShapeNames) / sizeof(kForwardShapeNames[0]);

int forward_shape_from_environment() {
  const char* value = std::getenv("KILN_ATTENTION_FORWARD_SHAPE");
  const int index = value != nullptr ? std::atoi(value) : 0;
  return index >= 0 && index < kForwardShapes ? index : 0;
}
std::atomic<int> forward_shape{forward_shape_from_environment()};

// `kernel` (an instantiation for shape S) over every query block of every head.
template <typename S, typename Kernel>
void launch_shape(Kernel kernel, const Params& p, int64_t heads, cuda::Stream stream) {
  launch(kernel, heads * ceil_div(p.q_len, S::kRows), S::kThreads, S::kBytes, stream, p, kForwardWhat);
}

// A candidate shape: only its plain kernel (no dropout, no mask) is instantiated.
template <typename T, int D, typename S>
void launch_forward_candidate(const Params& p, int64_t heads, cuda::Stream stream) {
  launch_shape<S>(attention_tc_forward_kernel<T, D, S, false, false>, p, heads, stream);
}

}  // namespace

template <typename T, int D>
void launch_forward(const Params& p, int64_t heads, cuda::Stream stream) {
  const int shape = forward_shape.load(std::memory_order_relaxed);
  if constexpr (D == 64 || D == 128) {
    if (shape >= kFirstWgmmaShape && shape_applies(shape, D) && !p.dropout && p.mask == nullptr) {
      return launch_forward_wgmma<T, D>(p, heads, shape - kFirstWgmmaShape, stream);
    }
  }
  if constexpr (D == 64) {
    if (!p.dropout && p.mask == nullptr) {
      switch (shape) {
        case 1: return launch_forward_candidate<T, D, ForwardShape64Warps8Keys128>(p, heads, stream);
        case 2: return launch_forward_candidate<T, D, ForwardShape64Warps4Keys128>(p, heads, stream);
        case 3: return launch_forward_candidate<T, D, ForwardShape64Warps4Keys64>(p, heads, stream);
        case 4: return launch_forward_candidate<T, D, ForwardShape64Warps8Keys64OneCta>(p, heads, stream);
        case 5: return launch_forward_candidate<T, D, ForwardShape64Warps4Rows32>(p, heads, stream);
        case 6: return launch_forward_candidate<T, D, ForwardShape64Warps8Rows32>(p, heads, stream);
        default: break;
      }
    }
  }
  using S = ForwardShape<D>;
  const auto kernels = []<bool kDropout, bool kMask>(std::bool_constant<kDropout>, std::bool_constant<kMask>) {
    return attention_tc_forward_kernel<T, D, S, kDropout, kMask>;
  };
  launch_shape<S>(pick(p, kernels), p, heads, stream);
}

KILN_ATTENTION_TC_INSTANTIATE(launch_forward)

}  // namespace kiln::kernels::attention_tc

namespace kiln::kernels {

void set_attention_forward_shape(int index) {
  KILN_CHECK(index >= 0 && index < attention_tc::kForwardShapes, "set_attention_forward_shape: ", index,
             " is not a shape index (0 to ", attention_tc::kForwardShapes - 1, ")");
  attention_tc::forward_shape.store(index, std::memory_order_relaxed);
}
int attention_forward_shape() { return attention_tc::forward_shape.load(std::memory_order_relaxed); }
int attention_forward_shape_count() { return attention_tc::kForwardShapes; }
bool attention_forward_shape_applies(int index, int64_t head_dim) {
  return index >= 0 && index < attention_tc::kForwardShapes && attention_tc::shape_applies(index, head_dim);
}
const char* attention_forward_shape_name(int index) {
  return index >= 0 && index < attention_tc::kForwardShapes ? attention_tc::kForwardShapeNames[index] : "";
}

}  // namespace kiln::kernels
