// Strided copy with dtype conversion, and fill: the kernels behind
// Tensor::copy_, contiguous(), to(dtype) and the constant factories.
#pragma once

#include "kernels/cuda/runtime.h"
#include "kernels/strided.h"

namespace kiln::kernels {

// operands[0] = destination, operands[1] = source (converted to the destination dtype).
void copy_cpu(const IterShape& shape, const Operand& dst, const Operand& src);
void copy_cuda(const IterShape& shape, const Operand& dst, const Operand& src, cuda::Stream stream);
// Sets `count` contiguous elements of `dtype` at `data` to `value`.
void fill_cpu(void* data, DType dtype, int64_t count, double value);
void fill_cuda(void* data, DType dtype, int64_t count, double value, cuda::Stream stream);

}  // namespace kiln::kernels
