// CUDA cumulative sums (kernels/scan.h): one thread per line, summing in the
// same order and type as the CPU, so both give the same bits. Transformer uses
// (positions, key-padding lengths, sampling CDFs) have many short lines; a
// single very long line runs on one thread, correct but not fast.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/scan.h"

namespace kiln::kernels {

namespace {

template <typename T, typename Out>
__global__ void cumsum_kernel(const ScanArgs args) {
  using Sum = std::conditional_t<std::is_floating_point_v<typename Acc<T>::type>, typename Acc<T>::type, int64_t>;
  const auto* x = static_cast<const T*>(args.x);
  auto* out = static_cast<Out*>(args.out);
  const int64_t lines = args.outer * args.inner;
  for (int64_t line = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; line < lines;
       line += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = line / args.inner, i = line % args.inner;
    const int64_t base = o * args.length * args.inner + i;
    Sum sum = 0;
    for (int64_t step = 0; step < args.length; ++step) {
      const int64_t l = args.reverse ? args.length - 1 - step : step;
      sum += static_cast<Sum>(to_acc(x[base + l * args.inner]));
      if constexpr (std::is_same_v<Out, T>) {
        out[base + l * args.inner] = from_acc<T>(sum);
      } else {
        out[base + l * args.inner] = static_cast<Out>(sum);
      }
    }
  }
}

}  // namespace

void cumsum_cuda(const ScanArgs& args, cuda::Stream stream) {
  const int64_t lines = args.outer * args.inner;
  if (lines == 0 || args.length == 0) return;
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((lines + kThreads - 1) / kThreads, 65535));
  dispatch_all(args.dtype, "cumsum", [&]<typename T>() {
    using N = typename Native<T>::type;
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      cumsum_kernel<N, N><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
    } else {
      cumsum_kernel<N, int64_t><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
    }
  });
  cuda::check_last_launch("cumsum");
}

}  // namespace kiln::kernels
