// CPU GEMM over Eigen. Invariants:
//   - operands are Eigen::Maps over the caller's pointers (a transposed operand
//     is a column-major Map, never a copy); float16/bfloat16 are converted to
//     float buffers, multiplied, and converted back;
//   - the work is cut into items (batch entries x tiles of C x chunks of k) by
//     a rule that reads only the shape, each item is one single-threaded Eigen
//     product and chunk partials are summed in a fixed order, so the bits of C
//     do not depend on the thread count (Eigen's own threading changes its
//     k-blocking between 1 and >1 threads).
#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "kernels/linalg.h"

namespace kiln::kernels {

namespace {

template <typename T, int Order>
using ConstMatrixMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using RowMajorMap =
    Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned, Eigen::OuterStride<>>;

// One tile: C (rows, cols) = op(A) (rows, k) @ op(B) (k, cols) [+ bias (cols)].
template <typename T, int OrderA, int OrderB>
void tile_product(const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, int64_t rows, int64_t cols,
                  int64_t k, const T* bias) {
  RowMajorMap<T> C(c, rows, cols, Eigen::OuterStride<>(ldc));
  if (bias != nullptr) {
    C.rowwise() = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, cols);
  } else if (k == 0) {
    C.setZero();
  }
  if (k == 0) return;
  ConstMatrixMap<T, OrderA> A(a, rows, k, Eigen::OuterStride<>(lda));
  ConstMatrixMap<T, OrderB> B(b, k, cols, Eigen::OuterStride<>(ldb));
  if (bias != nullptr) {
    C.noalias() += A * B;
  } else {
    C.noalias() = A * B;
  }
}

// The work items of a product, fixed by the shape alone: batch entries x
// tiles of C x chunks of k. Splitting a side of C makes every tile re-pack the
// other operand; splitting k does not (each chunk packs its own slice) but
// needs a partial C per chunk, summed afterwards in chunk order. So: halve the
// larger side of the tile while it is at least 256, then halve k while the
// chunks stay at least 1024 deep, then halve sides down to 64; stop at 32
// items (two per core on 16 cores) or when an item would do under 16 MFLOP.
struct TilePlan {
  int64_t tile_m, tile_n, chunk_k;
  int64_t tiles_m = 1, tiles_n = 1, splits_k = 1;
  int64_t per_batch() const { return tiles_m * tiles_n * splits_k; }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

TilePlan plan_tiles(int64_t batch, int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMaxItems = 32;
  constexpr double kMinItemFlops = 16e6;
  TilePlan plan{m, n, k};
  auto split_side = [&](int64_t min_side) {
    if (plan.tile_m >= plan.tile_n && plan.tile_m >= 2 * min_side) {
      plan.tile_m = ceil_div(ceil_div(plan.tile_m, 2), 16) * 16;
      plan.tiles_m = ceil_div(m, plan.tile_m);
      return true;
    }
    if (plan.tile_n >= 2 * min_side) {
      plan.tile_n = ceil_div(ceil_div(plan.tile_n, 2), 16) * 16;
      plan.tiles_n = ceil_div(n, plan.tile_n);
      return true;
    }
    return false;
  };
  while (batch * plan.per_batch() < kMaxItems &&
         2.0 * static_cast<double>(plan.tile_m) * static_cast<double>(plan.tile_n) *
                 static_cast<double>(plan.chunk_k) >= 2 * kMinItemFlops) {
    if (split_side(128)) continue;
    if (plan.chunk_k >= 2048) {
      plan.splits_k *= 2;
      plan.chunk_k = ceil_div(k, plan.splits_k);
      continue;
    }
    if (!split_side(32)) break;
  }
  return plan;
}

template <typename T, int OrderA, int OrderB>
void run_tiles(const GemmProblem& p) {
  const TilePlan plan = plan_tiles(p.batch, p.m, p.n, p.k);
  const int64_t items = p.batch * plan.per_batch(), tiles = plan.tiles_m * plan.tiles_n;
  // (splits_k, batch, m, n) partial products when k is split.
  std::vector<T> partial(plan.splits_k > 1 ? static_cast<size_t>(plan.splits_k * p.batch * p.m * p.n) : 0);
  auto run_item = [&](int64_t item) {
    const int64_t batch = item / plan.per_batch(), split = item % plan.per_batch() / tiles, tile = item % tiles;
    const int64_t r0 = (tile / plan.tiles_n) * plan.tile_m, c0 = (tile % plan.tiles_n) * plan.tile_n;
    const int64_t k0 = split * plan.chunk_k;
    const int64_t rows = std::min(plan.tile_m, p.m - r0), cols = std::min(plan.tile_n, p.n - c0);
    const int64_t depth = std::max<int64_t>(0, std::min(plan.chunk_k, p.k - k0));
    // Element (r, k) of op(A) is at r * ld + k in a row-major store, k * ld + r in a transposed one.
    const T* a = static_cast<const T*>(p.a.data) + batch * p.a.batch_stride +
                 (p.a.transposed ? k0 * p.a.ld + r0 : r0 * p.a.ld + k0);
    const T* b = static_cast<const T*>(p.b.data) + batch * p.b.batch_stride +
                 (p.b.transposed ? c0 * p.b.ld + k0 : k0 * p.b.ld + c0);
    if (plan.splits_k > 1) {
      T* c = partial.data() + ((split * p.batch + batch) * p.m + r0) * p.n + c0;
      tile_product<T, OrderA, OrderB>(a, p.a.ld, b, p.b.ld, c, p.n, rows, cols, depth, nullptr);
    } else {
      T* c = static_cast<T*>(p.c.data) + batch * p.c.batch_stride + r0 * p.c.ld + c0;
      const T* bias = p.bias != nullptr ? static_cast<const T*>(p.bias) + c0 : nullptr;
      tile_product<T, OrderA, OrderB>(a, p.a.ld, b, p.b.ld, c, p.c.ld, rows, cols, depth, bias);
    }
  };
  // Below Eigen's own threshold for threading (rows * cols * depth < 2 * 50000)
  // one product runs serially anyway; above it, run inside a parallel region
  // even for one item, where Eigen sees omp_get_num_threads() > 1 and stays
  // single-threaded (its multi-threaded blocking would change the bits).
  if (items == 1 && static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) < 1e5) {
    run_item(0);
    return;
  }
  // Dynamic: on a shared machine a preempted thread does not hold up the rest;
  // which thread runs an item never changes its bits.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < items; ++item) run_item(item);
  if (plan.splits_k == 1) return;
  // C = bias + partial[0] + partial[1] + ..., always in that order.
  const int64_t rows = p.batch * p.m, plane = p.batch * p.m * p.n;
#pragma omp parallel for if (rows * p.n > (1 << 15)) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t batch = row / p.m, r = row % p.m;
    T* c = static_cast<T*>(p.c.data) + batch * p.c.batch_stride + r * p.c.ld;
    const T* bias = static_cast<const T*>(p.bias);
    for (int64_t col = 0; col < p.n; ++col) c[col] = bias != nullptr ? bias[col] : T(0);
    for (int64_t split = 0; split < plan.splits_k; ++split) {
      const T* part = partial.data() + split * plane + row * p.n;
      for (int64_t col = 0; col < p.n; ++col) c[col] += part[col];
    }
  }
}

template <typename T>
void gemm_typed(const GemmProblem& p) {
  constexpr int kRow = Eigen::RowMajor, kCol = Eigen::ColMajor;
  // A transposed store of op(X) is op(X) in column-major order with the same ld.
  if (!p.a.transposed && !p.b.transposed) return run_tiles<T, kRow, kRow>(p);
  if (!p.a.transposed && p.b.transposed) return run_tiles<T, kRow, kCol>(p);
  if (p.a.transposed && !p.b.transposed) return run_tiles<T, kCol, kRow>(p);
  run_tiles<T, kCol, kCol>(p);
}

// A dense float copy of every distinct stored matrix of `x` (one when broadcast).
template <typename T>
std::vector<float> to_float(const GemmMatrix& x, int64_t batch, int64_t rows, int64_t cols, GemmMatrix* dense) {
  const int64_t stored_rows = x.transposed ? cols : rows, stored_cols = x.transposed ? rows : cols;
  const int64_t copies = x.batch_stride == 0 ? 1 : batch;
  std::vector<float> out(static_cast<size_t>(copies * stored_rows * stored_cols));
#pragma omp parallel for if (copies * stored_rows * stored_cols > (1 << 16)) schedule(static)
  for (int64_t row = 0; row < copies * stored_rows; ++row) {
    const int64_t b = row / stored_rows, r = row % stored_rows;
    const T* src = static_cast<const T*>(x.data) + b * x.batch_stride + r * x.ld;
    float* dst = out.data() + row * stored_cols;
    for (int64_t col = 0; col < stored_cols; ++col) dst[col] = static_cast<float>(src[col]);
  }
  *dense = GemmMatrix{out.data(), stored_cols, copies == 1 ? 0 : stored_rows * stored_cols, x.transposed};
  return out;
}

// float16/bfloat16: convert, multiply in float, convert back.
template <typename T>
void gemm_reduced_precision(const GemmProblem& p) {
  GemmProblem f = p;
  f.dtype = DType::f32;
  std::vector<float> a = to_float<T>(p.a, p.batch, p.m, p.k, &f.a);
  std::vector<float> b = to_float<T>(p.b, p.batch, p.k, p.n, &f.b);
  std::vector<float> bias;
  if (p.bias != nullptr) {
    bias.resize(static_cast<size_t>(p.n));
    for (int64_t i = 0; i < p.n; ++i) bias[i] = static_cast<float>(static_cast<const T*>(p.bias)[i]);
    f.bias = bias.data();
  }
  std::vector<float> c(static_cast<size_t>(p.batch * p.m * p.n));
  f.c = GemmMatrix{c.data(), p.n, p.m * p.n, false};
  gemm_typed<float>(f);
  const int64_t rows = p.batch * p.m;
#pragma omp parallel for if (rows * p.n > (1 << 16)) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / p.m, r = row % p.m;
    T* dst = static_cast<T*>(p.c.data) + b * p.c.batch_stride + r * p.c.ld;
    const float* src = c.data() + row * p.n;
    for (int64_t col = 0; col < p.n; ++col) dst[col] = T(src[col]);
  }
}

}  // namespace

void gemm_cpu(const GemmProblem& p) {
  KILN_ASSERT(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 0, "gemm_cpu: negative size");
  KILN_ASSERT(!p.c.transposed, "gemm_cpu: C must not be transposed");
  if (p.batch == 0 || p.m == 0 || p.n == 0) return;
  switch (p.dtype) {
    case DType::f32: return gemm_typed<float>(p);
    case DType::f64: return gemm_typed<double>(p);
    case DType::f16: return gemm_reduced_precision<Half>(p);
    case DType::bf16: return gemm_reduced_precision<BFloat16>(p);
    default: break;
  }
  KILN_THROW("matmul: integer and bool dtypes are not supported (got ", dtype_name(p.dtype),
             "); expected float32, float64, float16 or bfloat16");
}

}  // namespace kiln::kernels
