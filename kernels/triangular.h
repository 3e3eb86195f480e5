// tril / triu (core/ops/triangular.cpp): out = x where the element keeps its
// place (tril: col - row <= diagonal; triu: col - row >= diagonal), 0 elsewhere,
// over `batch` dense (rows, cols) matrices of any dtype. The backward is the
// same op on the gradient. Nothing synchronizes.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

struct TriangularArgs {
  DType dtype = DType::f32;
  const void* x = nullptr;
  void* out = nullptr;
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t diagonal = 0;
  bool upper = false;  // triu
};

// Whether (row, col) keeps its value.
KILN_HOST_DEVICE inline bool triangular_keeps(const TriangularArgs& args, int64_t row, int64_t col) {
  return args.upper ? col - row >= args.diagonal : col - row <= args.diagonal;
}

void triangular_cpu(const TriangularArgs& args);
void triangular_cuda(const TriangularArgs& args, cuda::Stream stream);

}  // namespace kiln::kernels
