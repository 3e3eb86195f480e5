// CUDA softmax, log-softmax, fused cross-entropy and NLL loss (see kernels/softmax.h).
//
// One block per row for softmax and cross-entropy: each thread folds a strided
// slice of the row (online max and sum of exp for softmax), then the block
// combines thread partials with xor-shuffles and one shared-memory step: a
// fixed tree, so results are the same bits on every run. A second sweep of
// the row (from L1/L2) writes the outputs. NLL is one thread per element.
// Math in float for f16/bf16/f32, double for f64.
// Out-of-range targets (other than ignore_index) give a NaN loss and a zero
// gradient for that row, and their value is stored in *bad_target if given.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/softmax.h"
#include "kernels/cuda/native_types.cuh"

namespace kiln::kernels {

namespace {

constexpr int kMaxThreads = 512;
constexpr int kThreads = 256;

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;


template <typename T>
__device__ __forceinline__ T store(acc_of<T> value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(value);
  } else {
    return value;
  }
}

template <typename A>
__device__ __forceinline__ A neg_infinity() {
  if constexpr (std::is_same_v<A, double>) {
    return -__longlong_as_double(0x7ff0000000000000LL);
  } else {
    return -__int_as_float(0x7f800000);
  }
}

template <typename A>
__device__ __forceinline__ A nan_value() {
  if constexpr (std::is_same_v<A, double>) {
    return __longlong_as_double(0x7ff8000000000000LL);
  } else {
    return __int_as_float(0x7fc00000);
  }
}

// Block size for a row of `cols`: a power of two in [32, kMaxThreads].
int threads_for(int64_t cols) {
  int threads = 32;
  while (threads < cols && threads < kMaxThreads) threads *= 2;
  return threads;
}

// ---------------------------------------------------------------- block reductions

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum (or max) over the block; every thread gets the result. `shared` holds 32 values.
template <bool kMax, typename A>
__device__ A block_reduce(A v, A* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < warps ? shared[lane] : (kMax ? neg_infinity<A>() : A(0));
    w = kMax ? warp_max(w) : warp_sum(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  const A result = shared[0];
  __syncthreads();  // shared may be reused right after
  return result;
}

// Online (max, sum of exp(x - max)) pairs.
template <typename A>
struct MaxSum {
  A m;
  A s;
};

template <typename A>
__device__ __forceinline__ A rescale(A s, A from, A to) {
  return s == A(0) ? A(0) : s * exp(from - to);
}

template <typename A>
__device__ __forceinline__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  const A m = fmax(a.m, b.m);
  return {m, rescale(a.s, a.m, m) + rescale(b.s, b.m, m)};
}

template <typename A>
__device__ __forceinline__ void fold(MaxSum<A>& acc, A x) {
  if (x > acc.m) {
    acc.s = rescale(acc.s, acc.m, x) + A(1);
    acc.m = x;
  } else if (!(x == neg_infinity<A>())) {
    acc.s += exp(x - acc.m);  // NaN x propagates into the sum
  }
}

template <typename A>
__device__ MaxSum<A> block_max_sum(MaxSum<A> v, A* shared_m, A* shared_s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    v = combine(v, MaxSum<A>{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)});
  }
  if (lane == 0) {
    shared_m[warp] = v.m;
    shared_s[warp] = v.s;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum<A> w = lane < warps ? MaxSum<A>{shared_m[lane], shared_s[lane]} : MaxSum<A>{neg_infinity<A>(), A(0)};
    for (int offset = 16; offset > 0; offset /= 2) {
      w = combine(w, MaxSum<A>{__shfl_xor_sync(0xffffffffu, w.m, offset), __shfl_xor_sync(0xffffffffu, w.s, offset)});
    }
    if (lane == 0) {
      shared_m[0] = w.m;
      shared_s[0] = w.s;
    }
  }
  __syncthreads();
  return {shared_m[0], shared_s[0]};
}

// ---------------------------------------------------------------- softmax

template <typename T>
__global__ void softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols, bool log) {
  using A = acc_of<T>;
  __shared__ A shared_m[32], shared_s[32];
  const T* row = x + blockIdx.x * cols;
  T* out = y + blockIdx.x * cols;
  MaxSum<A> acc{neg_infinity<A>(), A(0)};
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) fold(acc, to_acc(row[c]));
  const MaxSum<A> total = block_max_sum(acc, shared_m, shared_s);
  if (log) {
    const A lse = total.m + ::log(total.s);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = store<T>(to_acc(row[c]) - lse);
  } else {
    const A inv = A(1) / total.s;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = store<T>(exp(to_acc(row[c]) - total.m) * inv);
  }
}

template <typename T>
__global__ void softmax_grad_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                    int64_t cols, bool log) {
  using A = acc_of<T>;
  __shared__ A shared[32];
  const int64_t base = blockIdx.x * cols;
  A partial = A(0);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    partial += log ? to_acc(dy[base + c]) : to_acc(dy[base + c]) * to_acc(y[base + c]);
  }
  const A total = block_reduce<false>(partial, shared);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A yv = to_acc(y[base + c]), g = to_acc(dy[base + c]);
    dx[base + c] = store<T>(log ? g - exp(yv) * total : yv * (g - total));
  }
}

// ---------------------------------------------------------------- cross entropy

__device__ __forceinline__ void report_bad_target(int64_t* slot, int64_t value) {
  if (slot != nullptr) {
    atomicCAS(reinterpret_cast<unsigned long long*>(slot), static_cast<unsigned long long>(LLONG_MIN),
              static_cast<unsigned long long>(value));
  }
}

template <typename T>
__global__ void cross_entropy_kernel(CrossEntropyArgs a) {
  using A = acc_of<T>;
  __shared__ A shared[32];
  const int64_t r = blockIdx.x, C = a.classes;
  const int64_t t = a.target[r];
  A* loss = static_cast<A*>(a.loss);
  A* row_weight = static_cast<A*>(a.row_weight);
  A* lse_out = static_cast<A*>(a.lse);
  if (t == a.ignore_index || t < 0 || t >= C) {  // uniform across the block
    if (threadIdx.x == 0) {
      const bool ignored = t == a.ignore_index;
      if (!ignored) report_bad_target(a.bad_target, t);
      loss[r] = ignored ? A(0) : nan_value<A>();
      row_weight[r] = lse_out[r] = A(0);
    }
    return;
  }
  const T* row = static_cast<const T*>(a.logits) + r * C;
  const T* weight = static_cast<const T*>(a.weight);
  A m = neg_infinity<A>();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = fmax(m, to_acc(row[c]));
  m = block_reduce<true>(m, shared);
  const A ls = static_cast<A>(a.label_smoothing);
  A s = A(0), smooth = A(0), weight_total = A(0);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A x = to_acc(row[c]);
    s += exp(x - m);
    if (ls != A(0)) {
      const A w = weight != nullptr ? to_acc(weight[c]) : A(1);
      smooth += w * (m - x);  // every term >= 0: no cancellation
      weight_total += w;
    }
  }
  s = block_reduce<false>(s, shared);
  if (ls != A(0)) {
    smooth = block_reduce<false>(smooth, shared);
    weight_total = block_reduce<false>(weight_total, shared);
  }
  if (threadIdx.x == 0) {
    const A lse = m + ::log(s);
    const A wt = weight != nullptr ? to_acc(weight[t]) : A(1);
    A value = (A(1) - ls) * wt * (lse - to_acc(row[t]));
    if (ls != A(0)) value += ls / static_cast<A>(C) * (smooth + weight_total * (lse - m));
    loss[r] = value;
    row_weight[r] = wt;
    lse_out[r] = lse;
  }
}

template <typename T>
__global__ void cross_entropy_grad_kernel(CrossEntropyGradArgs a) {
  using A = acc_of<T>;
  const int64_t r = blockIdx.x, C = a.classes;
  const int64_t t = a.target[r];
  T* out = static_cast<T*>(a.dlogits) + r * C;
  if (t == a.ignore_index || t < 0 || t >= C) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[c] = store<T>(A(0));
    return;
  }
  const T* row = static_cast<const T*>(a.logits) + r * C;
  const T* weight = static_cast<const T*>(a.weight);
  const A lse = static_cast<const A*>(a.lse)[r];
  const A divisor = a.total_weight != nullptr ? *static_cast<const A*>(a.total_weight) : A(1);
  const A W = a.weight_sum != nullptr ? *static_cast<const A*>(a.weight_sum) : static_cast<A>(C);
  const A g = to_acc(static_cast<const T*>(a.grad)[a.per_row_grad ? r : 0]) / divisor;
  const A ls = static_cast<A>(a.label_smoothing);
  const A smooth = ls / static_cast<A>(C);
  const A nll = (A(1) - ls) * (weight != nullptr ? to_acc(weight[t]) : A(1));
  const A scale = g * (nll + smooth * W);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A w = weight != nullptr ? to_acc(weight[c]) : A(1);
    A d = scale * exp(to_acc(row[c]) - lse) - g * smooth * w;
    if (c == t) d -= g * nll;
    out[c] = store<T>(d);
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
      loss[r] = ignored ? A(0) : nan_value<A>();
      row_weight[r] = A(0);
      continue;
    }
    const int64_t n = r / a.inner, i = r % a.inner;
    const A w = weight != nullptr ? to_acc(weight[t]) : A(1);
    loss[r] = -w * to_acc(lp[(n * a.classes + t) * a.inner + i]);
    row_weight[r] = w;
  }
}

template <typename T>
__global__ void nll_loss_grad_kernel(NllLossGradArgs a) {
  using A = acc_of<T>;
  const int64_t total = a.n * a.classes * a.inner;
  const T* weight = static_cast<const T*>(a.weight);
  const T* grad = static_cast<const T*>(a.grad);
  T* out = static_cast<T*>(a.dlog_probs);
  const A divisor = a.total_weight != nullptr ? *static_cast<const A*>(a.total_weight) : A(1);
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k % a.inner, c = (k / a.inner) % a.classes, n = k / (a.inner * a.classes);
    const int64_t r = n * a.inner + i;
    const int64_t t = a.target[r];
    A d = A(0);
    if (c == t && t != a.ignore_index) {
      const A w = weight != nullptr ? to_acc(weight[t]) : A(1);
      d = -w * to_acc(grad[a.per_row_grad ? r : 0]) / divisor;
    }
    out[k] = store<T>(d);
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20)); }

void check_rows(int64_t rows, const char* op) {
  KILN_CHECK(rows <= INT32_MAX, op, ": ", rows, " rows exceed one launch (at most ", INT32_MAX, ")");
}

}  // namespace

void softmax_cuda(const SoftmaxArgs& args, cuda::Stream stream) {
  if (args.rows * args.cols == 0) return;
  const char* op = args.log ? "log_softmax" : "softmax";
  check_rows(args.rows, op);
  dispatch_floating(args.dtype, op, [&]<typename T>() {
    using N = typename Native<T>::type;
    softmax_kernel<N><<<static_cast<unsigned>(args.rows), threads_for(args.cols), 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const N*>(args.x), static_cast<N*>(args.y), args.cols, args.log);
    cuda::check_last_launch(op);
  });
}

void softmax_grad_cuda(const SoftmaxGradArgs& args, cuda::Stream stream) {
  if (args.rows * args.cols == 0) return;
  const char* op = args.log ? "log_softmax backward" : "softmax backward";
  check_rows(args.rows, op);
  dispatch_floating(args.dtype, op, [&]<typename T>() {
    using N = typename Native<T>::type;
    softmax_grad_kernel<N><<<static_cast<unsigned>(args.rows), threads_for(args.cols), 0,
                             static_cast<cudaStream_t>(stream)>>>(static_cast<const N*>(args.y),
                                                                  static_cast<const N*>(args.dy),
                                                                  static_cast<N*>(args.dx), args.cols, args.log);
    cuda::check_last_launch(op);
  });
}

void cross_entropy_cuda(const CrossEntropyArgs& args, cuda::Stream stream) {
  if (args.rows == 0) return;
  check_rows(args.rows, "cross_entropy");
  dispatch_floating(args.dtype, "cross_entropy", [&]<typename T>() {
    using N = typename Native<T>::type;
    cross_entropy_kernel<N><<<static_cast<unsigned>(args.rows), threads_for(args.classes), 0,
                              static_cast<cudaStream_t>(stream)>>>(args);
    cuda::check_last_launch("cross_entropy");
  });
}

void cross_entropy_grad_cuda(const CrossEntropyGradArgs& args, cuda::Stream stream) {
  if (args.rows * args.classes == 0) return;
  check_rows(args.rows, "cross_entropy backward");
  dispatch_floating(args.dtype, "cross_entropy backward", [&]<typename T>() {
    using N = typename Native<T>::type;
    cross_entropy_grad_kernel<N><<<static_cast<unsigned>(args.rows), threads_for(args.classes), 0,
                                   static_cast<cudaStream_t>(stream)>>>(args);
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
    nll_loss_grad_kernel<N><<<grid_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
    cuda::check_last_launch("nll_loss backward");
  });
}

}  // namespace kiln::kernels
