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

// Division by a fixed divisor in [1, 2^31] with a multiply-high and a shift
// (Granlund and Montgomery's method, as torch's IntDivider): exact for every
// dividend below 2^31. Elementwise CUDA kernels index with it when the
// iteration has fewer than 2^31 elements: a 64-bit division is a software
// routine of tens of instructions on the GPU, and two per element and dim
// made strided copies compute-bound by an instruction count (not yet
// measured on a GPU).
struct FastDivmod {
  uint32_t divisor = 1, magic = 1, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t d);  // kiln::Error unless 1 <= d <= 2^31
  KILN_HOST_DEVICE uint32_t div(uint32_t n) const {
    const auto high = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
    return (high + n) >> shift;  // high + n < 2^32 for n < 2^31
  }
};

// A transpose-like copy of operands[1] into operands[0] (coalesced), split for a
// tiled kernel (kernels/cpu/copy.cpp, kernels/cuda/copy.cu): the destination is
// dense along one dim (a tile's columns), the source along another (its rows),
// and the source's stride along the columns is 64 bytes or more, so that
// walking the destination row by row reads a new cache line per element.
// Element (rest index, row r, column c) is at dst[offsets[0] + r * dst_row_stride + c]
// and src[offsets[1] + r + c * src_col_stride], offsets_of(rest index, rest, rest_operands).
struct TransposeSplit {
  bool found = false;
  int64_t rows = 0, cols = 0, dst_row_stride = 0, src_col_stride = 0;
  IterShape rest;  // the other dims
  Operand rest_operands[2];
};
TransposeSplit transpose_split(const IterShape& shape, const Operand* operands);

// Tests only: CUDA kernels that divide their flat index by FastDivmod below a
// size limit (pooling, the reductions' and nll_loss's backward) take their
// 64-bit-division path at every size instead, so both paths run on small tensors.
void force_64bit_index_for_testing(bool force);
bool force_64bit_index();

// An IterShape for indices below 2^31, its sizes as FastDivmods.
struct FastIterShape {
  int ndim = 0;
  FastDivmod sizes[kMaxDims];
};
// shape.numel() must be below 2^31 (kiln::Error otherwise).
FastIterShape fast_iter_shape(const IterShape& shape);

// offsets_of for an index below shape's element count (so dim 0 needs no division).
KILN_HOST_DEVICE inline void fast_offsets_of(uint32_t index, const FastIterShape& shape, const Operand* operands,
                                             int count, int64_t* offsets) {
  for (int k = 0; k < count; ++k) offsets[k] = 0;
  for (int d = shape.ndim - 1; d > 0; --d) {
    const uint32_t quotient = shape.sizes[d].div(index);
    const int64_t coordinate = index - quotient * shape.sizes[d].divisor;
    index = quotient;
    for (int k = 0; k < count; ++k) offsets[k] += coordinate * operands[k].strides[d];
  }
  if (shape.ndim > 0) {
    for (int k = 0; k < count; ++k) offsets[k] += static_cast<int64_t>(index) * operands[k].strides[0];
  }
}

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
