// 2-D pooling kernels: max (with argmax indices), average, adaptive average.
// Front ends in core/ops/pooling.cpp.
//
// Tensors are dense NCHW, seen as `planes` = N*C planes of (H, W) in and
// (OH, OW) out, or with `channels_last` dense NHWC (torch.channels_last):
// (N, H, W, C) in memory, N = planes / channels, for x, y, the indices, dy
// and dx alike. Max-pool indices are int32 flat offsets into the input plane
// (ih * W + iw) in either layout, the argmax of each window: the first maximum
// in row-major window order, NaN counting as the maximum (as torch). Backward
// kernels gather or scatter within a plane (CPU NHWC: within an image), so no
// atomics and no dependence on the thread count or the GPU; the NHWC kernels
// do each element's arithmetic in the NCHW kernels' order, so the two layouts
// give the same bits. Outputs are written (=).
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

struct Pool2dParams {
  int64_t planes = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;  // max pool only
  bool count_include_pad = true;           // avg pool only
  bool channels_last = false;              // NHWC tensors (see above)
  int64_t channels = 1;                    // C: read only when channels_last
};
// Adaptive pooling uses planes, in_h/in_w and out_h/out_w only: output cell
// (oh, ow) averages rows [floor(oh*H/OH), ceil((oh+1)*H/OH)) and likewise columns.

void max_pool2d_forward_cpu(DType dtype, const Pool2dParams& p, const void* x, void* y, int32_t* indices);
void max_pool2d_backward_cpu(DType dtype, const Pool2dParams& p, const void* dy, const int32_t* indices, void* dx);
void avg_pool2d_forward_cpu(DType dtype, const Pool2dParams& p, const void* x, void* y);
void avg_pool2d_backward_cpu(DType dtype, const Pool2dParams& p, const void* dy, void* dx);
void adaptive_avg_pool2d_forward_cpu(DType dtype, const Pool2dParams& p, const void* x, void* y);
void adaptive_avg_pool2d_backward_cpu(DType dtype, const Pool2dParams& p, const void* dy, void* dx);

// CUDA versions: asynchronous on `stream`.
void max_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y, int32_t* indices,
                             cuda::Stream stream);
void max_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, const int32_t* indices, void* dx,
                              cuda::Stream stream);
void avg_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y, cuda::Stream stream);
void avg_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, void* dx, cuda::Stream stream);
void adaptive_avg_pool2d_forward_cuda(DType dtype, const Pool2dParams& p, const void* x, void* y, cuda::Stream stream);
void adaptive_avg_pool2d_backward_cuda(DType dtype, const Pool2dParams& p, const void* dy, void* dx,
                                       cuda::Stream stream);

// Window bounds shared by the CPU and CUDA kernels.
KILN_HOST_DEVICE inline int64_t adaptive_start(int64_t index, int64_t in_size, int64_t out_size) {
  return (index * in_size) / out_size;
}
KILN_HOST_DEVICE inline int64_t adaptive_end(int64_t index, int64_t in_size, int64_t out_size) {
  return ((index + 1) * in_size + out_size - 1) / out_size;
}
// Average-pool window [start, end) along one dim, and its divisor share.
struct AvgWindow {
  int64_t start, end, padded_size;
};
KILN_HOST_DEVICE inline AvgWindow avg_window(int64_t index, int64_t stride, int64_t pad, int64_t kernel,
                                             int64_t in_size) {
  int64_t start = index * stride - pad;
  int64_t end = start + kernel < in_size + pad ? start + kernel : in_size + pad;
  const int64_t padded = end - start;
  start = start < 0 ? 0 : start;
  end = end < in_size ? end : in_size;
  return {start, end, padded};
}

}  // namespace kiln::kernels
