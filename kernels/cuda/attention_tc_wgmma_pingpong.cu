// attention_tc's forward on wgmma (sm_90a; this file alone is compiled for
// that target, see kernels/CMakeLists.txt) with FlashAttention-3's whole
// schedule: forward CTA shapes 12 (head dims 64 and 128) and 13 (64), without
// dropout or an additive mask; same rounding points and outputs as
// attention_tc_wgmma.cu.
//  - Warp specialization: a producer warpgroup (the last 128 threads) only
//    loads K/V blocks into a ring of kStages swizzled stages; G consumer
//    warpgroups (64 queries each; G = 2 in shape 12, 3 in shape 13) only compute. They meet at
//    mbarriers, not at CTA barriers: full[s] (stage s holds its next block)
//    and empty[s] (every consumer is done with it). The producer gives up
//    registers (setmaxnreg) so that the consumers can hold more.
//  - Pingpong: the consumers take turns at the tensor cores (a named barrier
//    each): one issues its products while the others run their softmax, so
//    the softmaxes, which leave the tensor cores idle in shapes 7-11, are
//    hidden behind the other warpgroup's products.
//  - Within a consumer, one "burst" per turn: block i's S = Q K^T and block
//    i - 1's O += P V, issued together; the softmax of block i then runs
//    while block i - 1's P V is still on the tensor cores (FlashAttention-3's
//    intra-warpgroup overlap), and P's fragments stay untouched until it ends.
// A stage is released two bursts after its S (its V's product ends then),
// so the producer, loading kStages - 2 blocks ahead of the consumers, needs
// 5 stages to keep two blocks in flight; it signals block b full once its own
// copies of b are waited for (cp.async wait, proxy fence, mbarrier arrive),
// one block behind its issue, as the other wgmma kernels do at their barrier.
// The turns keep the consumers within one turn of each other, far less than
// kStages, so each phase of an empty barrier counts every consumer's release
// of one block.
// Not yet run on a GPU. Emulated (KILN_ATTENTION_FORWARD_SHAPE=12
// scripts/cuda_emu/run.sh 64 and 128, and 13 at 64, also with the producer's
// copies landing late, EMU_COPY_DELAY_US=20000 EMU_COPY_DELAY_FROM=256 or 384):
// 0 failures; caught (shape 12)
// there: the producer signalling a block before its copies land, no wait for
// block i's S before its softmax, a consumer waiting for the wrong phase
// (deadlock), a stage released before its P V ended, acc rescaled while a
// P V still adds into it, no wait for a free stage (deadlock). ptxas (CUDA
// 13.0), no spills, each turn's products back to back with one wait: shape
// 12 168 registers at launch, the consumers 232 and the producer 40 after
// setmaxnreg; shape 13 128, then 160 and 32.
#include <cuda_runtime_api.h>

#include "kernels/cuda/attention_tc_wgmma_common.cuh"

namespace kiln::kernels::attention_tc {

namespace {

// G consumer warpgroups of 64 queries each and key blocks of kKeys keys:
// shape 12, 2 consumers and 128 (D 64) or 64 (D 128) keys, so that a stage
// (K and V) is 32 KiB either way; shape 13 (D 64 only), 3 consumers and 64
// keys (128 made ptxas spill and serialize the products at 160 registers).
// Shared memory (from a 1024-byte-aligned base): Q
// (rows padded as the mma.sync kernel's, read by ldmatrix), the kStages K/V
// stages, then the mbarriers. The registers each warpgroup keeps after
// setmaxnreg: 128 (G + 1) threads launch with R = 65536 / (128 (G + 1))
// registers each (in steps of 8), and G kConsumerRegisters +
// kProducerRegisters must not exceed (G + 1) R: 2 x 232 + 40 = 3 x 168 and
// 3 x 160 + 32 = 4 x 128. That ptxas gave exactly R is checked by the
// launcher (require_kernel_registers) and by CTest's wgmma_ptxas.
template <int D, int G, int kKeys, int kConsumerRegs, int kProducerRegs>
struct PingpongShape {
  static_assert(D == 64 || D == 128, "wgmma products of N = D: 64 or 128");
  static constexpr int kGroups = G;
  static constexpr int kConsumers = 128 * G, kProducers = 128, kThreads = kConsumers + kProducers;
  static constexpr int kRows = 64 * G;
  static constexpr int kCols = kKeys;
  static constexpr int kStages = 5;
  static constexpr int kLd = D + kPad;
  static constexpr int kTileBytes = kCols * D * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kKv = (kRows * kLd * 2 + 1023) / 1024 * 1024;
  static constexpr int kBarriers = kKv + kStages * kStageBytes;  // full[kStages], then empty[kStages]
  static constexpr size_t kBytes = size_t{kBarriers} + 2 * kStages * sizeof(uint64_t) + 1024;
  static constexpr int kProducerRegisters = kProducerRegs, kConsumerRegisters = kConsumerRegs;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(G * kConsumerRegisters + kProducerRegisters <= (G + 1) * kLaunchRegisters, "setmaxnreg's pool");
};
template <int D>
using TwoConsumerShape = PingpongShape<D, 2, D == 64 ? 128 : 64, 232, 40>;
using ThreeConsumerShape = PingpongShape<64, 3, 64, 160, 32>;
static_assert(TwoConsumerShape<64>::kBytes <= kMaxSmem && TwoConsumerShape<128>::kBytes <= kMaxSmem &&
              ThreeConsumerShape::kBytes <= kMaxSmem);

// Key block `block` of K and V into a stage (K at `to`, V tile_bytes after
// it) by the producer's kProducers threads, in swizzled_offset's layout with
// load_swizzled_tile's contract (cp.async when p.vector_loads, rows past
// kv_len zeroed). Thread t copies 16-byte chunk t % kChunks of rows t /
// kChunks + j kRowStep: a multiple of 8 apart, so its chunks share one
// swizzle and its addresses advance by constants (load_swizzled_tile's
// general map made the producer spill at its 56 registers).
template <int N, int D, int kProducers, typename T>
__device__ __forceinline__ void produce_kv_block(unsigned char* to, int tile_bytes, const T* k, const T* v,
                                                 int64_t block, const Params& p, int thread) {
  constexpr int kChunks = D / 8, kRowStep = kProducers / kChunks;
  static_assert(kProducers % kChunks == 0 && kRowStep % 8 == 0 && N % kRowStep == 0, "one swizzle per thread");
  const int chunk = thread % kChunks, row = thread / kChunks;
  const int64_t row0 = block * N;
  const int rows_left = p.kv_len - row0 >= N ? N : static_cast<int>(p.kv_len - row0);
  const int offset = swizzled_offset<N>(row, chunk);
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) {
    const int64_t ld = tile == 0 ? p.k_layout.row : p.v_layout.row;
    const T* from = (tile == 0 ? k : v) + (row0 + row) * ld + chunk * 8;
    unsigned char* dst = to + tile * tile_bytes + offset;
#pragma unroll
    for (int j = 0; j < N / kRowStep; ++j) {
      T* chunk_to = reinterpret_cast<T*>(dst + j * kRowStep * 128);
      const T* chunk_from = from + j * kRowStep * ld;
      if (row + j * kRowStep >= rows_left) {
        *reinterpret_cast<uint4*>(chunk_to) = make_uint4(0, 0, 0, 0);
      } else if (p.vector_loads) {
        cp_async_16(chunk_to, chunk_from);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) chunk_to[e] = chunk_from[e];
      }
    }
  }
}

// Named barriers (0 is __syncthreads): the consumers' Q tile, and each consumer's turn
// (consumer w's turn follows consumer w - 1's, consumer 0's consumer G - 1's).
constexpr int kQueryTileBarrier = 1, kFirstTurnBarrier = 2;

template <typename T, int D, typename S>
__global__ void __launch_bounds__(S::kThreads, 1) attention_tc_wgmma_pingpong_kernel(Params p) {
  constexpr int M = S::kRows, N = S::kCols, NT = N / 8, DT = D / 8, KD = D / 16, KN = N / 16, LD = S::kLd;
  constexpr int kStages = S::kStages;
  extern __shared__ __align__(16) unsigned char attention_tc_smem[];
  unsigned char* base = aligned_smem_base(attention_tc_smem);
  T* q_tile = reinterpret_cast<T*>(base);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + S::kBarriers);
  uint64_t* empty = full + kStages;
  const QueryCta cta = query_cta<M>(p);
  const int warp = cta.warp, lane = cta.lane, g = cta.g, t = cta.t;
  const int64_t bh = cta.bh, q0 = cta.q0, r0 = cta.r0, mask_base = cta.mask_base;
  const T* k = static_cast<const T*>(p.k) + head_offset(p.k_layout, bh, p.heads);
  const T* v = static_cast<const T*>(p.v) + head_offset(p.v_layout, bh, p.heads);
  const int64_t k_end = p.causal && q0 + M < p.kv_len ? q0 + M : p.kv_len;
  const int64_t blocks = ceil_div(k_end, N);
  const auto stage = [&](int64_t block) { return base + S::kKv + (block % kStages) * S::kStageBytes; };
  // Completion j of a stage's barrier is its block s + j kStages: waited for by that completion's parity.
  const auto parity = [](int64_t use) { return static_cast<uint32_t>(use & 1); };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], S::kProducers);
      mbarrier_init(&empty[s], S::kConsumers);
    }
  }
  __syncthreads();

  if (threadIdx.x >= S::kConsumers) {  // the producer
    warpgroup_registers_decrease<S::kProducerRegisters>();
    for (int64_t block = 0; block <= blocks; ++block) {
      if (block < blocks) {
        if (block >= kStages) mbarrier_wait(&empty[block % kStages], parity(block / kStages - 1));
        produce_kv_block<N, D, S::kProducers>(stage(block), S::kTileBytes, k, v, block, p,
                                              static_cast<int>(threadIdx.x) - S::kConsumers);
      }
      cp_async_commit();
      if (block > 0) {
        cp_async_wait<1>();   // block - 1's copies (this thread's) are in ...
        fence_proxy_async();  // ... and ordered before the tensor cores' reads
        mbarrier_arrive(&full[(block - 1) % kStages]);
      }
    }
    cp_async_wait<0>();
    return;
  }

  // A consumer: warpgroup w = warp / 4 owns queries q0 + 64 w ..; warp w of it 16 of them, as in shapes 7-11.
  constexpr int G = S::kGroups;
  warpgroup_registers_increase<S::kConsumerRegisters>();
  const int group = warp / 4;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.q_layout, bh, p.heads);
  load_tile<M, D, S::kConsumers>(q_tile, q, p.q_layout.row, q0, p.q_len, p.vector_loads);
  cp_async_commit();
  cp_async_wait<0>();
  named_barrier_sync(kQueryTileBarrier, S::kConsumers);
  uint32_t qf[KD][4];  // the warp's 16 rows of Q as A fragments, for the whole loop
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) load_a(qf[kk], q_tile + warp * 16 * LD, LD, 16 * kk, lane);

  const QueryRowBlocks warp_blocks = query_row_blocks<N, false>(p, r0);
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  float acc[DT][4] = {};  // (16, D): the warp's unnormalized output
  float s[NT][4];         // (16, N): block i's scores after turn i, then its probabilities
  uint32_t pf[KN][4];     // (16, N): block i - 1's P as A fragments, read by the tensor cores during turn i
  const int my_turn = kFirstTurnBarrier + group, next_turn = kFirstTurnBarrier + (group + 1) % G;

  // Turn i (0 .. blocks) issues block i's S (i < blocks) and block i - 1's P V (i > 0); the first and
  // the last turn are peeled, so that no product is issued under a condition (ptxas serializes wgmma
  // issued on paths it cannot prove warp-uniform). Every consumer computes every block of the CTA:
  // under causal masking the last blocks may lie above a consumer's rows (all masked, they add
  // p = 0; about 3% more products for shape 12 at D 128, and up to about 10% for shape 13).
  const auto take_turn = [&] {
    named_barrier_sync(my_turn, 256);  // this warpgroup's 128 threads and the previous one's
    wgmma_fence(s, acc, pf, qf);  // s, acc and pf were last written by ordinary instructions
  };
  const auto end_turn = [&](int64_t i) {  // the last consumer's last turn has no next
    if (group < G - 1 || i < blocks) named_barrier_arrive(next_turn, 256);
  };
  const auto wait_full = [&](int64_t block) { mbarrier_wait(&full[block % kStages], parity(block / kStages)); };
  const auto issue_scores = [&](int64_t block) {
    issue_product_nt_rs<T, N>(s, qf, stage(block));
    wgmma_commit();
  };
  // Before turn i > 0: block i - 1's scores (complete since turn i - 1) through the online softmax
  // into pf, once block i - 2's P V (issued at turn i - 1) has ended; its stage is then released.
  const auto softmax_into_pf = [&](int64_t i) {
    const int64_t block = i - 1;
    if (warp_blocks.all_masked || block >= warp_blocks.first_masked) {
      mask_scores<false, true>(s, 1.0f, p, mask_base, r0, block * N, lane);
    }
    float alpha[2];
    const bool rescale = online_softmax<false>(s, m, l, alpha, p.scale_log2, 0u);
    wgmma_wait<0>(acc, pf);  // block i - 2's P V
    if (i >= 2) mbarrier_arrive(&empty[(i - 2) % kStages]);
    rescale_output_and_pack_p<T>(acc, alpha, rescale, s, pf);
  };
  const auto issue_pv = [&](int64_t block) {
    issue_product_nn<T, N>(acc, pf, stage(block) + S::kTileBytes);
    wgmma_commit();
  };

  if (blocks > 0) {
    if (group == G - 1) named_barrier_arrive(kFirstTurnBarrier, 256);  // warpgroup 0 goes first
    wait_full(0);
    take_turn();
    issue_scores(0);
    end_turn(0);
    wgmma_wait<0>(s);
    for (int64_t i = 1; i < blocks; ++i) {
      softmax_into_pf(i);
      wait_full(i);
      take_turn();
      issue_scores(i);
      issue_pv(i - 1);
      end_turn(i);
      wgmma_wait<1>(s);  // block i's S is complete (block i - 1's P V may still run)
    }
    softmax_into_pf(blocks);
    take_turn();
    issue_pv(blocks - 1);
    end_turn(blocks);
  }
  wgmma_wait<0>(acc);

  T* out = static_cast<T*>(p.out) + head_offset(p.out_layout, bh, p.heads);
  store_output_rows<T>(out, acc, m, l, r0, bh, p, g, t);
}

}  // namespace

template <typename T, int D>
void launch_forward_wgmma_pingpong(const Params& p, int64_t heads, int consumers, cuda::Stream stream) {
  const auto run = [&]<typename S>(S) {
    constexpr const char* kWhat = "scaled_dot_product_attention forward (wgmma, warp-specialized)";
    static const bool registers_checked =
        (require_kernel_registers(attention_tc_wgmma_pingpong_kernel<T, D, S>, S::kLaunchRegisters, kWhat), true);
    (void)registers_checked;
    launch(attention_tc_wgmma_pingpong_kernel<T, D, S>, heads * ceil_div(p.q_len, S::kRows), S::kThreads, S::kBytes,
           stream, p, kWhat);
  };
  if constexpr (D == 64) {
    if (consumers == 3) return run(ThreeConsumerShape{});
  }
  KILN_CHECK(consumers == 2, "scaled_dot_product_attention forward (wgmma, warp-specialized): no kernel of ",
             consumers, " consumer warpgroups for head dim ", D);
  run(TwoConsumerShape<D>{});
}

template void launch_forward_wgmma_pingpong<__half, 64>(const Params&, int64_t, int, cuda::Stream);
template void launch_forward_wgmma_pingpong<__half, 128>(const Params&, int64_t, int, cuda::Stream);
template void launch_forward_wgmma_pingpong<__nv_bfloat16, 64>(const Params&, int64_t, int, cuda::Stream);
template void launch_forward_wgmma_pingpong<__nv_bfloat16, 128>(const Params&, int64_t, int, cuda::Stream);

}  // namespace kiln::kernels::attention_tc
