// CUDA fused attention for float16 and bfloat16 on tensor cores, with
// FlashAttention-2's register-resident schedule (Dao, 2023), written for kiln
// from the paper's description. The contract is kernels/attention.h's; the
// kernels of attention.cu stay as the reference (set_attention_cuda_kernels)
// and take every other problem (float32).
//
// STATUS: run on an H200 (sessions 10 and 19: parity in every dtype and head
// dim; 189-202 TFLOP/s forward in bf16). The [gpu] case "attention: the
// tensor-core kernels match the reference kernels and the CPU ..." of
// tests/test_attention.cpp is the check; bench_attention times both sets of
// kernels and the forward's candidate CTA shapes. ptxas (CUDA 13.0, sm_90,
// session 22): forward 128 registers where D <= 64 without mask or dropout
// (two 256-thread CTAs per SM), no spill (the D = 64 kernel, GPT-2's,
// spilled 8 bytes until its masked blocks kept raw scores too); 160-245
// otherwise (one CTA, or the two-row-group candidates), no spills. dK/dV
// and dQ 176-255, no spills except dK/dV at D = 128 with dropout (8 bytes;
// 28 with a mask as well).
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
//  - exp2 on the SFU without exp2f's subnormal guard (exp2_approx), of
//    scale * log2(e) * score - max in one FFMA: the forward takes a row's
//    max over the raw scores (so only positive scales come here); lse stays
//    in natural-log units.
//  - The forward rescales its output accumulators only in blocks where some
//    row of the warp has a new max (exact: the skipped factors are 1).
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
//    128 rows halve the L2 traffic of K and V against 64-row CTAs. Its
//    tuning candidates (attention_tc_forward.cu) include 32 rows per warp.
//  - dK/dV: 4 warps, 64 keys per CTA, query steps of 64 (32 for D >= 96: dK
//    and dV take D / 2 float registers each per thread).
//  - dQ: 4 warps, 64 queries per CTA, 64-key steps.
//  Rows are padded by 16 bytes: each ldmatrix phase (8 rows of 16 bytes)
//  then touches all 32 banks once, for D = 32, 64, 96 and 128.
//
// Files: attention_tc_ptx.cuh (the inline PTX and fragment helpers),
// attention_tc_common.cuh (shapes, Params, tile loads, masking, dropout, the
// block schedule), attention_common.cuh (what attention.cu uses too: the
// tensors that open Params, the dropout word, the gradient stores, Params from
// the arguments, dispatch by head dim, launch), attention_tc_forward.cu and
// attention_tc_backward.cu (the kernels and their launchers),
// attention_tc_wgmma.cu, attention_tc_wgmma_pingpong.cu and
// attention_tc_wgmma_backward.cu with attention_tc_wgmma_common.cuh and
// attention_tc_wgmma_ptx.cuh (the forward and the backward on Hopper's wgmma,
// sm_90a: forward candidate shapes 7-11 and 12-13, warp-specialized, and
// set_attention_wgmma_backward, not yet run on a GPU), and this file
// (dispatch by dtype). scripts/cuda_emu/run.sh runs them all on
// the CPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/attention_tc_common.cuh"

namespace kiln::kernels::attention_tc {

namespace {

// Calls body.template operator()<T, D>() for the problem's dtype and head dim.
template <typename F>
void dispatch(const AttentionArgs& a, const char* op, F&& body) {
  KILN_ASSERT(supports(a.dtype, a.head_dim), op, ": the tensor-core kernels got ", a.dtype, " with head_dim ",
              a.head_dim);
  if (a.dtype == DType::f16) {
    dispatch_head_dim<__half>(a.head_dim, body);
  } else {
    dispatch_head_dim<__nv_bfloat16>(a.head_dim, body);
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
  KILN_ASSERT(args.scale > 0.0, "scaled_dot_product_attention: the tensor-core forward got scale ", args.scale);
  dispatch(args, "scaled_dot_product_attention", [&]<typename T, int D>() {
    Params p = params_of<Params>(args);
    p.out = out;
    p.lse_out = static_cast<float*>(lse);
    launch_forward<T, D>(p, heads, stream);
  });
}

void backward(const AttentionGradArgs& args, const float* delta, cuda::Stream stream) {
  const AttentionArgs& a = args.forward;
  const int64_t heads = a.batch * a.heads;
  if (heads == 0) return;
  dispatch(a, "scaled_dot_product_attention backward", [&]<typename T, int D>() {
    const Params p = backward_params_of<Params>(args, delta);
    if ((args.dk != nullptr || args.dv != nullptr) && a.kv_len > 0) launch_dkdv<T, D>(p, heads, stream);
    if (args.dq != nullptr && a.q_len > 0) launch_dq<T, D>(p, heads, stream);
  });
}

}  // namespace kiln::kernels::attention_tc
