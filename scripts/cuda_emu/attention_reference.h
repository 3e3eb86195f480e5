// What both attention emulations (main.cpp: attention_tc*.cu; test_attention.cpp:
// attention.cu's reference kernels) check against: the problems, their
// operand layouts and masks, and a float64 forward and backward. Include after
// the emulation's prelude (prelude.h or emu_cuda.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/philox.h"
#include "kernels/random.h"

namespace emu_attention {

using kiln::kernels::AttentionLayout;

struct Problem {
  int64_t B, H, L, S;
  bool causal;
  int mask;  // 0 none, 1 additive (L, S), 2 key padding (B, 1, 1, S), 3 (L, S) with rows that allow no key
  float dropout = 0.0f;
  bool unaligned = false;
  // q, k, v the heads of one (B, L, 3, H, E) buffer (a fused projection; L = S),
  // out, dq, dk (B, T, H, E), dout and dv dense (B, H, T, E): no two operands
  // of one kernel with the same strides but q, k and v.
  bool fused = false;
  // Seed and base offset read from a philox::ReplayState in device memory (a CUDA graph's
  // replay): the arguments' seed is then ignored and their offset is relative to it.
  bool replay = false;
};

// Sizes, edge cases (Tk = 0, rows past a block, rows with no allowed key), masks, dropout,
// unaligned operands, fused layouts.
inline const std::vector<Problem>& problems() {
  static const std::vector<Problem> cases = {
      {2, 3, 5, 7, false, 0},       {1, 2, 130, 70, false, 0},   {2, 2, 257, 257, true, 0},
      {1, 1, 70, 200, true, 0},     {2, 2, 33, 97, false, 1},    {2, 2, 64, 65, false, 2},
      {1, 1, 3, 0, false, 0},       {1, 2, 300, 384, false, 0},  {1, 2, 40, 90, false, 3},
      {1, 2, 70, 90, true, 0, 0.0f, true}, {2, 1, 129, 200, false, 2, 0.0f, true},
      {2, 2, 70, 90, true, 0, 0.2f},       {2, 2, 70, 90, false, 1, 0.2f},
      {2, 3, 130, 130, true, 0, 0.0f, false, true},
      {2, 2, 70, 70, false, 2, 0.2f, true, true},
      {2, 2, 70, 90, true, 0, 0.2f, false, false, true},
      // More key blocks than the warp-specialized forward's 5 stages (shape 12): its ring wraps.
      {1, 1, 130, 1400, false, 0},         {1, 1, 700, 700, true, 0}};
  return cases;
}

// Element strides over (B, H, T) of each operand (AttentionLayout) for head dim E.
struct Layouts {
  AttentionLayout q, kv, out, dk, dout, dv;
  Layouts(const Problem& c, int64_t E) {
    const int64_t HE = c.H * E, L = c.L, S = c.S;
    const AttentionLayout dense_q{c.H * L * E, L * E, E, true}, dense_kv{c.H * S * E, S * E, E, true};
    const AttentionLayout fused_qkv{L * 3 * HE, E, 3 * HE, true}, rows_q{L * HE, E, HE, true}, rows_kv{S * HE, E, HE, true};
    q = c.fused ? fused_qkv : dense_q;
    kv = c.fused ? fused_qkv : dense_kv;
    out = c.fused ? rows_q : dense_q;  // dq too
    dk = c.fused ? rows_kv : dense_kv;
    dout = dense_q;
    dv = dense_kv;
  }
};

// Element (t, d) of head bh = b * H + h through a layout.
inline int64_t element_at(const AttentionLayout& l, int64_t heads, int64_t bh, int64_t t, int64_t d) {
  return bh / heads * l.batch + bh % heads * l.head + t * l.row + d;
}

// The additive float32 mask of a problem and its strides over (B, L, S) (none: empty).
struct Mask {
  std::vector<float> values;
  int64_t stride_b = 0, stride_q = 0, stride_k = 0;
  double at(int64_t b, int64_t i, int64_t j) const {
    return values.empty() ? 0.0 : values[b * stride_b + i * stride_q + j * stride_k];
  }
};

inline Mask make_mask(const Problem& c, std::mt19937_64& engine, std::normal_distribution<float>& normal) {
  Mask m;
  const float ninf = -std::numeric_limits<float>::infinity();
  if (c.mask == 1 || c.mask == 3) {
    m.values.resize(c.L * c.S);
    m.stride_q = c.S;
    m.stride_k = 1;
    for (int64_t i = 0; i < c.L; ++i) {
      const bool row_allowed = normal(engine) > -0.5f;
      for (int64_t j = 0; j < c.S; ++j) {
        const float x = normal(engine);
        m.values[i * c.S + j] = c.mask == 1 ? x : (row_allowed && x > -1.0f ? 0.0f : ninf);
      }
    }
  } else if (c.mask == 2) {
    m.values.resize(c.B * c.S);
    m.stride_b = c.S;
    m.stride_k = 1;
    for (auto& x : m.values) x = normal(engine) > -1.0f ? 0.0f : ninf;
  }
  return m;
}

// Dropout's seed and offset (the reference's) and how a problem passes them to the kernels.
constexpr uint64_t kSeed = 1234, kOffset = 77;
struct RandomArguments {
  uint64_t seed, offset;        // AttentionArgs' seed and offset
  kiln::philox::ReplayState state;  // what args.replay points at, for a replay problem
};
inline RandomArguments random_arguments(const Problem& c) {
  if (!c.replay) return {kSeed, kOffset, {0, 0}};
  return {99999, 7, {kSeed, kOffset - 7}};  // a seed the kernels must ignore, an offset relative to the state's
}

// The forward arguments of a problem: q, k, v where they start in their buffers (read
// through `layouts` when fused, dense otherwise), the mask's values at mask_data (a
// device copy of mask.values), dropout's seed and offset as random_arguments says, the
// replay state (for a replay problem) at `replay`.
inline kiln::kernels::AttentionArgs forward_args(const Problem& c, int64_t E, kiln::DType dtype, const Layouts& layouts,
                                                 const void* q, const void* k, const void* v, const Mask& mask,
                                                 const float* mask_data, const kiln::philox::ReplayState* replay) {
  kiln::kernels::AttentionArgs args;
  args.dtype = dtype;
  args.batch = c.B;
  args.heads = c.H;
  args.q_len = c.L;
  args.kv_len = c.S;
  args.head_dim = E;
  args.q = q;
  args.k = k;
  args.v = v;
  if (c.fused) {  // otherwise left all zero: dense
    args.q_layout = layouts.q;
    args.k_layout = layouts.kv;
    args.v_layout = layouts.kv;
    args.out_layout = layouts.out;
  }
  if (!mask.values.empty()) {
    args.mask.data = mask_data;
    args.mask.stride_b = mask.stride_b;
    args.mask.stride_q = mask.stride_q;
    args.mask.stride_k = mask.stride_k;
  }
  args.causal = c.causal;
  args.scale = 1.0 / std::sqrt(static_cast<double>(E));
  args.dropout_p = c.dropout;
  const RandomArguments random = random_arguments(c);
  args.seed = random.seed;
  args.offset = random.offset;
  args.replay = c.replay ? replay : nullptr;
  return args;
}

// The backward arguments: dq and dk in out's and the keys' (B, T, H, E) order when fused.
inline kiln::kernels::AttentionGradArgs backward_args(const Problem& c, const kiln::kernels::AttentionArgs& forward,
                                                      const Layouts& layouts, const void* out, const float* lse,
                                                      const void* dout, void* dq, void* dk, void* dv) {
  kiln::kernels::AttentionGradArgs grad;
  grad.forward = forward;
  grad.out = out;
  grad.lse = lse;
  grad.dout = dout;
  grad.dq = dq;
  grad.dk = dk;
  grad.dv = dv;
  if (c.fused) {
    grad.dout_layout = layouts.dout;
    grad.dq_layout = layouts.out;
    grad.dk_layout = layouts.dk;
    grad.dv_layout = layouts.dv;
  }
  return grad;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// float64 attention of dense (bh, t, d) operands: out and lse, and the
// gradients for dout; dropout keeps score (i, j) of head bh by Philox word
// (bh * L + i) * S + j (kernels/attention.h).
inline Reference reference(const Problem& c, int64_t E, const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v, const std::vector<double>& dout, const Mask& mask,
                           double scale, uint64_t seed, uint64_t offset) {
  const int64_t BH = c.B * c.H, L = c.L, S = c.S;
  Reference r;
  r.out.assign(BH * L * E, 0);
  r.lse.assign(BH * L, 0);
  r.dq.assign(BH * L * E, 0);
  r.dk.assign(BH * S * E, 0);
  r.dv.assign(BH * S * E, 0);
  const double p = c.dropout, keep_scale = p > 0 ? 1.0 / (1.0 - p) : 1.0;
  for (int64_t bh = 0; bh < BH; ++bh) {
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(S), P(S, 0.0), keep(S, 1.0);
      double m = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < E; ++d) dot += q[(bh * L + i) * E + d] * k[(bh * S + j) * E + d];
        s[j] = (c.causal && j > i) ? -INFINITY : dot * scale + mask.at(bh / c.H, i, j);
        m = std::max(m, s[j]);
        if (p > 0) {
          const uint64_t index = (static_cast<uint64_t>(bh) * L + i) * S + j;
          keep[j] = kiln::kernels::dropout_keep(kiln::philox::word_at(seed, offset, index), c.dropout) ? 1.0 : 0.0;
        }
      }
      double sum = 0;
      if (m != -INFINITY) {
        for (int64_t j = 0; j < S; ++j) sum += P[j] = std::exp(s[j] - m);
        for (int64_t j = 0; j < S; ++j) P[j] /= sum;
      }
      r.lse[bh * L + i] = m == -INFINITY ? -INFINITY : m + std::log(sum);
      std::vector<double> o(E, 0.0);
      for (int64_t j = 0; j < S; ++j) {
        for (int64_t d = 0; d < E; ++d) o[d] += P[j] * keep[j] * keep_scale * v[(bh * S + j) * E + d];
      }
      double dl = 0;
      for (int64_t d = 0; d < E; ++d) {
        r.out[(bh * L + i) * E + d] = o[d];
        dl += o[d] * dout[(bh * L + i) * E + d];
      }
      for (int64_t j = 0; j < S; ++j) {
        double dp = 0;
        for (int64_t d = 0; d < E; ++d) dp += dout[(bh * L + i) * E + d] * v[(bh * S + j) * E + d];
        dp *= keep[j] * keep_scale;
        const double ds = P[j] * (dp - dl);
        for (int64_t d = 0; d < E; ++d) {
          r.dq[(bh * L + i) * E + d] += scale * ds * k[(bh * S + j) * E + d];
          r.dk[(bh * S + j) * E + d] += scale * ds * q[(bh * L + i) * E + d];
          r.dv[(bh * S + j) * E + d] += P[j] * keep[j] * keep_scale * dout[(bh * L + i) * E + d];
        }
      }
    }
  }
  return r;
}

}  // namespace emu_attention
