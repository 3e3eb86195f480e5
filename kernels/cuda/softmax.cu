// CUDA softmax and log-softmax, forward and backward (see kernels/softmax.h);
// the row machinery they share with cross-entropy is kernels/cuda/softmax_rows.cuh.
//
// Each kernel moves the fewest bytes its math allows: softmax reads x once and
// writes y once, its backward reads y and dy once and writes dx once (the row
// stays in registers between the reduction and the outputs). Only rows too long
// for registers (over 32768 float or 16384 double columns) read their input
// twice, the second time mostly from L2.
#include "kernels/cuda/softmax_rows.cuh"

namespace kiln::kernels {

using namespace softmax_rows;

namespace {

// ---------------------------------------------------------------- softmax

// Rows of up to kLanes * kPacks packs, held in registers: one read of x, one write of y.
template <typename T, int kLanes, int kPacks>
__global__ void __launch_bounds__(block_threads<kLanes>)
    softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, bool vec, bool log) {
  using A = acc_of<T>;
  constexpr int N = kVec<T>;
  __shared__ A shared_max[32], shared_sum[32];
  const int lane = threadIdx.x % kLanes;
  const int64_t r = group_row<kLanes>();
  const int64_t offset = (r < rows ? r : 0) * cols;  // a group past the last row has no packs
  const RowPacks<T> packs(x + offset, r < rows ? cols : 0, vec);
  A v[kPacks][N];
  A m = -infinity<A>();
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    packs.load(x + offset, k * kLanes + lane, -infinity<A>(), v[k]);
#pragma unroll
    for (int i = 0; i < N; ++i) m = fmax(m, v[k][i]);
  }
  m = group_reduce<kLanes>(m, Max{}, shared_max);
  const A base = exp_base(m);
  A s = A(0);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const A e = exp(v[k][i] - base);
      s += e;
      if (!log) v[k][i] = e;
    }
  }
  s = group_reduce<kLanes>(s, Sum{}, shared_sum);
  const A shift = log ? m + ::log(s) : A(0), scale = log ? A(1) : A(1) / s;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[k][i] = log ? v[k][i] - shift : v[k][i] * scale;
  }
  packs.template store<kLanes>(y + offset, lane, v);
}

// Rows too long for registers, one per block: an online max/sum pass, then the outputs.
template <typename T>
__global__ void __launch_bounds__(kStreamThreads)
    softmax_long_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols, bool vec, bool log) {
  using A = acc_of<T>;
  constexpr int N = kVec<T>;
  constexpr int64_t kStride = int64_t{kStreamThreads} * kUnroll<T>;
  __shared__ RowStats<A> shared[32];
  const T* row = x + int64_t{blockIdx.x} * cols;
  T* out = y + int64_t{blockIdx.x} * cols;
  const RowPacks<T> packs(row, cols, vec);
  RowStats<A> st{-infinity<A>(), A(0), A(0), A(0)};
#pragma unroll 1
  for (int64_t p = threadIdx.x; p < packs.count; p += kStride) {
    A v[kUnroll<T>][N];
    load_chunk<kStreamThreads>(packs, row, p, -infinity<A>(), v);
    fold<false>(st, v, v);
  }
  st = group_reduce<kStreamThreads>(st, Combine<false>{}, shared);
  const A shift = log ? st.m + ::log(st.s) : exp_base(st.m), scale = log ? A(1) : A(1) / st.s;
#pragma unroll 1
  for (int64_t p = threadIdx.x; p < packs.count; p += kStride) {
    A v[kUnroll<T>][N];
    load_chunk<kStreamThreads>(packs, row, p, -infinity<A>(), v);
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[u][i] = log ? v[u][i] - shift : exp(v[u][i] - shift) * scale;
    }
    packs.template store<kStreamThreads>(out, p, v);
  }
}

// softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
template <typename A>
__device__ __forceinline__ A softmax_grad_of(A y, A g, A total, bool log) {
  return log ? g - exp(y) * total : y * (g - total);
}

template <typename T, int kLanes, int kPacks>
__global__ void __launch_bounds__(block_threads<kLanes>)
    softmax_grad_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                        int64_t cols, bool vec, bool log) {
  using A = acc_of<T>;
  constexpr int N = kVec<T>;
  __shared__ A shared[32];
  const int lane = threadIdx.x % kLanes;
  const int64_t r = group_row<kLanes>();
  const int64_t offset = (r < rows ? r : 0) * cols;
  const RowPacks<T> packs(y + offset, r < rows ? cols : 0, vec);
  A yv[kPacks][N], gv[kPacks][N];
  A partial = A(0);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) packs.load(y + offset, k * kLanes + lane, A(0), yv[k]);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) packs.load(dy + offset, k * kLanes + lane, A(0), gv[k]);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int i = 0; i < N; ++i) partial += log ? gv[k][i] : gv[k][i] * yv[k][i];
  }
  const A total = group_reduce<kLanes>(partial, Sum{}, shared);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int i = 0; i < N; ++i) gv[k][i] = softmax_grad_of(yv[k][i], gv[k][i], total, log);
  }
  packs.template store<kLanes>(dx + offset, lane, gv);
}

template <typename T>
__global__ void __launch_bounds__(kStreamThreads)
    softmax_grad_long_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t cols,
                             bool vec, bool log) {
  using A = acc_of<T>;
  constexpr int N = kVec<T>;
  constexpr int64_t kStride = int64_t{kStreamThreads} * kUnroll<T>;
  __shared__ A shared[32];
  const int64_t offset = int64_t{blockIdx.x} * cols;
  const RowPacks<T> packs(y + offset, cols, vec);
  A partial = A(0);
#pragma unroll 1
  for (int64_t p = threadIdx.x; p < packs.count; p += kStride) {
    A yv[kUnroll<T>][N], gv[kUnroll<T>][N];
    if (!log) load_chunk<kStreamThreads>(packs, y + offset, p, A(0), yv);
    load_chunk<kStreamThreads>(packs, dy + offset, p, A(0), gv);
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u) {
#pragma unroll
      for (int i = 0; i < N; ++i) partial += log ? gv[u][i] : gv[u][i] * yv[u][i];
    }
  }
  const A total = group_reduce<kStreamThreads>(partial, Sum{}, shared);
#pragma unroll 1
  for (int64_t p = threadIdx.x; p < packs.count; p += kStride) {
    A yv[kUnroll<T>][N], gv[kUnroll<T>][N];
    load_chunk<kStreamThreads>(packs, y + offset, p, A(0), yv);
    load_chunk<kStreamThreads>(packs, dy + offset, p, A(0), gv);
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u) {
#pragma unroll
      for (int i = 0; i < N; ++i) gv[u][i] = softmax_grad_of(yv[u][i], gv[u][i], total, log);
    }
    packs.template store<kStreamThreads>(dx + offset, p, gv);
  }
}

// ---------------------------------------------------------------- launch shapes

int pow2_at_least(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Threads per row and packs per thread for rows held in registers (at most
// max_packs per thread); lanes 0 when a row does not fit in 1024 threads.
struct RowShape {
  int lanes, packs;
};

RowShape register_shape(int64_t packs, int max_packs) {
  if (packs <= 32) return {pow2_at_least(packs), 1};
  if (packs <= 32 * int64_t{max_packs}) return {32, pow2_at_least((packs + 31) / 32)};
  if (packs <= 1024 * int64_t{max_packs}) return {pow2_at_least((packs + max_packs - 1) / max_packs), max_packs};
  return {0, 0};
}

// Calls launch.template operator()<kLanes, kPacks>() for a shape from register_shape.
template <int kMaxPacks, typename Launch>
void dispatch_shape(RowShape shape, Launch&& launch) {
  switch (shape.lanes) {
    case 1: return launch.template operator()<1, 1>();
    case 2: return launch.template operator()<2, 1>();
    case 4: return launch.template operator()<4, 1>();
    case 8: return launch.template operator()<8, 1>();
    case 16: return launch.template operator()<16, 1>();
    case 32:
      if (shape.packs == 1) return launch.template operator()<32, 1>();
      if (shape.packs == 2) return launch.template operator()<32, 2>();
      if constexpr (kMaxPacks >= 4) {
        if (shape.packs == 4) return launch.template operator()<32, 4>();
      }
      if constexpr (kMaxPacks >= 8) {
        if (shape.packs == 8) return launch.template operator()<32, 8>();
      }
      break;
    case 64: return launch.template operator()<64, kMaxPacks>();
    case 128: return launch.template operator()<128, kMaxPacks>();
    case 256: return launch.template operator()<256, kMaxPacks>();
    case 512: return launch.template operator()<512, kMaxPacks>();
    case 1024: return launch.template operator()<1024, kMaxPacks>();
    default: break;
  }
  KILN_ASSERT(false, "no softmax kernel for ", shape.lanes, " lanes x ", shape.packs, " packs");
}

}  // namespace

void softmax_cuda(const SoftmaxArgs& args, cuda::Stream stream) {
  if (args.rows * args.cols == 0) return;
  const char* op = args.log ? "log_softmax" : "softmax";
  check_rows(args.rows, op);
  dispatch_floating(args.dtype, op, [&]<typename T>() {
    using N = typename Native<T>::type;
    const auto* x = static_cast<const N*>(args.x);
    auto* y = static_cast<N*>(args.y);
    const auto s = static_cast<cudaStream_t>(stream);
    const bool vec = vectorizable<N>({x, y});
    const RowShape shape = register_shape(packs_per_row<N>(x, args.cols, vec), kRegisterPacks<N>);
    if (shape.lanes == 0) {
      softmax_long_kernel<N><<<static_cast<unsigned>(args.rows), kStreamThreads, 0, s>>>(x, y, args.cols, vec, args.log);
    } else {
      dispatch_shape<kRegisterPacks<N>>(shape, [&]<int kLanes, int kPacks>() {
        softmax_kernel<N, kLanes, kPacks><<<blocks_for<kLanes>(args.rows), block_threads<kLanes>, 0, s>>>(
            x, y, args.rows, args.cols, vec, args.log);
      });
    }
    cuda::check_last_launch(op);
  });
}

void softmax_grad_cuda(const SoftmaxGradArgs& args, cuda::Stream stream) {
  if (args.rows * args.cols == 0) return;
  const char* op = args.log ? "log_softmax backward" : "softmax backward";
  check_rows(args.rows, op);
  dispatch_floating(args.dtype, op, [&]<typename T>() {
    using N = typename Native<T>::type;
    const auto* y = static_cast<const N*>(args.y);
    const auto* dy = static_cast<const N*>(args.dy);
    auto* dx = static_cast<N*>(args.dx);
    const auto s = static_cast<cudaStream_t>(stream);
    const bool vec = vectorizable<N>({y, dy, dx});
    constexpr int kMaxPacks = kRegisterPacks<N> / 2;
    const RowShape shape = register_shape(packs_per_row<N>(y, args.cols, vec), kMaxPacks);
    if (shape.lanes == 0) {
      softmax_grad_long_kernel<N><<<static_cast<unsigned>(args.rows), kStreamThreads, 0, s>>>(y, dy, dx, args.cols,
                                                                                              vec, args.log);
    } else {
      dispatch_shape<kMaxPacks>(shape, [&]<int kLanes, int kPacks>() {
        softmax_grad_kernel<N, kLanes, kPacks><<<blocks_for<kLanes>(args.rows), block_threads<kLanes>, 0, s>>>(
            y, dy, dx, args.rows, args.cols, vec, args.log);
      });
    }
    cuda::check_last_launch(op);
  });
}

}  // namespace kiln::kernels
