#include "kernels/strided.h"

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

}  // namespace kiln::kernels
