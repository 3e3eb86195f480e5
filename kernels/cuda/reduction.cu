// CUDA reductions over a dense (outer, reduced, inner) view, and their gradients.
//
// One kernel for every reduction: a block of (bx, by) threads owns bx adjacent
// columns of one outer index and a chunk of the reduced rows. Thread (tx, ty)
// folds rows ty, ty + by, ... of column tx in order, then the block combines
// its by partials in a fixed shared-memory tree. When outer * inner is too
// small to fill the GPU, the reduced dim is cut into chunks (grid.y); chunk
// partials go to a workspace and a second kernel folds them in chunk order.
// No atomics: the result is the same bits on every run (for a given GPU model,
// whose multiprocessor count sets the chunking).
//   inner == 1: bx = 1, consecutive ty read consecutive values (coalesced);
//               when the rows allow, 16-byte vectors of consecutive values
//               (Geometry::vectors: eight bf16 per load instead of one, so
//               enough bytes are in flight to reach the memory's bandwidth).
//   inner  > 1: bx <= 32 columns side by side (coalesced across tx).
// Accumulation: float for f16/bf16/f32, double for f64, int64 for integer sums.
// The gradient kernel (one thread per input element) splits its flat index by
// FastDivmod below 2^31 elements (fast_divide.cuh), by 64-bit division above.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/fast_divide.cuh"
#include "kernels/reduction.h"
#include "kernels/cuda/native_types.cuh"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxChunks = 1024;
constexpr int64_t kMinRowsPerThread = 32;  // chunk only when each thread still folds this many rows
constexpr size_t kMaxStateBytes = 16;      // ValueIndex<double>
constexpr int kVectorBytes = 16;           // one load of consecutive values (inner == 1)

// ---------------------------------------------------------------- types

template <typename T> using compute_of = typename Acc<T>::type;

template <typename T>
constexpr bool is_float_native_v = std::is_floating_point_v<T> || std::is_same_v<T, __half> ||
                                   std::is_same_v<T, __nv_bfloat16>;

template <typename T>
using sum_of = std::conditional_t<std::is_same_v<T, double>, double,
                                  std::conditional_t<is_float_native_v<T>, float, int64_t>>;


template <typename Out, typename V>
__device__ __forceinline__ Out store(V value) {
  if constexpr (std::is_same_v<Out, __half>) {
    return __float2half_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<Out, bool>) {
    return value != V(0);
  } else {
    return static_cast<Out>(value);
  }
}

template <typename V>
__device__ __forceinline__ bool is_nan(V value) {
  if constexpr (std::is_floating_point_v<V>) {
    return value != value;
  } else {
    return false;
  }
}

// ---------------------------------------------------------------- reducers

template <typename T, typename Acc>
struct SumReducer {
  using State = Acc;
  __device__ State identity() const { return State(0); }
  __device__ State load_one(T x, int64_t, int64_t) const { return static_cast<Acc>(to_acc(x)); }
  __device__ State combine(State a, State b) const { return a + b; }
};

template <typename T, typename Acc>
struct SquaredDeviationReducer {
  using State = Acc;
  const Acc* mean;
  __device__ State identity() const { return State(0); }
  __device__ State load_one(T x, int64_t, int64_t out) const {
    const Acc d = static_cast<Acc>(to_acc(x)) - mean[out];
    return d * d;
  }
  __device__ State combine(State a, State b) const { return a + b; }
};

template <typename V, bool kMax>
__device__ __forceinline__ V extremum_identity() {
  if constexpr (std::is_floating_point_v<V>) {
    return kMax ? -infinity<V>() : infinity<V>();
  } else {
    return kMax ? std::numeric_limits<V>::lowest() : std::numeric_limits<V>::max();
  }
}

template <typename V, bool kMax>
__device__ __forceinline__ V extremum_combine(V a, V b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  if constexpr (kMax) {
    return b > a ? b : a;
  } else {
    return b < a ? b : a;
  }
}

template <typename T, bool kMax>
struct ExtremumReducer {
  using State = compute_of<T>;
  __device__ State identity() const { return extremum_identity<State, kMax>(); }
  __device__ State load_one(T x, int64_t, int64_t) const { return to_acc(x); }
  __device__ State combine(State a, State b) const { return extremum_combine<State, kMax>(a, b); }
};

template <typename V>
struct ValueIndex {
  V value;
  int64_t index;
};

// Ties and NaNs resolve to the smaller index: combine is commutative.
template <typename T, bool kMax>
struct ArgExtremumReducer {
  using V = compute_of<T>;
  using State = ValueIndex<V>;
  __device__ State identity() const { return {extremum_identity<V, kMax>(), INT64_MAX}; }
  __device__ State load_one(T x, int64_t r, int64_t) const { return {to_acc(x), r}; }
  __device__ State combine(State a, State b) const {
    const bool a_nan = is_nan(a.value), b_nan = is_nan(b.value);
    if (a_nan || b_nan) {
      if (a_nan && b_nan) return a.index <= b.index ? a : b;
      return a_nan ? a : b;
    }
    const bool better = kMax ? b.value > a.value : b.value < a.value;
    if (better || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
};


template <typename T, typename Acc, int kClass>
struct NormReducer {
  using State = Acc;
  Acc p;
  __device__ State identity() const { return kClass == kNormNegInf ? infinity<Acc>() : Acc(0); }
  __device__ State load_one(T x, int64_t, int64_t) const {
    const Acc a = fabs(static_cast<Acc>(to_acc(x)));
    if constexpr (kClass == kNormZero) return a != Acc(0) ? Acc(1) : Acc(0);
    if constexpr (kClass == kNormTwo) return a * a;
    if constexpr (kClass == kNormGeneral) return pow(a, p);
    return a;
  }
  __device__ State combine(State a, State b) const {
    if constexpr (kClass == kNormInf) return extremum_combine<Acc, true>(a, b);
    if constexpr (kClass == kNormNegInf) return extremum_combine<Acc, false>(a, b);
    return a + b;
  }
  __device__ Acc finish(State s) const {
    if constexpr (kClass == kNormTwo) return sqrt(s);
    if constexpr (kClass == kNormGeneral) return pow(s, Acc(1) / p);
    return s;
  }
};

template <typename T>
struct AllReducer {
  using State = bool;
  __device__ State identity() const { return true; }
  __device__ State load_one(T x, int64_t, int64_t) const { return to_acc(x) != compute_of<T>(0); }
  __device__ State combine(State a, State b) const { return a && b; }
};

template <typename T, typename Acc, bool kAbs>
struct CountEqualReducer {
  using State = Acc;
  const Acc* value;
  __device__ State identity() const { return Acc(0); }
  __device__ State load_one(T x, int64_t, int64_t out) const {
    const Acc v = static_cast<Acc>(to_acc(x));
    if constexpr (kAbs) return (fabs(v) == value[out] || v != v) ? Acc(1) : Acc(0);
    return v == value[out] ? Acc(1) : Acc(0);
  }
  __device__ State combine(State a, State b) const { return a + b; }
};

// ---------------------------------------------------------------- writers

template <typename Out, typename Acc>
struct ScaleWriter {  // sum, mean, var, counts: out = s * scale
  Out* out;
  Acc scale;
  __device__ void operator()(int64_t i, Acc s) const { out[i] = store<Out>(scale == Acc(1) ? s : s * scale); }
};

template <typename Out>
struct CastWriter {
  Out* out;
  template <typename S>
  __device__ void operator()(int64_t i, S s) const { out[i] = store<Out>(s); }
};

template <typename Out>
struct IndexWriter {
  Out* out;
  int64_t* indices;
  template <typename S>
  __device__ void operator()(int64_t i, S s) const {
    out[i] = store<Out>(s.value);
    indices[i] = s.index;
  }
};

template <typename Out, typename R>
struct NormWriter {
  Out* out;
  R red;
  __device__ void operator()(int64_t i, typename R::State s) const { out[i] = store<Out>(red.finish(s)); }
};

// ---------------------------------------------------------------- kernels

struct Geometry {
  int64_t outer, reduced, inner;
  int64_t column_blocks;   // ceil(inner / bx)
  int64_t rows_per_chunk;  // rows of the reduced dim per grid.y index (a multiple of the vector with vectors)
  int64_t chunks;
  // inner == 1 and every row and chunk starts on a kVectorBytes boundary:
  // thread ty folds vectors ty, ty + by, ... of kVectorBytes / sizeof(T) rows each.
  bool vectors;
};

template <typename T, typename R, typename W>
__global__ void reduce_kernel(const T* __restrict__ x, Geometry g, R red, W write,
                              typename R::State* __restrict__ partial) {
  using State = typename R::State;
  __shared__ State shared[kThreads];
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t o = blockIdx.x / g.column_blocks;
  const int64_t c = (blockIdx.x % g.column_blocks) * bx + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t r_end = min(g.reduced, (chunk + 1) * g.rows_per_chunk);
  const int64_t out = o * g.inner + c;
  State s = red.identity();
  if (c < g.inner) {
    const T* base = x + o * g.reduced * g.inner + c;
    if (g.vectors) {
      constexpr int kWidth = static_cast<int>(kVectorBytes / sizeof(T));
#pragma unroll 4
      for (int64_t r = chunk * g.rows_per_chunk + int64_t{kWidth} * ty; r < r_end; r += int64_t{kWidth} * by) {
        if (r + kWidth <= r_end) {
          const uint4 bits = *reinterpret_cast<const uint4*>(base + r);
          T v[kWidth];
          memcpy(v, &bits, sizeof(bits));
#pragma unroll
          for (int k = 0; k < kWidth; ++k) s = red.combine(s, red.load_one(v[k], r + k, out));
        } else {
          for (int64_t k = r; k < r_end; ++k) s = red.combine(s, red.load_one(base[k], k, out));
        }
      }
    } else {
      for (int64_t r = chunk * g.rows_per_chunk + ty; r < r_end; r += by) {
        s = red.combine(s, red.load_one(base[r * g.inner], r, out));
      }
    }
  }
  shared[ty * bx + tx] = s;
  __syncthreads();
  for (int stride = by / 2; stride > 0; stride /= 2) {
    if (ty < stride) shared[ty * bx + tx] = red.combine(shared[ty * bx + tx], shared[(ty + stride) * bx + tx]);
    __syncthreads();
  }
  if (ty != 0 || c >= g.inner) return;
  if (g.chunks == 1) {
    write(out, shared[tx]);
  } else {
    partial[(o * g.chunks + chunk) * g.inner + c] = shared[tx];
  }
}

// Folds the chunk partials of each output in chunk order.
template <typename R, typename W>
__global__ void reduce_partials_kernel(const typename R::State* __restrict__ partial, Geometry g, R red, W write) {
  const int64_t outputs = g.outer * g.inner;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < outputs; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = i / g.inner, c = i % g.inner;
    const typename R::State* p = partial + o * g.chunks * g.inner + c;
    typename R::State s = p[0];
    for (int64_t k = 1; k < g.chunks; ++k) s = red.combine(s, p[k * g.inner]);
    write(i, s);
  }
}

int next_pow2(int64_t n) {
  int p = 1;
  while (p < n && p < kThreads) p *= 2;
  return p;
}

struct LaunchPlan {
  dim3 block;
  Geometry geometry;
};

LaunchPlan plan_launch(const ReduceArgs& a) {
  LaunchPlan plan;
  const auto width = static_cast<int64_t>(kVectorBytes / dtype_size(a.in_dtype));
  const bool vectors = a.inner == 1 && reinterpret_cast<uintptr_t>(a.in) % kVectorBytes == 0 &&
                       (a.outer == 1 || a.reduced % width == 0);
  const int64_t loads = vectors ? (a.reduced + width - 1) / width : a.reduced;  // per row
  const int bx = a.inner == 1 ? 1 : std::min(32, next_pow2(a.inner));
  const int by = std::max(1, std::min(kThreads / bx, next_pow2(loads)));
  plan.block = dim3(bx, by);
  Geometry& g = plan.geometry;
  g.outer = a.outer;
  g.reduced = a.reduced;
  g.inner = a.inner;
  g.column_blocks = (a.inner + bx - 1) / bx;
  g.chunks = 1;
  const int64_t blocks = a.outer * g.column_blocks;
  const int64_t target = int64_t{cuda::device_properties(a.device).multiprocessor_count} * (2048 / kThreads);
  // Chunks by elements, vectors or not: a thread's vector loads then still
  // number at least kMinRowsPerThread / width, and the chunks keep enough
  // blocks in flight (counting vector loads here left a bfloat16 sum of 100K
  // elements to one block).
  if (blocks < target && a.reduced > by * kMinRowsPerThread) {
    g.chunks = std::min({(target + blocks - 1) / blocks, a.reduced / (by * kMinRowsPerThread), kMaxChunks});
  }
  g.vectors = vectors;
  g.rows_per_chunk = std::max<int64_t>(1, (a.reduced + g.chunks - 1) / g.chunks);
  if (vectors) g.rows_per_chunk = (g.rows_per_chunk + width - 1) / width * width;  // chunks start on vectors
  g.chunks = std::max<int64_t>(1, (a.reduced + g.rows_per_chunk - 1) / g.rows_per_chunk);
  KILN_CHECK(blocks <= INT32_MAX, "reduce: too many outputs (", a.outer, " x ", a.inner, ") for one launch");
  return plan;
}

template <typename T, typename R, typename W>
void run(const ReduceArgs& a, const void* input, const R& red, const W& write, void* workspace, cudaStream_t stream,
         const char* name) {
  static_assert(sizeof(typename R::State) <= kMaxStateBytes);
  const LaunchPlan plan = plan_launch(a);
  const Geometry& g = plan.geometry;
  auto* partial = static_cast<typename R::State*>(workspace);
  KILN_ASSERT(g.chunks == 1 || partial != nullptr, "reduce: missing workspace");
  const dim3 grid(static_cast<unsigned>(a.outer * g.column_blocks), static_cast<unsigned>(g.chunks));
  reduce_kernel<T><<<grid, plan.block, 0, stream>>>(static_cast<const T*>(input), g, red, write, partial);
  cuda::check_last_launch(name);
  if (g.chunks == 1) return;
  const int64_t outputs = a.outer * a.inner;
  const int blocks = static_cast<int>(std::min<int64_t>((outputs + kThreads - 1) / kThreads, 1 << 16));
  reduce_partials_kernel<<<blocks, kThreads, 0, stream>>>(partial, g, red, write);
  cuda::check_last_launch(name);
}

template <typename Native>
void reduce_typed(const ReduceArgs& a, void* workspace, cudaStream_t stream) {
  using T = Native;
  const int64_t n = a.reduced;
  switch (a.kind) {
    case ReduceKind::sum:
    case ReduceKind::mean: {
      using Acc = sum_of<T>;
      using Out = std::conditional_t<is_float_native_v<T>, T, int64_t>;
      KILN_CHECK(a.out_dtype == (is_float_native_v<T> ? a.in_dtype : DType::i64), "sum: unsupported output dtype ",
                 dtype_name(a.out_dtype), " for ", dtype_name(a.in_dtype), " on CUDA");
      Acc scale = static_cast<Acc>(a.scale);
      if (a.kind == ReduceKind::mean) scale = static_cast<Acc>(1.0 / static_cast<double>(n));
      run<T>(a, a.in, SumReducer<T, Acc>{}, ScaleWriter<Out, Acc>{static_cast<Out*>(a.out), scale}, workspace,
             stream, "reduce_sum");
      return;
    }
    case ReduceKind::var: {
      if constexpr (is_float_native_v<T>) {
        using Acc = sum_of<T>;
        Acc* mean = static_cast<Acc*>(a.aux);
        run<T>(a, a.in, SumReducer<T, Acc>{}, ScaleWriter<Acc, Acc>{mean, static_cast<Acc>(1.0 / static_cast<double>(n))},
               workspace, stream, "reduce_var_mean");
        const double divisor = static_cast<double>(std::max<int64_t>(n - a.correction, 0));
        run<T>(a, a.in, SquaredDeviationReducer<T, Acc>{mean},
               ScaleWriter<T, Acc>{static_cast<T*>(a.out), static_cast<Acc>(1.0 / divisor)}, workspace, stream,
               "reduce_var");
        return;
      }
      break;
    }
    case ReduceKind::amax:
      run<T>(a, a.in, ExtremumReducer<T, true>{}, CastWriter<T>{static_cast<T*>(a.out)}, workspace, stream,
             "reduce_amax");
      return;
    case ReduceKind::amin:
      run<T>(a, a.in, ExtremumReducer<T, false>{}, CastWriter<T>{static_cast<T*>(a.out)}, workspace, stream,
             "reduce_amin");
      return;
    case ReduceKind::max_index:
      run<T>(a, a.in, ArgExtremumReducer<T, true>{}, IndexWriter<T>{static_cast<T*>(a.out), a.indices}, workspace,
             stream, "reduce_max_index");
      return;
    case ReduceKind::min_index:
      run<T>(a, a.in, ArgExtremumReducer<T, false>{}, IndexWriter<T>{static_cast<T*>(a.out), a.indices}, workspace,
             stream, "reduce_min_index");
      return;
    case ReduceKind::norm: {
      if constexpr (is_float_native_v<T>) {
        using Acc = sum_of<T>;
        auto go = [&]<int kClass>() {
          NormReducer<T, Acc, kClass> red{static_cast<Acc>(a.p)};
          run<T>(a, a.in, red, NormWriter<T, decltype(red)>{static_cast<T*>(a.out), red}, workspace, stream,
                 "reduce_norm");
        };
        dispatch_norm_class(a.p, go);
        return;
      }
      break;
    }
    case ReduceKind::all:
      run<T>(a, a.in, AllReducer<T>{}, CastWriter<bool>{static_cast<bool*>(a.out)}, workspace, stream, "reduce_all");
      return;
    case ReduceKind::count_equal:
    case ReduceKind::count_abs_equal: {
      if constexpr (is_float_native_v<T>) {
        using Acc = sum_of<T>;
        const Acc* value = static_cast<const Acc*>(a.aux);
        ScaleWriter<Acc, Acc> write{static_cast<Acc*>(a.out), Acc(1)};
        if (a.kind == ReduceKind::count_equal) {
          run<T>(a, a.in, CountEqualReducer<T, Acc, false>{value}, write, workspace, stream, "reduce_count_equal");
        } else {
          run<T>(a, a.in, CountEqualReducer<T, Acc, true>{value}, write, workspace, stream, "reduce_count_equal");
        }
        return;
      }
      break;
    }
  }
  KILN_THROW("reduce: unsupported dtype ", dtype_name(a.in_dtype), " for this reduction on CUDA");
}

// ---------------------------------------------------------------- gradients

// One thread per element of x; split: its (outer, reduced, inner) coordinates.
template <typename T, typename D>
__global__ void reduce_grad_kernel(ReduceGradArgs a, const T* __restrict__ x, const T* __restrict__ grad,
                                   T* __restrict__ dx, Split3<D> split) {
  using Acc = sum_of<T>;
  const Acc* aux = static_cast<const Acc*>(a.aux);
  const Acc* count = static_cast<const Acc*>(a.count);
  const int64_t total = a.outer * a.reduced * a.inner;
  const Acc p = static_cast<Acc>(a.p), scale = static_cast<Acc>(a.scale);
  const bool inf_norm = isinf(a.p);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t o, r, c;
    split(i, o, r, c);
    const int64_t out = o * a.inner + c;
    const Acc g = static_cast<Acc>(to_acc(grad[out]));
    const Acc v = x == nullptr ? Acc(0) : static_cast<Acc>(to_acc(x[i]));
    Acc d = Acc(0);
    switch (a.kind) {
      case ReduceGradKind::scale: d = g * scale; break;
      case ReduceGradKind::var: d = g * scale * (v - aux[out]); break;
      case ReduceGradKind::equal: d = v == aux[out] ? g / count[out] : Acc(0); break;
      case ReduceGradKind::index: d = r == a.indices[out] ? g : Acc(0); break;
      case ReduceGradKind::norm: {
        const Acc sign = v > 0 ? Acc(1) : (v < 0 ? Acc(-1) : Acc(0));
        const Acc norm = aux[out];
        if (p == 0) {
          d = Acc(0);
        } else if (p == 1) {
          d = g * sign;
        } else if (inf_norm) {
          d = (fabs(v) == norm || v != v) ? sign * g / count[out] : Acc(0);
        } else if (norm == 0) {
          d = Acc(0);
        } else if (p == 2) {
          d = g * v / norm;
        } else {
          d = g * sign * pow(fabs(v), p - 1) / pow(norm, p - 1);
        }
        break;
      }
    }
    dx[i] = store<T>(d);
  }
}

}  // namespace

int64_t reduce_cuda_workspace_bytes(const ReduceArgs& args) {
  if (args.outer * args.inner == 0) return 0;
  const LaunchPlan plan = plan_launch(args);
  if (plan.geometry.chunks == 1) return 0;
  return args.outer * args.inner * plan.geometry.chunks * static_cast<int64_t>(kMaxStateBytes);
}

void reduce_cuda(const ReduceArgs& args, void* workspace, cuda::Stream stream) {
  if (args.outer * args.inner == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_all(args.in_dtype, "reduce", [&]<typename T>() { reduce_typed<typename Native<T>::type>(args, workspace, s); });
}

void reduce_grad_cuda(const ReduceGradArgs& args, cuda::Stream stream) {
  const int64_t total = args.outer * args.reduced * args.inner;
  if (total == 0) return;
  dispatch_floating(args.dtype, "reduce backward", [&]<typename T>() {
    using N = typename Native<T>::type;
    const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 20));
    dispatch_divider(fast_divide_fits(total), [&]<typename D>() {
      reduce_grad_kernel<N, D><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          args, static_cast<const N*>(args.x), static_cast<const N*>(args.grad), static_cast<N*>(args.dx),
          split3_for<D>(args.reduced, args.inner));
    });
    cuda::check_last_launch("reduce_grad");
  });
}

}  // namespace kiln::kernels
