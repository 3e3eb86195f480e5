// cuDNN convolutions on the paths a first GPU run has not seen: channels-last
// (NHWC) with groups (2 and depthwise), with one input channel (Fashion-MNIST's
// first layer), in 16-bit, under deterministic algorithms and in benchmark
// mode, each against the same convolution in NCHW, forward and both backward
// products; the run-time fallback when cuDNN refuses the cached algorithm;
// and cuDNN's graph API against its legacy API (its descriptors without a GPU).
#include <doctest/doctest.h>

#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/conv.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

struct ConvCase {
  const char* name;
  int64_t in_channels, out_channels, groups, height, width, stride, padding;
};

// Restores the global convolution flags a case changes, whatever happens in it.
struct ConvFlags {
  bool deterministic = deterministic_algorithms_enabled(), benchmark = cudnn_benchmark();
  CudnnApi api = cudnn_api();
  ~ConvFlags() {
    set_deterministic_algorithms(deterministic);
    set_cudnn_benchmark(benchmark);
    set_cudnn_api(api);
  }
};

// y, dx and dw of conv2d on x (NCHW or channels-last) with the weight w.
struct ConvResult {
  Tensor y, dx, dw;
};
ConvResult conv_with_grads(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvCase& c) {
  const Tensor xr = x.detach().requires_grad_(), wr = w.detach().requires_grad_();
  const Tensor y = conv2d(xr, wr, Tensor(), c.stride, c.padding, 1, c.groups);
  const autograd::TensorList grads = autograd::grad({y}, {xr, wr}, {dy});
  return {y, grads[0], grads[1]};
}

// The paths a first GPU run has not seen: one input channel, groups, depthwise, strides.
const ConvCase kCases[] = {
    {"one input channel 28x28", 1, 8, 1, 28, 28, 1, 1},
    {"groups 2", 8, 16, 2, 9, 7, 1, 1},
    {"depthwise stride 2", 16, 16, 16, 10, 10, 2, 1},
    {"strided, no padding", 6, 12, 1, 5, 5, 2, 0},
};

// Float64 CPU x, w and dy of a case at batch `batch`, from seeds seed + 1 .. seed + 3:
// x and dy standard normal, w scaled by 1/sqrt(fan-in) as initialisation does,
// so that y is about standard normal too. Unscaled, y's spread grows with the
// square root of the fan-in (68 for 512 channels at 3x3), and so does float32's
// rounding in a sum of that many terms: the H200 run at b59d5ed saw 1.7e-4 on
// such a y element near zero (both cuDNN APIs alike), over an absolute 1e-4.
struct ConvInputs {
  Tensor x, w, dy;
};
ConvInputs conv_inputs(const ConvCase& c, int64_t batch, uint64_t seed) {
  const Shape x_shape{batch, c.in_channels, c.height, c.width};
  const Shape w_shape{c.out_channels, c.in_channels / c.groups, 3, 3};
  const int64_t out_h = (c.height + 2 * c.padding - 3) / c.stride + 1;
  const int64_t out_w = (c.width + 2 * c.padding - 3) / c.stride + 1;
  const Shape y_shape{batch, c.out_channels, out_h, out_w};
  const double fan_in = static_cast<double>(c.in_channels / c.groups * 9);
  return {tensor<double>(random_values(shape_numel(x_shape), seed + 1), x_shape),
          mul(tensor<double>(random_values(shape_numel(w_shape), seed + 2), w_shape), 1.0 / std::sqrt(fan_in)),
          tensor<double>(random_values(shape_numel(y_shape), seed + 3), y_shape)};
}

// The geometry of conv2d on (batch, 8, 12, 12) with a (16, 8, 3, 3) weight, stride 2, padding 1.
kernels::Conv2dParams strided_params(int64_t batch) {
  kernels::Conv2dParams p;
  p.batch = batch;
  p.in_channels = 8;
  p.in_h = p.in_w = 12;
  p.out_channels = 16;
  p.kernel_h = p.kernel_w = 3;
  p.out_h = p.out_w = 6;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  return p;
}

// Different algorithms in each layout: float32 sums in another order, 16-bit
// outputs a rounding apart.
Tolerance layout_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f16: return {1e-2, 1e-2};
    case DType::bf16: return {3e-2, 3e-2};
    default: return {1e-4, 1e-4};
  }
}

TEST_CASE("conv2d on CUDA: channels-last equals NCHW for groups, one channel, 16-bit, deterministic, benchmark [gpu]") {
  KILN_REQUIRE_GPU();
  const char* modes[] = {"heuristics", "deterministic", "benchmark"};
  ConvFlags restore;
  uint64_t seed = 100;
  for (const ConvCase& c : kCases) {
    const auto [x64, w64, dy64] = conv_inputs(c, 2, seed += 3);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (int mode = 0; mode < 3; ++mode) {
        const std::string label = std::string(c.name) + ", " + std::string(dtype_name(dtype)) + ", " + modes[mode];
        CAPTURE(label);
        set_deterministic_algorithms(mode == 1);
        set_cudnn_benchmark(mode == 2);
        try {
          const Tensor x = x64.to(Device::cuda(), dtype), w = w64.to(Device::cuda(), dtype);
          const Tensor dy = dy64.to(Device::cuda(), dtype);
          const ConvResult nchw = conv_with_grads(x, w, dy, c);
          const ConvResult nhwc = conv_with_grads(x.contiguous(MemoryFormat::channels_last), w, dy, c);
          CHECK(is_channels_last(nhwc.y));
          CHECK(is_channels_last(nhwc.dx));
          const Tolerance tol = layout_tolerance(dtype);
          KILN_CHECK_CLOSE(nhwc.y.cpu(), nchw.y.cpu(), tol.rtol, tol.atol);
          KILN_CHECK_CLOSE(nhwc.dx.cpu(), nchw.dx.cpu(), tol.rtol, tol.atol);
          KILN_CHECK_CLOSE(nhwc.dw.cpu(), nchw.dw.cpu(), tol.rtol, tol.atol * 10);  // sums of 2 x H x W products
          // And NCHW itself against the CPU in float64, so that both layouts cannot be wrong alike.
          if (dtype == DType::f32) {
            const ConvResult cpu = conv_with_grads(x64, w64, dy64, c);
            KILN_CHECK_CLOSE(nchw.y.cpu().to(DType::f64), cpu.y, 1e-4, 1e-4);
            KILN_CHECK_CLOSE(nchw.dw.cpu().to(DType::f64), cpu.dw, 1e-4, 1e-3);
          }
        } catch (const Error& error) {
          FAIL_CHECK(label << ": " << error.message());
        }
      }
    }
  }
}

TEST_CASE("conv2d on CUDA: an algorithm cuDNN refuses at the call is replaced by one that runs, and cached [gpu]") {
  KILN_REQUIRE_GPU();
  ConvFlags restore;
  set_deterministic_algorithms(false);
  set_cudnn_benchmark(false);
  const Tensor x64 = tensor<double>(random_values(2 * 8 * 12 * 12, 7), {2, 8, 12, 12});
  const Tensor w64 = tensor<double>(random_values(16 * 8 * 3 * 3, 8), {16, 8, 3, 3});
  // The key conv2d's forward will look up: float32 NCHW, stride 2, padding 1.
  const kernels::Conv2dParams p = strided_params(2);
  kernels::ConvCudaConfig config;
  config.dtype = DType::f32;
  config.allow_tf32 = allow_tf32();
  config.device = 0;
  kernels::cudnn_conv_cache_clear();
  const int refused = kernels::cudnn_conv_cache_put_refused_forward_for_testing(p, config);
  CHECK(kernels::cudnn_conv_cached_forward_algo_for_testing(p, config) == refused);
  const Tensor y = conv2d(x64.to(Device::cuda(), DType::f32), w64.to(Device::cuda(), DType::f32), Tensor(), 2, 1);
  KILN_CHECK_CLOSE(y.cpu().to(DType::f64), conv2d(x64, w64, Tensor(), 2, 1), 1e-4, 1e-4);
  const int cached = kernels::cudnn_conv_cached_forward_algo_for_testing(p, config);
  CHECK(cached != refused);
  CHECK(cached >= 0);
  kernels::cudnn_conv_cache_clear();
}

// cuDNN's graph API against its legacy API on the same calls: every case of
// the layout test above plus two of ResNet-9's shapes, in both layouts, three
// dtypes and the three modes; and float32 against the CPU in float64. The
// graph API must have run them (no fallback to the legacy API) for float32
// and 16-bit, so that bench_conv_gpu's graph rows time what they name.
TEST_CASE("conv2d on CUDA: cuDNN's graph API equals its legacy API, forward and both backward products [gpu]") {
  KILN_REQUIRE_GPU();
  const char* modes[] = {"heuristics", "deterministic", "benchmark"};
  ConvFlags restore;
  std::vector<ConvCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({"ResNet-9 residual 128 at 14x14", 128, 128, 1, 14, 14, 1, 1});
  cases.push_back({"ResNet-9 residual 512 at 3x3", 512, 512, 1, 3, 3, 1, 1});
  uint64_t seed = 300;
  for (const ConvCase& c : cases) {
    const auto [x64, w64, dy64] = conv_inputs(c, 4, seed += 3);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (int mode = 0; mode < 3; ++mode) {
        for (bool channels_last : {false, true}) {
          const std::string label = std::string(c.name) + ", " + std::string(dtype_name(dtype)) + ", " + modes[mode] +
                                    (channels_last ? ", channels-last" : ", NCHW");
          CAPTURE(label);
          set_deterministic_algorithms(mode == 1);
          set_cudnn_benchmark(mode == 2);
          try {
            Tensor x = x64.to(Device::cuda(), dtype);
            if (channels_last) x = x.contiguous(MemoryFormat::channels_last);
            const Tensor w = w64.to(Device::cuda(), dtype), dy = dy64.to(Device::cuda(), dtype);
            set_cudnn_api(CudnnApi::legacy);
            const ConvResult legacy = conv_with_grads(x, w, dy, c);
            set_cudnn_api(CudnnApi::graph);
            const uint64_t fallbacks_before = cudnn_benchmark_stats().graph_fallbacks;
            const ConvResult graph = conv_with_grads(x, w, dy, c);
            CHECK(cudnn_benchmark_stats().graph_fallbacks == fallbacks_before);
            CHECK(is_channels_last(graph.y) == channels_last);
            const Tolerance tol = layout_tolerance(dtype);
            KILN_CHECK_CLOSE(graph.y.cpu(), legacy.y.cpu(), tol.rtol, tol.atol);
            KILN_CHECK_CLOSE(graph.dx.cpu(), legacy.dx.cpu(), tol.rtol, tol.atol);
            KILN_CHECK_CLOSE(graph.dw.cpu(), legacy.dw.cpu(), tol.rtol, tol.atol * 10);
            if (dtype == DType::f32) {
              const ConvResult cpu = conv_with_grads(x64, w64, dy64, c);
              KILN_CHECK_CLOSE(graph.y.cpu().to(DType::f64), cpu.y, 1e-4, 1e-4);
              KILN_CHECK_CLOSE(graph.dx.cpu().to(DType::f64), cpu.dx, 1e-4, 1e-4);
              KILN_CHECK_CLOSE(graph.dw.cpu().to(DType::f64), cpu.dw, 1e-4, 1e-3);
            }
          } catch (const Error& error) {
            FAIL_CHECK(label << ": " << error.message());
          }
        }
      }
    }
  }
  CHECK(cudnn_benchmark_stats().graph_entries > 0);
  cudnn_benchmark_cache_clear();
}

// The default API choice: automatic sends 16-bit convolutions to the graph
// API and float32 to the legacy API (core/nn_ops.h says why); the benchmark
// cache's graph-entry count shows which API cached the plan.
TEST_CASE("conv2d on CUDA: the automatic cuDNN API is the graph API for 16-bit, the legacy API for float32 [gpu]") {
  KILN_REQUIRE_GPU();
  ConvFlags restore;
  set_deterministic_algorithms(false);
  set_cudnn_benchmark(true);
  set_cudnn_api(CudnnApi::automatic);
  CHECK(cudnn_api() == CudnnApi::automatic);
  const ConvCase c = kCases[1];
  const auto [x64, w64, dy64] = conv_inputs(c, 2, 900);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    cudnn_benchmark_cache_clear();
    const ConvResult result = conv_with_grads(x64.to(Device::cuda(), dtype), w64.to(Device::cuda(), dtype),
                                              dy64.to(Device::cuda(), dtype), c);
    const CudnnBenchmarkStats stats = cudnn_benchmark_stats();
    CHECK(stats.entries == 3);  // forward, dx, dw
    CHECK(stats.graph_entries == (dtype == DType::f32 ? 0u : 3u));
    const ConvResult cpu = conv_with_grads(x64, w64, dy64, c);
    const Tolerance tol = layout_tolerance(dtype);
    KILN_CHECK_CLOSE(result.y.cpu().to(DType::f64), cpu.y, tol.rtol, tol.atol);
  }
  cudnn_benchmark_cache_clear();
}

// Which API a caller set is the one cudnn_api() reports, without a GPU.
TEST_CASE("conv2d: set_cudnn_api sets what cudnn_api reports") {
  ConvFlags restore;
  for (CudnnApi api : {CudnnApi::legacy, CudnnApi::graph, CudnnApi::automatic}) {
    set_cudnn_api(api);
    CHECK(cudnn_api() == api);
  }
}

#if KILN_WITH_CUDA
// The graph API's descriptors need cuDNN but no GPU: built here for each
// direction, layout and dtype of kiln's convolutions; and cuDNN must refuse an
// operation whose output shape does not follow from its input, which shows
// that the operation carries the tensors and geometry kiln set.
TEST_CASE("conv2d on CUDA: cuDNN accepts the graph API's descriptors, and refuses an inconsistent output shape") {
  const kernels::Conv2dParams p = strided_params(4);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (bool channels_last : {false, true}) {
      for (int groups : {1, 2, 8}) {
        for (int direction = 0; direction < 3; ++direction) {
          kernels::Conv2dParams q = p;
          q.groups = groups;
          kernels::ConvCudaConfig config;
          config.dtype = dtype;
          config.channels_last = channels_last;
          CAPTURE(dtype_name(dtype));
          CAPTURE(channels_last);
          CAPTURE(groups);
          CAPTURE(direction);
          CHECK(kernels::cudnn_graph_descriptors_check_for_testing(q, config, direction, 16) == "");
          q.out_h = 7;  // (12 + 2 - 3) / 2 + 1 = 6
          const std::string refused = kernels::cudnn_graph_descriptors_check_for_testing(q, config, direction, 16);
          CHECK(refused.find("operation refused") != std::string::npos);
        }
      }
    }
  }
}
#endif

}  // namespace
}  // namespace kiln::testing
