// CPU gather and scatter-add along one dim (see kernels/indexing.h).
//
// The index's shape is split into (outer dims, the indexed dim, inner dims),
// each side coalesced, so the common cases (rows of a contiguous matrix, the
// last dim) run a tight inner loop. gather parallelizes over every (outer,
// index) pair. scatter_add parallelizes over (outer, block of inner) only and
// walks the indexed dim sequentially inside each task: each destination
// element is then written by exactly one thread, in index order, so the result
// is race-free and independent of the thread count.
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/indexing.h"

namespace kiln::kernels {

namespace {

constexpr int64_t kParallelThreshold = 1 << 15;  // elements

// scatter: inner elements per task, small enough for ~4 tasks per thread when
// the outer dims are few (embedding rows). The result does not depend on it.
int64_t inner_block(int64_t n_outer, int64_t n_inner) {
  const int64_t wanted_tasks = 4 * static_cast<int64_t>(omp_get_max_threads());
  const int64_t splits = std::max<int64_t>(1, (wanted_tasks + n_outer - 1) / n_outer);
  return std::max<int64_t>(64, (n_inner + splits - 1) / splits);
}

// The iteration split around the indexed dim; operands are (data, index, values).
struct Loop {
  IterShape outer, inner;
  Operand outer_ops[3], inner_ops[3];
  int64_t length = 0;  // index size along dim
  int64_t data_step = 0, index_step = 0, values_step = 0;  // strides along dim
};

Loop split(const IndexArgs& args) {
  Loop loop;
  const Operand ops[3] = {args.data, args.index, args.values};
  loop.outer.ndim = args.dim;
  loop.inner.ndim = args.shape.ndim - args.dim - 1;
  for (int d = 0; d < args.shape.ndim; ++d) {
    if (d == args.dim) continue;
    const bool before = d < args.dim;
    const int slot = before ? d : d - args.dim - 1;
    (before ? loop.outer : loop.inner).sizes[slot] = args.shape.sizes[d];
    for (int k = 0; k < 3; ++k) (before ? loop.outer_ops : loop.inner_ops)[k].strides[slot] = ops[k].strides[d];
  }
  loop.length = args.shape.sizes[args.dim];
  loop.data_step = args.data.strides[args.dim];
  loop.index_step = args.index.strides[args.dim];
  loop.values_step = args.values.strides[args.dim];
  coalesce(loop.outer, loop.outer_ops, 3);
  coalesce(loop.inner, loop.inner_ops, 3);
  return loop;
}

void record_error(IndexError& error, int64_t value, int64_t size) {
#pragma omp critical(kiln_index_error)
  {
    if (!error.found) error = IndexError{true, value, size};
  }
}

// Calls body(i, data_offset, index_offset, values_offset) for inner elements
// [begin, end) relative to the given bases.
template <typename Body>
inline void for_inner(const Loop& loop, int64_t begin, int64_t end, const int64_t* base, Body&& body) {
  if (loop.inner.ndim <= 1) {
    const int64_t sd = loop.inner_ops[0].strides[0], si = loop.inner_ops[1].strides[0],
                  sv = loop.inner_ops[2].strides[0];
    for (int64_t i = begin; i < end; ++i) body(base[0] + i * sd, base[1] + i * si, base[2] + i * sv);
    return;
  }
  for (int64_t i = begin; i < end; ++i) {
    int64_t offsets[3];
    offsets_of(i, loop.inner, loop.inner_ops, 3, offsets);
    body(base[0] + offsets[0], base[1] + offsets[1], base[2] + offsets[2]);
  }
}

template <typename T, typename I>
IndexError gather_typed(const IndexArgs& args) {
  const Loop loop = split(args);
  const T* data = static_cast<const T*>(args.data.data);
  const I* index = static_cast<const I*>(args.index.data);
  T* values = static_cast<T*>(args.values.data);
  const int64_t size = args.data_dim_size;
  const int64_t n_outer = loop.outer.numel(), n_inner = loop.inner.numel();
  const int64_t tasks = n_outer * loop.length;
  // index_select and embedding: one index per (outer, j) row, and the row
  // contiguous in data and values: checked once and copied (the per-element
  // loop below reads and checks the same index for every element of the row).
  const bool row_copy = loop.inner.ndim == 1 && loop.inner_ops[0].strides[0] == 1 &&
                        loop.inner_ops[1].strides[0] == 0 && loop.inner_ops[2].strides[0] == 1;
  IndexError error;
#pragma omp parallel for if (tasks * n_inner > kParallelThreshold) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t o = task / loop.length, j = task % loop.length;
    int64_t base[3];
    offsets_of(o, loop.outer, loop.outer_ops, 3, base);
    base[1] += j * loop.index_step;
    base[2] += j * loop.values_step;
    if (row_copy) {
      const int64_t at = static_cast<int64_t>(index[base[1]]);
      if (at < 0 || at >= size) [[unlikely]] {
        record_error(error, at, size);
        continue;
      }
      const T* row = data + base[0] + at * loop.data_step;
      std::copy(row, row + n_inner, values + base[2]);
      continue;
    }
    for_inner(loop, 0, n_inner, base, [&](int64_t d, int64_t i, int64_t v) {
      const int64_t at = static_cast<int64_t>(index[i]);
      if (at < 0 || at >= size) [[unlikely]] {
        record_error(error, at, size);
        return;
      }
      values[v] = data[d + at * loop.data_step];
    });
  }
  return error;
}

template <typename T, typename I>
IndexError scatter_add_typed(const IndexArgs& args) {
  using C = compute_t<T>;
  const Loop loop = split(args);
  T* data = static_cast<T*>(args.data.data);
  const I* index = static_cast<const I*>(args.index.data);
  const T* values = static_cast<const T*>(args.values.data);
  const int64_t size = args.data_dim_size;
  const int64_t n_outer = loop.outer.numel(), n_inner = loop.inner.numel();
  const int64_t block_size = inner_block(n_outer, n_inner);
  const int64_t blocks = (n_inner + block_size - 1) / block_size;
  const int64_t tasks = n_outer * blocks;
  IndexError error;
#pragma omp parallel for if (tasks > 1 && n_outer * loop.length * n_inner > kParallelThreshold) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t o = task / blocks, block = task % blocks;
    const int64_t begin = block * block_size, end = std::min(n_inner, begin + block_size);
    int64_t outer_base[3];
    offsets_of(o, loop.outer, loop.outer_ops, 3, outer_base);
    for (int64_t j = 0; j < loop.length; ++j) {
      const int64_t base[3] = {outer_base[0], outer_base[1] + j * loop.index_step,
                               outer_base[2] + j * loop.values_step};
      for_inner(loop, begin, end, base, [&](int64_t d, int64_t i, int64_t v) {
        const int64_t at = static_cast<int64_t>(index[i]);
        if (at < 0 || at >= size) [[unlikely]] {
          record_error(error, at, size);
          return;
        }
        T& target = data[d + at * loop.data_step];
        target = static_cast<T>(static_cast<C>(target) + static_cast<C>(values[v]));
      });
    }
  }
  return error;
}

}  // namespace

IndexError gather_cpu(const IndexArgs& args) {
  if (args.shape.numel() == 0) return {};
  return dispatch_all(args.data.dtype, "gather", [&]<typename T>() {
    return dispatch_index(args.index.dtype, "gather", [&]<typename I>() { return gather_typed<T, I>(args); });
  });
}

IndexError scatter_add_cpu(const IndexArgs& args) {
  if (args.shape.numel() == 0) return {};
  return dispatch_all(args.data.dtype, "scatter_add", [&]<typename T>() -> IndexError {
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>) {
      KILN_THROW("scatter_add: unsupported dtype ", dtype_name(args.data.dtype),
                 " (expected a floating dtype, int32 or int64)");
    } else {
      return dispatch_index(args.index.dtype, "scatter_add",
                            [&]<typename I>() { return scatter_add_typed<T, I>(args); });
    }
  });
}

namespace {

template <typename T, typename I>
IndexError index_add_rows_typed(const IndexAddArgs& args) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto* index = static_cast<const I*>(args.index);
  const auto* values = static_cast<const T*>(args.values);
  auto* data = static_cast<T*>(args.data);
  const int64_t rows = args.data_dim_size, count = args.count, inner = args.inner;
  // Counting sort of the positions by their row (stable: index order within a row).
  std::vector<int64_t> starts(static_cast<size_t>(rows + 1), 0), order(static_cast<size_t>(count));
  IndexError error;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = static_cast<int64_t>(index[i]);
    if (row < 0 || row >= rows) {
      if (!error.found) error = {true, row, rows};
      continue;
    }
    ++starts[static_cast<size_t>(row + 1)];
  }
  for (int64_t r = 0; r < rows; ++r) starts[static_cast<size_t>(r + 1)] += starts[static_cast<size_t>(r)];
  {
    std::vector<int64_t> next(starts.begin(), starts.end() - 1);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = static_cast<int64_t>(index[i]);
      if (row >= 0 && row < rows) order[static_cast<size_t>(next[static_cast<size_t>(row)]++)] = i;
    }
  }
  const int64_t tasks = args.outer * rows;
#pragma omp parallel if (tasks * inner > kParallelThreshold)
  {
    std::vector<Acc> sum(static_cast<size_t>(inner));
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t o = task / rows, r = task % rows;
      T* out = data + (o * rows + r) * inner;
      const int64_t begin = starts[static_cast<size_t>(r)], end = starts[static_cast<size_t>(r + 1)];
      if (begin == end) {
        std::fill(out, out + inner, T(0));
        continue;
      }
      std::fill(sum.begin(), sum.end(), Acc(0));
      for (int64_t k = begin; k < end; ++k) {
        const T* in = values + (o * count + order[static_cast<size_t>(k)]) * inner;
        for (int64_t j = 0; j < inner; ++j) sum[static_cast<size_t>(j)] += static_cast<Acc>(in[j]);
      }
      for (int64_t j = 0; j < inner; ++j) out[j] = static_cast<T>(sum[static_cast<size_t>(j)]);
    }
  }
  return error;
}

}  // namespace

IndexError index_add_rows_cpu(const IndexAddArgs& args) {
  return dispatch_floating(args.dtype, "index_add", [&]<typename T>() {
    return dispatch_index(args.index_dtype, "index_add",
                          [&]<typename I>() { return index_add_rows_typed<T, I>(args); });
  });
}

}  // namespace kiln::kernels
