// Winograd F(2x2, 3x3) and F(3x3, 3x3) CPU convolution
// (kernels/cpu/conv_winograd.cpp): the
// path conv2d_forward_cpu / conv2d_backward_cpu (kernels/conv.h) take where it
// measured faster than im2col + GEMM. Internal to kernels/; tests and bench/
// include it to run the path on any supported shape or to compare the paths.
#pragma once

#include "kernels/conv.h"

namespace kiln::kernels {

// Whether the Winograd path can compute this convolution: 3x3 kernel, stride
// 1, dilation 1, groups 1, any padding.
bool conv2d_winograd_supports(const Conv2dParams& p);
// Whether the path is supported and, by the measurements in
// conv_winograd.cpp, faster than im2col + GEMM for this shape.
bool conv2d_winograd_pays(const Conv2dParams& p);

// Which convolutions conv2d_*_cpu send to the Winograd path: those where it
// pays (the default), every supported one, or none. Process-wide; tests and
// benchmarks use it to run or compare both paths through the public entry points.
enum class WinogradPolicy { kWhenFaster, kAlways, kNever };
void conv2d_winograd_set_policy(WinogradPolicy policy);
// Whether conv2d_*_cpu take the Winograd path for this shape under the current policy.
bool conv2d_winograd_selected(const Conv2dParams& p);

// The output tile the path uses: F(2x2, 3x3) (m = 2) or F(3x3, 3x3) (m = 3).
// kWhenFaster picks per shape by the measurements in conv_winograd.cpp; the
// others force one (process-wide, for tests and benchmarks).
enum class WinogradTile { kWhenFaster, k2x2, k3x3 };
void conv2d_winograd_set_tile(WinogradTile tile);
// The tile size m (2 or 3) the path uses for this shape under the current tile setting.
int conv2d_winograd_tile_size(const Conv2dParams& p);

// The contracts of conv2d_forward_cpu / conv2d_backward_cpu (float32 or
// float64, contiguous NCHW, outputs written =) for shapes the path supports;
// throws kiln::Error otherwise. The backward computes no bias gradient.
void conv2d_winograd_forward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight,
                                 const void* bias, void* y);
void conv2d_winograd_backward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight,
                                  const void* dy, void* dx, void* dweight);

}  // namespace kiln::kernels
