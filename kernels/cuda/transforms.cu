// CUDA augmentation kernels on a batch (B, C, H, W) of float32 images, in
// place, and the row gather of GPU-resident loading. Row b is data set sample
// indices[b]; its random decisions come from transforms.h's shared functions,
// so they equal the CPU kernels' for the same (seed, epoch, index, slot).
#include <cuda_runtime.h>

#include "kernels/transforms.h"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 32 ? (blocks > 0 ? blocks : 1) : 65535 * 32);
}

__global__ void random_crop_kernel(const float* batch, float* out, int64_t total, int64_t channels, int64_t height,
                                   int64_t width, int64_t padding, float fill, const int64_t* indices, uint64_t seed,
                                   uint64_t epoch, uint32_t slot) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t x = i % width, y = (i / width) % height, b = i / (width * height * channels);
    const CropOffset offset = crop_offset(AugmentKey{seed, epoch, indices[b], slot}, padding);
    const int64_t sy = y + offset.top - padding, sx = x + offset.left - padding;
    // i - x - y * width is the start of this (b, c) plane.
    out[i] = (sy >= 0 && sy < height && sx >= 0 && sx < width) ? batch[i - x - y * width + sy * width + sx] : fill;
  }
}

// One thread per pair (x, width - 1 - x) of the left half.
__global__ void horizontal_flip_kernel(float* batch, int64_t total_pairs, int64_t rows_per_sample, int64_t width,
                                       float p, const int64_t* indices, uint64_t seed, uint64_t epoch, uint32_t slot) {
  const int64_t half = width / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total_pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t x = i % half, row = i / half, b = row / rows_per_sample;
    if (!flip_decision(AugmentKey{seed, epoch, indices[b], slot}, p)) continue;
    float* values = batch + row * width;
    const float left = values[x];
    values[x] = values[width - 1 - x];
    values[width - 1 - x] = left;
  }
}

__global__ void normalize_kernel(float* batch, int64_t total, int64_t plane, NormalizeParams params) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>((i / plane) % params.channels);
    batch[i] = (batch[i] - params.mean[c]) * params.inv_std[c];
  }
}

// One block per sample: thread 0 draws the box, the block fills it.
__global__ void random_erasing_kernel(float* batch, int64_t channels, int64_t height, int64_t width,
                                      ErasingParams params, const int64_t* indices, uint64_t seed, uint64_t epoch,
                                      uint32_t slot) {
  __shared__ ErasingBox box;
  const int64_t b = blockIdx.x;
  if (threadIdx.x == 0) box = erasing_box(AugmentKey{seed, epoch, indices[b], slot}, height, width, params);
  __syncthreads();
  const int64_t area = box.height * box.width, count = channels * area;
  float* sample = batch + b * channels * height * width;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const int64_t c = i / area, r = i % area;
    sample[(c * height + box.top + r / box.width) * width + box.left + r % box.width] = params.value;
  }
}

template <typename Src, typename Dst>
__global__ void gather_rows_kernel(const Src* src, int64_t row_numel, const int64_t* indices, int64_t total, Dst* dst,
                                   float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_numel, column = i % row_numel;
    const Src value = src[indices[row] * row_numel + column];
    if constexpr (std::is_same_v<Dst, float>) {
      dst[i] = static_cast<float>(value) * scale;
    } else {
      dst[i] = static_cast<Dst>(value);
    }
  }
}

template <typename Src>
void gather_rows_to(const Src* src, int64_t row_numel, const int64_t* indices, int64_t count, void* dst,
                    DType dst_dtype, float scale, cudaStream_t stream) {
  const int64_t total = row_numel * count;
  switch (dst_dtype) {
    case DType::f32:
      gather_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(src, row_numel, indices, total,
                                                                     static_cast<float*>(dst), scale);
      break;
    case DType::i32:
      gather_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(src, row_numel, indices, total,
                                                                     static_cast<int32_t*>(dst), scale);
      break;
    case DType::i64:
      gather_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(src, row_numel, indices, total,
                                                                     static_cast<int64_t*>(dst), scale);
      break;
    default:
      KILN_THROW("gather_rows_cuda: unsupported destination dtype ", dtype_name(dst_dtype),
                 " (expected float32, int32 or int64)");
  }
  cuda::check_last_launch("gather_rows_kernel");
}

}  // namespace

void random_crop_cuda(float* batch, float* scratch, int64_t batch_size, int64_t channels, int64_t height,
                      int64_t width, int64_t padding, float fill, const int64_t* indices, uint64_t seed,
                      uint64_t epoch, uint32_t slot, cuda::Stream stream) {
  const int64_t total = batch_size * channels * height * width;
  if (total == 0 || padding == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  random_crop_kernel<<<blocks_for(total), kThreads, 0, s>>>(batch, scratch, total, channels, height, width, padding,
                                                            fill, indices, seed, epoch, slot);
  cuda::check_last_launch("random_crop_kernel");
  cuda::memcpy_async(batch, scratch, sizeof(float) * total, cuda::CopyKind::device_to_device, stream);
}

void horizontal_flip_cuda(float* batch, int64_t batch_size, int64_t channels, int64_t height, int64_t width, float p,
                          const int64_t* indices, uint64_t seed, uint64_t epoch, uint32_t slot, cuda::Stream stream) {
  const int64_t total_pairs = batch_size * channels * height * (width / 2);
  if (total_pairs == 0) return;
  horizontal_flip_kernel<<<blocks_for(total_pairs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      batch, total_pairs, channels * height, width, p, indices, seed, epoch, slot);
  cuda::check_last_launch("horizontal_flip_kernel");
}

void normalize_cuda(float* batch, int64_t batch_size, int64_t plane, const NormalizeParams& params,
                    cuda::Stream stream) {
  KILN_CHECK(params.channels >= 1 && params.channels <= kMaxNormalizeChannels,
             "normalize_cuda: channels must be in [1, ", kMaxNormalizeChannels, "], got ", params.channels);
  const int64_t total = batch_size * params.channels * plane;
  if (total == 0) return;
  normalize_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch, total, plane, params);
  cuda::check_last_launch("normalize_kernel");
}

void random_erasing_cuda(float* batch, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
                         const ErasingParams& params, const int64_t* indices, uint64_t seed, uint64_t epoch,
                         uint32_t slot, cuda::Stream stream) {
  if (batch_size == 0) return;
  KILN_CHECK(batch_size <= 2147483647, "random_erasing_cuda: batch of ", batch_size, " samples is too large");
  random_erasing_kernel<<<static_cast<unsigned>(batch_size), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      batch, channels, height, width, params, indices, seed, epoch, slot);
  cuda::check_last_launch("random_erasing_kernel");
}

void gather_rows_cuda(const void* src, DType src_dtype, int64_t row_numel, const int64_t* indices, int64_t count,
                      void* dst, DType dst_dtype, float scale, cuda::Stream stream) {
  if (row_numel * count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (src_dtype) {
    case DType::u8: return gather_rows_to(static_cast<const uint8_t*>(src), row_numel, indices, count, dst, dst_dtype, scale, s);
    case DType::i32: return gather_rows_to(static_cast<const int32_t*>(src), row_numel, indices, count, dst, dst_dtype, scale, s);
    case DType::i64: return gather_rows_to(static_cast<const int64_t*>(src), row_numel, indices, count, dst, dst_dtype, scale, s);
    case DType::f32: return gather_rows_to(static_cast<const float*>(src), row_numel, indices, count, dst, dst_dtype, scale, s);
    default:
      KILN_THROW("gather_rows_cuda: unsupported source dtype ", dtype_name(src_dtype),
                 " (expected uint8, int32, int64 or float32)");
  }
}

}  // namespace kiln::kernels
