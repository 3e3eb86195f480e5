// Scaled dot-product attention, fused (flash-style): the compute behind
// kiln::scaled_dot_product_attention (core/ops/attention.cpp).
//
// Invariants:
//   - q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, D), out and dout
//     (B, H, Tq, D), dq, dk, dv like q, k, v: buffers of one dtype whose last
//     dim is dense; each has its own batch, head and row strides
//     (AttentionLayout; strided = false means dense (B, H, T, D)). So the heads of
//     a fused qkv projection, (B, T, 3, H, D) viewed as (B, H, T, D), are read
//     in place, and out can be written (B, T, H, D) for the projection after
//     it, without copies. D is the same for q, k and v; the front end
//     broadcasts k/v heads.
//   - scores s_ij = scale * q_i . k_j + mask_ij; the mask is optional, float32
//     (float64 for a float64 problem, which only the CPU takes), additive (-inf where a boolean mask is false), read through strides so a
//     (Tq, Tk) or (B, 1, 1, Tk) mask is never expanded in memory. is_causal
//     masks j > i (torch's top-left alignment: tril(ones(Tq, Tk))).
//   - p_ij = exp(s_ij - lse_i), lse_i = log sum_j exp(s_ij) over the allowed
//     j. A row with no allowed key (every s_ij = -inf) has lse_i = -inf, an
//     output of zeros and zero gradients (torch >= 2.5's safe softmax).
//   - Dropout (p > 0): keep_ij = dropout_keep(word, p) with the Philox word
//     philox::word_at(seed, offset, ((b * H + h) * Tq + i) * Tk + j) of
//     kernels/philox.h; kept probabilities are scaled by 1 / (1 - p). The
//     backward regenerates the same words, so no mask is stored.
//     attention_dropout_counters() is how far the generator advances.
//   - The T x T matrix is never stored in global memory: the kernels walk key
//     blocks with an online softmax and keep one tile of scores per block
//     (CUDA) or per thread (CPU).
//   - Math in float (double for f64); lse is float32 (float64 for f64).
//   - The forward writes out (=) and lse (=); the backward writes dq, dk and dv
//     (=), each when non-null.
//   - Dtypes: CPU float32 and float64 (the front end converts 16-bit inputs to
//     float32 on the CPU); CUDA float32, float16 and bfloat16 (16-bit inputs on
//     tensor cores), head dims D in {32, 64, 96, 128} on CUDA (any D on the
//     CPU); attention_cuda_supports() says whether a problem fits, and the
//     front end falls back to the composite matmul/softmax path when not.
//   - CUDA: q, k, v and dout need not be 16-byte aligned (aligned ones take
//     vector loads, or cp.async); scale is applied in float; 16-bit problems
//     round P and dS to the input type before their products, as
//     flash-attention does. Two sets of CUDA kernels (set_attention_cuda_kernels
//     below): 16-bit problems take the tensor-core kernels of attention_tc.cu
//     by default, everything else the kernels of attention.cu.
//   - Nothing here synchronizes.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"
#include "kernels/philox.h"

namespace kiln::kernels {

struct AttentionMask {
  const float* data = nullptr;  // additive, or null for none
  const double* data_f64 = nullptr;  // a float64 problem's (CPU only), instead of data
  // Element strides over (B, H, Tq, Tk); 0 for a broadcast dimension.
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_k = 0;
};

// Element strides of a (B, H, T, D) operand over B, H and T (its D is dense).
// strided = false (the default): the dense layout, (H * T * D, T * D, D),
// whatever the strides say; true: these strides, zeros included (a tensor
// broadcast over B, H or T is read in place).
struct AttentionLayout {
  int64_t batch = 0, head = 0, row = 0;
  bool strided = false;
};

// `layout` with the dense strides filled in when it is not strided.
inline AttentionLayout resolved(AttentionLayout layout, int64_t heads, int64_t len, int64_t head_dim) {
  if (!layout.strided) return {heads * len * head_dim, len * head_dim, head_dim, true};
  return layout;
}

struct AttentionArgs {
  DType dtype = DType::f32;
  int64_t batch = 0, heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  const void* q = nullptr;  // (B, H, Tq, D)
  const void* k = nullptr;  // (B, H, Tk, D)
  const void* v = nullptr;  // (B, H, Tk, D)
  // Their layouts, and the output's (written by the forward, read by the backward).
  AttentionLayout q_layout, k_layout, v_layout, out_layout;
  AttentionMask mask;
  bool causal = false;
  double scale = 1.0;
  // Dropout on the probabilities; p = 0 turns it off.
  float dropout_p = 0.0f;
  uint64_t seed = 0, offset = 0;
  const philox::ReplayState* replay = nullptr;  // CUDA, inside a graph: seed and base offset read at replay
};

// Counters a dropout draw of this problem consumes (one word per score).
uint64_t attention_dropout_counters(const AttentionArgs& args);

// out (B, H, Tq, D) in args.out_layout and lse, dense (B, H, Tq) (float32; float64 for f64).
void attention_forward_cpu(const AttentionArgs& args, void* out, void* lse);
void attention_forward_cuda(const AttentionArgs& args, void* out, void* lse, cuda::Stream stream);

struct AttentionGradArgs {
  AttentionArgs forward;
  const void* out = nullptr;   // (B, H, Tq, D), the forward's output
  const void* lse = nullptr;   // (B, H, Tq), the forward's
  const void* dout = nullptr;  // (B, H, Tq, D)
  void* dq = nullptr;          // (B, H, Tq, D) or null
  void* dk = nullptr;          // (B, H, Tk, D) or null
  void* dv = nullptr;          // (B, H, Tk, D) or null
  AttentionLayout dout_layout, dq_layout, dk_layout, dv_layout;
};

// Bytes of device scratch attention_backward_cuda needs: the row sums of
// dout * out (B * H * Tq floats); every dq, dk and dv element has one owning
// block, so there are no accumulators (and no atomics).
size_t attention_backward_workspace_bytes(const AttentionGradArgs& args);
void attention_backward_cpu(const AttentionGradArgs& args);
void attention_backward_cuda(const AttentionGradArgs& args, void* workspace, cuda::Stream stream);

// Whether the CUDA kernels take this problem (dtype and head dim).
bool attention_cuda_supports(DType dtype, int64_t head_dim);

// Which CUDA kernels attention_forward_cuda and attention_backward_cuda run
// for float16 and bfloat16: `tensor_core` (the default) takes head dims 32,
// 64, 96 and 128 to kernels/cuda/attention_tc.cu (FlashAttention-2's register-
// resident schedule); `reference` forces the first kernels of attention.cu,
// kept so that tests and bench_attention can compare the two. float32 always
// runs attention.cu's kernels. Process-wide, read at each launch (so a
// forward and its backward may take different paths; both compute the same
// lse). Without CUDA the setting is kept and has no effect.
enum class AttentionCudaKernels { tensor_core, reference };
void set_attention_cuda_kernels(AttentionCudaKernels kernels);
AttentionCudaKernels attention_cuda_kernels();

// A tuning knob of the tensor-core forward, for bench_attention: the CTA
// shape it runs without dropout or an additive mask. 0 is the default,
// shapes 0 .. attention_forward_shape_count() - 1 exist;
// attention_forward_shape_name(i) describes shape i ("" for any other index);
// attention_forward_shape_applies(i, D) says whether shape i runs for head
// dim D (0 for every D; 1-6 for D = 64, GPT-2's attention; the wgmma shapes,
// which need compute capability 9.0, for 64 and 128, 13 for 64): where it does not, the
// default runs. set_attention_forward_shape throws for an index
// out of range. Process-wide, read at each launch; the environment variable
// KILN_ATTENTION_FORWARD_SHAPE sets it at start-up. Without CUDA only 0 exists.
void set_attention_forward_shape(int index);
int attention_forward_shape();
int attention_forward_shape_count();
bool attention_forward_shape_applies(int index, int64_t head_dim);
const char* attention_forward_shape_name(int index);

// The tensor-core backward's kernels on Hopper's wgmma (sm_90a; head dims 64
// and 128 without dropout or an additive mask, other problems keep the
// mma.sync kernels) instead of mma.sync: off by default until a GPU has
// timed and checked them; on a GPU other than compute capability 9.0 the
// backward then throws. Process-wide, read at each launch; the environment
// variable KILN_ATTENTION_WGMMA_BACKWARD=1 sets it at start-up. Without CUDA
// the setting is kept and has no effect.
void set_attention_wgmma_backward(bool on);
bool attention_wgmma_backward();

// The tensor-core kernels themselves (kernels/cuda/attention_tc.cu, CUDA
// builds only); callers go through attention_*_cuda, which route here.
namespace attention_tc {
bool supports(DType dtype, int64_t head_dim);  // float16/bfloat16, D in {32, 64, 96, 128}
// The largest row stride (elements) of q, k, v and dout these kernels take:
// their tile loads index a tile's rows in 32 bits (up to 128 rows). Problems
// with a larger stride run attention.cu's kernels.
constexpr int64_t kMaxRowStride = 16'000'000;
void forward(const AttentionArgs& args, void* out, void* lse, cuda::Stream stream);
// dq, dk, dv given delta (B * H * Tq floats, dout . out per row; the caller computes it).
void backward(const AttentionGradArgs& args, const float* delta, cuda::Stream stream);
}  // namespace attention_tc

}  // namespace kiln::kernels
