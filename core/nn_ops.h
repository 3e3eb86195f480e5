// The functional neural-network ops under the nn layers: convolution,
// normalization and pooling, forward and backward, on CPU and CUDA. Front ends
// in core/ops/conv.cpp, core/ops/normalization.cpp, core/ops/pooling.cpp;
// kernels in kernels/{conv,norm,pool}.h.
//
// Every op throws kiln::Error naming the op, shapes, dtypes and devices when
// its inputs do not fit, and records one autograd node that saves only what
// its backward reads. Floating dtypes: float32, float64, float16, bfloat16 (the
// CPU computes 16-bit types in float). None of them synchronizes the device,
// except the first call of a shape in cuDNN benchmark mode.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace kiln {

// A (height, width) pair; an integer means the same value for both:
//   conv2d(x, w, {}, /*stride=*/2, /*padding=*/{1, 0})
struct Size2 {
  int64_t h = 0, w = 0;
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT: implicit on purpose
  Size2(int64_t height, int64_t width) : h(height), w(width) {}
  bool operator==(const Size2&) const = default;
};

// ---------------------------------------------------------------- convolution
// x (N, C, H, W) or unbatched (C, H, W); weight (O, C/groups, kh, kw); bias (O)
// or undefined. Output (N, O, OH, OW) with OH = (H + 2*pad - dilation*(kh-1) - 1) / stride + 1.
// On CUDA a channels-last (NHWC-strided) x gives a channels-last output (cuDNN
// NHWC kernels). Throws on channel mismatch, groups not dividing the channels,
// or a kernel larger than the padded input.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Size2 stride = 1,
              Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1);

// cuDNN algorithm choice: heuristics by default; with benchmark on, the first
// call of each (shapes, dtype, layout, flags) key times the candidates
// (cudnnFind*AlgorithmEx, synchronizes) and later calls reuse the winner, like
// torch.backends.cudnn.benchmark. Off by default.
void set_cudnn_benchmark(bool enabled);
bool cudnn_benchmark();
// Which cuDNN API runs convolutions on CUDA: the legacy API (cudnnConvolution*,
// cudnnFind*AlgorithmEx in benchmark mode) or the graph (backend) API (engine
// configurations from heuristics, timed in benchmark mode, as torch reaches
// cuDNN). automatic, the default: the graph API for float16 and bfloat16, the
// legacy API for float32 and float64. On the H200 (bench_conv_gpu, benchmark
// mode, 8 shapes of ResNet-9 and FashionCNN) the graph API ran bfloat16
// forward + backward at 1.37x torch against the legacy API's 0.83x (NCHW) and
// 1.85x against 0.90x (channels-last); in float32 the legacy API's search
// finds faster algorithms (1.39x against 1.20x). The environment variable
// KILN_CUDNN_API=legacy|graph|automatic sets it at start-up.
enum class CudnnApi { automatic, legacy, graph };
void set_cudnn_api(CudnnApi api);
CudnnApi cudnn_api();
// Benchmark-mode cache counters (zero without CUDA); for tests and logs.
struct CudnnBenchmarkStats {
  uint64_t hits = 0, misses = 0, entries = 0;
  uint64_t graph_entries = 0;    // of `entries`, the graph API's plans
  uint64_t graph_fallbacks = 0;  // graph-API calls no engine could run (the legacy API ran them)
};
CudnnBenchmarkStats cudnn_benchmark_stats();
void cudnn_benchmark_cache_clear();

// ---------------------------------------------------------------- normalization
// x (N, C) or (N, C, d...). running_mean/running_var (C) may be undefined (then
// training mode must be on); weight/bias (C) may be undefined (affine off).
// Training: normalizes with the batch statistics (biased variance) and, when
// defined, updates the running stats in place: running = (1 - momentum) *
// running + momentum * batch, with the unbiased variance for running_var (as
// torch). Eval: normalizes with the running stats. Per-channel tensors are in
// x's dtype, or float32 when x is float16/bfloat16.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(...)) in one pass (the conv -> BN -> ReLU hot path); its
// backward recomputes the ReLU mask from x, so it saves no extra tensor.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);

// max_pool2d(batch_norm_relu(...), 2) of an (N, C, H, W) x, H and W at least
// 2: the conv -> BN -> ReLU -> pool hot path (FashionCNN, ResNet-9's pooled
// layers). Same values, running stats and gradients (bit for bit) as the two
// ops. The full-size activation and its gradient are never stored (CUDA, and
// NCHW on the CPU). The backward saves x and the pooling's argmax indices.
Tensor batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                                  double eps = 1e-5);

// Normalizes over the trailing dims `normalized_shape` (which x's shape must
// end with); weight and bias (normalized_shape) may be undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// x / sqrt(mean(x^2 over the trailing dims normalized_shape) + eps) * weight
// (torch.nn.functional.rms_norm); eps defaults to the dtype's machine epsilon
// (torch's None), weight (normalized_shape) may be undefined. Composed of
// differentiable ops, computed in float32 for 16-bit inputs.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt);

// ---------------------------------------------------------------- pooling
// x (N, C, H, W) or (C, H, W). stride defaults to kernel. Padding is at most
// half the (dilated) kernel, as in torch. Ties go to the first maximum in
// window order; NaN propagates.
Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                  Size2 dilation = 1);
// count_include_pad: whether padded zeros count in the divisor.
Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                  bool count_include_pad = true);
// Output (N, C, OH, OW); cell (i, j) averages rows [floor(i*H/OH), ceil((i+1)*H/OH)) and likewise columns.
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);

// ---------------------------------------------------------------- attention
// torch.nn.functional.scaled_dot_product_attention: query (..., L, E), key
// (..., S, E), value (..., S, Ev) with the same batch dims; output (..., L, Ev)
// = softmax(query key^T * scale + mask) value, scale 1/sqrt(E) by default.
// attn_mask broadcasts to (..., L, S): bool (true = may attend) or floating
// (added to the scores). is_causal masks key j > query i (tril(ones(L, S)));
// it cannot be combined with attn_mask. dropout_p drops probabilities (always,
// as torch's functional form does; modules pass 0 in eval). A row with no
// allowed key is zeros (torch >= 2.5). Fused kernels (flash-style on CUDA,
// tiled on the CPU; the L x S matrix is never stored) unless Ev != E, the mask
// needs a gradient, or CUDA lacks the head dim / dtype (float64; E other than
// 32, 64, 96, 128): then matmul + softmax. Does not synchronize.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

}  // namespace kiln
