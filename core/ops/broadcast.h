// Helpers shared by the op families: NumPy broadcasting, turning tensors into
// kernel operands (kernels::IterShape / kernels::Operand, broadcast dims get
// stride 0), and the checks every op makes on its inputs, with messages that
// name the op, the shapes, dtypes and devices.
#pragma once

#include "core/tensor.h"
#include "kernels/strided.h"

namespace kiln {

// The broadcast of two shapes (NumPy rules: align trailing dims; sizes must be
// equal or 1). Throws kiln::Error naming `op` and both shapes otherwise.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// The iteration shape of a kernel over `shape`; throws when it has more dims
// than the kernels support (kernels::kMaxDims).
kernels::IterShape iter_shape(const Shape& shape);

// Strides (in elements) of `tensor` viewed as broadcast to `shape`: 0 on dims
// that are broadcast, the tensor's own stride elsewhere. Throws naming `op`
// when the tensor's shape does not broadcast to `shape`.
Shape broadcast_strides(const Tensor& tensor, const Shape& shape, const char* op);

// A kernel operand for `tensor` iterated over `out_shape` (with broadcast
// strides as above). Throws naming `op` when the shapes do not broadcast.
kernels::Operand operand(const Tensor& tensor, const Shape& out_shape, const char* op);

// Reorders the iteration dims so that operands[0] (the output) is walked in
// its memory order (strides descending): a channels-last output, and inputs of
// its layout, then coalesce into one flat dim in the kernels. For ops whose
// result does not depend on the visiting order (elementwise ops, copies).
void iterate_in_memory_order(kernels::IterShape& shape, kernels::Operand* operands, int count);

// A new tensor of `shape` for an elementwise result: channels-last when
// `like` has `shape` and is channels-last (torch keeps the memory format of
// the input), else contiguous.
Tensor empty_in_layout_of(const Tensor& like, const Shape& shape, const TensorOptions& options);

// Throws naming `op` and `what` ("input", "other", ...) when `tensor` is undefined.
void check_defined(const Tensor& tensor, const char* op, const char* what = "input");
// Throws naming `op`, both shapes and both devices when they differ.
void check_same_device(const Tensor& a, const Tensor& b, const char* op);
// Throws naming `op`, both shapes and both dtypes when they differ.
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);

// Checks that `self` may be written in place by `op`: not a tensor that
// requires grad while grad mode is on (autograd could not see the write), and
// no two of its elements share memory (an expanded tensor).
void check_inplace_target(const Tensor& self, const char* op);

}  // namespace kiln
