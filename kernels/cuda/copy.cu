// CUDA strided copy with dtype conversion, and fill. A dense same-dtype copy is
// one cudaMemcpyAsync; a same-dtype strided copy moves raw 1/2/4/8-byte words,
// a transpose-like one (kernels::transpose_split) through shared-memory tiles;
// conversions go through the elementwise launcher (vectorized when dense).
#include <algorithm>
#include <cmath>

#include "kernels/copy.h"
#include "kernels/cuda/elementwise_launch.cuh"

namespace kiln::kernels {

namespace {

struct Identity {
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    return x;
  }
};

template <typename T>
struct Constant {
  T value;
  __device__ __forceinline__ T operator()() const { return value; }
};

template <typename Word>
void copy_words(const IterShape& shape, const Operand& dst, const Operand& src, cuda::Stream stream) {
  const Operand operands[2] = {dst, src};
  cuda_detail::launch<Word, Word>(shape, operands, Identity{}, stream, "copy");
}

// A transpose through 32 x 32 tiles in shared memory, so that a warp reads 32
// consecutive source elements (along a tile's rows) and writes 32 consecutive
// destination elements (along its columns): the elementwise kernel reads the
// source a stride apart per lane, one 32-byte sector per 4-byte element.
// Block (32, 8); grid (column tiles, row tiles, the other dims' index).
constexpr int kTile = 32, kTileLanes = 8;

template <typename Word>
__global__ void __launch_bounds__(kTile * kTileLanes) transpose_tiles_kernel(TransposeSplit split, int64_t rest_count,
                                                                              Word* dst, const Word* src) {
  __shared__ Word tile[kTile][kTile + 1];  // [column][row]; + 1: a column's reads spread over the banks
  const int64_t col0 = int64_t{blockIdx.x} * kTile, row0 = int64_t{blockIdx.y} * kTile;
  const int lane = threadIdx.x, group = threadIdx.y;
  for (int64_t rest = blockIdx.z; rest < rest_count; rest += gridDim.z) {
    int64_t offsets[2];
    offsets_of(rest, split.rest, split.rest_operands, 2, offsets);
    const int64_t row = row0 + lane;
#pragma unroll
    for (int j = group; j < kTile; j += kTileLanes) {
      const int64_t col = col0 + j;
      if (row < split.rows && col < split.cols) tile[j][lane] = src[offsets[1] + col * split.src_col_stride + row];
    }
    __syncthreads();
    const int64_t col = col0 + lane;
#pragma unroll
    for (int j = group; j < kTile; j += kTileLanes) {
      const int64_t out_row = row0 + j;
      if (out_row < split.rows && col < split.cols) {
        dst[offsets[0] + out_row * split.dst_row_stride + col] = tile[lane][j];
      }
    }
    __syncthreads();  // the tile is read before the next rest index overwrites it
  }
}

template <typename Word>
void copy_transposed(const TransposeSplit& split, const Operand* operands, cuda::Stream stream) {
  const int64_t rest_count = split.rest.numel();
  const dim3 grid(static_cast<unsigned>((split.cols + kTile - 1) / kTile),
                  static_cast<unsigned>((split.rows + kTile - 1) / kTile),
                  static_cast<unsigned>(std::min<int64_t>(rest_count, 65535)));
  transpose_tiles_kernel<Word><<<grid, dim3(kTile, kTileLanes), 0, static_cast<cudaStream_t>(stream)>>>(
      split, rest_count, static_cast<Word*>(operands[0].data), static_cast<const Word*>(operands[1].data));
  cuda::check_last_launch("copy (transpose)");
}

template <typename To, typename From>
inline To host_convert(From value) {
  if constexpr (std::is_same_v<To, bool>) {
    return value != 0;
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace

void copy_cuda(const IterShape& input_shape, const Operand& input_dst, const Operand& input_src, cuda::Stream stream) {
  IterShape shape = input_shape;
  Operand operands[2] = {input_dst, input_src};
  coalesce(shape, operands, 2);
  const int64_t n = shape.numel();
  if (n == 0) return;
  const DType to = operands[0].dtype, from = operands[1].dtype;
  if (to == from) {
    if (all_contiguous(shape, operands, 2)) {
      cuda::memcpy_async(operands[0].data, operands[1].data, static_cast<size_t>(n) * dtype_size(to),
                         cuda::CopyKind::device_to_device, stream);
      return;
    }
    // Rows of contiguous elements at other row strides (a column slice, a
    // narrowed last dim): one cudaMemcpy2DAsync, not the elementwise kernel's
    // index arithmetic per element (22% of the H200's copy rate in float32,
    // 13% in bf16: bench_kernels "copy_ into a column slice").
    if (shape.ndim == 2 && operands[0].strides[1] == 1 && operands[1].strides[1] == 1 &&
        operands[0].strides[0] >= shape.sizes[1] && operands[1].strides[0] >= shape.sizes[1]) {
      const auto element = static_cast<size_t>(dtype_size(to));
      cuda::memcpy_2d_device_async(operands[0].data, static_cast<size_t>(operands[0].strides[0]) * element,
                                   operands[1].data, static_cast<size_t>(operands[1].strides[0]) * element,
                                   static_cast<size_t>(shape.sizes[1]) * element, static_cast<size_t>(shape.sizes[0]),
                                   stream);
      return;
    }
    // Within the grid's limits: at most 2^31 - 1 column tiles and 65535 row tiles.
    if (const TransposeSplit split = transpose_split(shape, operands);
        split.found && split.rows <= int64_t{65535} * kTile && split.cols <= int64_t{2147483647} * kTile) {
      switch (dtype_size(to)) {
        case 1: return copy_transposed<uint8_t>(split, operands, stream);
        case 2: return copy_transposed<uint16_t>(split, operands, stream);
        case 4: return copy_transposed<uint32_t>(split, operands, stream);
        case 8: return copy_transposed<uint64_t>(split, operands, stream);
        default: KILN_ASSERT(false, "copy: element size ", dtype_size(to));
      }
    }
    switch (dtype_size(to)) {
      case 1: return copy_words<uint8_t>(shape, operands[0], operands[1], stream);
      case 2: return copy_words<uint16_t>(shape, operands[0], operands[1], stream);
      case 4: return copy_words<uint32_t>(shape, operands[0], operands[1], stream);
      case 8: return copy_words<uint64_t>(shape, operands[0], operands[1], stream);
      default: KILN_ASSERT(false, "copy: element size ", dtype_size(to));
    }
  }
  dispatch_all(to, "copy", [&]<typename To>() {
    dispatch_all(from, "copy", [&]<typename From>() {
      cuda_detail::launch<To, From>(shape, operands, Identity{}, stream, "copy");
    });
  });
}

void fill_cuda(void* data, DType dtype, int64_t count, double value, cuda::Stream stream) {
  if (count == 0) return;
  if (value == 0.0 && !std::signbit(value)) {
    // All-zero bits are zero in every dtype.
    cuda::memset_async(data, 0, static_cast<size_t>(count) * dtype_size(dtype), stream);
    return;
  }
  IterShape shape;
  shape.ndim = 1;
  shape.sizes[0] = count;
  Operand out;
  out.data = data;
  out.dtype = dtype;
  out.strides[0] = 1;
  dispatch_all(dtype, "fill", [&]<typename T>() {
    cuda_detail::launch<T>(shape, &out, Constant<T>{host_convert<T>(value)}, stream, "fill");
  });
}

}  // namespace kiln::kernels
