// CPU reductions over a dense (outer, reduced, inner) view, and their gradients.
//
// Every reduction is a fold with a "reducer": identity(), load(x, r, out) and an
// associative combine(). The reduced dim is cut into fixed chunks of kChunkRows
// rows (parallel tasks), each chunk is folded pairwise down to leaves of kLeaf
// rows, and chunk partials are combined pairwise: the order of every addition
// depends only on the shape, never on the number of threads.
//   inner == 1: a leaf folds kLeaf contiguous values into kLanes interleaved lanes
//               (vectorizable), then combines the lanes in a fixed tree.
//   inner  > 1: a leaf folds kColumnLeaf rows of a block of kColumns columns, one
//               accumulator per column (vectorizable over columns).
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "kernels/reduction.h"

namespace kiln::kernels {

namespace {

constexpr int64_t kLeaf = 1024;                // values folded sequentially (32 lanes of 32) when inner == 1
constexpr int64_t kColumnLeaf = 16;            // rows folded sequentially when inner > 1
constexpr int64_t kChunkRows = 8192;            // rows per parallel task (a multiple of both leaves)
constexpr int64_t kColumns = 256;              // columns per task when inner > 1 (1 KiB of floats per row)
constexpr int kLanes = 32;  // 4 AVX accumulators of floats: hides the add latency
constexpr int kMaxDepth = 12;                  // > log2(kChunkRows / kColumnLeaf) + 1
constexpr int64_t kParallelWork = 1 << 15;     // elements below which loops stay serial

template <typename T>
constexpr bool is_16bit_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
constexpr bool is_float_v = std::is_floating_point_v<T> || is_16bit_v<T>;

// Accumulator of a sum over T.
template <typename T>
using sum_t = std::conditional_t<std::is_same_v<T, double>, double, std::conditional_t<is_float_v<T>, float, int64_t>>;
// Value type of a comparison over T (16-bit floats compare as float).
template <typename T>
using cmp_t = compute_t<T>;

template <typename To, typename From>
inline To convert(From value) {
  if constexpr (std::is_same_v<To, bool>) {
    return value != From(0);
  } else if constexpr (is_16bit_v<To>) {
    return To(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

template <typename V>
inline bool is_nan(V value) {
  if constexpr (std::is_floating_point_v<V>) {
    return value != value;
  } else {
    return false;
  }
}

// ---------------------------------------------------------------- reducers

template <typename T>
using ConstArray = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

template <typename T, typename Acc>
struct SumReducer {
  using State = Acc;
  State identity() const { return State(0); }
  State load(T x, int64_t, int64_t) const { return static_cast<Acc>(static_cast<cmp_t<T>>(x)); }
  State combine(State a, State b) const { return a + b; }
  // One contiguous leaf (<= kLeaf values): Eigen's unrolled packet sum, 3x the
  // speed of the generic lane loop (which GCC keeps partly in memory).
  State leaf_contiguous(const T* x, int64_t n, int64_t) const
    requires std::is_floating_point_v<T>
  {
    return ConstArray<T>(x, n).sum();
  }
#if defined(__AVX2__) && defined(__F16C__)
  // 16-bit leaves: eight values widened per instruction into four float
  // accumulators (32 interleaved lanes, as the generic loop, which GCC left at
  // a third of the memory bandwidth), then the lanes folded in a fixed order.
  State leaf_contiguous(const T* x, int64_t n, int64_t) const
    requires(std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
  {
    auto widen8 = [](const T* at) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
      if constexpr (std::is_same_v<T, BFloat16>) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
      } else {
        return _mm256_cvtph_ps(raw);
      }
    };
    __m256 lanes[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {  // two cache lines per step: more loads in flight
      for (int k = 0; k < 8; ++k) lanes[k % 4] = _mm256_add_ps(lanes[k % 4], widen8(x + i + 8 * k));
    }
    for (; i + 32 <= n; i += 32) {
      for (int k = 0; k < 4; ++k) lanes[k] = _mm256_add_ps(lanes[k], widen8(x + i + 8 * k));
    }
    alignas(32) float folded[32];
    for (int k = 0; k < 4; ++k) _mm256_store_ps(folded + 8 * k, lanes[k]);
    for (int j = 0; i < n; ++i, ++j) folded[j] += static_cast<float>(x[i]);
    for (int width = 16; width > 0; width /= 2) {
      for (int j = 0; j < width; ++j) folded[j] += folded[j + width];
    }
    return static_cast<State>(folded[0]);
  }
#endif
};

// (x - mean[out])^2, the second pass of var.
template <typename T, typename Acc>
struct SquaredDeviationReducer {
  using State = Acc;
  const Acc* mean;
  State identity() const { return State(0); }
  State load(T x, int64_t, int64_t out) const {
    const Acc d = static_cast<Acc>(x) - mean[out];
    return d * d;
  }
  State combine(State a, State b) const { return a + b; }
  State leaf_contiguous(const T* x, int64_t n, int64_t out) const
    requires std::is_floating_point_v<T>
  {
    return (ConstArray<T>(x, n) - mean[out]).square().sum();
  }
};

template <typename T, bool kMax>
struct ExtremumReducer {
  using State = cmp_t<T>;
  State identity() const {
    if constexpr (std::is_floating_point_v<State>) {
      return kMax ? -std::numeric_limits<State>::infinity() : std::numeric_limits<State>::infinity();
    } else {
      return kMax ? std::numeric_limits<State>::lowest() : std::numeric_limits<State>::max();
    }
  }
  State load(T x, int64_t, int64_t) const { return static_cast<State>(x); }
  // A NaN on either side wins.
  State combine(State a, State b) const {
    const bool take_b = kMax ? b > a : b < a;
    return (take_b | is_nan(b)) ? b : a;
  }
  // A contiguous run at once: GCC does not vectorize the select above, Eigen's
  // NaN-propagating max/min does. (Order is irrelevant for max/min.)
  State fold_contiguous(const T* x, int64_t n) const
    requires std::is_floating_point_v<T>
  {
    ConstArray<T> values(x, n);
    return kMax ? values.template maxCoeff<Eigen::PropagateNaN>() : values.template minCoeff<Eigen::PropagateNaN>();
  }
};

template <typename V>
struct ValueIndex {
  V value;
  int64_t index;
};

// Ties and NaNs resolve to the smaller index, which makes combine commutative.
template <typename T, bool kMax>
struct ArgExtremumReducer {
  using V = cmp_t<T>;
  using State = ValueIndex<V>;
  State identity() const {
    return {ExtremumReducer<T, kMax>().identity(), std::numeric_limits<int64_t>::max()};
  }
  State load(T x, int64_t r, int64_t) const { return {static_cast<V>(x), r}; }
  State combine(State a, State b) const {
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
  State identity() const {
    if constexpr (kClass == kNormNegInf) return std::numeric_limits<Acc>::infinity();
    return Acc(0);
  }
  State load(T x, int64_t, int64_t) const {
    const Acc a = std::abs(static_cast<Acc>(x));
    if constexpr (kClass == kNormZero) return a != Acc(0) ? Acc(1) : Acc(0);
    if constexpr (kClass == kNormTwo) return a * a;
    if constexpr (kClass == kNormGeneral) return std::pow(a, p);
    return a;
  }
  State combine(State a, State b) const {
    if constexpr (kClass == kNormInf) return ExtremumReducer<Acc, true>().combine(a, b);
    if constexpr (kClass == kNormNegInf) return ExtremumReducer<Acc, false>().combine(a, b);
    return a + b;
  }
  State leaf_contiguous(const T* x, int64_t n, int64_t) const
    requires(std::is_floating_point_v<T> && (kClass == kNormOne || kClass == kNormTwo))
  {
    if constexpr (kClass == kNormOne) return ConstArray<T>(x, n).abs().sum();
    return ConstArray<T>(x, n).square().sum();
  }
  Acc finish(State s) const {
    if constexpr (kClass == kNormTwo) return std::sqrt(s);
    if constexpr (kClass == kNormGeneral) return std::pow(s, Acc(1) / p);
    return s;
  }
};

template <typename T>
struct AllReducer {
  using State = bool;
  State identity() const { return true; }
  State load(T x, int64_t, int64_t) const { return static_cast<cmp_t<T>>(x) != cmp_t<T>(0); }
  State combine(State a, State b) const { return a && b; }
};

// 1 where x == value[out] (|x| == value[out] or NaN for the inf-norm), summed.
template <typename T, typename Acc, bool kAbs>
struct CountEqualReducer {
  using State = Acc;
  const Acc* value;
  State identity() const { return Acc(0); }
  State load(T x, int64_t, int64_t out) const {
    Acc v = static_cast<Acc>(x);
    if constexpr (kAbs) return (std::abs(v) == value[out] || std::isnan(v)) ? Acc(1) : Acc(0);
    return v == value[out] ? Acc(1) : Acc(0);
  }
  State combine(State a, State b) const { return a + b; }
};

// ---------------------------------------------------------------- the fold

// The left half of a pairwise split of n rows: a multiple of the leaf size.
inline int64_t split_point(int64_t n, int64_t leaf) { return (n / 2 + leaf - 1) / leaf * leaf; }

// Pairwise fold of x[r0..r1) (contiguous, inner == 1) for output `out`.
template <typename T, typename R>
typename R::State fold_row(const T* x, int64_t r0, int64_t r1, int64_t out, const R& red) {
  using State = typename R::State;
  const int64_t n = r1 - r0;
  if constexpr (requires { red.fold_contiguous(x, n); }) {
    return n == 0 ? red.identity() : red.fold_contiguous(x + r0, n);
  }
  if (n > kLeaf) {
    const int64_t mid = r0 + split_point(n, kLeaf);
    return red.combine(fold_row(x, r0, mid, out, red), fold_row(x, mid, r1, out, red));
  }
  if constexpr (requires { red.leaf_contiguous(x, n, out); }) return red.leaf_contiguous(x + r0, n, out);
  State lane[kLanes];
  for (int j = 0; j < kLanes; ++j) lane[j] = red.identity();
  int64_t r = r0;
  for (; r + kLanes <= r1; r += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane[j] = red.combine(lane[j], red.load(x[r + j], r + j, out));
  }
  for (int j = 0; r < r1; ++r, ++j) lane[j] = red.combine(lane[j], red.load(x[r], r, out));
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] = red.combine(lane[j], lane[j + width]);
  }
  return lane[0];
}

// Pairwise fold of rows [r0, r1) of columns [c0, c0 + nc) (inner > 1) into
// acc[0..nc); `scratch` holds nc states per remaining level of recursion.
template <typename T, typename R>
void fold_columns(const T* x, int64_t inner, int64_t c0, int64_t nc, int64_t r0, int64_t r1, int64_t out_base,
                  const R& red, typename R::State* acc, typename R::State* scratch) {
  const int64_t n = r1 - r0;
  if (n > kColumnLeaf) {
    const int64_t mid = r0 + split_point(n, kColumnLeaf);
    fold_columns(x, inner, c0, nc, r0, mid, out_base, red, acc, scratch + nc);
    fold_columns(x, inner, c0, nc, mid, r1, out_base, red, scratch, scratch + nc);
    for (int64_t c = 0; c < nc; ++c) acc[c] = red.combine(acc[c], scratch[c]);
    return;
  }
  for (int64_t c = 0; c < nc; ++c) acc[c] = red.identity();
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * inner + c0;
    for (int64_t c = 0; c < nc; ++c) acc[c] = red.combine(acc[c], red.load(row[c], r, out_base + c0 + c));
  }
}

// Pairwise combine of states[0], states[stride], ... (count of them).
template <typename R>
typename R::State combine_range(const typename R::State* states, int64_t count, int64_t stride, const R& red) {
  if (count == 1) return states[0];
  const int64_t half = count / 2;
  return red.combine(combine_range(states, half, stride, red),
                     combine_range(states + half * stride, count - half, stride, red));
}

// Folds every output of the (outer, reduced, inner) view `x` and calls
// finish(out_index, state) once per output.
template <typename T, typename R, typename Finish>
void run_reduce(const T* x, int64_t outer, int64_t reduced, int64_t inner, const R& red, Finish finish) {
  using State = typename R::State;
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  const int64_t chunks = std::max<int64_t>(1, (reduced + kChunkRows - 1) / kChunkRows);
  const int64_t column_blocks = inner == 1 ? 1 : (inner + kColumns - 1) / kColumns;
  const int64_t tasks = outer * chunks * column_blocks;
  const bool parallel = outputs * reduced > kParallelWork && tasks > 1;
  // Chunk partials, (outer, chunks, inner); unused with a single chunk.
  // (a plain array, not std::vector: vector<bool> has no data() and packs bits across threads).
  std::unique_ptr<State[]> partial(chunks > 1 ? new State[outer * chunks * inner] : nullptr);

#pragma omp parallel for if (parallel) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t block = task % column_blocks;
    const int64_t chunk = (task / column_blocks) % chunks;
    const int64_t o = task / (column_blocks * chunks);
    const int64_t r0 = chunk * kChunkRows, r1 = std::min(reduced, r0 + kChunkRows);
    const T* base = x + o * reduced * inner;
    if (inner == 1) {
      const State s = reduced == 0 ? red.identity() : fold_row(base, r0, r1, o, red);
      if (chunks == 1) {
        finish(o, s);
      } else {
        partial[o * chunks + chunk] = s;
      }
      continue;
    }
    const int64_t c0 = block * kColumns, nc = std::min(kColumns, inner - c0);
    State acc[kColumns];
    State scratch[kColumns * kMaxDepth];
    if (reduced == 0) {
      for (int64_t c = 0; c < nc; ++c) acc[c] = red.identity();
    } else {
      fold_columns(base, inner, c0, nc, r0, r1, o * inner, red, acc, scratch);
    }
    for (int64_t c = 0; c < nc; ++c) {
      if (chunks == 1) {
        finish(o * inner + c0 + c, acc[c]);
      } else {
        partial[(o * chunks + chunk) * inner + c0 + c] = acc[c];
      }
    }
  }
  if (chunks == 1) return;
#pragma omp parallel for if (parallel) schedule(static)
  for (int64_t index = 0; index < outputs; ++index) {
    const int64_t o = index / inner, c = index % inner;
    finish(index, combine_range(partial.get() + o * chunks * inner + c, chunks, inner, red));
  }
}

// ---------------------------------------------------------------- per kind

template <typename T>
void reduce_typed(const ReduceArgs& a) {
  const T* x = static_cast<const T*>(a.in);
  const int64_t n = a.reduced;
  switch (a.kind) {
    case ReduceKind::sum:
    case ReduceKind::mean: {
      using Acc = sum_t<T>;
      const bool mean = a.kind == ReduceKind::mean;
      dispatch_all(a.out_dtype, "sum", [&]<typename Out>() {
        Out* out = static_cast<Out*>(a.out);
        run_reduce(x, a.outer, n, a.inner, SumReducer<T, Acc>{}, [&](int64_t i, Acc s) {
          if constexpr (std::is_floating_point_v<Acc>) {
            out[i] = convert<Out>(mean ? s / static_cast<Acc>(n) : (a.scale == 1.0 ? s : s * static_cast<Acc>(a.scale)));
          } else {
            out[i] = convert<Out>(s);
          }
        });
      });
      return;
    }
    case ReduceKind::var: {
      if constexpr (is_float_v<T>) {
        using Acc = sum_t<T>;
        Acc* mean = static_cast<Acc*>(a.aux);
        run_reduce(x, a.outer, n, a.inner, SumReducer<T, Acc>{},
                   [&](int64_t i, Acc s) { mean[i] = s / static_cast<Acc>(n); });
        T* out = static_cast<T*>(a.out);
        const Acc divisor = static_cast<Acc>(std::max<int64_t>(n - a.correction, 0));
        run_reduce(x, a.outer, n, a.inner, SquaredDeviationReducer<T, Acc>{mean},
                   [&](int64_t i, Acc s) { out[i] = convert<T>(s / divisor); });
        return;
      }
      break;
    }
    case ReduceKind::amax:
    case ReduceKind::amin: {
      T* out = static_cast<T*>(a.out);
      auto write = [&](int64_t i, cmp_t<T> s) { out[i] = convert<T>(s); };
      if (a.kind == ReduceKind::amax) {
        run_reduce(x, a.outer, n, a.inner, ExtremumReducer<T, true>{}, write);
      } else {
        run_reduce(x, a.outer, n, a.inner, ExtremumReducer<T, false>{}, write);
      }
      return;
    }
    case ReduceKind::max_index:
    case ReduceKind::min_index: {
      T* out = static_cast<T*>(a.out);
      auto write = [&](int64_t i, ValueIndex<cmp_t<T>> s) {
        out[i] = convert<T>(s.value);
        a.indices[i] = s.index;
      };
      if (a.kind == ReduceKind::max_index) {
        run_reduce(x, a.outer, n, a.inner, ArgExtremumReducer<T, true>{}, write);
      } else {
        run_reduce(x, a.outer, n, a.inner, ArgExtremumReducer<T, false>{}, write);
      }
      return;
    }
    case ReduceKind::norm: {
      if constexpr (is_float_v<T>) {
        using Acc = sum_t<T>;
        T* out = static_cast<T*>(a.out);
        const Acc p = static_cast<Acc>(a.p);
        auto run = [&]<int kClass>() {
          NormReducer<T, Acc, kClass> red{p};
          run_reduce(x, a.outer, n, a.inner, red, [&](int64_t i, Acc s) { out[i] = convert<T>(red.finish(s)); });
        };
        dispatch_norm_class(a.p, run);
        return;
      }
      break;
    }
    case ReduceKind::all: {
      bool* out = static_cast<bool*>(a.out);
      run_reduce(x, a.outer, n, a.inner, AllReducer<T>{}, [&](int64_t i, bool s) { out[i] = s; });
      return;
    }
    case ReduceKind::count_equal:
    case ReduceKind::count_abs_equal: {
      if constexpr (is_float_v<T>) {
        using Acc = sum_t<T>;
        Acc* out = static_cast<Acc*>(a.out);
        const Acc* value = static_cast<const Acc*>(a.aux);
        auto write = [&](int64_t i, Acc s) { out[i] = s; };
        if (a.kind == ReduceKind::count_equal) {
          run_reduce(x, a.outer, n, a.inner, CountEqualReducer<T, Acc, false>{value}, write);
        } else {
          run_reduce(x, a.outer, n, a.inner, CountEqualReducer<T, Acc, true>{value}, write);
        }
        return;
      }
      break;
    }
  }
  KILN_THROW("reduce: unsupported dtype ", dtype_name(a.in_dtype), " for this reduction");
}

// ---------------------------------------------------------------- gradients

template <typename T>
void reduce_grad_typed(const ReduceGradArgs& a) {
  using Acc = sum_t<T>;
  const T* x = static_cast<const T*>(a.x);
  const T* grad = static_cast<const T*>(a.grad);
  const Acc* aux = static_cast<const Acc*>(a.aux);
  const Acc* count = static_cast<const Acc*>(a.count);
  T* dx = static_cast<T*>(a.dx);
  const int64_t rows = a.outer * a.reduced, inner = a.inner;
  const Acc scale = static_cast<Acc>(a.scale), p = static_cast<Acc>(a.p);
  const bool inf_norm = std::isinf(a.p);

  auto element = [&](Acc v, Acc g, int64_t out, int64_t r) -> Acc {
    switch (a.kind) {
      case ReduceGradKind::scale: return g * scale;
      case ReduceGradKind::var: return g * scale * (v - aux[out]);
      case ReduceGradKind::equal: return v == aux[out] ? g / count[out] : Acc(0);
      case ReduceGradKind::index: return r == a.indices[out] ? g : Acc(0);
      case ReduceGradKind::norm: {
        const Acc sign = v > 0 ? Acc(1) : (v < 0 ? Acc(-1) : Acc(0));
        const Acc norm = aux[out];
        if (p == 0) return Acc(0);
        if (p == 1) return g * sign;
        if (inf_norm) return (std::abs(v) == norm || std::isnan(v)) ? sign * g / count[out] : Acc(0);
        if (norm == 0) return Acc(0);
        if (p == 2) return g * v / norm;
        return g * sign * std::pow(std::abs(v), p - 1) / std::pow(norm, p - 1);
      }
    }
    return Acc(0);
  };

#pragma omp parallel for if (rows * inner > kParallelWork) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t o = row / a.reduced, r = row % a.reduced;
    const T* xr = x == nullptr ? nullptr : x + row * inner;  // scale and index read no x
    T* dr = dx + row * inner;
    for (int64_t c = 0; c < inner; ++c) {
      const int64_t out = o * inner + c;
      const Acc v = x == nullptr ? Acc(0) : static_cast<Acc>(static_cast<cmp_t<T>>(xr[c]));
      dr[c] = convert<T>(element(v, static_cast<Acc>(static_cast<cmp_t<T>>(grad[out])), out, r));
    }
  }
}

}  // namespace

void reduce_cpu(const ReduceArgs& args) {
  if (args.outer * args.inner == 0) return;
  dispatch_all(args.in_dtype, "reduce", [&]<typename T>() { reduce_typed<T>(args); });
}

void reduce_grad_cpu(const ReduceGradArgs& args) {
  if (args.outer * args.reduced * args.inner == 0) return;
  dispatch_floating(args.dtype, "reduce backward", [&]<typename T>() { reduce_grad_typed<T>(args); });
}

}  // namespace kiln::kernels
