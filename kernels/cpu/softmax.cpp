// CPU softmax, log-softmax, fused cross-entropy and NLL loss (see kernels/softmax.h).
//
// Rows are processed independently (OpenMP over rows when large), so results
// never depend on the thread count. Each row is an Eigen array map: max, then
// a vectorized exp and sum in Acc (float, or double for float64). 16-bit rows
// are widened into a per-thread float buffer first.
#include <Eigen/Core>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/float_convert.h"
#include "kernels/softmax.h"

namespace kiln::kernels {

namespace {

constexpr int64_t kParallelWork = 1 << 15;

template <typename A>
using Row = Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>>;
template <typename A>
using ConstRow = Eigen::Map<const Eigen::Array<A, Eigen::Dynamic, 1>>;

// Remembers the out-of-range target of the lowest row (deterministic message).
struct BadTarget {
  std::atomic<int64_t> row{std::numeric_limits<int64_t>::max()};
  void record(int64_t r) {
    int64_t current = row.load();
    while (r < current && !row.compare_exchange_weak(current, r)) {
    }
  }
  void raise(const char* op, const int64_t* target, int64_t classes, int64_t ignore_index) const {
    const int64_t r = row.load();
    KILN_CHECK(r == std::numeric_limits<int64_t>::max(), op, ": target ", target[r], " (at flat position ", r,
               ") is out of range for ", classes, " classes (expected a class index in [0, ", classes,
               ") or ignore_index ", ignore_index, ")");
  }
};

// Class weights as Acc (ones when absent) and their sum.
template <typename T>
std::vector<compute_t<T>> class_weights(const void* weight, int64_t classes) {
  std::vector<compute_t<T>> w(static_cast<size_t>(classes), compute_t<T>(1));
  if (weight != nullptr) {
    const T* src = static_cast<const T*>(weight);
    for (int64_t c = 0; c < classes; ++c) w[c] = static_cast<compute_t<T>>(src[c]);
  }
  return w;
}

// ---------------------------------------------------------------- softmax

template <typename T>
void softmax_typed(const SoftmaxArgs& a) {
  using A = compute_t<T>;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const int64_t n = a.cols;
#pragma omp parallel if (a.rows * n > kParallelWork)
  {
    std::vector<float> in_buffer, out_buffer;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      ConstRow<A> xr(cpu::compute_row(x + r * n, n, in_buffer), n);
      A* out = cpu::result_row(y + r * n, n, out_buffer);
      Row<A> yr(out, n);
      const A m = xr.maxCoeff();
      if (a.log) {
        const A lse = m + std::log((xr - m).exp().sum());
        yr = xr - lse;
      } else {
        yr = (xr - m).exp();
        yr *= A(1) / yr.sum();
      }
      cpu::store_result_row(out, y + r * n, n);
    }
  }
}

template <typename T>
void softmax_grad_typed(const SoftmaxGradArgs& a) {
  using A = compute_t<T>;
  const T* y = static_cast<const T*>(a.y);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  const int64_t n = a.cols;
#pragma omp parallel if (a.rows * n > kParallelWork)
  {
    std::vector<float> y_buffer, dy_buffer, out_buffer;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      ConstRow<A> yr(cpu::compute_row(y + r * n, n, y_buffer), n);
      ConstRow<A> gr(cpu::compute_row(dy + r * n, n, dy_buffer), n);
      A* out = cpu::result_row(dx + r * n, n, out_buffer);
      Row<A> dr(out, n);
      if (a.log) {
        dr = gr - yr.exp() * gr.sum();
      } else {
        dr = yr * (gr - (gr * yr).sum());
      }
      cpu::store_result_row(out, dx + r * n, n);
    }
  }
}

// ---------------------------------------------------------------- cross entropy

template <typename T>
void cross_entropy_typed(const CrossEntropyArgs& a) {
  using A = compute_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  A* loss = static_cast<A*>(a.loss);
  A* row_weight = static_cast<A*>(a.row_weight);
  A* lse_out = static_cast<A*>(a.lse);
  const int64_t C = a.classes;
  const std::vector<A> w = class_weights<T>(a.weight, C);
  ConstRow<A> wr(w.data(), C);
  const A W = wr.sum();
  const A ls = static_cast<A>(a.label_smoothing);
  BadTarget bad;
#pragma omp parallel if (a.rows * C > kParallelWork)
  {
    std::vector<float> buffer;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      const int64_t t = a.target[r];
      if (t == a.ignore_index) {
        loss[r] = row_weight[r] = lse_out[r] = A(0);
        continue;
      }
      if (t < 0 || t >= C) {
        bad.record(r);
        loss[r] = row_weight[r] = lse_out[r] = A(0);
        continue;
      }
      ConstRow<A> xr(cpu::compute_row(logits + r * C, C, buffer), C);
      const A m = xr.maxCoeff();
      const A lse = m + std::log((xr - m).exp().sum());
      A value = (A(1) - ls) * w[t] * (lse - xr[t]);
      if (ls != A(0)) {
        // sum_c w[c] (lse - x[c]) as sum_c w[c] (m - x[c]) + W (lse - m): every term >= 0, no cancellation.
        const A smooth = (wr * (m - xr)).sum() + W * (lse - m);
        value += ls / static_cast<A>(C) * smooth;
      }
      loss[r] = value;
      row_weight[r] = w[t];
      lse_out[r] = lse;
    }
  }
  bad.raise("cross_entropy", a.target, C, a.ignore_index);
}

template <typename T>
void cross_entropy_grad_typed(const CrossEntropyGradArgs& a) {
  using A = compute_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const A* grad = static_cast<const A*>(a.grad);
  const A* lse = static_cast<const A*>(a.lse);
  T* dlogits = static_cast<T*>(a.dlogits);
  const int64_t C = a.classes;
  const std::vector<A> w = class_weights<T>(a.weight, C);
  ConstRow<A> wr(w.data(), C);
  const A W = a.weight_sum != nullptr ? *static_cast<const A*>(a.weight_sum) : static_cast<A>(C);
  const A divisor = a.total_weight != nullptr ? *static_cast<const A*>(a.total_weight) : A(1);
  const A ls = static_cast<A>(a.label_smoothing);
  const A smooth = ls / static_cast<A>(C);
#pragma omp parallel if (a.rows * C > kParallelWork)
  {
    std::vector<float> in_buffer, out_buffer;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      const int64_t t = a.target[r];
      A* out = cpu::result_row(dlogits + r * C, C, out_buffer);
      Row<A> dr(out, C);
      if (t == a.ignore_index || t < 0 || t >= C) {
        dr.setZero();
      } else {
        ConstRow<A> xr(cpu::compute_row(logits + r * C, C, in_buffer), C);
        const A g = grad[a.per_row_grad ? r : 0] / divisor;
        const A nll = (A(1) - ls) * w[t];
        dr = (g * (nll + smooth * W)) * (xr - lse[r]).exp() - (g * smooth) * wr;
        dr[t] -= g * nll;
      }
      cpu::store_result_row(out, dlogits + r * C, C);
    }
  }
}

// ---------------------------------------------------------------- nll loss

template <typename T>
void nll_loss_typed(const NllLossArgs& a) {
  using A = compute_t<T>;
  const T* lp = static_cast<const T*>(a.log_probs);
  A* loss = static_cast<A*>(a.loss);
  A* row_weight = static_cast<A*>(a.row_weight);
  const std::vector<A> w = class_weights<T>(a.weight, a.classes);
  const int64_t rows = a.n * a.inner;
  BadTarget bad;
#pragma omp parallel for if (rows > kParallelWork) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = a.target[r];
    if (t == a.ignore_index || t < 0 || t >= a.classes) {
      if (t != a.ignore_index) bad.record(r);
      loss[r] = row_weight[r] = A(0);
      continue;
    }
    const int64_t n = r / a.inner, i = r % a.inner;
    const A value = static_cast<A>(static_cast<compute_t<T>>(lp[(n * a.classes + t) * a.inner + i]));
    loss[r] = -w[t] * value;
    row_weight[r] = w[t];
  }
  bad.raise("nll_loss", a.target, a.classes, a.ignore_index);
}

template <typename T>
void nll_loss_grad_typed(const NllLossGradArgs& a) {
  using A = compute_t<T>;
  const T* grad = static_cast<const T*>(a.grad);
  T* dlp = static_cast<T*>(a.dlog_probs);
  const std::vector<A> w = class_weights<T>(a.weight, a.classes);
  const A divisor = a.total_weight != nullptr ? *static_cast<const A*>(a.total_weight) : A(1);
  const int64_t rows = a.n * a.inner, total = rows * a.classes;
#pragma omp parallel for if (total > kParallelWork) schedule(static)
  for (int64_t i = 0; i < total; ++i) dlp[i] = T(0);
#pragma omp parallel for if (rows > kParallelWork) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = a.target[r];
    if (t == a.ignore_index || t < 0 || t >= a.classes) continue;
    const int64_t n = r / a.inner, i = r % a.inner;
    const A g = static_cast<A>(static_cast<compute_t<T>>(grad[a.per_row_grad ? r : 0])) / divisor;
    dlp[(n * a.classes + t) * a.inner + i] = T(-w[t] * g);
  }
}

}  // namespace

void softmax_cpu(const SoftmaxArgs& args) {
  if (args.rows * args.cols == 0) return;
  dispatch_floating(args.dtype, args.log ? "log_softmax" : "softmax", [&]<typename T>() { softmax_typed<T>(args); });
}

void softmax_grad_cpu(const SoftmaxGradArgs& args) {
  if (args.rows * args.cols == 0) return;
  dispatch_floating(args.dtype, args.log ? "log_softmax backward" : "softmax backward",
                    [&]<typename T>() { softmax_grad_typed<T>(args); });
}

void cross_entropy_cpu(const CrossEntropyArgs& args) {
  if (args.rows == 0) return;
  dispatch_floating(args.dtype, "cross_entropy", [&]<typename T>() { cross_entropy_typed<T>(args); });
}

void cross_entropy_grad_cpu(const CrossEntropyGradArgs& args) {
  if (args.rows * args.classes == 0) return;
  dispatch_floating(args.dtype, "cross_entropy backward", [&]<typename T>() { cross_entropy_grad_typed<T>(args); });
}

void nll_loss_cpu(const NllLossArgs& args) {
  if (args.n * args.inner == 0) return;
  dispatch_floating(args.dtype, "nll_loss", [&]<typename T>() { nll_loss_typed<T>(args); });
}

void nll_loss_grad_cpu(const NllLossGradArgs& args) {
  if (args.n * args.inner * args.classes == 0) return;
  dispatch_floating(args.dtype, "nll_loss backward", [&]<typename T>() { nll_loss_grad_typed<T>(args); });
}

}  // namespace kiln::kernels
