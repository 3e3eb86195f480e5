// CUDA fused cross-entropy and NLL loss, forward and backward (see
// kernels/softmax.h); the row machinery they share with softmax is
// kernels/cuda/softmax_rows.cuh.
//
// Cross-entropy reads the logits once forward (an online max and sum of exp)
// and once backward. NLL is one thread per element. Out-of-range targets
// (other than ignore_index) give a NaN loss and a zero gradient for that row,
// and their value is stored in *bad_target if given.
#include "kernels/cuda/fast_divide.cuh"
#include "kernels/cuda/softmax_rows.cuh"

namespace kiln::kernels {

using namespace softmax_rows;

namespace {

// ---------------------------------------------------------------- cross entropy

__device__ __forceinline__ void report_bad_target(int64_t* slot, int64_t value) {
  if (slot != nullptr) {
    atomicCAS(reinterpret_cast<unsigned long long*>(slot), static_cast<unsigned long long>(LLONG_MIN),
              static_cast<unsigned long long>(value));
  }
}

// One streaming pass over the logits. The smoothing sum
// sum_c w[c] (lse - x[c]) = sum_c w[c] (m - x[c]) + W (lse - m) is kept as
// sum w (m - x) against the running max m, lifted by (m' - m) sum w when the
// max grows (lift): every term added is >= 0, so there is no cancellation and
// its relative error stays a few ulps times the summation depth, as with the
// row's final max.
template <typename T, int kLanes, bool kSmooth>
__global__ void __launch_bounds__(block_threads<kLanes>) cross_entropy_kernel(CrossEntropyArgs a, bool vec) {
  static_assert(kLanes >= 32, "a group returns early: no sub-warp groups");
  using A = acc_of<T>;
  constexpr int N = kVec<T>;
  constexpr int64_t kStride = int64_t{kLanes} * kUnroll<T>;
  __shared__ RowStats<A> shared[32];
  const int lane = threadIdx.x % kLanes;
  const int64_t r = group_row<kLanes>(), C = a.classes;
  if (r >= a.rows) return;  // whole warps
  const int64_t t = a.target[r];
  A* loss = static_cast<A*>(a.loss);
  A* row_weight = static_cast<A*>(a.row_weight);
  A* lse_out = static_cast<A*>(a.lse);
  if (t == a.ignore_index || t < 0 || t >= C) {  // uniform across the group
    if (lane == 0) {
      const bool ignored = t == a.ignore_index;
      if (!ignored) report_bad_target(a.bad_target, t);
      loss[r] = ignored ? A(0) : quiet_nan<A>();
      row_weight[r] = lse_out[r] = A(0);
    }
    return;
  }
  const T* row = static_cast<const T*>(a.logits) + r * C;
  const T* weight = static_cast<const T*>(a.weight);
  const RowPacks<T> packs(row, C, vec);
  RowStats<A> st{-infinity<A>(), A(0), A(0), A(0)};
#pragma unroll 1
  for (int64_t p = lane; p < packs.count; p += kStride) {
    A x[kUnroll<T>][N], w[kUnroll<T>][N];
    load_chunk<kLanes>(packs, row, p, -infinity<A>(), x);
    if constexpr (kSmooth) {
#pragma unroll
      for (int u = 0; u < kUnroll<T>; ++u) {
        const int64_t c0 = packs.first(p + int64_t{u} * kLanes);
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const int64_t c = c0 + i;
          w[u][i] = c < 0 || c >= C ? A(0) : weight != nullptr ? to_acc(weight[c]) : A(1);
        }
      }
    }
    fold<kSmooth>(st, x, w);
  }
  st = group_reduce<kLanes>(st, Combine<kSmooth>{}, shared);
  if (lane == 0) {
    const A ls = static_cast<A>(a.label_smoothing);
    const A lse = st.m + ::log(st.s);
    const A wt = weight != nullptr ? to_acc(weight[t]) : A(1);
    A value = (A(1) - ls) * wt * (lse - to_acc(row[t]));
    if constexpr (kSmooth) value += ls / static_cast<A>(C) * (st.sw + st.wt * (lse - st.m));
    loss[r] = value;
    row_weight[r] = wt;
    lse_out[r] = lse;
  }
}

// Elementwise given the row's lse: one read of the logits, one write.
template <typename T, int kLanes>
__global__ void __launch_bounds__(block_threads<kLanes>) cross_entropy_grad_kernel(CrossEntropyGradArgs a, bool vec) {
  static_assert(kLanes >= 32, "a group returns early: no sub-warp groups");
  using A = acc_of<T>;
  constexpr int N = kVec<T>;
  constexpr int64_t kStride = int64_t{kLanes} * kUnroll<T>;
  const int lane = threadIdx.x % kLanes;
  const int64_t r = group_row<kLanes>(), C = a.classes;
  if (r >= a.rows) return;
  const int64_t t = a.target[r];
  const T* row = static_cast<const T*>(a.logits) + r * C;
  T* out = static_cast<T*>(a.dlogits) + r * C;
  const RowPacks<T> packs(row, C, vec);
  if (t == a.ignore_index || t < 0 || t >= C) {
    const A zeros[1][N] = {};
#pragma unroll 1
    for (int64_t p = lane; p < packs.count; p += kLanes) packs.template store<kLanes>(out, p, zeros);
    return;
  }
  const T* weight = static_cast<const T*>(a.weight);
  const A lse = static_cast<const A*>(a.lse)[r];
  const A divisor = a.total_weight != nullptr ? *static_cast<const A*>(a.total_weight) : A(1);
  const A W = a.weight_sum != nullptr ? *static_cast<const A*>(a.weight_sum) : static_cast<A>(C);
  const A g = static_cast<const A*>(a.grad)[a.per_row_grad ? r : 0] / divisor;
  const A ls = static_cast<A>(a.label_smoothing);
  const A smooth = ls / static_cast<A>(C);
  const A nll = (A(1) - ls) * (weight != nullptr ? to_acc(weight[t]) : A(1));
  const A scale = g * (nll + smooth * W);
#pragma unroll 1
  for (int64_t p = lane; p < packs.count; p += kStride) {
    A v[kUnroll<T>][N];
    load_chunk<kLanes>(packs, row, p, A(0), v);
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u) {
      const int64_t c0 = packs.first(p + int64_t{u} * kLanes), at = t - c0;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        A w = A(1);
        if (weight != nullptr && c0 + i >= 0 && c0 + i < C) w = to_acc(weight[c0 + i]);
        A d = scale * exp(v[u][i] - lse) - g * smooth * w;
        if (i == at) d -= g * nll;
        v[u][i] = d;
      }
    }
    packs.template store<kLanes>(out, p, v);
  }
}

// ---------------------------------------------------------------- nll loss

template <typename T>
__global__ void nll_loss_kernel(NllLossArgs a) {
  using A = acc_of<T>;
  const int64_t rows = a.n * a.inner;
  const T* lp = static_cast<const T*>(a.log_probs);
  const T* weight = static_cast<const T*>(a.weight);
  A* loss = static_cast<A*>(a.loss);
  A* row_weight = static_cast<A*>(a.row_weight);
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows; r += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = a.target[r];
    if (t == a.ignore_index || t < 0 || t >= a.classes) {
      const bool ignored = t == a.ignore_index;
      if (!ignored) report_bad_target(a.bad_target, t);
      loss[r] = ignored ? A(0) : quiet_nan<A>();
      row_weight[r] = A(0);
      continue;
    }
    const int64_t n = r / a.inner, i = r % a.inner;
    const A w = weight != nullptr ? to_acc(weight[t]) : A(1);
    loss[r] = -w * to_acc(lp[(n * a.classes + t) * a.inner + i]);
    row_weight[r] = w;
  }
}

// One thread per element of dlog_probs; split: its (n, class, inner) coordinates.
template <typename T, typename D>
__global__ void nll_loss_grad_kernel(NllLossGradArgs a, Split3<D> split) {
  using A = acc_of<T>;
  const int64_t total = a.n * a.classes * a.inner;
  const T* weight = static_cast<const T*>(a.weight);
  const T* grad = static_cast<const T*>(a.grad);
  T* out = static_cast<T*>(a.dlog_probs);
  const A divisor = a.total_weight != nullptr ? *static_cast<const A*>(a.total_weight) : A(1);
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t n, c, i;
    split(k, n, c, i);
    const int64_t r = n * a.inner + i;
    const int64_t t = a.target[r];
    A d = A(0);
    if (c == t && t != a.ignore_index) {
      const A w = weight != nullptr ? to_acc(weight[t]) : A(1);
      d = -w * (to_acc(grad[a.per_row_grad ? r : 0]) / divisor);  // the CPU's (and torch's) order: w * (g / total)
    }
    out[k] = from_acc<T>(d);
  }
}

// ---------------------------------------------------------------- launch shapes

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20)); }

// Calls launch.template operator()<kLanes>() with cross-entropy's group for a
// row of `packs`: a warp for up to 8 packs per lane, then blocks of 128 or 512.
template <typename Launch>
void dispatch_loss_lanes(int64_t packs, Launch&& launch) {
  if (packs <= 32 * 8) return launch.template operator()<32>();
  if (packs <= 128 * 16) return launch.template operator()<128>();
  return launch.template operator()<512>();
}

}  // namespace

void cross_entropy_cuda(const CrossEntropyArgs& args, cuda::Stream stream) {
  if (args.rows == 0) return;
  check_rows(args.rows, "cross_entropy");
  dispatch_floating(args.dtype, "cross_entropy", [&]<typename T>() {
    using N = typename Native<T>::type;
    const bool vec = vectorizable<N>({args.logits});
    dispatch_loss_lanes(packs_per_row<N>(args.logits, args.classes, vec), [&]<int kLanes>() {
      const unsigned blocks = blocks_for<kLanes>(args.rows);
      const auto s = static_cast<cudaStream_t>(stream);
      if (args.label_smoothing != 0.0) {
        cross_entropy_kernel<N, kLanes, true><<<blocks, block_threads<kLanes>, 0, s>>>(args, vec);
      } else {
        cross_entropy_kernel<N, kLanes, false><<<blocks, block_threads<kLanes>, 0, s>>>(args, vec);
      }
    });
    cuda::check_last_launch("cross_entropy");
  });
}

void cross_entropy_grad_cuda(const CrossEntropyGradArgs& args, cuda::Stream stream) {
  if (args.rows * args.classes == 0) return;
  check_rows(args.rows, "cross_entropy backward");
  dispatch_floating(args.dtype, "cross_entropy backward", [&]<typename T>() {
    using N = typename Native<T>::type;
    const bool vec = vectorizable<N>({args.logits, args.dlogits});
    dispatch_loss_lanes(packs_per_row<N>(args.logits, args.classes, vec), [&]<int kLanes>() {
      cross_entropy_grad_kernel<N, kLanes><<<blocks_for<kLanes>(args.rows), block_threads<kLanes>, 0,
                                             static_cast<cudaStream_t>(stream)>>>(args, vec);
    });
    cuda::check_last_launch("cross_entropy backward");
  });
}

void nll_loss_cuda(const NllLossArgs& args, cuda::Stream stream) {
  const int64_t rows = args.n * args.inner;
  if (rows == 0) return;
  dispatch_floating(args.dtype, "nll_loss", [&]<typename T>() {
    using N = typename Native<T>::type;
    nll_loss_kernel<N><<<grid_for(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
    cuda::check_last_launch("nll_loss");
  });
}

void nll_loss_grad_cuda(const NllLossGradArgs& args, cuda::Stream stream) {
  const int64_t total = args.n * args.classes * args.inner;
  if (total == 0) return;
  dispatch_floating(args.dtype, "nll_loss backward", [&]<typename T>() {
    using N = typename Native<T>::type;
    dispatch_divider(fast_divide_fits(total), [&]<typename D>() {
      nll_loss_grad_kernel<N, D><<<grid_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          args, split3_for<D>(args.classes, args.inner));
    });
    cuda::check_last_launch("nll_loss backward");
  });
}


}  // namespace kiln::kernels
