// CPU scaled dot-product attention (see kernels/attention.h), tiled like the
// CUDA flash kernels so that no T x T matrix is ever held for the batch:
//   - Forward: one task per (b, h, block of kQueryBlock queries); it walks key
//     blocks of kKeyBlock with an online softmax, keeping one score tile
//     (kQueryBlock x kKeyBlock) and a running output (kQueryBlock x D) in
//     per-thread buffers. Tile products are Eigen GEMMs.
//   - Backward: one task per (b, h), which owns that head's dq, dk and dv, so
//     the sums need no atomics and come out the same bits on every run and
//     for every thread count. Scores and probabilities are recomputed from
//     lse, tile by tile.
// Operands are read and written through their layouts (row strides in the
// tiles' Eigen maps). Float32 and float64 (the front end converts 16-bit
// inputs to float32).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cpu/eigen_scratch.h"
#include "kernels/philox.h"
#include "kernels/random.h"

namespace kiln::kernels {

namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 64;

enum class Slot { scores, grads, output, row_max, row_sum, row_dot, kSlots };

// Row-major tiles with a row stride (an operand's layout.row).
template <typename T>
using TileMap = Eigen::Map<MatrixRM<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using ConstTileMap = Eigen::Map<const MatrixRM<T>, 0, Eigen::OuterStride<>>;

// One (b, h) of an operand: its first row and its row stride.
template <typename T>
struct HeadRows {
  T* base = nullptr;
  int64_t row = 0;
  T* at(int64_t i) const { return base + i * row; }
};

template <typename T>
HeadRows<T> head_rows(T* data, const AttentionLayout& layout, int64_t bh, int64_t heads) {
  return {data + bh / heads * layout.batch + bh % heads * layout.head, layout.row};
}

// Additive mask (of the problem's float type M) and causal rule of one (b, h).
template <typename M>
struct HeadMask {
  const M* base = nullptr;  // mask of this (b, h), or null
  int64_t stride_q = 0, stride_k = 0;
  bool causal = false;
  M at(int64_t i, int64_t j) const {
    if (causal && j > i) return -std::numeric_limits<M>::infinity();
    return base == nullptr ? M(0) : base[i * stride_q + j * stride_k];
  }
};

template <typename M>
HeadMask<M> head_mask(const AttentionArgs& args, int64_t bh) {
  HeadMask<M> mask;
  mask.causal = args.causal;
  const M* data = nullptr;
  if constexpr (std::is_same_v<M, double>) {
    data = args.mask.data_f64;
  } else {
    data = args.mask.data;
  }
  if (data != nullptr) {
    const int64_t b = bh / args.heads, h = bh % args.heads;
    mask.base = data + b * args.mask.stride_b + h * args.mask.stride_h;
    mask.stride_q = args.mask.stride_q;
    mask.stride_k = args.mask.stride_k;
  }
  return mask;
}

// The last key (exclusive) queries [q0, q0 + rows) may attend to.
int64_t key_end(const AttentionArgs& args, int64_t q0, int64_t rows) {
  return args.causal ? std::min(args.kv_len, q0 + rows) : args.kv_len;
}

// Dropout's keep-and-scale factor of score (bh, i, j): 0 or 1 / (1 - p).
struct Dropout {
  float p = 0.0f;
  double inverse_keep = 1.0;
  uint64_t seed = 0, offset = 0;
  int64_t q_len = 0, kv_len = 0;
  bool on() const { return p > 0.0f; }
  double factor(int64_t bh, int64_t i, int64_t j) const {
    const uint64_t index = static_cast<uint64_t>((bh * q_len + i) * kv_len + j);
    return dropout_keep(philox::word_at(seed, offset, index), p) ? inverse_keep : 0.0;
  }
};

Dropout dropout_of(const AttentionArgs& args) {
  Dropout dropout;
  dropout.p = args.dropout_p;
  dropout.inverse_keep = args.dropout_p > 0.0f ? 1.0 / (1.0 - static_cast<double>(args.dropout_p)) : 1.0;
  dropout.seed = args.seed;
  dropout.offset = args.offset;
  dropout.q_len = args.q_len;
  dropout.kv_len = args.kv_len;
  return dropout;
}

template <typename T>
void forward(const AttentionArgs& args, T* out, T* lse) {
  const int64_t BH = args.batch * args.heads, Tq = args.q_len, Tk = args.kv_len, D = args.head_dim;
  const int64_t q_blocks = (Tq + kQueryBlock - 1) / kQueryBlock;
  const T scale = static_cast<T>(args.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const Dropout dropout = dropout_of(args);
  const int64_t H = args.heads;
  const AttentionLayout q_layout = resolved(args.q_layout, H, Tq, D), k_layout = resolved(args.k_layout, H, Tk, D),
                        v_layout = resolved(args.v_layout, H, Tk, D), out_layout = resolved(args.out_layout, H, Tq, D);
  const auto* q = static_cast<const T*>(args.q);
  const auto* k = static_cast<const T*>(args.k);
  const auto* v = static_cast<const T*>(args.v);
  const int64_t tasks = BH * q_blocks;
#pragma omp parallel for schedule(dynamic) if (tasks > 1 && BH * Tq * Tk * D > (1 << 16))
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t bh = task / q_blocks, q0 = task % q_blocks * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, Tq - q0);
    const HeadMask<T> mask = head_mask<T>(args, bh);
    T* scores = thread_buffer<T>(static_cast<size_t>(kQueryBlock * kKeyBlock), Slot::scores);
    T* acc = thread_buffer<T>(static_cast<size_t>(kQueryBlock * D), Slot::output);
    T* row_max = thread_buffer<T>(static_cast<size_t>(kQueryBlock), Slot::row_max);
    T* row_sum = thread_buffer<T>(static_cast<size_t>(kQueryBlock), Slot::row_sum);
    std::fill(acc, acc + rows * D, T(0));
    std::fill(row_max, row_max + rows, neg_inf);
    std::fill(row_sum, row_sum + rows, T(0));
    const HeadRows<const T> q_head = head_rows(q, q_layout, bh, H), k_head = head_rows(k, k_layout, bh, H),
                            v_head = head_rows(v, v_layout, bh, H);
    ConstTileMap<T> q_tile(q_head.at(q0), rows, D, Eigen::OuterStride<>(q_head.row));  // (rows, D)
    MapRM<T> acc_tile(acc, rows, D);
    const int64_t end = key_end(args, q0, rows);
    for (int64_t k0 = 0; k0 < end; k0 += kKeyBlock) {
      const int64_t cols = std::min(kKeyBlock, end - k0);
      ConstTileMap<T> k_tile(k_head.at(k0), cols, D, Eigen::OuterStride<>(k_head.row));  // (cols, D)
      ConstTileMap<T> v_tile(v_head.at(k0), cols, D, Eigen::OuterStride<>(v_head.row));
      MapRM<T> s(scores, rows, cols);
      s.noalias() = scale * (q_tile * k_tile.transpose());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = q0 + r;
        T block_max = neg_inf;
        for (int64_t c = 0; c < cols; ++c) {
          s(r, c) += mask.at(i, k0 + c);
          block_max = std::max(block_max, s(r, c));
        }
        const T new_max = std::max(row_max[r], block_max);
        if (new_max == neg_inf) {  // nothing allowed yet in this row
          for (int64_t c = 0; c < cols; ++c) s(r, c) = T(0);
          continue;
        }
        const T correction = std::exp(row_max[r] - new_max);  // 0 on the first allowed block
        T sum = 0;
        for (int64_t c = 0; c < cols; ++c) {
          T p = std::exp(s(r, c) - new_max);
          sum += p;
          if (dropout.on()) p *= static_cast<T>(dropout.factor(bh, i, k0 + c));
          s(r, c) = p;
        }
        row_sum[r] = row_sum[r] * correction + sum;
        row_max[r] = new_max;
        acc_tile.row(r) *= correction;
      }
      acc_tile.noalias() += s * v_tile;
    }
    const HeadRows<T> out_head = head_rows(out, out_layout, bh, H);
    for (int64_t r = 0; r < rows; ++r) {
      const bool empty_row = row_sum[r] == T(0);
      const T inverse = empty_row ? T(0) : T(1) / row_sum[r];
      T* out_row = out_head.at(q0 + r);
      for (int64_t d = 0; d < D; ++d) out_row[d] = acc[r * D + d] * inverse;
      lse[bh * Tq + q0 + r] = empty_row ? neg_inf : row_max[r] + std::log(row_sum[r]);
    }
  }
}

template <typename T>
void backward(const AttentionGradArgs& grad_args) {
  const AttentionArgs& args = grad_args.forward;
  const int64_t BH = args.batch * args.heads, Tq = args.q_len, Tk = args.kv_len, D = args.head_dim;
  const T scale = static_cast<T>(args.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const Dropout dropout = dropout_of(args);
  const auto* q = static_cast<const T*>(args.q);
  const auto* k = static_cast<const T*>(args.k);
  const auto* v = static_cast<const T*>(args.v);
  const auto* out = static_cast<const T*>(grad_args.out);
  const auto* lse = static_cast<const T*>(grad_args.lse);
  const auto* dout = static_cast<const T*>(grad_args.dout);
  auto* dq = static_cast<T*>(grad_args.dq);
  auto* dk = static_cast<T*>(grad_args.dk);
  auto* dv = static_cast<T*>(grad_args.dv);
  const int64_t H = args.heads;
  const AttentionLayout q_layout = resolved(args.q_layout, H, Tq, D), k_layout = resolved(args.k_layout, H, Tk, D),
                        v_layout = resolved(args.v_layout, H, Tk, D), out_layout = resolved(args.out_layout, H, Tq, D),
                        dout_layout = resolved(grad_args.dout_layout, H, Tq, D),
                        dq_layout = resolved(grad_args.dq_layout, H, Tq, D),
                        dk_layout = resolved(grad_args.dk_layout, H, Tk, D),
                        dv_layout = resolved(grad_args.dv_layout, H, Tk, D);
#pragma omp parallel for schedule(dynamic) if (BH > 1 && BH * Tq * Tk * D > (1 << 16))
  for (int64_t bh = 0; bh < BH; ++bh) {
    const HeadMask<T> mask = head_mask<T>(args, bh);
    T* probs = thread_buffer<T>(static_cast<size_t>(kQueryBlock * kKeyBlock), Slot::scores);
    T* grads = thread_buffer<T>(static_cast<size_t>(kQueryBlock * kKeyBlock), Slot::grads);
    T* row_dot = thread_buffer<T>(static_cast<size_t>(Tq), Slot::row_dot);
    // Gradients that were not asked for still need somewhere to add up (dq
    // and dk come from the same dS tiles): the per-thread output scratch.
    const size_t scratch = static_cast<size_t>((dq == nullptr ? Tq * D : 0) + (dk == nullptr ? Tk * D : 0) +
                                               (dv == nullptr ? Tk * D : 0));
    T* spare = thread_buffer<T>(std::max<size_t>(scratch, 1), Slot::output);
    // An asked-for gradient's head through its layout, else dense rows of the scratch.
    const auto gradient_head = [&](T* data, const AttentionLayout& layout, int64_t len) {
      if (data != nullptr) return head_rows(data, layout, bh, H);
      const HeadRows<T> rows{spare, D};
      spare += len * D;
      return rows;
    };
    const HeadRows<T> dq_head = gradient_head(dq, dq_layout, Tq), dk_head = gradient_head(dk, dk_layout, Tk),
                      dv_head = gradient_head(dv, dv_layout, Tk);
    for (int64_t i = 0; i < Tq; ++i) std::fill(dq_head.at(i), dq_head.at(i) + D, T(0));
    for (int64_t j = 0; j < Tk; ++j) {
      std::fill(dk_head.at(j), dk_head.at(j) + D, T(0));
      std::fill(dv_head.at(j), dv_head.at(j) + D, T(0));
    }
    const HeadRows<const T> q_head = head_rows(q, q_layout, bh, H), k_head = head_rows(k, k_layout, bh, H),
                            v_head = head_rows(v, v_layout, bh, H), out_head = head_rows(out, out_layout, bh, H),
                            dout_head = head_rows(dout, dout_layout, bh, H);
    const T* lse_head = lse + bh * Tq;
    // D_i = dout_i . out_i (= sum_j P_ij dP_ij with dropout folded in).
    for (int64_t i = 0; i < Tq; ++i) {
      T dot = 0;
      const T* dout_row = dout_head.at(i);
      const T* out_row = out_head.at(i);
      for (int64_t d = 0; d < D; ++d) dot += dout_row[d] * out_row[d];
      row_dot[i] = dot;
    }
    for (int64_t q0 = 0; q0 < Tq; q0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, Tq - q0);
      ConstTileMap<T> q_tile(q_head.at(q0), rows, D, Eigen::OuterStride<>(q_head.row));
      ConstTileMap<T> dout_tile(dout_head.at(q0), rows, D, Eigen::OuterStride<>(dout_head.row));
      TileMap<T> dq_tile(dq_head.at(q0), rows, D, Eigen::OuterStride<>(dq_head.row));
      const int64_t end = key_end(args, q0, rows);
      for (int64_t k0 = 0; k0 < end; k0 += kKeyBlock) {
        const int64_t cols = std::min(kKeyBlock, end - k0);
        ConstTileMap<T> k_tile(k_head.at(k0), cols, D, Eigen::OuterStride<>(k_head.row));
        ConstTileMap<T> v_tile(v_head.at(k0), cols, D, Eigen::OuterStride<>(v_head.row));
        TileMap<T> dk_tile(dk_head.at(k0), cols, D, Eigen::OuterStride<>(dk_head.row));
        TileMap<T> dv_tile(dv_head.at(k0), cols, D, Eigen::OuterStride<>(dv_head.row));
        MapRM<T> p(probs, rows, cols);
        MapRM<T> ds(grads, rows, cols);
        p.noalias() = scale * (q_tile * k_tile.transpose());
        ds.noalias() = dout_tile * v_tile.transpose();  // dP (rows, cols)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = q0 + r;
          for (int64_t c = 0; c < cols; ++c) {
            const T s = p(r, c) + mask.at(i, k0 + c);
            const T prob = (lse_head[i] == neg_inf || s == neg_inf) ? T(0) : std::exp(s - lse_head[i]);
            const T keep = dropout.on() ? static_cast<T>(dropout.factor(bh, i, k0 + c)) : T(1);
            ds(r, c) = prob * (ds(r, c) * keep - row_dot[i]);  // dS = P * (dP * keep - D_i)
            p(r, c) = prob * keep;                            // the dropped probabilities, for dV
          }
        }
        dv_tile.noalias() += p.transpose() * dout_tile;
        dq_tile.noalias() += scale * (ds * k_tile);
        dk_tile.noalias() += scale * (ds.transpose() * q_tile);
      }
    }
  }
}

}  // namespace

uint64_t attention_dropout_counters(const AttentionArgs& args) {
  const uint64_t words = static_cast<uint64_t>(args.batch * args.heads * args.q_len * args.kv_len);
  return (words + 3) / 4;
}

void attention_forward_cpu(const AttentionArgs& args, void* out, void* lse) {
  switch (args.dtype) {
    case DType::f32: forward<float>(args, static_cast<float*>(out), static_cast<float*>(lse)); return;
    case DType::f64: forward<double>(args, static_cast<double*>(out), static_cast<double*>(lse)); return;
    default: break;
  }
  KILN_THROW("attention_forward_cpu: float32 or float64 expected, got ", dtype_name(args.dtype));
}

void attention_backward_cpu(const AttentionGradArgs& args) {
  switch (args.forward.dtype) {
    case DType::f32: backward<float>(args); return;
    case DType::f64: backward<double>(args); return;
    default: break;
  }
  KILN_THROW("attention_backward_cpu: float32 or float64 expected, got ", dtype_name(args.forward.dtype));
}

}  // namespace kiln::kernels
