// CUDA softmax, log-softmax, fused cross-entropy and NLL loss (see kernels/softmax.h).
//
// Each kernel moves the fewest bytes its math allows: softmax reads x once and
// writes y once, its backward reads y and dy once and writes dx once (the row
// stays in registers between the reduction and the outputs); cross-entropy
// reads the logits once forward (an online max and sum of exp) and once
// backward. Only softmax rows too long for registers (over 32768 float or
// 16384 double columns) read their input twice, the second time mostly from L2.
//
// A row is cut at the 16-byte lines of memory (RowPacks): every pack but the
// first and the last of a row is one 16-byte load or store, whatever the width
// and the row's offset. A group of threads owns a row: 1 to 32 lanes of a warp
// for short rows (several rows per block), the whole block for long ones.
// Reductions are fixed xor-shuffle trees (plus one shared-memory step across a
// block's warps) of commutative combines, so every lane gets the same bits on
// every run. NLL is one thread per element.
// Math in float for f16/bf16/f32, double for f64.
// Out-of-range targets (other than ignore_index) give a NaN loss and a zero
// gradient for that row, and their value is stored in *bad_target if given.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/softmax.h"
#include "kernels/cuda/native_types.cuh"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;        // NLL's blocks
constexpr int kRowBlock = 128;       // block of rows owned by warps or sub-warps
constexpr int kStreamThreads = 512;  // block of a softmax row too long for registers

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements of a 16-byte pack

// Packs per thread that the streaming loops load at once: 32 or 64 bytes in
// flight per thread and buffer (plenty: Little's law asks ~16 KB per SM), and
// 8 to 16 values in registers.
template <typename T>
constexpr int kUnroll = sizeof(T) == 4 ? 4 : 2;

// Row elements a thread keeps in registers in softmax forward: 32 floats or 16
// doubles (32 registers); the backward holds two rows (y and dy) in half as many.
template <typename T>
constexpr int kRegisterPacks = (std::is_same_v<T, double> ? 16 : 32) / kVec<T>;

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

// The shift of exp(x - base) for a set whose max is m: m, or 0 when m is -inf.
// Then every x is -inf (masked, or past the row's end: exp gives exactly 0
// instead of exp(-inf + inf) = NaN) or NaN (which stays NaN), and no select
// per element is needed.
template <typename A>
__device__ __forceinline__ A exp_base(A m) {
  return m == neg_infinity<A>() ? A(0) : m;
}

// ---------------------------------------------------------------- row packs

template <typename T>
struct alignas(16) Line {
  T e[kVec<T>];
};

// A line moves as one uint4. Stores go through __stwb (a plain write-back
// store): a Line or uint4 stored directly comes out as element stores where the
// branch beside it (a row's edge) stores the same elements.
template <typename To, typename From>
__device__ __forceinline__ To bit_copy(From from) {  // by value: one 16-byte load
  static_assert(sizeof(To) == sizeof(From));
  To to;
  memcpy(&to, &from, sizeof to);
  return to;
}

// A row of `cols` elements seen as 16-byte packs of memory: pack p holds columns
// [p * N - head, p * N - head + N), head being the row start's offset (in
// elements) within its 16-byte line, so all packs but the first and the last
// are whole lines. Columns outside the row read as `fill` and are never touched.
// Without vectors (the buffers' rows start at different offsets within their
// lines) head is 0 and packs are read element by element. A group with no row
// (past the last) sees cols == 0: no packs.
template <typename T>
struct RowPacks {
  static constexpr int N = kVec<T>;
  int64_t cols, head, count;
  bool vec;

  __device__ RowPacks(const T* row, int64_t cols_, bool vec_) : cols(cols_), vec(vec_) {
    head = vec ? static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) / sizeof(T) % N) : 0;
    count = cols == 0 ? 0 : (head + cols + N - 1) / N;
  }
  __device__ int64_t first(int64_t p) const { return p * N - head; }
  __device__ bool whole(int64_t c0) const { return vec && c0 >= 0 && c0 + N <= cols; }

  template <typename A>
  __device__ void load(const T* row, int64_t p, A fill, A (&v)[N]) const {
    const int64_t c0 = first(p);
    if (whole(c0)) {
      const auto line = bit_copy<Line<T>>(*reinterpret_cast<const uint4*>(row + c0));
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = to_acc(line.e[i]);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = c0 + i >= 0 && c0 + i < cols ? to_acc(row[c0 + i]) : fill;
    }
  }

  // Packs p, p + kStride, ... (a thread's packs of a register row, or a chunk).
  template <int kStride, int kCount, typename A>
  __device__ void store(T* row, int64_t p, const A (&v)[kCount][N]) const {
#pragma unroll
    for (int k = 0; k < kCount; ++k) {
      const int64_t c0 = first(p + int64_t{k} * kStride);
      if (whole(c0)) {
        Line<T> line;
#pragma unroll
        for (int i = 0; i < N; ++i) line.e[i] = from_acc<T>(v[k][i]);
        __stwb(reinterpret_cast<uint4*>(row + c0), bit_copy<uint4>(line));
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          if (c0 + i >= 0 && c0 + i < cols) row[c0 + i] = from_acc<T>(v[k][i]);
        }
      }
    }
  }
};

// Loads this thread's kUnroll<T> packs p, p + kLanes, ... of a row (a streaming
// loop's step: the loads are issued together, kUnroll<T> lines in flight).
template <int kLanes, typename T, typename A>
__device__ __forceinline__ void load_chunk(const RowPacks<T>& packs, const T* row, int64_t p, A fill,
                                           A (&v)[kUnroll<T>][kVec<T>]) {
#pragma unroll
  for (int u = 0; u < kUnroll<T>; ++u) packs.load(row, p + int64_t{u} * kLanes, fill, v[u]);
}

// ---------------------------------------------------------------- groups and reductions

// kLanes threads own a row: an aligned part of a warp (kLanes <= 32; kRowBlock /
// kLanes rows per block) or the whole block (kLanes == blockDim.x).
template <int kLanes>
constexpr int block_threads = kLanes > 32 ? kLanes : kRowBlock;

template <int kLanes>
__device__ __forceinline__ int64_t group_row() {
  if constexpr (kLanes > 32) return blockIdx.x;
  return int64_t{blockIdx.x} * (kRowBlock / kLanes) + threadIdx.x / kLanes;
}

// Online softmax statistics of a set of columns: m = max, s = sum exp(x - m),
// and for label smoothing sw = sum w (m - x) and wt = sum w.
template <typename A>
struct RowStats {
  A m, s, sw, wt;
};

template <typename A>
__device__ __forceinline__ A shfl_xor(A v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}

template <typename A>
__device__ __forceinline__ RowStats<A> shfl_xor(const RowStats<A>& v, int offset) {
  return {shfl_xor(v.m, offset), shfl_xor(v.s, offset), shfl_xor(v.sw, offset), shfl_xor(v.wt, offset)};
}

struct Max {
  template <typename A>
  __device__ A operator()(A a, A b) const { return fmax(a, b); }
};

struct Sum {
  template <typename A>
  __device__ A operator()(A a, A b) const { return a + b; }
};

// s (a sum of exp(x - from)) as a sum of exp(x - to), to >= from.
template <typename A>
__device__ __forceinline__ A rescale(A s, A from, A to) {
  return s == A(0) ? A(0) : s * exp(from - to);
}

// sw (a sum of w (from - x)) as a sum of w (to - x): adds (to - from) * wt,
// a term >= 0 like sw's own (weights are >= 0), so the sum never cancels.
// Nothing to add when the max stays (also at -inf) or the set is empty.
template <typename A>
__device__ __forceinline__ A lift(A sw, A wt, A from, A to) {
  return sw + (wt == A(0) || to == from ? A(0) : (to - from) * wt);
}

template <bool kSmooth>
struct Combine {
  template <typename A>
  __device__ RowStats<A> operator()(const RowStats<A>& a, const RowStats<A>& b) const {
    const A m = fmax(a.m, b.m);
    RowStats<A> r{m, rescale(a.s, a.m, m) + rescale(b.s, b.m, m), A(0), A(0)};
    if constexpr (kSmooth) {
      r.sw = lift(a.sw, a.wt, a.m, m) + lift(b.sw, b.wt, b.m, m);
      r.wt = a.wt + b.wt;
    }
    return r;
  }
};

// Reduces v over the group with a commutative `op`; every lane gets the same
// result. A block-wide group uses `shared` (32 values), which the caller does
// not use again: each reduction of a kernel has its own.
template <int kLanes, typename V, typename Op>
__device__ __forceinline__ V group_reduce(V v, Op op, V* shared) {
#pragma unroll
  for (int offset = (kLanes < 32 ? kLanes : 32) / 2; offset > 0; offset /= 2) v = op(v, shfl_xor(v, offset));
  if constexpr (kLanes > 32) {
    constexpr int kWarps = kLanes / 32;
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    // Every warp reduces the warps' values the same way: no second barrier.
    v = shared[threadIdx.x % kWarps];
#pragma unroll
    for (int offset = kWarps / 2; offset > 0; offset /= 2) v = op(v, shfl_xor(v, offset));
  }
  return v;
}

// Folds a chunk of columns (x past the row's end is -inf, its w 0) into the
// running stats: the new max first, so that exp runs once per element and the
// running sums are rescaled once per chunk.
template <bool kSmooth, typename A, int kU, int kN>
__device__ __forceinline__ void fold(RowStats<A>& st, const A (&x)[kU][kN], const A (&w)[kU][kN]) {
  A m = st.m;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
#pragma unroll
    for (int i = 0; i < kN; ++i) m = fmax(m, x[u][i]);
  }
  st.s = rescale(st.s, st.m, m);
  if constexpr (kSmooth) st.sw = lift(st.sw, st.wt, st.m, m);
  st.m = m;
  const A base = exp_base(m);
#pragma unroll
  for (int u = 0; u < kU; ++u) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      st.s += exp(x[u][i] - base);
      if constexpr (kSmooth) {
        // w (m - x) >= 0. A -inf logit adds +inf (as w (m - x) with the row's max
        // does) even while this chunk's m is -inf too.
        const A gap = x[u][i] == neg_infinity<A>() ? -neg_infinity<A>() : m - x[u][i];
        st.sw += w[u][i] == A(0) ? A(0) : w[u][i] * gap;
        st.wt += w[u][i];
      }
    }
  }
}

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
  A m = neg_infinity<A>();
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    packs.load(x + offset, k * kLanes + lane, neg_infinity<A>(), v[k]);
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
  RowStats<A> st{neg_infinity<A>(), A(0), A(0), A(0)};
#pragma unroll 1
  for (int64_t p = threadIdx.x; p < packs.count; p += kStride) {
    A v[kUnroll<T>][N];
    load_chunk<kStreamThreads>(packs, row, p, neg_infinity<A>(), v);
    fold<false>(st, v, v);
  }
  st = group_reduce<kStreamThreads>(st, Combine<false>{}, shared);
  const A shift = log ? st.m + ::log(st.s) : exp_base(st.m), scale = log ? A(1) : A(1) / st.s;
#pragma unroll 1
  for (int64_t p = threadIdx.x; p < packs.count; p += kStride) {
    A v[kUnroll<T>][N];
    load_chunk<kStreamThreads>(packs, row, p, neg_infinity<A>(), v);
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
      loss[r] = ignored ? A(0) : nan_value<A>();
      row_weight[r] = lse_out[r] = A(0);
    }
    return;
  }
  const T* row = static_cast<const T*>(a.logits) + r * C;
  const T* weight = static_cast<const T*>(a.weight);
  const RowPacks<T> packs(row, C, vec);
  RowStats<A> st{neg_infinity<A>(), A(0), A(0), A(0)};
#pragma unroll 1
  for (int64_t p = lane; p < packs.count; p += kStride) {
    A x[kUnroll<T>][N], w[kUnroll<T>][N];
    load_chunk<kLanes>(packs, row, p, neg_infinity<A>(), x);
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
  const A g = to_acc(static_cast<const T*>(a.grad)[a.per_row_grad ? r : 0]) / divisor;
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
    out[k] = from_acc<T>(d);
  }
}

// ---------------------------------------------------------------- launch shapes

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20)); }

void check_rows(int64_t rows, const char* op) {
  KILN_CHECK(rows <= INT32_MAX, op, ": ", rows, " rows exceed one launch (at most ", INT32_MAX, ")");
}

// 16-byte packs need every buffer's rows to start at the same offset within a line.
template <typename T>
bool vectorizable(std::initializer_list<const void*> buffers) {
  const auto line = reinterpret_cast<uintptr_t>(*buffers.begin()) % 16;
  return std::all_of(buffers.begin(), buffers.end(), [&](const void* b) {
    const auto at = reinterpret_cast<uintptr_t>(b);
    return at % sizeof(T) == 0 && at % 16 == line;
  });
}

// Packs in the longest row (RowPacks): one more than cols / N rounded up when
// some row starts inside a line.
template <typename T>
int64_t packs_per_row(const void* base, int64_t cols, bool vec) {
  const int64_t n = kVec<T>;
  const bool lined = !vec || (reinterpret_cast<uintptr_t>(base) % 16 == 0 && cols % n == 0);
  return (cols + n - 1) / n + (lined ? 0 : 1);
}

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

template <int kLanes>
unsigned blocks_for(int64_t rows) {
  constexpr int64_t per_block = kLanes > 32 ? 1 : kRowBlock / kLanes;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

// Calls launch.template operator()<kLanes>() with cross-entropy's group for a
// row of `packs`: a warp for up to 8 packs per lane, then blocks of 128 or 512.
template <typename Launch>
void dispatch_loss_lanes(int64_t packs, Launch&& launch) {
  if (packs <= 32 * 8) return launch.template operator()<32>();
  if (packs <= 128 * 16) return launch.template operator()<128>();
  return launch.template operator()<512>();
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
    nll_loss_grad_kernel<N><<<grid_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
    cuda::check_last_launch("nll_loss backward");
  });
}

}  // namespace kiln::kernels
