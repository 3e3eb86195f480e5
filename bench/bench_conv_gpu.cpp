// kiln's GPU convolutions (cuDNN) through the front end users call:
// kiln::conv2d forward, and forward + backward by autograd::grad for dx and
// dweight (the input requires grad and nothing accumulates into .grad, as for
// a layer inside a network; no bias). Shapes: the
// convolutions of ResNet-9 on Fashion-MNIST at batch 512 and FashionCNN's two
// at batch 64 (nn/models.cpp; all 3x3, stride 1, pad 1). Dtypes and layouts:
// bfloat16 NCHW and channels-last (NHWC strides, so cuDNN runs its NHWC
// kernels), float32 NCHW with kiln's default TF32 setting (off: cuDNN runs
// CUDNN_FMA_MATH, true float32).
//
// Method: cuDNN benchmark mode on (set_cudnn_benchmark), one untimed call of
// each pass so the algorithm search is done, then bench::GpuTimer: warm-ups,
// and per repeat an L2 flush, then CUDA events on kiln's current stream around
// one call; the median of the repeats. TFLOP/s count 2 N Cout Cin kh kw Hout
// Wout FLOPs for the forward and 3x that for forward + backward. Afterwards
// each row's forward output, dx and dweight are checked against a float64 loop
// on the host at sampled positions (and for finiteness on the device); a row
// that fails carries "error" (the text table prints it instead of the times)
// and the exit status is 1.
//
// bench/compare_conv.py runs `bench_conv_gpu --json` and times
// torch.nn.functional.conv2d on the same rows the same way.
//
//   bench_conv_gpu [--json] [--repeats N] [--cudnn-api legacy|graph|both]
//   (repeats 20 by default; estimated 10-20 s on an H100 with both APIs, most
//   of it the float32 rows and cuDNN's searches). Each row runs once per cuDNN
//   API (set_cudnn_api): legacy (cudnnFind) and graph (engine
//   configurations, timed), both by default, so one run compares them.
// --json: one JSON object per row on stdout: what, n, c_in, c_out, h, w,
// kernel, stride, padding, dtype, layout ("nchw" | "nhwc", the tensors'),
// cudnn_layout (the layout of kiln's output: what cuDNN ran), cudnn_api
// ("legacy" | "graph"), graph_fallbacks (graph rows: of the three directions,
// how many the graph API could not run, so the legacy API ran them), tf32,
// device, repeats, forward_ms, forward_backward_ms, forward_tflops,
// forward_backward_tflops, check_error, check_tolerance, and "error" on a
// failed row; without a GPU one {"skipped": true, "reason": ...} object.
// Without a GPU it prints a skip line (or that object) and exits 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "core/autograd.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/cuda/runtime.h"

namespace kiln::bench {
namespace {

constexpr int64_t kKernel = 3, kStride = 1, kPadding = 1;

struct ConvShape {
  const char* what;
  int64_t n, c_in, c_out, h, w;  // input (n, c_in, h, w); 3x3, stride 1, pad 1 keep h x w
};

const ConvShape kShapes[] = {
    {"resnet9 prep", 512, 1, 64, 28, 28},         {"resnet9 layer1", 512, 64, 128, 28, 28},
    {"resnet9 residual1", 512, 128, 128, 14, 14}, {"resnet9 layer2", 512, 128, 256, 14, 14},
    {"resnet9 layer3", 512, 256, 512, 7, 7},      {"resnet9 residual3", 512, 512, 512, 3, 3},
    {"fashioncnn conv1", 64, 1, 32, 28, 28},      {"fashioncnn conv2", 64, 32, 64, 14, 14},
};

struct Variant {
  DType dtype;
  bool channels_last;
};

const Variant kVariants[] = {{DType::bf16, false}, {DType::bf16, true}, {DType::f32, false}};

int64_t out_size(int64_t in) { return (in + 2 * kPadding - kKernel) / kStride + 1; }

double forward_flops(const ConvShape& s) {
  return 2.0 * static_cast<double>(s.n * s.c_out * s.c_in * kKernel * kKernel * out_size(s.h) * out_size(s.w));
}

// A standard-normal CUDA tensor of `shape`, NCHW-contiguous or channels-last.
Tensor random_cuda(const Shape& shape, DType dtype, bool channels_last) {
  const TensorOptions options{.dtype = dtype, .device = Device::cuda(0)};
  Tensor t = randn(shape, options);
  return channels_last ? t.contiguous(MemoryFormat::channels_last) : t;
}

// ---------------------------------------------------------------- check

// One result recomputed as a float64 dot product: the sum of its terms, and
// their norm (the scale a rounding error is measured against).
struct Reference {
  double sum = 0, sum_squares = 0;
  void add(double a, double b) {
    sum += a * b;
    sum_squares += a * b * a * b;
  }
  // |got - sum| relative to |sum| + ||terms||.
  double error(double got) const {
    const double scale = std::abs(sum) + std::sqrt(sum_squares);
    return scale > 0 ? std::abs(got - sum) / scale : std::abs(got);
  }
};

// Largest normalized error of the forward output, dx and dweight at sampled
// positions against float64 loops on the host copies of the same inputs
// (the device inputs already rounded to the dtype, so the references see the
// values the kernels saw). Also throws if any of the three is not finite.
double check_against_reference(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor& dy,
                               const Tensor& y, const Tensor& dx, const Tensor& dw) {
  NoGradGuard no_grad;
  for (const Tensor* t : {&y, &dx, &dw}) {
    KILN_CHECK(all(isfinite(*t)).item<bool>(), "bench_conv_gpu: non-finite values in a result of shape ",
               shape_str(t->shape()));
  }
  const int64_t oh_size = out_size(s.h), ow_size = out_size(s.w);
  const std::vector<float> w_host = w.to_vector<float>();    // (c_out, c_in, 3, 3)
  const std::vector<float> dw_host = dw.to_vector<float>();  // (c_out, c_in, 3, 3)
  auto w_at = [&](int64_t o, int64_t c, int64_t i, int64_t j) {
    return static_cast<double>(w_host[static_cast<size_t>(((o * s.c_in + c) * kKernel + i) * kKernel + j)]);
  };
  std::mt19937 engine(7);
  auto pick = [&](int64_t size) { return std::uniform_int_distribution<int64_t>(0, size - 1)(engine); };
  double worst = 0;

  // y[n, o, oh, ow] = sum_{c, i, j} x[n, c, oh + i - pad, ow + j - pad] w[o, c, i, j]
  // dx[n, c, h, w] = sum_{o, i, j} dy[n, o, h + pad - i, w + pad - j] w[o, c, i, j]
  for (int64_t n : {int64_t{0}, s.n - 1}) {
    const std::vector<float> xn = x.select(0, n).to_vector<float>();    // (c_in, h, w)
    const std::vector<float> dyn = dy.select(0, n).to_vector<float>();  // (c_out, oh, ow)
    const std::vector<float> yn = y.select(0, n).to_vector<float>();    // (c_out, oh, ow)
    const std::vector<float> dxn = dx.select(0, n).to_vector<float>();  // (c_in, h, w)
    for (int sample = 0; sample < 32; ++sample) {
      // The first samples sit in the corners, where the padding is read.
      const bool corner = sample < 2;
      const int64_t o = pick(s.c_out), c = pick(s.c_in);
      const int64_t oh = corner ? (sample == 0 ? 0 : oh_size - 1) : pick(oh_size);
      const int64_t ow = corner ? (sample == 0 ? 0 : ow_size - 1) : pick(ow_size);
      Reference ry;
      for (int64_t ci = 0; ci < s.c_in; ++ci) {
        for (int64_t i = 0; i < kKernel; ++i) {
          for (int64_t j = 0; j < kKernel; ++j) {
            const int64_t hi = oh * kStride + i - kPadding, wi = ow * kStride + j - kPadding;
            if (hi < 0 || hi >= s.h || wi < 0 || wi >= s.w) continue;
            ry.add(xn[static_cast<size_t>((ci * s.h + hi) * s.w + wi)], w_at(o, ci, i, j));
          }
        }
      }
      worst = std::max(worst, ry.error(yn[static_cast<size_t>((o * oh_size + oh) * ow_size + ow)]));
      const int64_t h = corner ? (sample == 0 ? 0 : s.h - 1) : pick(s.h);
      const int64_t wc = corner ? (sample == 0 ? 0 : s.w - 1) : pick(s.w);
      Reference rdx;
      for (int64_t oc = 0; oc < s.c_out; ++oc) {
        for (int64_t i = 0; i < kKernel; ++i) {
          for (int64_t j = 0; j < kKernel; ++j) {
            const int64_t ho = h + kPadding - i, wo = wc + kPadding - j;  // stride 1
            if (ho < 0 || ho >= oh_size || wo < 0 || wo >= ow_size) continue;
            rdx.add(dyn[static_cast<size_t>((oc * oh_size + ho) * ow_size + wo)], w_at(oc, c, i, j));
          }
        }
      }
      worst = std::max(worst, rdx.error(dxn[static_cast<size_t>((c * s.h + h) * s.w + wc)]));
    }
  }

  // dw[o, c, i, j] = sum_{n, oh, ow} dy[n, o, oh, ow] x[n, c, oh + i - pad, ow + j - pad]
  for (int pair = 0; pair < 3; ++pair) {
    const int64_t o = pair == 0 ? 0 : pick(s.c_out), c = pair == 0 ? s.c_in - 1 : pick(s.c_in);
    const std::vector<float> xc = x.select(1, c).to_vector<float>();   // (n, h, w)
    const std::vector<float> dyo = dy.select(1, o).to_vector<float>();  // (n, oh, ow)
    for (int64_t i = 0; i < kKernel; ++i) {
      for (int64_t j = 0; j < kKernel; ++j) {
        Reference rdw;
        for (int64_t n = 0; n < s.n; ++n) {
          for (int64_t oh = 0; oh < oh_size; ++oh) {
            for (int64_t ow = 0; ow < ow_size; ++ow) {
              const int64_t hi = oh * kStride + i - kPadding, wi = ow * kStride + j - kPadding;
              if (hi < 0 || hi >= s.h || wi < 0 || wi >= s.w) continue;
              rdw.add(dyo[static_cast<size_t>((n * oh_size + oh) * ow_size + ow)],
                      xc[static_cast<size_t>((n * s.h + hi) * s.w + wi)]);
            }
          }
        }
        const size_t at = static_cast<size_t>(((o * s.c_in + c) * kKernel + i) * kKernel + j);
        worst = std::max(worst, rdw.error(dw_host[at]));
      }
    }
  }
  return worst;
}

// Normalized error allowed: bfloat16 rounds each result to 8 bits (2^-9
// relative); float32 under FMA math is exact to ~1e-6 (FFT and Winograd
// algorithms included), TF32 rounds each input to 10 bits. A broken kernel is
// off by O(1).
double tolerance(DType dtype, bool tf32) {
  if (dtype == DType::f32) return tf32 ? 1e-2 : 1e-3;
  return 3e-2;
}

// ---------------------------------------------------------------- rows

nlohmann::json run_row(const ConvShape& s, const Variant& v, bool graph_api, int repeats, GpuTimer& timer,
                       const cuda::DeviceProperties& properties) {
  const bool tf32 = v.dtype == DType::f32 && allow_tf32();
  set_cudnn_api(graph_api ? CudnnApi::graph : CudnnApi::legacy);
  nlohmann::json row = {{"what", s.what},
                        {"cudnn_api", graph_api ? "graph" : "legacy"},
                        {"n", s.n},
                        {"c_in", s.c_in},
                        {"c_out", s.c_out},
                        {"h", s.h},
                        {"w", s.w},
                        {"kernel", kKernel},
                        {"stride", kStride},
                        {"padding", kPadding},
                        {"dtype", std::string(dtype_name(v.dtype))},
                        {"layout", v.channels_last ? "nhwc" : "nchw"},
                        {"tf32", tf32},
                        {"device", properties.name},
                        {"repeats", repeats}};
  try {
    Tensor x = random_cuda({s.n, s.c_in, s.h, s.w}, v.dtype, v.channels_last);         // (N, Cin, H, W)
    Tensor w = random_cuda({s.c_out, s.c_in, kKernel, kKernel}, v.dtype, v.channels_last);  // (Cout, Cin, 3, 3)
    const Tensor dy = random_cuda({s.n, s.c_out, out_size(s.h), out_size(s.w)}, v.dtype, v.channels_last);
    x.requires_grad_();
    w.requires_grad_();
    auto forward = [&] {
      NoGradGuard no_grad;
      (void)conv2d(x, w, Tensor(), kStride, kPadding);
    };
    auto forward_backward = [&] { (void)autograd::grad({conv2d(x, w, Tensor(), kStride, kPadding)}, {x, w}, {dy}); };
    // Untimed first calls: cuDNN's benchmark search (it synchronizes) for the three directions.
    const uint64_t fallbacks = cudnn_benchmark_stats().graph_fallbacks;
    forward();
    forward_backward();
    // Directions the graph API could not run went to the legacy API: the row says how many.
    if (graph_api) row["graph_fallbacks"] = cudnn_benchmark_stats().graph_fallbacks - fallbacks;
    const uint64_t searches = cudnn_benchmark_stats().misses;
    const Measurement forward_time = timer.time(forward, repeats);
    const Measurement both_time = timer.time(forward_backward, repeats);
    KILN_CHECK(cudnn_benchmark_stats().misses == searches, "bench_conv_gpu: a cuDNN algorithm search ran inside "
               "the timed calls");

    // The times stay in the row for diagnosis when the check below fails, but
    // the row then carries "error" and no reader takes it as a figure.
    const double flops = forward_flops(s);
    row["forward_ms"] = forward_time.median_ms;
    row["forward_backward_ms"] = both_time.median_ms;
    row["forward_tflops"] = flops / (forward_time.median_ms * 1e-3) / 1e12;
    row["forward_backward_tflops"] = 3 * flops / (both_time.median_ms * 1e-3) / 1e12;

    const Tensor y = conv2d(x, w, Tensor(), kStride, kPadding);
    const autograd::TensorList grads = autograd::grad({y}, {x, w}, {dy});
    row["cudnn_layout"] = y.is_contiguous() ? "nchw" : "nhwc";  // what cuDNN ran (kiln follows the strides)
    const double error = check_against_reference(s, x, w, dy, y, grads[0], grads[1]);
    row["check_error"] = error;
    row["check_tolerance"] = tolerance(v.dtype, tf32);
    KILN_CHECK(error <= tolerance(v.dtype, tf32), "bench_conv_gpu: result differs from the float64 reference (",
               "normalized error ", error, ", tolerance ", tolerance(v.dtype, tf32), ")");
  } catch (const std::exception& error) {  // kiln::Error, or the host running out of memory
    row["error"] = error.what();
  }
  return row;
}

void print_text_row(const nlohmann::json& row) {
  const std::string shape = std::to_string(row["c_in"].get<int64_t>()) + "->" +
                            std::to_string(row["c_out"].get<int64_t>()) + " " +
                            std::to_string(row["h"].get<int64_t>()) + "x" + std::to_string(row["w"].get<int64_t>()) +
                            " n" + std::to_string(row["n"].get<int64_t>());
  std::printf("%-20s %-20s %-9s %-6s %-6s ", row["what"].get<std::string>().c_str(), shape.c_str(),
              row["dtype"].get<std::string>().c_str(), row["layout"].get<std::string>().c_str(),
              row["cudnn_api"].get<std::string>().c_str());
  if (row.contains("error")) {
    std::printf("FAILED: %s\n", row["error"].get<std::string>().c_str());
    return;
  }
  const int64_t fallbacks = row.value("graph_fallbacks", int64_t{0});
  std::printf("%9.3f %9.1f %11.3f %11.1f %9.1e%s%s\n", row["forward_ms"].get<double>(),
              row["forward_tflops"].get<double>(), row["forward_backward_ms"].get<double>(),
              row["forward_backward_tflops"].get<double>(), row["check_error"].get<double>(),
              row["cudnn_layout"] != row["layout"] ? "  (kiln ran nchw)" : "",
              fallbacks > 0 ? ("  (" + std::to_string(fallbacks) + " of 3 directions ran legacy)").c_str() : "");
}

int run(bool json, int repeats, const std::vector<bool>& apis) {
  if (!cuda::is_available()) {
    const std::string reason = "no CUDA device (" + cuda::availability().problem + ")";
    if (json) {
      std::printf("%s\n", nlohmann::json({{"skipped", true}, {"reason", reason}}).dump().c_str());
    } else {
      std::printf("bench_conv_gpu: skipped: %s\n", reason.c_str());
    }
    return 0;
  }
  cuda::set_device(0);
  const cuda::DeviceProperties properties = cuda::device_properties(0);
  set_cudnn_benchmark(true);
  GpuTimer timer(0);
  if (!json) {
    std::printf("bench_conv_gpu on %s (%d SMs): kiln::conv2d (cuDNN), benchmark mode, 3x3 stride 1 pad 1, no bias;\n"
                "median of %d repeats after warm-up, L2 flushed; fwd+bwd = forward + dx + dweight (3x the FLOPs); "
                "float32 with TF32 %s\n\n",
                properties.name, properties.multiprocessor_count, repeats, allow_tf32() ? "allowed" : "off");
    std::printf("%-20s %-20s %-9s %-6s %-6s %9s %9s %11s %11s %9s\n", "what", "shape", "dtype", "layout", "cuDNN",
                "fwd ms", "TFLOP/s", "fwd+bwd ms", "TFLOP/s", "check");
  }
  bool failed = false;
  for (const Variant& v : kVariants) {
    for (const ConvShape& s : kShapes) {
      for (bool graph_api : apis) {
        const nlohmann::json row = run_row(s, v, graph_api, repeats, timer, properties);
        failed = failed || row.contains("error");
        if (json) {
          std::printf("%s\n", row.dump().c_str());
        } else {
          print_text_row(row);
        }
        std::fflush(stdout);
      }
    }
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  bool json = false;
  int repeats = 20;
  std::vector<bool> apis = {false, true};  // legacy, graph
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      repeats = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--cudnn-api") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "legacy") == 0 || std::strcmp(argv[i + 1], "graph") == 0 ||
                std::strcmp(argv[i + 1], "both") == 0)) {
      const std::string api = argv[++i];
      apis = api == "both" ? std::vector<bool>{false, true} : std::vector<bool>{api == "graph"};
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--repeats N] [--cudnn-api legacy|graph|both]\n", argv[0]);
      return 2;
    }
  }
  try {
    return kiln::bench::run(json, repeats, apis);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_conv_gpu: %s\n", error.what());
    return 1;
  }
}
