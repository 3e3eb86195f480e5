// What attention.cu's reference kernels and attention_tc's tensor-core
// kernels share: the tensors and sizes that open both Params, small device
// helpers (quad reductions, the dropout word of a score, the dQ and dK/dV
// stores), and the host side (Params from the arguments, dispatch by head
// dim, launch). Each set keeps its own Params: attention_tc's has scale_log2
// after scale, and one struct for both would move the fields after it in one
// set's kernel parameters and so change that set's code. Everything but
// AttentionTensors is internal to each translation unit.
#pragma once
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/native_types.cuh"

namespace kiln::kernels {

// The head of both Params: 408 bytes without padding, so the fields each
// Params adds after it keep the offsets they would have in one flat struct.
// Each (B, H, T, D) operand has its layout (kernels/attention.h), resolved:
// a head's rows start at b * batch + h * head, row i at + i * row.
struct AttentionTensors {
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
  AttentionLayout q_layout, k_layout, v_layout, out_layout, dout_layout, dq_layout, dk_layout, dv_layout;
};
static_assert(sizeof(AttentionTensors) == 408 && alignof(AttentionTensors) == 8, "no tail padding");

namespace {

constexpr float kNegInf = -__builtin_huge_valf();

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Max and sum over the 4 lanes of a quad (the lanes that hold one row of an m16n8 tile).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---------------------------------------------------------------- layouts

// Where head bh = b * H + h of an operand starts (elements).
__device__ __forceinline__ int64_t head_offset(const AttentionLayout& layout, int64_t bh, int64_t heads) {
  return bh / heads * layout.batch + bh % heads * layout.head;
}

// ---------------------------------------------------------------- dropout

// Dropout word of score (i, j) of head bh: ((b * H + h) * Tq + i) * Tk + j (attention.h).
__device__ __forceinline__ uint64_t dropout_index(const AttentionTensors& p, int64_t bh, int64_t i, int64_t j) {
  return (static_cast<uint64_t>(bh) * p.q_len + i) * p.kv_len + j;
}

// ---------------------------------------------------------------- gradient stores
// A warp's (16, D) float accumulators in the m16n8 layout (acc[n][2 h + e]:
// row g + 8 h, column 8 n + 2 t + e) written (=) as T to the lane's rows `row`
// and row + 8 of head bh; rows past the end are skipped.

// dQ times scale (Params: either set's).
template <typename T, int D, typename Params>
__device__ __forceinline__ void store_dq(const Params& p, const float (&dq)[D / 8][4], int64_t bh, int64_t row, int t) {
  T* dq_out = static_cast<T*>(p.dq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row + 8 * h >= p.q_len) continue;
    const int64_t at = head_offset(p.dq_layout, bh, p.heads) + (row + 8 * h) * p.dq_layout.row;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      dq_out[at + 8 * n + 2 * t] = from_acc<T>(dq[n][2 * h] * p.scale);
      dq_out[at + 8 * n + 2 * t + 1] = from_acc<T>(dq[n][2 * h + 1] * p.scale);
    }
  }
}

// dK times scale and dV of the lane's keys `key` and key + 8; a null output is skipped.
template <typename T, int D, typename Params>
__device__ __forceinline__ void store_dkdv(const Params& p, const float (&dk)[D / 8][4], const float (&dv)[D / 8][4],
                                           int64_t bh, int64_t key, int t) {
  T* dk_out = static_cast<T*>(p.dk);
  T* dv_out = static_cast<T*>(p.dv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key + 8 * h >= p.kv_len) continue;
    const int64_t dk_at = head_offset(p.dk_layout, bh, p.heads) + (key + 8 * h) * p.dk_layout.row;
    const int64_t dv_at = head_offset(p.dv_layout, bh, p.heads) + (key + 8 * h) * p.dv_layout.row;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (dk_out != nullptr) dk_out[dk_at + 8 * n + 2 * t + e] = from_acc<T>(dk[n][2 * h + e] * p.scale);
        if (dv_out != nullptr) dv_out[dv_at + 8 * n + 2 * t + e] = from_acc<T>(dv[n][2 * h + e]);
      }
    }
  }
}

// ---------------------------------------------------------------- host side

inline bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// Whether every row of an operand starts 16-byte aligned (vector loads, cp.async).
inline bool rows_aligned16(const void* data, const AttentionLayout& layout, size_t element_bytes) {
  const auto aligned = [&](int64_t stride) { return static_cast<size_t>(stride) * element_bytes % 16 == 0; };
  return aligned16(data) && aligned(layout.batch) && aligned(layout.head) && aligned(layout.row);
}

// The Params (either set's) of a forward problem; the caller sets the outputs.
template <typename Params>
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
  if constexpr (requires(Params& x) { x.scale_log2; }) p.scale_log2 = static_cast<float>(a.scale * 1.4426950408889634);
  p.dropout = a.dropout_p > 0.0f;
  p.dropout_p = a.dropout_p;
  // p = 1 drops everything: the output is 0, not 0 * inf.
  p.dropout_scale = !p.dropout ? 1.0f : a.dropout_p < 1.0f ? 1.0f / (1.0f - a.dropout_p) : 0.0f;
  p.seed = a.seed;
  p.offset = a.offset;
  p.replay = a.replay;
  p.causal = a.causal;
  const int64_t H = a.heads, D = a.head_dim;
  p.q_layout = resolved(a.q_layout, H, a.q_len, D);
  p.k_layout = resolved(a.k_layout, H, a.kv_len, D);
  p.v_layout = resolved(a.v_layout, H, a.kv_len, D);
  p.out_layout = resolved(a.out_layout, H, a.q_len, D);
  const size_t bytes = dtype_size(a.dtype);
  p.vector_loads = rows_aligned16(a.q, p.q_layout, bytes) && rows_aligned16(a.k, p.k_layout, bytes) &&
                   rows_aligned16(a.v, p.v_layout, bytes);
  return p;
}

// The Params of a backward problem, given delta = dout . out per query row.
template <typename Params>
Params backward_params_of(const AttentionGradArgs& args, const float* delta) {
  Params p = params_of<Params>(args.forward);
  p.dout = args.dout;
  p.lse = static_cast<const float*>(args.lse);
  p.delta = delta;
  p.dq = args.dq;
  p.dk = args.dk;
  p.dv = args.dv;
  const AttentionArgs& a = args.forward;
  const int64_t H = a.heads, D = a.head_dim;
  p.dout_layout = resolved(args.dout_layout, H, a.q_len, D);
  p.dq_layout = resolved(args.dq_layout, H, a.q_len, D);
  p.dk_layout = resolved(args.dk_layout, H, a.kv_len, D);
  p.dv_layout = resolved(args.dv_layout, H, a.kv_len, D);
  p.vector_loads = p.vector_loads && rows_aligned16(args.dout, p.dout_layout, dtype_size(a.dtype));
  return p;
}

// Calls body.template operator()<T, D>() for head_dim D = 32, 64, 96 or 128
// (the caller has checked that it is one of them).
template <typename T, typename F>
void dispatch_head_dim(int64_t head_dim, F& body) {
  switch (head_dim) {
    case 32: body.template operator()<T, 32>(); break;
    case 64: body.template operator()<T, 64>(); break;
    case 96: body.template operator()<T, 96>(); break;
    default: body.template operator()<T, 128>(); break;
  }
}

// scripts/cuda_emu/gen.py finds this function by its first two lines and swaps in an emulation.
template <typename Kernel, typename Params>
void launch(Kernel kernel, int64_t blocks, int threads, size_t smem, cuda::Stream stream, const Params& p,
            const char* what) {
  KILN_CHECK(blocks <= INT32_MAX, what, ": ", blocks, " thread blocks exceed one launch (at most ", INT32_MAX, ")");
  if (smem > 48 * 1024) {  // above the default limit: opt in (per device, so on every launch, as FlashAttention does)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), smem, static_cast<cudaStream_t>(stream)>>>(p);
  cuda::check_last_launch(what);
}

}  // namespace
}  // namespace kiln::kernels
