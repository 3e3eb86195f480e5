// CUDA tril / triu (kernels/triangular.h): one thread per element (grid-stride).
#include <cuda_runtime_api.h>

#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/triangular.h"

namespace kiln::kernels {

namespace {

template <typename T>
__global__ void triangular_kernel(const TriangularArgs args) {
  const auto* x = static_cast<const T*>(args.x);
  auto* out = static_cast<T*>(args.out);
  const int64_t n = args.batch * args.rows * args.cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t col = i % args.cols, row = i / args.cols % args.rows;
    out[i] = triangular_keeps(args, row, col) ? x[i] : T{};
  }
}

}  // namespace

void triangular_cuda(const TriangularArgs& args, cuda::Stream stream) {
  const int64_t n = args.batch * args.rows * args.cols;
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  dispatch_all(args.dtype, args.upper ? "triu" : "tril", [&]<typename T>() {
    triangular_kernel<typename Native<T>::type><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  });
  cuda::check_last_launch(args.upper ? "triu" : "tril");
}

}  // namespace kiln::kernels
