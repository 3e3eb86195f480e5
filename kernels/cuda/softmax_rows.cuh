// What kernels/cuda/softmax.cu (softmax, log-softmax) and
// kernels/cuda/cross_entropy.cu (cross-entropy, NLL) share: rows cut into
// 16-byte packs, groups of lanes owning a row, the fixed reduction trees, the
// online max / sum-of-exp statistics, and the launch shapes.
//
// A row is cut at the 16-byte lines of memory (RowPacks): every pack but the
// first and the last of a row is one 16-byte load or store, whatever the width
// and the row's offset. A group of threads owns a row: 1 to 32 lanes of a warp
// for short rows (several rows per block), the whole block for long ones.
// Reductions are fixed xor-shuffle trees (plus one shared-memory step across a
// block's warps) of commutative combines, so every lane gets the same bits on
// every run. Math in float for f16/bf16/f32, double for f64.
#pragma once

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

namespace kiln::kernels::softmax_rows {


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

// The shift of exp(x - base) for a set whose max is m: m, or 0 when m is -inf.
// Then every x is -inf (masked, or past the row's end: exp gives exactly 0
// instead of exp(-inf + inf) = NaN) or NaN (which stays NaN), and no select
// per element is needed.
template <typename A>
__device__ __forceinline__ A exp_base(A m) {
  return m == -infinity<A>() ? A(0) : m;
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
        const A gap = x[u][i] == -infinity<A>() ? infinity<A>() : m - x[u][i];
        st.sw += w[u][i] == A(0) ? A(0) : w[u][i] * gap;
        st.wt += w[u][i];
      }
    }
  }
}

// ---------------------------------------------------------------- launch shapes

inline void check_rows(int64_t rows, const char* op) {
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

template <int kLanes>
unsigned blocks_for(int64_t rows) {
  constexpr int64_t per_block = kLanes > 32 ? 1 : kRowBlock / kLanes;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

}  // namespace kiln::kernels::softmax_rows
