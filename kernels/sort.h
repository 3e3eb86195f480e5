// Sorting along the last dim of dense rows (kiln::topk, core/ops/sort.cpp).
//
// Each of `rows` rows of `cols` values is ordered descending (largest) or
// ascending, stably: equal values keep their order, so the lower index comes
// first on both devices. NaN counts as larger than every number (torch's
// topk). The CPU keeps only the first k of each row; CUDA sorts whole rows
// with CUB's segmented radix sort into caller workspace and writes the first
// k. Values keep the input's dtype; indices are int64. Nothing synchronizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

struct TopkArgs {
  DType dtype = DType::f32;
  const void* x = nullptr;  // (rows, cols)
  int64_t rows = 0, cols = 0, k = 0;
  bool largest = true;
  void* values = nullptr;     // (rows, k), x's dtype
  int64_t* indices = nullptr; // (rows, k)
};

void topk_cpu(const TopkArgs& args);
size_t topk_cuda_workspace_bytes(const TopkArgs& args);
void topk_cuda(const TopkArgs& args, void* workspace, size_t workspace_bytes, cuda::Stream stream);

}  // namespace kiln::kernels
