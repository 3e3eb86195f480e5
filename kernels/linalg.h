// Matrix products: one (strided-batched) row-major GEMM for CPU and CUDA.
//
//   C[b] = op(A[b]) @ op(B[b]) (+ bias)     op(A[b]) (m, k), op(B[b]) (k, n), C[b] (m, n)
//
// Operands are raw pointers with a leading dimension, a transpose flag and a
// batch stride, so a transposed contiguous matrix is passed as a flag, never
// copied; a batch stride of 0 broadcasts one matrix over the batch. C is never
// transposed and its batches must not overlap. Integer dtypes are not
// supported (kiln::Error). k may be 0 (C is then 0, or the bias).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

// Element (b, r, c) of op(X) is data[b * batch_stride + (transposed ? c * ld + r : r * ld + c)].
struct GemmMatrix {
  void* data = nullptr;
  int64_t ld = 0;            // row stride of the stored matrix (>= its column count)
  int64_t batch_stride = 0;  // 0 broadcasts
  bool transposed = false;
};

struct GemmProblem {
  DType dtype = DType::f32;  // of A, B, C and bias
  int64_t batch = 1, m = 0, n = 0, k = 0;
  GemmMatrix a, b, c;
  const void* bias = nullptr;  // (n), added to every row of every C[b]; null for none
};

// On the CPU: Eigen products in float/double (float16/bfloat16 are converted
// to float and back). Work is split into items (batch entries x tiles of C x
// chunks of k) fixed by the shape alone and run in parallel with OpenMP, each
// by one thread, chunk partials summed in a fixed order, so results do not
// depend on the thread count.
void gemm_cpu(const GemmProblem& problem);

// On the GPU: cuBLASLt for float32 (TF32 tensor cores only when allow_tf32),
// float16 and bfloat16 (float32 accumulation), with the bias as an epilogue;
// cuBLAS for float64. `workspace` (device memory of `workspace_bytes`, used
// only on `stream`) comes from the caller. Deterministic: the same inputs on
// the same GPU give the same bits. Does not synchronize.
void gemm_cuda(const GemmProblem& problem, bool allow_tf32, void* workspace, size_t workspace_bytes, int device,
               cuda::Stream stream);
// The workspace size gemm_cuda wants on `device` (32 MiB on Hopper, 4 MiB before).
size_t gemm_cuda_workspace_bytes(int device);

}  // namespace kiln::kernels
