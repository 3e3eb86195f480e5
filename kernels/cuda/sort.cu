// CUDA top-k (kernels/sort.h): CUB's segmented radix sort orders every row
// (stable, so equal values keep the lower index first, as on the CPU), then a
// gather kernel writes each row's first k values and indices. CUB's radix order
// puts a NaN with its sign bit set below -inf (x86's 0/0 is one), while torch
// and the CPU put every NaN above +inf: the keys CUB sorts are a copy with the
// sign bit of each NaN cleared, and the values written are read back from the
// input by index, so every NaN keeps its bits. CUB already sorts -0.0 and +0.0
// as equal (ties by index, as on the CPU). Workspace: the sorted keys and the
// index arrays (int32 while sorting), the row offsets, the keys' copy, and
// CUB's temp storage; rows * cols must fit CUB's int offsets.
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/native_types.cuh"
#include "kernels/sort.h"

namespace kiln::kernels {

namespace {

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

struct TopkBuffers {
  void* keys_in;  // the input with every NaN made positive
  void* keys_out;
  int32_t* index_in;
  int32_t* index_out;
  int32_t* offsets;  // rows + 1
  void* temp;
  size_t temp_bytes;
};

template <typename K>
size_t cub_temp_bytes(const TopkArgs& args) {
  size_t bytes = 0;
  const int items = static_cast<int>(args.rows * args.cols), segments = static_cast<int>(args.rows);
  if (args.largest) {
    KILN_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, bytes, static_cast<const K*>(nullptr), static_cast<K*>(nullptr), static_cast<const int32_t*>(nullptr),
        static_cast<int32_t*>(nullptr), items, segments, static_cast<const int32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr)));
  } else {
    KILN_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
        nullptr, bytes, static_cast<const K*>(nullptr), static_cast<K*>(nullptr), static_cast<const int32_t*>(nullptr),
        static_cast<int32_t*>(nullptr), items, segments, static_cast<const int32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr)));
  }
  return bytes;
}

size_t fixed_bytes(const TopkArgs& args) {
  const size_t items = static_cast<size_t>(args.rows * args.cols);
  return 2 * align_up(items * dtype_size(args.dtype)) + 2 * align_up(items * 4) + align_up((args.rows + 1) * 4);
}

TopkBuffers carve(const TopkArgs& args, void* workspace, size_t workspace_bytes) {
  const size_t items = static_cast<size_t>(args.rows * args.cols);
  char* base = static_cast<char*>(workspace);
  TopkBuffers buffers;
  buffers.keys_in = base;
  base += align_up(items * dtype_size(args.dtype));
  buffers.keys_out = base;
  base += align_up(items * dtype_size(args.dtype));
  buffers.index_in = reinterpret_cast<int32_t*>(base);
  base += align_up(items * 4);
  buffers.index_out = reinterpret_cast<int32_t*>(base);
  base += align_up(items * 4);
  buffers.offsets = reinterpret_cast<int32_t*>(base);
  base += align_up((args.rows + 1) * 4);
  buffers.temp = base;
  KILN_ASSERT(workspace_bytes >= fixed_bytes(args), "topk: workspace of ", workspace_bytes, " bytes is too small");
  buffers.temp_bytes = workspace_bytes - fixed_bytes(args);
  return buffers;
}

// The key CUB sorts for x: a NaN with its sign bit cleared (CUB then puts it
// above +inf), anything else unchanged.
template <typename K>
__device__ __forceinline__ K positive_nan_key(K x) {
  if constexpr (std::is_integral_v<K>) {
    return x;
  } else {
    using Bits = std::conditional_t<sizeof(K) == 2, uint16_t, std::conditional_t<sizeof(K) == 4, uint32_t, uint64_t>>;
    constexpr int exponent_bits = std::is_same_v<K, __half> ? 5 : sizeof(K) == 8 ? 11 : 8;
    constexpr Bits sign = Bits{1} << (sizeof(K) * 8 - 1);
    constexpr Bits infinity = static_cast<Bits>(((Bits{1} << exponent_bits) - 1) << (sizeof(K) * 8 - 1 - exponent_bits));
    Bits bits;
    memcpy(&bits, &x, sizeof(K));
    if ((bits & ~sign) > infinity) bits &= static_cast<Bits>(~sign);
    memcpy(&x, &bits, sizeof(K));
    return x;
  }
}

// Per row: the indices 0..cols-1, the segment offsets, and the keys to sort.
template <typename K>
__global__ void init_kernel(const K* x, K* keys, int32_t* index, int32_t* offsets, int64_t rows, int64_t cols) {
  const int64_t items = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i <= items; i += int64_t{gridDim.x} * blockDim.x) {
    if (i < items) {
      index[i] = static_cast<int32_t>(i % cols);
      keys[i] = positive_nan_key(x[i]);
    }
    if (i % cols == 0) offsets[i / cols] = static_cast<int32_t>(i);
  }
}

// Each row's first k sorted positions: the index, and the input's value there.
template <typename K>
__global__ void take_kernel(const K* x, const int32_t* index, int64_t rows, int64_t cols, int64_t k, K* values,
                            int64_t* indices) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * k; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / k, j = i % k;
    const int32_t column = index[row * cols + j];
    values[i] = x[row * cols + column];
    indices[i] = column;
  }
}

int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535));
}

template <typename Fn>
void dispatch_keys(DType dtype, Fn&& fn) {
  dispatch_all(dtype, "topk", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      KILN_THROW("topk: bool tensors are not supported");
    } else {
      fn.template operator()<typename Native<T>::type>();
    }
  });
}

}  // namespace

size_t topk_cuda_workspace_bytes(const TopkArgs& args) {
  KILN_CHECK(args.rows * args.cols < INT_MAX, "topk (cuda): ", args.rows, " rows of ", args.cols,
             " values exceed the 2^31 elements CUB's segmented sort takes");
  size_t temp = 0;
  dispatch_keys(args.dtype, [&]<typename K>() { temp = cub_temp_bytes<K>(args); });
  return fixed_bytes(args) + align_up(temp);
}

void topk_cuda(const TopkArgs& args, void* workspace, size_t workspace_bytes, cuda::Stream stream) {
  if (args.rows == 0 || args.k == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  TopkBuffers buffers = carve(args, workspace, workspace_bytes);
  const int items = static_cast<int>(args.rows * args.cols), segments = static_cast<int>(args.rows);
  dispatch_keys(args.dtype, [&]<typename K>() {
    const auto* x = static_cast<const K*>(args.x);
    auto* keys_in = static_cast<K*>(buffers.keys_in);
    auto* keys_out = static_cast<K*>(buffers.keys_out);
    init_kernel<K><<<grid_for(items + 1, 256), 256, 0, s>>>(x, keys_in, buffers.index_in, buffers.offsets, args.rows,
                                                            args.cols);
    cuda::check_last_launch("topk (keys and indices)");
    if (args.largest) {
      KILN_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
          buffers.temp, buffers.temp_bytes, keys_in, keys_out, buffers.index_in, buffers.index_out, items, segments,
          buffers.offsets, buffers.offsets + 1, 0, static_cast<int>(sizeof(K) * 8), s));
    } else {
      KILN_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
          buffers.temp, buffers.temp_bytes, keys_in, keys_out, buffers.index_in, buffers.index_out, items, segments,
          buffers.offsets, buffers.offsets + 1, 0, static_cast<int>(sizeof(K) * 8), s));
    }
    take_kernel<K><<<grid_for(args.rows * args.k, 256), 256, 0, s>>>(x, buffers.index_out, args.rows, args.cols, args.k,
                                                                    static_cast<K*>(args.values), args.indices);
    cuda::check_last_launch("topk (take)");
  });
}

}  // namespace kiln::kernels
