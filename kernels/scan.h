// Cumulative sums along one dim (kiln::cumsum, core/ops/scan.cpp).
//
// The front end makes the input dense and describes it as (outer, length,
// inner): element (o, l, i) sits at (o * length + l) * inner + i, and the sum
// runs along l. Each of the outer * inner lines is summed in order, one after
// the other element, in the accumulation type (float for float32/16-bit,
// double for float64, int64 for integers and bool), so the CPU and CUDA give
// the same bits. `reverse` sums from the end (the backward of cumsum). The
// output has the input's dtype for floating inputs and int64 otherwise.
// Nothing here synchronizes.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

struct ScanArgs {
  DType dtype = DType::f32;      // the input's
  DType out_dtype = DType::f32;  // the input's, or int64 for integer/bool inputs
  const void* x = nullptr;
  void* out = nullptr;
  int64_t outer = 1, length = 0, inner = 1;
  bool reverse = false;
};

void cumsum_cpu(const ScanArgs& args);
void cumsum_cuda(const ScanArgs& args, cuda::Stream stream);

}  // namespace kiln::kernels
