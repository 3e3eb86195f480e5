#include "kernels/strided.h"

#include <atomic>
#include <cstdlib>

#include "kernels/error.h"

namespace kiln::kernels {

void coalesce(IterShape& shape, Operand* operands, int count) {
  // Drop size-1 dims first: their strides are irrelevant.
  int kept = 0;
  for (int d = 0; d < shape.ndim; ++d) {
    if (shape.sizes[d] == 1) continue;
    shape.sizes[kept] = shape.sizes[d];
    for (int k = 0; k < count; ++k) operands[k].strides[kept] = operands[k].strides[d];
    ++kept;
  }
  shape.ndim = kept;
  if (shape.ndim <= 1) return;
  // Merge dim d into the previous one when, for every operand, stepping the
  // outer dim once equals stepping the inner dim through its whole size.
  int out = 0;
  for (int d = 1; d < shape.ndim; ++d) {
    bool mergeable = true;
    for (int k = 0; k < count; ++k) {
      if (operands[k].strides[out] != operands[k].strides[d] * shape.sizes[d]) mergeable = false;
    }
    if (mergeable) {
      shape.sizes[out] *= shape.sizes[d];
      for (int k = 0; k < count; ++k) operands[k].strides[out] = operands[k].strides[d];
    } else {
      ++out;
      shape.sizes[out] = shape.sizes[d];
      for (int k = 0; k < count; ++k) operands[k].strides[out] = operands[k].strides[d];
    }
  }
  shape.ndim = out + 1;
}

bool all_contiguous(const IterShape& shape, const Operand* operands, int count) {
  if (shape.ndim == 0) return true;
  if (shape.ndim > 1) return false;
  for (int k = 0; k < count; ++k) {
    if (operands[k].strides[0] != 1) return false;
  }
  return true;
}

TransposeSplit transpose_split(const IterShape& shape, const Operand* operands) {
  int to_dim = -1, from_dim = -1;
  for (int d = 0; d < shape.ndim; ++d) {
    if (operands[0].strides[d] == 1 && to_dim < 0) to_dim = d;
    if (operands[1].strides[d] == 1 && from_dim < 0) from_dim = d;
  }
  TransposeSplit split;
  if (to_dim < 0 || from_dim < 0 || to_dim == from_dim) return split;
  const auto line_elements = static_cast<int64_t>(64 / dtype_size(operands[1].dtype));
  if (std::abs(operands[1].strides[to_dim]) < line_elements) return split;
  split.found = true;
  split.rows = shape.sizes[from_dim];
  split.cols = shape.sizes[to_dim];
  split.dst_row_stride = operands[0].strides[from_dim];
  split.src_col_stride = operands[1].strides[to_dim];
  for (int k = 0; k < 2; ++k) split.rest_operands[k] = operands[k];
  for (int d = 0; d < shape.ndim; ++d) {
    if (d == to_dim || d == from_dim) continue;
    split.rest.sizes[split.rest.ndim] = shape.sizes[d];
    for (int k = 0; k < 2; ++k) split.rest_operands[k].strides[split.rest.ndim] = operands[k].strides[d];
    ++split.rest.ndim;
  }
  return split;
}

FastDivmod::FastDivmod(uint32_t d) : divisor(d) {
  KILN_CHECK(d >= 1 && d <= (uint32_t{1} << 31), "FastDivmod: divisor ", d, " outside [1, 2^31]");
  shift = 0;
  while ((uint64_t{1} << shift) < d) ++shift;  // 2^shift >= d
  // magic = 2^32 (2^shift - d) / d + 1 < 2^32, as 2^shift - d < d.
  magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
}

namespace {
std::atomic<bool> forced_64bit_index{false};
}  // namespace

void force_64bit_index_for_testing(bool force) { forced_64bit_index.store(force); }
bool force_64bit_index() { return forced_64bit_index.load(); }

FastIterShape fast_iter_shape(const IterShape& shape) {
  KILN_CHECK(shape.numel() < (int64_t{1} << 31), "fast_iter_shape: ", shape.numel(), " elements need 64-bit indexing");
  FastIterShape fast;
  fast.ndim = shape.ndim;
  for (int d = 0; d < shape.ndim; ++d) fast.sizes[d] = FastDivmod(static_cast<uint32_t>(shape.sizes[d]));
  return fast;
}

}  // namespace kiln::kernels
