// Shape and strides of the operands of an elementwise kernel, passed by value
// to CPU and CUDA kernels alike. Sizes and strides are in elements. Operands
// share one iteration shape (already broadcast: a broadcast dim has stride 0).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kiln::kernels {

constexpr int kMaxDims = 10;
constexpr int kMaxOperands = 4;

struct IterShape {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= sizes[d];
    return n;
  }
};

struct Operand {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t strides[kMaxDims] = {};
};

// Merges adjacent dims that are contiguous in every operand and drops size-1
// dims, so a contiguous tensor of any shape iterates as one flat dim.
void coalesce(IterShape& shape, Operand* operands, int count);

// True when every operand is dense row-major over `shape` (after coalesce: one
// dim with stride 1, or no dim).
bool all_contiguous(const IterShape& shape, const Operand* operands, int count);

// Element offsets of linear index `index` over `shape`, one per operand.
KILN_HOST_DEVICE inline void offsets_of(int64_t index, const IterShape& shape, const Operand* operands,
                                        int count, int64_t* offsets) {
  for (int k = 0; k < count; ++k) offsets[k] = 0;
  for (int d = shape.ndim - 1; d >= 0; --d) {
    int64_t coordinate = index % shape.sizes[d];
    index /= shape.sizes[d];
    for (int k = 0; k < count; ++k) offsets[k] += coordinate * operands[k].strides[d];
  }
}

}  // namespace kiln::kernels
