// 2-D convolution kernels: the compute behind kiln::conv2d (core/ops/conv.cpp).
//
// CPU (kernels/cpu/conv.cpp): contiguous NCHW, float32 or float64 (the front
// end converts 16-bit inputs to float32). im2col into a thread-local buffer
// plus an Eigen GEMM per (sample, group), samples split across threads; 3x3
// stride-1 ungrouped layers with enough channels and tiles take Winograd
// F(2x2, 3x3) instead (kernels/cpu/conv_winograd.cpp: 16 GEMMs over
// transformed tiles, 2.25x fewer multiply-adds). Either way the weight
// gradient sums fixed chunks of the batch in a fixed order, so results do not
// depend on the thread count.
//
// CUDA (kernels/cuda/conv.cpp): cuDNN 9 legacy convolution API, NCHW or
// channels-last (NHWC) tensors, float32/float16/bfloat16/float64. Algorithms
// come from cudnnGet*_v7 heuristics, or in benchmark mode from
// cudnnFind*AlgorithmEx once per (shape, dtype, layout, flags) key, cached.
// With ConvCudaConfig::graph_api, cuDNN's graph API instead
// (kernels/cuda/conv_graph.cpp: engine configurations in place of algorithms).
// Workspace memory comes from the caller through `WorkspaceAllocator`.
// Every call is asynchronous on the stream given, except that a benchmark-mode
// cache miss synchronizes (cuDNN's Find times the candidates).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

// Geometry of one 2-D convolution; the front end checks it and computes
// out_h/out_w. Groups divide in_channels and out_channels.
struct Conv2dParams {
  int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// Multiply-adds of the forward pass (each backward product costs the same).
inline double conv2d_macs(const Conv2dParams& p) {
  return static_cast<double>(p.batch) * static_cast<double>(p.out_channels) * static_cast<double>(p.out_h * p.out_w) *
         static_cast<double>(p.in_channels / p.groups) * static_cast<double>(p.kernel_h * p.kernel_w);
}

// ---------------------------------------------------------------- CPU
// x (N, C, H, W), weight (O, C/groups, kh, kw), bias (O) or null -> y (N, O, OH, OW); all contiguous.
void conv2d_forward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight, const void* bias,
                        void* y);
// From dy (N, O, OH, OW): dx (N, C, H, W), dweight (O, C/groups, kh, kw) and
// dbias (O), each written (=) when non-null. x is read only for dweight and
// weight only for dx.
void conv2d_backward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight, const void* dy,
                         void* dx, void* dweight, void* dbias);

// ---------------------------------------------------------------- CUDA (cuDNN)
struct ConvCudaConfig {
  DType dtype = DType::f32;
  // Tensors are NHWC in memory (x, y and the weight as (O, kh, kw, C/groups));
  // otherwise NCHW contiguous.
  bool channels_last = false;
  bool deterministic = false;  // only algorithms cuDNN reports deterministic
  bool allow_tf32 = false;     // float32 may use TF32 tensor cores
  bool benchmark = false;      // cudnnFind once per key instead of heuristics
  // cuDNN's graph (backend) API instead of the legacy one: engine
  // configurations from heuristics mode A and the fallback list, timed in
  // benchmark mode (kernels/cuda/conv_graph.cpp). A call it cannot run goes
  // to the legacy API (counted in CudnnConvCacheStats::graph_fallbacks).
  bool graph_api = false;
  int device = 0;
  cuda::Stream stream = nullptr;
};

// Returns device memory of at least `bytes` on the config's stream, valid
// until the kernel call returns (the caller's caching allocator keeps it
// stream-ordered). Usually called once per kernel call (twice in benchmark
// mode); when it throws OutOfMemoryError the call retries with algorithms
// that need less workspace, so it may be called again.
using WorkspaceAllocator = std::function<void*(size_t bytes)>;

// y = conv(x, weight) (written, =). The bias is not cuDNN's business: its
// cudnnAddTensor / cudnnConvolutionBackwardBias may refuse bfloat16, so the
// front end adds it, and sums its gradient, with kiln's own kernels.
void conv2d_forward_cuda(const Conv2dParams& p, const ConvCudaConfig& config, const void* x, const void* weight,
                         void* y, const WorkspaceAllocator& workspace);
// dx = conv_transpose(dy, weight) (written, =).
void conv2d_backward_input_cuda(const Conv2dParams& p, const ConvCudaConfig& config, const void* weight,
                                const void* dy, void* dx, const WorkspaceAllocator& workspace);
// dweight = correlation of x and dy (written, =).
void conv2d_backward_weight_cuda(const Conv2dParams& p, const ConvCudaConfig& config, const void* x, const void* dy,
                                 void* dweight, const WorkspaceAllocator& workspace);

// Counters of the benchmark-mode algorithm cache (all zero with CUDA off).
struct CudnnConvCacheStats {
  uint64_t hits = 0;    // a benchmark-mode call found its key cached
  uint64_t misses = 0;  // a benchmark-mode call ran cudnnFind*AlgorithmEx
  uint64_t entries = 0;
  uint64_t graph_entries = 0;    // of `entries`, plans cached by the graph API
  uint64_t graph_fallbacks = 0;  // graph-API calls no engine could run (the legacy API ran them)
};
CudnnConvCacheStats cudnn_conv_cache_stats();
// Forgets every cached algorithm and zeroes the counters.
void cudnn_conv_cache_clear();

// Tests of the run-time fallback only (cuDNN's heuristics do not rank an
// algorithm it then refuses on demand). The first caches, as the forward
// choice for p and config with 16-byte aligned operands, an algorithm cuDNN
// refuses for a convolution with a stride above 1 (FFT, with no workspace),
// and returns its number; the second returns the cached forward algorithm's
// number for the same key, or -1 when none is cached.
int cudnn_conv_cache_put_refused_forward_for_testing(const Conv2dParams& p, const ConvCudaConfig& config);
int cudnn_conv_cached_forward_algo_for_testing(const Conv2dParams& p, const ConvCudaConfig& config);
// Builds and finalizes the graph API's tensor, convolution and operation
// descriptors of one call (direction 0 forward, 1 backward data, 2 backward
// filter; operands aligned to `alignment` bytes) without a handle: "" when
// cuDNN accepts them, else what it refused. Needs the cuDNN library, no GPU.
std::string cudnn_graph_descriptors_check_for_testing(const Conv2dParams& p, const ConvCudaConfig& config,
                                                      int direction, int alignment);

}  // namespace kiln::kernels
