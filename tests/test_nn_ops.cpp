// conv2d, batch_norm, layer_norm and pooling against plain double loops and
// hand computations; error messages; cuDNN benchmark cache (GPU).
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "core/autograd.h"
#include "core/nn_ops.h"
#include "nn/conv.h"
#include "kernels/pool.h"
#include "tests/support/op_info.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

struct ConvCase {
  Shape x, w;
  bool bias;
  Size2 stride, padding, dilation;
  int64_t groups;
};

// Direct convolution and its three gradients (for an upstream gradient g) in double.
struct NaiveConv {
  std::vector<double> y, dx, dw, db;
  Shape y_shape;
};
NaiveConv naive_conv(const ConvCase& c, const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& b, const std::vector<double>* g) {
  const int64_t N = c.x[0], C = c.x[1], H = c.x[2], W = c.x[3];
  const int64_t O = c.w[0], Cg = c.w[1], KH = c.w[2], KW = c.w[3], Og = O / c.groups;
  const int64_t OH = (H + 2 * c.padding.h - c.dilation.h * (KH - 1) - 1) / c.stride.h + 1;
  const int64_t OW = (W + 2 * c.padding.w - c.dilation.w * (KW - 1) - 1) / c.stride.w + 1;
  NaiveConv r;
  r.y_shape = {N, O, OH, OW};
  r.y.assign(static_cast<size_t>(N * O * OH * OW), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dw.assign(w.size(), 0.0);
  r.db.assign(static_cast<size_t>(O), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t yi = ((n * O + o) * OH + oh) * OW + ow;
          double total = c.bias ? b[o] : 0.0;
          const double gy = g ? (*g)[yi] : 0.0;
          if (g) r.db[o] += gy;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t ki = 0; ki < KH; ++ki)
              for (int64_t kj = 0; kj < KW; ++kj) {
                const int64_t ih = oh * c.stride.h - c.padding.h + ki * c.dilation.h;
                const int64_t iw = ow * c.stride.w - c.padding.w + kj * c.dilation.w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t channel = (o / Og) * Cg + ci;
                const int64_t xi = ((n * C + channel) * H + ih) * W + iw;
                const int64_t wi = ((o * Cg + ci) * KH + ki) * KW + kj;
                total += x[xi] * w[wi];
                if (g) {
                  r.dx[xi] += gy * w[wi];
                  r.dw[wi] += gy * x[xi];
                }
              }
          r.y[yi] = total;
        }
  return r;
}

Tensor from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype) {
  return tensor<double>(values, shape).to(dtype);
}

}  // namespace

TEST_CASE("conv2d matches a direct loop in double, forward and backward") {
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 9}, {4, 3, 3, 3}, true, 2, 1, 1, 1},
      {{2, 2, 7, 9}, {3, 2, 3, 3}, false, 1, {2, 1}, 2, 1},
      {{2, 4, 6, 5}, {6, 2, 3, 2}, true, {1, 2}, {1, 0}, 1, 2},
      {{1, 6, 5, 5}, {6, 1, 3, 3}, true, 1, 1, 1, 6},  // depthwise
      {{3, 3, 5, 4}, {5, 3, 1, 1}, false, 1, 0, 1, 1},  // pointwise fast path
      {{2, 2, 5, 5}, {3, 2, 1, 1}, true, 2, 0, 1, 1},   // 1x1 with stride: im2col path
      {{20, 1, 8, 8}, {4, 1, 3, 3}, false, 1, 1, 1, 1}, // more samples than weight chunks
      // Small planes: several samples per GEMM (kernels/cpu/conv.cpp samples_per_gemm).
      {{64, 3, 3, 3}, {5, 3, 3, 3}, true, 1, 1, 1, 1},  // 3x3: 4 chunks of 16 samples, one GEMM each
      {{80, 2, 9, 9}, {3, 2, 3, 3}, true, 1, 1, 1, 1},  // blocks of 3 and 2 samples in chunks of 5
      {{24, 4, 5, 5}, {6, 2, 3, 3}, true, 1, 1, 1, 2},    // grouped
      {{12, 4, 4, 4}, {6, 4, 1, 1}, false, 1, 0, 1, 1},   // pointwise, samples gathered
  };
  for (DType dtype : {DType::f64, DType::f32}) {
    for (size_t k = 0; k < cases.size(); ++k) {
      const ConvCase& c = cases[k];
      INFO("case " << k << " x " << shape_str(c.x) << " w " << shape_str(c.w) << " " << dtype_name(dtype));
      const auto xv = random_values(shape_numel(c.x), 1 + k), wv = random_values(shape_numel(c.w), 100 + k);
      const auto bv = random_values(c.w[0], 200 + k);
      const NaiveConv probe = naive_conv(c, xv, wv, bv, nullptr);
      const auto gv = random_values(shape_numel(probe.y_shape), 300 + k);
      const NaiveConv ref = naive_conv(c, xv, wv, bv, &gv);

      Tensor x = from_doubles(xv, c.x, dtype).requires_grad_();
      Tensor w = from_doubles(wv, c.w, dtype).requires_grad_();
      Tensor b = c.bias ? from_doubles(bv, {c.w[0]}, dtype).requires_grad_() : Tensor();
      Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
      const double tol = dtype == DType::f64 ? 1e-12 : 2e-5;
      KILN_CHECK_CLOSE(y, tensor<double>(ref.y, ref.y_shape).to(dtype), tol, tol);
      y.backward(from_doubles(gv, probe.y_shape, dtype));
      KILN_CHECK_CLOSE(x.grad(), tensor<double>(ref.dx, c.x).to(dtype), tol, tol);
      KILN_CHECK_CLOSE(w.grad(), tensor<double>(ref.dw, c.w).to(dtype), tol, tol * 10);
      if (c.bias) KILN_CHECK_CLOSE(b.grad(), tensor<double>(ref.db, {c.w[0]}).to(dtype), tol, tol * 10);
    }
  }
}

TEST_CASE("conv2d: unbatched input, and results independent of the thread count") {
  const auto xv = random_values(2 * 3 * 9 * 9, 5), wv = random_values(8 * 3 * 3 * 3, 6);
  Tensor x = tensor<double>(xv, {2, 3, 9, 9}).to(DType::f32);
  Tensor w = tensor<double>(wv, {8, 3, 3, 3}).to(DType::f32);
  Tensor y1 = conv2d(x.select(0, 1), w, Tensor(), 1, 1);
  CHECK(y1.shape() == Shape{8, 9, 9});
  // Equal up to rounding, not bit for bit: with small planes the batch shares
  // one GEMM whose blocking differs from a single sample's (as in PyTorch,
  // results are not batch-size invariant).
  KILN_CHECK_CLOSE(y1, conv2d(x, w, Tensor(), 1, 1).select(0, 1), 1e-6, 1e-6);

  // Weight gradients of a batch of 40 with 1 thread and with 2 must agree bit
  // for bit (the batch is large enough for the kernels to go parallel).
  const auto big = random_values(40 * 3 * 16 * 16, 7);
  std::vector<Tensor> grads;
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor wt = w.detach().clone().requires_grad_();
    Tensor out = conv2d(tensor<double>(big, {40, 3, 16, 16}).to(DType::f32), wt, Tensor(), 1, 1);
    out.backward(ones_like(out));
    grads.push_back(wt.grad());
  }
  omp_set_num_threads(threads_before);
  KILN_CHECK_CLOSE(grads[0], grads[1], 0.0, 0.0);

  // Likewise with small planes, where several samples share one GEMM.
  const auto small = random_values(64 * 3 * 5 * 5, 8);
  std::vector<Tensor> outputs, input_grads;
  grads.clear();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor wt = w.detach().clone().requires_grad_();
    Tensor xt = tensor<double>(small, {64, 3, 5, 5}).to(DType::f32).requires_grad_();
    Tensor out = conv2d(xt, wt, Tensor(), 1, 1);
    out.backward(ones_like(out));
    outputs.push_back(out.detach());
    grads.push_back(wt.grad());
    input_grads.push_back(xt.grad());
  }
  omp_set_num_threads(threads_before);
  KILN_CHECK_CLOSE(outputs[0], outputs[1], 0.0, 0.0);
  KILN_CHECK_CLOSE(grads[0], grads[1], 0.0, 0.0);
  KILN_CHECK_CLOSE(input_grads[0], input_grads[1], 0.0, 0.0);
}

TEST_CASE("conv2d: shape errors name the problem") {
  Tensor x = zeros({2, 4, 5, 5});
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({3, 3, 3, 3})), doctest::Contains("channel mismatch"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({3, 3, 3, 3})), doctest::Contains("[2, 4, 5, 5]"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({4, 4, 7, 7})), doctest::Contains("larger than the padded input"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({4, 4, 3, 3}), Tensor(), 1, 0, 3), doctest::Contains("larger than the padded"),
                       Error);  // dilation 3 makes the 3x3 kernel 7x7
  CHECK_NOTHROW(conv2d(x, zeros({4, 4, 7, 7}), Tensor(), 1, 1));  // fits once padded
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({3, 4, 3, 3}), Tensor(), 1, 0, 1, 3),
                       doctest::Contains("groups=3 does not divide the input's 4 channels"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({3, 2, 3, 3}), Tensor(), 1, 0, 1, 2),
                       doctest::Contains("does not divide the weight's 3 output channels"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({3, 4, 3, 3}), zeros({4})), doctest::Contains("bias of shape [3]"), Error);
  CHECK_THROWS_WITH_AS(conv2d(zeros({4, 5, 5, 1, 1}), zeros({3, 4, 3, 3})), doctest::Contains("expected input"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({3, 4, 3, 3}, {.dtype = DType::f64})), doctest::Contains("float64"), Error);
}

TEST_CASE("batch_norm: running statistics after two training steps, then eval uses them") {
  const int64_t N = 4, C = 3, HW = 5;
  Tensor running_mean = zeros({C}), running_var = ones({C});
  Tensor weight = tensor<float>({1.5f, -0.5f, 2.0f}, {C}), bias = tensor<float>({0.1f, 0.2f, -0.3f}, {C});
  std::vector<double> expected_mean(C, 0.0), expected_var(C, 1.0);
  for (int step = 0; step < 2; ++step) {
    const auto values = random_values(N * C * HW, 40 + step);
    Tensor x = tensor<double>(values, {N, C, HW}).to(DType::f32);
    Tensor y = batch_norm(x, running_mean, running_var, weight, bias, true, 0.1, 1e-5);
    std::vector<double> y_expected(values.size());
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0, squares = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) sum += values[(n * C + c) * HW + i];
      const double mean = sum / (N * HW);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) squares += std::pow(values[(n * C + c) * HW + i] - mean, 2);
      const double biased = squares / (N * HW), unbiased = squares / (N * HW - 1);
      expected_mean[c] = 0.9 * expected_mean[c] + 0.1 * mean;
      expected_var[c] = 0.9 * expected_var[c] + 0.1 * unbiased;
      const std::vector<double> w{1.5, -0.5, 2.0}, b{0.1, 0.2, -0.3};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) {
          const int64_t at = (n * C + c) * HW + i;
          y_expected[at] = (values[at] - mean) / std::sqrt(biased + 1e-5) * w[c] + b[c];
        }
    }
    KILN_CHECK_CLOSE(y, tensor<double>(y_expected, {N, C, HW}).to(DType::f32), 1e-5, 1e-5);
  }
  KILN_CHECK_CLOSE(running_mean, tensor<double>(expected_mean, {C}).to(DType::f32), 1e-6, 1e-6);
  KILN_CHECK_CLOSE(running_var, tensor<double>(expected_var, {C}).to(DType::f32), 1e-6, 1e-6);

  // Eval: normalizes with the running stats and leaves them unchanged.
  const auto values = random_values(N * C * HW, 99);
  Tensor x = tensor<double>(values, {N, C, HW}).to(DType::f32);
  Tensor y = batch_norm(x, running_mean, running_var, weight, bias, false, 0.1, 1e-5);
  std::vector<double> y_expected(values.size());
  const std::vector<double> w{1.5, -0.5, 2.0}, b{0.1, 0.2, -0.3};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t at = (n * C + c) * HW + i;
        y_expected[at] = (values[at] - expected_mean[c]) / std::sqrt(expected_var[c] + 1e-5) * w[c] + b[c];
      }
  KILN_CHECK_CLOSE(y, tensor<double>(y_expected, {N, C, HW}).to(DType::f32), 1e-5, 1e-5);
  KILN_CHECK_CLOSE(running_mean, tensor<double>(expected_mean, {C}).to(DType::f32), 1e-6, 1e-6);
}

TEST_CASE("batch_norm_relu equals relu(batch_norm) forward and backward, in NCHW and channels-last") {
  const int64_t N = 4, C = 3, H = 5, W = 6;
  const auto xv = random_values(N * C * H * W, 11), gv = random_values(N * C * H * W, 12);
  for (bool training : {true, false}) {
    INFO("training " << training);
    Tensor x = tensor<double>(xv, {N, C, H, W}).requires_grad_();
    Tensor weight = tensor<double>({1.2, -0.7, 0.9}, {C}).requires_grad_();
    Tensor bias = tensor<double>({0.3, 0.1, -0.2}, {C}).requires_grad_();
    Tensor rm = tensor<double>({0.1, -0.2, 0.05}, {C}), rv = tensor<double>({0.8, 1.3, 1.1}, {C});
    Tensor y = batch_norm(x, rm.clone(), rv.clone(), weight, bias, training);
    std::vector<double> yv = y.to_vector<double>(), relu_y(yv.size()), masked_g(yv.size());
    for (size_t i = 0; i < yv.size(); ++i) {
      relu_y[i] = std::max(yv[i], 0.0);
      masked_g[i] = yv[i] > 0 ? gv[i] : 0.0;
    }
    y.backward(tensor<double>(masked_g, {N, C, H, W}));
    const Tensor dx_ref = x.grad(), dw_ref = weight.grad(), db_ref = bias.grad();
    for (bool channels_last : {false, true}) {
      INFO("channels_last " << channels_last);
      Tensor xi = tensor<double>(xv, {N, C, H, W});
      if (channels_last) xi = xi.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
      xi = xi.detach().requires_grad_();
      Tensor wi = weight.detach().clone().requires_grad_(), bi = bias.detach().clone().requires_grad_();
      Tensor fused = batch_norm_relu(xi, rm.clone(), rv.clone(), wi, bi, training);
      if (channels_last) CHECK(fused.strides() == xi.strides());
      KILN_CHECK_CLOSE(fused, tensor<double>(relu_y, {N, C, H, W}), 1e-12, 1e-12);
      fused.backward(tensor<double>(gv, {N, C, H, W}));
      KILN_CHECK_CLOSE(xi.grad(), dx_ref, 1e-10, 1e-12);
      KILN_CHECK_CLOSE(wi.grad(), dw_ref, 1e-10, 1e-12);
      KILN_CHECK_CLOSE(bi.grad(), db_ref, 1e-10, 1e-12);
    }
  }
}

TEST_CASE("batch_norm: checks") {
  Tensor x = zeros({4, 3, 2, 2});
  CHECK_THROWS_WITH_AS(batch_norm(x, zeros({4}), ones({4}), Tensor(), Tensor(), true),
                       doctest::Contains("running_mean of shape [3]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false),
                       doctest::Contains("eval mode"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(zeros({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("more than 1 value per channel"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(zeros({2, 3}), {2}), doctest::Contains("trailing dims"), Error);
}

TEST_CASE("layer_norm matches a hand computation") {
  const int64_t R = 3, D = 7;
  const auto xv = random_values(R * D, 21), wv = random_values(D, 22), bv = random_values(D, 23);
  Tensor y = layer_norm(tensor<double>(xv, {R, D}), {D}, tensor<double>(wv, {D}), tensor<double>(bv, {D}), 1e-5);
  std::vector<double> expected(xv.size());
  for (int64_t r = 0; r < R; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < D; ++i) mean += xv[r * D + i] / D;
    for (int64_t i = 0; i < D; ++i) var += std::pow(xv[r * D + i] - mean, 2) / D;
    for (int64_t i = 0; i < D; ++i) expected[r * D + i] = (xv[r * D + i] - mean) / std::sqrt(var + 1e-5) * wv[i] + bv[i];
  }
  KILN_CHECK_CLOSE(y, tensor<double>(expected, {R, D}), 1e-12, 1e-12);
}

namespace {
// Each of a GPU run's results against the CPU run's, within rtol = atol = tol.
void check_gpu_results_close(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu, double tol) {
  REQUIRE(gpu.size() == cpu.size());
  for (size_t k = 0; k < cpu.size(); ++k) {
    INFO("result " << k);
    KILN_CHECK_CLOSE(gpu[k].cpu(), cpu[k], tol, tol);
  }
}
}  // namespace

// The op table's norm samples are small: one statistics split, NCHW only, no
// running stats compared. This covers batch_norm.cu's multi-split statistics, the
// channels-last (rows) kernels, the running-stat update and the layer-norm
// weight-gradient splits on the device.
TEST_CASE("batch_norm and layer_norm: CUDA matches the CPU with split statistics and channels-last [gpu]") {
  KILN_REQUIRE_GPU();
  const int64_t N = 2, C = 3, H = 96, W = 96;  // 18432 values per channel: two 16K splits
  const Tensor x64 = tensor<double>(random_values(N * C * H * W, 61), {N, C, H, W});
  const Tensor g64 = tensor<double>(random_values(N * C * H * W, 62), {N, C, H, W});
  const Tensor weight = tensor<float>({1.5f, -0.5f, 2.0f}, {C}), bias = tensor<float>({0.1f, 0.2f, -0.3f}, {C});
  for (DType dtype : {DType::f32, DType::f16}) {
    for (bool channels_last : {false, true}) {
      INFO("dtype " << dtype_name(dtype) << " channels_last " << channels_last);
      Tensor x = x64.to(dtype);
      if (channels_last) x = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
      // A training step (batch statistics, running-stat update, backward), then eval on the updated stats.
      auto run = [&](bool cuda) {
        auto on = [&](const Tensor& t) { return cuda ? t.cuda() : t; };
        Tensor xi = on(x).detach().requires_grad_();
        Tensor wi = on(weight).detach().requires_grad_(), bi = on(bias).detach().requires_grad_();
        Tensor rm = on(zeros({C})), rv = on(ones({C}));
        Tensor y = batch_norm(xi, rm, rv, wi, bi, true, 0.1, 1e-5);
        y.backward(on(g64.to(dtype)));
        Tensor eval = batch_norm(on(x), rm, rv, wi.detach(), bi.detach(), false, 0.1, 1e-5);
        return std::vector<Tensor>{y, xi.grad(), wi.grad(), bi.grad(), rm, rv, eval};
      };
      check_gpu_results_close(run(true), run(false), dtype == DType::f32 ? 1e-4 : 1e-2);
    }
  }
  // 130 rows: three 64-row splits of the weight gradients; 300 columns: more than one block stride.
  const int64_t R = 130, D = 300;
  const Tensor lx = tensor<double>(random_values(R * D, 63), {R, D}).to(DType::f32);
  const Tensor lg = tensor<double>(random_values(R * D, 64), {R, D}).to(DType::f32);
  const Tensor lw = tensor<double>(random_values(D, 65), {D}).to(DType::f32);
  const Tensor lb = tensor<double>(random_values(D, 66), {D}).to(DType::f32);
  auto run_layer_norm = [&](bool cuda) {
    auto on = [&](const Tensor& t) { return cuda ? t.cuda() : t; };
    Tensor xi = on(lx).detach().requires_grad_();
    Tensor wi = on(lw).detach().requires_grad_(), bi = on(lb).detach().requires_grad_();
    Tensor y = layer_norm(xi, {D}, wi, bi, 1e-5);
    y.backward(on(lg));
    return std::vector<Tensor>{y, xi.grad(), wi.grad(), bi.grad()};
  };
  check_gpu_results_close(run_layer_norm(true), run_layer_norm(false), 1e-4);
}

// batch_norm.cu's 16-byte packs: channels-last with C a multiple of 8 (each
// thread keeps 8, 4 or 2 channels in registers; 520 channels make several
// channel blocks, the last partial) and NCHW planes of 64; each also as a view
// one element past a 16-byte boundary (the packs' element-by-element loads),
// with and without the fused ReLU, training step then eval.
TEST_CASE("batch_norm: CUDA's packed kernels match the CPU, channels-last and NCHW, offset views, fused ReLU [gpu]") {
  KILN_REQUIRE_GPU();
  const int64_t N = 4, H = 8, W = 8;
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (int64_t C : {64, 520}) {
      for (bool channels_last : {true, false}) {
        for (bool offset : {false, true}) {
          for (bool relu : {false, true}) {
            INFO(dtype_name(dtype) << " C " << C << (channels_last ? " NHWC" : " NCHW")
                                   << (offset ? " offset view" : "") << (relu ? " relu" : ""));
            const int64_t n = N * C * H * W;
            const Tensor base = tensor<double>(random_values(n + 1, 81), {n + 1}).to(dtype);
            const Tensor flat = base.narrow(0, offset ? 1 : 0, n);
            const Tensor x = channels_last ? flat.view({N, H, W, C}).permute({0, 3, 1, 2}) : flat.view({N, C, H, W});
            const Tensor dy = tensor<double>(random_values(n, 82), {N, C, H, W}).to(dtype);
            const Tensor weight = tensor<double>(random_values(C, 83), {C}).to(DType::f32);
            const Tensor bias = tensor<double>(random_values(C, 84), {C}).to(DType::f32);
            auto run = [&](bool cuda) {
              auto on = [&](const Tensor& t) { return cuda ? t.cuda() : t; };
              Tensor xi = on(x).detach().requires_grad_();
              Tensor wi = on(weight).detach().requires_grad_(), bi = on(bias).detach().requires_grad_();
              Tensor rm = on(zeros({C})), rv = on(ones({C}));
              auto norm = relu ? batch_norm_relu : batch_norm;
              Tensor y = norm(xi, rm, rv, wi, bi, true, 0.1, 1e-5);
              y.backward(on(dy));
              Tensor eval = norm(on(x), rm, rv, wi.detach(), bi.detach(), false, 0.1, 1e-5);
              return std::vector<Tensor>{y, xi.grad(), wi.grad(), bi.grad(), rm, rv, eval};
            };
            check_gpu_results_close(run(true), run(false), dtype == DType::f32 ? 1e-4 : 2e-2);
          }
        }
      }
    }
  }
}

TEST_CASE("layer_norm: the CUDA warp-per-row kernels match the CPU in every dtype, vector and element paths [gpu]") {
  KILN_REQUIRE_GPU();
  // 768 columns take 16-byte vectors in every dtype; 301 (odd) and a view one
  // element off a 16-byte boundary take single elements; 8 columns leave most
  // lanes idle. With and without the affine parameters.
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (int64_t D : {768, 301, 8}) {
      for (bool affine : {true, false}) {
        for (bool offset : {false, true}) {
          INFO(dtype_name(dtype) << " D " << D << (affine ? " affine" : "") << (offset ? " offset view" : ""));
          const int64_t R = 37;
          const Tensor base = tensor<double>(random_values((R * D + 1), 71), {R * D + 1}).to(dtype);
          const Tensor x = base.narrow(0, offset ? 1 : 0, R * D).view({R, D});
          const Tensor dy = tensor<double>(random_values(R * D, 72), {R, D}).to(dtype);
          const Tensor w = tensor<double>(random_values(D, 73), {D}).to(dtype);
          const Tensor b = tensor<double>(random_values(D, 74), {D}).to(dtype);
          auto run = [&](bool cuda) {
            auto on = [&](const Tensor& t) { return cuda ? t.cuda() : t; };
            Tensor xi = on(x).detach().requires_grad_();
            Tensor wi = on(w).detach().requires_grad_(), bi = on(b).detach().requires_grad_();
            Tensor y = affine ? layer_norm(xi, {D}, wi, bi, 1e-5) : layer_norm(xi, {D}, Tensor(), Tensor(), 1e-5);
            y.backward(on(dy));
            std::vector<Tensor> out = {y.cpu(), xi.grad().cpu()};
            if (affine) {
              out.push_back(wi.grad().cpu());
              out.push_back(bi.grad().cpu());
            }
            return out;
          };
          const std::vector<Tensor> gpu = run(true), cpu = run(false);
          const testing::Tolerance tol = testing::parity_tolerance(dtype);
          for (size_t i = 0; i < gpu.size(); ++i) {
            CAPTURE(i);
            // Parameter gradients sum 37 rows: a few more roundings than the elementwise outputs.
            const double scale = i >= 2 ? 4.0 : 1.0;
            KILN_CHECK_CLOSE(gpu[i].to(DType::f64), cpu[i].to(DType::f64), scale * tol.rtol, scale * tol.atol);
          }
        }
      }
    }
  }
}

TEST_CASE("max_pool2d: ties go to the first maximum, padding never wins, NaN propagates") {
  // One 2x2 window of equal values, one with a tie between positions 1 and 3.
  Tensor x = tensor<double>({5, 5, 1, 7, 5, 5, 2, 7}, {1, 1, 2, 4}).requires_grad_();
  Tensor y = max_pool2d(x, 2);
  KILN_CHECK_CLOSE(y, tensor<double>({5, 7}, {1, 1, 1, 2}), 0.0, 0.0);
  y.backward(tensor<double>({1, 1}, {1, 1, 1, 2}));
  KILN_CHECK_CLOSE(x.grad(), tensor<double>({1, 0, 0, 1, 0, 0, 0, 0}, {1, 1, 2, 4}), 0.0, 0.0);

  // All-negative input with padding: the maximum is a real element, not a padded zero.
  Tensor neg = tensor<double>({-3, -1, -2, -4}, {1, 1, 2, 2}).requires_grad_();
  Tensor pooled = max_pool2d(neg, 3, Size2(1), 1);
  KILN_CHECK_CLOSE(pooled, tensor<double>({-1, -1, -1, -1}, {1, 1, 2, 2}), 0.0, 0.0);
  pooled.backward(ones_like(pooled));
  KILN_CHECK_CLOSE(neg.grad(), tensor<double>({0, 4, 0, 0}, {1, 1, 2, 2}), 0.0, 0.0);

  Tensor with_nan = tensor<double>({1, NAN, 3, 2}, {1, 1, 2, 2});
  CHECK(std::isnan(max_pool2d(with_nan, 2).item<double>()));
  CHECK(std::isnan(max_pool2d(with_nan.to(DType::f32), {1, 2}, Size2(1)).to_vector<float>()[0]));
}

TEST_CASE("max_pool2d 2x2: every window's value and index follow the sequential rule, at every row length") {
  // Rows of 1 to 21 outputs (scalar, 4- and 8-wide vectors, an overlapping last
  // vector), odd sizes that drop a row or column, and values full of ties, signed
  // zeros, infinities and NaNs. Reference: each window's elements in order
  // (0,0) (0,1) (1,0) (1,1); a greater value or a NaN takes the place.
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> choices = {-inf, -2, -1, -0.0, 0.0, 1, 2, inf, std::nan("")};
  std::mt19937_64 engine(2026);
  std::uniform_int_distribution<size_t> pick(0, choices.size() - 1);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t H : {2, 5}) {
      for (int64_t W : {2, 3, 6, 7, 8, 9, 14, 15, 16, 17, 28, 29, 42, 43}) {
        INFO(dtype_name(dtype) << " H " << H << " W " << W);
        const int64_t planes = 6, OH = H / 2, OW = W / 2;
        std::vector<double> values(static_cast<size_t>(planes * H * W));
        for (double& v : values) v = choices[pick(engine)];
        Tensor x = tensor<double>(values, {2, 3, H, W}).to(dtype).requires_grad_();
        Tensor y = max_pool2d(x, 2);
        std::vector<double> dy_values(static_cast<size_t>(planes * OH * OW));
        for (size_t o = 0; o < dy_values.size(); ++o) dy_values[o] = static_cast<double>(o % 200 + 1);
        y.backward(tensor<double>(dy_values, y.shape()).to(dtype));
        const std::vector<double> got = y.to_vector<double>(), dx = x.grad().to_vector<double>();
        std::vector<double> expected_dx(values.size(), 0.0);
        bool values_equal = true;
        for (int64_t p = 0; p < planes; ++p) {
          for (int64_t oh = 0; oh < OH; ++oh) {
            for (int64_t ow = 0; ow < OW; ++ow) {
              int64_t at = -1;
              double best = 0;
              for (int64_t k = 0; k < 4; ++k) {
                const int64_t i = (p * H + 2 * oh + k / 2) * W + 2 * ow + k % 2;
                const double v = values[static_cast<size_t>(i)];
                if (at < 0 || v > best || std::isnan(v)) {
                  best = v;
                  at = i;
                }
              }
              const size_t o = static_cast<size_t>((p * OH + oh) * OW + ow);
              const bool same = std::isnan(best) ? std::isnan(got[o])
                                                 : got[o] == best && std::signbit(got[o]) == std::signbit(best);
              values_equal = values_equal && same;
              expected_dx[static_cast<size_t>(at)] = dy_values[o];
            }
          }
        }
        CHECK(values_equal);
        CHECK(dx == expected_dx);
      }
    }
  }
}

TEST_CASE("pooling: checks and output sizes") {
  Tensor x = zeros({2, 3, 5, 5});
  CHECK(max_pool2d(x, 2).shape() == Shape{2, 3, 2, 2});
  CHECK(max_pool2d(x, 3, Size2(2), 1).shape() == Shape{2, 3, 3, 3});
  CHECK(avg_pool2d(x, 3, Size2(2), 1).shape() == Shape{2, 3, 3, 3});
  CHECK(adaptive_avg_pool2d(x, {2, 3}).shape() == Shape{2, 3, 2, 3});
  CHECK_THROWS_WITH_AS(max_pool2d(x, 7), doctest::Contains("larger than the padded input"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, 2, Size2(2), 2), doctest::Contains("at most half"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(zeros({5, 5}), 2), doctest::Contains("expected input (N, C, H, W)"), Error);
  // avg with count_include_pad=false divides by the real elements only.
  Tensor ones4 = ones({1, 1, 2, 2});
  KILN_CHECK_CLOSE(avg_pool2d(ones4, 2, Size2(1), 1, false), ones({1, 1, 3, 3}), 0.0, 0.0);
  KILN_CHECK_CLOSE(avg_pool2d(ones4, 2, Size2(1), 1, true),
                   tensor<float>({0.25f, 0.5f, 0.25f, 0.5f, 1.0f, 0.5f, 0.25f, 0.5f, 0.25f}, {1, 1, 3, 3}), 0.0, 0.0);
}

// With dilation a window can lie wholly in the padding (padding 3 <= half the
// dilated kernel 6): its output is -inf with index -1, and nothing flows back
// from it; a window with one real element passes that element's gradient.
TEST_CASE("max_pool2d: a window wholly in the padding gives -inf and no gradient, on CPU and CUDA [gpu]") {
  auto pool = [](const Tensor& x) { return max_pool2d(x, {1, 2}, Size2(1), {0, 3}, {1, 5}); };
  Tensor x = tensor<double>({1, 2, 3}, {1, 1, 1, 3}).requires_grad_();
  Tensor y = pool(x);  // windows at columns {-3, 2}, {-2, 3}, {-1, 4}, {0, 5}
  const double inf = std::numeric_limits<double>::infinity();
  KILN_CHECK_CLOSE(y, tensor<double>({3, -inf, -inf, 1}, {1, 1, 1, 4}), 0.0, 0.0);
  y.backward(tensor<double>({1, 10, 100, 1000}, {1, 1, 1, 4}));
  KILN_CHECK_CLOSE(x.grad(), tensor<double>({1000, 0, 1}, {1, 1, 1, 3}), 0.0, 0.0);

  KILN_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::f16}) {
    CAPTURE(dtype);
    Tensor xg = x.detach().to(Device::cuda(), dtype).requires_grad_();
    Tensor yg = pool(xg);
    KILN_CHECK_CLOSE(yg.cpu().to(DType::f64), y.detach(), 0.0, 0.0);
    yg.backward(tensor<double>({1, 10, 100, 1000}, {1, 1, 1, 4}).to(Device::cuda(), dtype));
    KILN_CHECK_CLOSE(xg.grad().cpu().to(DType::f64), x.grad(), 0.0, 0.0);
  }
}

TEST_CASE("cuDNN benchmark mode: the second call of a shape hits the algorithm cache [gpu]") {
  KILN_REQUIRE_GPU();
  const bool before = cudnn_benchmark();
  set_cudnn_benchmark(true);
  cudnn_benchmark_cache_clear();
  Tensor x = tensor<double>(random_values(2 * 3 * 9 * 9, 1), {2, 3, 9, 9}).to(Device::cuda(), DType::f32);
  Tensor w = tensor<double>(random_values(4 * 3 * 3 * 3, 2), {4, 3, 3, 3}).to(Device::cuda(), DType::f32);
  Tensor first = conv2d(x, w, Tensor(), 1, 1);
  const CudnnBenchmarkStats after_first = cudnn_benchmark_stats();
  CHECK(after_first.misses == 1);
  CHECK(after_first.hits == 0);
  Tensor second = conv2d(x, w, Tensor(), 1, 1);
  const CudnnBenchmarkStats after_second = cudnn_benchmark_stats();
  CHECK(after_second.hits == 1);
  CHECK(after_second.misses == 1);
  KILN_CHECK_CLOSE(second.cpu(), first.cpu(), 1e-6, 1e-6);
  // A new shape is a new key.
  conv2d(x.narrow(0, 0, 1), w, Tensor(), 1, 1);
  CHECK(cudnn_benchmark_stats().misses == 2);
  set_cudnn_benchmark(before);
}

TEST_CASE("conv2d on CUDA: channels-last input gives a channels-last output equal to NCHW [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor x = tensor<double>(random_values(2 * 8 * 7 * 9, 3), {2, 8, 7, 9}).to(Device::cuda(), DType::f32);
  Tensor w = tensor<double>(random_values(16 * 8 * 3 * 3, 4), {16, 8, 3, 3}).to(Device::cuda(), DType::f32);
  Tensor reference = conv2d(x, w, Tensor(), 1, 1);
  Tensor x_nhwc = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
  Tensor y = conv2d(x_nhwc, w, Tensor(), 1, 1);
  CHECK(y.stride(1) == 1);
  KILN_CHECK_CLOSE(y.cpu(), reference.cpu(), 1e-5, 1e-5);
}

TEST_CASE("conv2d on CUDA: the bias and its gradient in every dtype and layout, without cuDNN's bias calls [gpu]") {
  KILN_REQUIRE_GPU();
  // cuDNN 9's cudnnAddTensor / cudnnConvolutionBackwardBias may refuse
  // bfloat16; kiln adds the bias and sums its gradient with its own kernels.
  const Tensor x = tensor<double>(random_values(2 * 4 * 6 * 5, 8), {2, 4, 6, 5});
  const Tensor w = tensor<double>(random_values(8 * 4 * 3 * 3, 9), {8, 4, 3, 3});
  const Tensor b = tensor<double>(random_values(8, 10), {8});
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (bool channels_last : {false, true}) {
      INFO(dtype_name(dtype) << (channels_last ? " channels-last" : " NCHW"));
      // detach: for float64, to(dtype) returns x itself, which must stay a leaf
      // that does not require grad (the CUDA copies below are leaves too).
      Tensor xc = x.to(dtype).detach().requires_grad_(), wc = w.to(dtype).detach().requires_grad_(),
             bc = b.to(dtype).detach().requires_grad_();
      Tensor xg = x.to(Device::cuda(), dtype);
      if (channels_last) xg = xg.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
      xg.requires_grad_();
      Tensor wg = w.to(Device::cuda(), dtype).requires_grad_(), bg = b.to(Device::cuda(), dtype).requires_grad_();
      Tensor expected = conv2d(xc, wc, bc, 1, 1);
      Tensor got = conv2d(xg, wg, bg, 1, 1);
      const Tolerance tol = parity_tolerance(dtype);
      // 16-bit: kiln adds the bias after cuDNN rounded the product (the CPU rounds
      // once); where the bias cancels a product of magnitude ~4 the two differ
      // by up to half an ulp at 4 (seen on an H200: 4e-4 in f16, 4e-3 in bf16).
      const double half_ulp_at_4 = dtype == DType::f16 ? 2e-3 : dtype == DType::bf16 ? 1.6e-2 : 0.0;
      const double rtol = std::max(tol.rtol, 1e-4), atol = std::max({tol.atol, 1e-4, half_ulp_at_4});
      KILN_CHECK_CLOSE(got.cpu(), expected, rtol, atol);
      Tensor seed = tensor<double>(random_values(expected.numel(), 11), expected.shape()).to(dtype);
      sum(expected * seed).backward();
      sum(got * seed.cuda()).backward();
      // Gradients sum up to 60 products: twice the dtype's parity tolerance.
      const double grad_rtol = std::max(2 * tol.rtol, 1e-4), grad_atol = 1e-3;
      KILN_CHECK_CLOSE(bg.grad().cpu(), bc.grad(), grad_rtol, grad_atol);
      KILN_CHECK_CLOSE(wg.grad().cpu(), wc.grad(), grad_rtol, grad_atol);
      KILN_CHECK_CLOSE(xg.grad().cpu(), xc.grad(), grad_rtol, grad_atol);
    }
  }
}

TEST_CASE("conv2d on CUDA: tensors on a GPU other than the current one run there [gpu2]") {
  KILN_REQUIRE_GPUS(2);
  const Tensor x = tensor<double>(random_values(2 * 3 * 9 * 9, 5), {2, 3, 9, 9}).to(DType::f32);
  const Tensor w = tensor<double>(random_values(4 * 3 * 3 * 3, 6), {4, 3, 3, 3}).to(DType::f32);
  const Tensor b = tensor<double>(random_values(4, 7), {4}).to(DType::f32);
  const Tensor reference = conv2d(x, w, b, 1, 1);
  // cuDNN's handle for cuda:1 used while cuda:0 is current fails or runs on the wrong device.
  cuda::DeviceGuard current(0, "test");
  const Device other = Device::cuda(1);
  const Tensor y = conv2d(x.to(other), w.to(other), b.to(other), 1, 1);
  CHECK(cuda::current_device() == 0);
  KILN_CHECK_CLOSE(y.cpu(), reference, 1e-4, 1e-4);
}

// Channels-last pooling. The NHWC kernels do each element's arithmetic in the
// NCHW kernels' order, so on one device the two layouts give the same bits in
// every dtype: outputs, and dx too (max: the same rounded adds in the same
// order; avg and adaptive: 16-bit shares summed in float and rounded once in
// both). Windows: overlapping (stride < kernel), padded, dilated, one wholly
// in the padding, odd sizes with no ceil mode (the last row/column left out),
// channel counts 1, odd, and 16/17 (the CPU kernel's vector loop and its tail).
// dx comes from autograd::grad: the gradient as the kernel wrote it, in the
// layout of the pooling's input, with no AccumulateGrad copy in between.
namespace {

struct PoolLayoutCase {
  const char* name;
  Shape shape;
  std::function<Tensor(const Tensor&)> pool;
};

std::vector<PoolLayoutCase> pool_layout_cases() {
  return {
      {"max 2x2", {2, 5, 7, 9}, [](const Tensor& x) { return max_pool2d(x, 2); }},
      {"max 2x2, one channel", {3, 1, 6, 6}, [](const Tensor& x) { return max_pool2d(x, 2); }},
      // 16 channels: on CUDA, channels-last takes pool.cu's kernels over 16-byte packs of channels.
      {"max 2x2, 16 channels", {2, 16, 7, 9}, [](const Tensor& x) { return max_pool2d(x, 2); }},
      {"max 3x3 stride 2 padding 1", {2, 5, 7, 9}, [](const Tensor& x) { return max_pool2d(x, 3, Size2(2), 1); }},
      {"max 3x3 stride 1", {1, 16, 6, 5}, [](const Tensor& x) { return max_pool2d(x, 3, Size2(1)); }},
      {"max 2x3 stride (1, 2) padding (1, 0) dilation 2", {2, 3, 7, 8},
       [](const Tensor& x) { return max_pool2d(x, {2, 3}, Size2(1, 2), {1, 0}, 2); }},
      {"max, windows wholly in the padding", {2, 4, 1, 3},
       [](const Tensor& x) { return max_pool2d(x, {1, 2}, Size2(1), {0, 3}, {1, 5}); }},
      {"avg 2x2", {2, 5, 7, 9}, [](const Tensor& x) { return avg_pool2d(x, 2); }},
      {"avg 3x3 stride 2 padding 1", {2, 5, 7, 9}, [](const Tensor& x) { return avg_pool2d(x, 3, Size2(2), 1); }},
      {"avg 3x3 stride 2 padding 1, padding not counted", {2, 5, 7, 9},
       [](const Tensor& x) { return avg_pool2d(x, 3, Size2(2), 1, false); }},
      {"avg 3x2 stride 1 padding 1", {1, 17, 6, 5},
       [](const Tensor& x) { return avg_pool2d(x, {3, 2}, Size2(1), 1); }},
      {"adaptive 3x4", {2, 5, 7, 9}, [](const Tensor& x) { return adaptive_avg_pool2d(x, {3, 4}); }},
      {"adaptive 1x1", {2, 6, 5, 5}, [](const Tensor& x) { return adaptive_avg_pool2d(x, {1, 1}); }},
      {"adaptive 4x10 from 7x9 (overlapping)", {1, 3, 7, 9},
       [](const Tensor& x) { return adaptive_avg_pool2d(x, {4, 10}); }},
  };
}

// The output, and dx for the gradient `g` given in NCHW and in channels-last.
struct PoolLayoutResult {
  Tensor y, dx_from_nchw_grad, dx_from_channels_last_grad;
};
PoolLayoutResult run_pool_layout_case(const PoolLayoutCase& c, const Tensor& x_in, const Tensor& g) {
  Tensor x = x_in.detach().requires_grad_();
  PoolLayoutResult r;
  r.y = c.pool(x);
  r.dx_from_nchw_grad = autograd::grad({r.y}, {x}, {g.contiguous()}, /*retain_graph=*/true)[0];
  r.dx_from_channels_last_grad = autograd::grad({r.y}, {x}, {g.contiguous(MemoryFormat::channels_last)})[0];
  return r;
}

}  // namespace

TEST_CASE("pooling: a channels-last input gives channels-last y and dx equal to NCHW's, bit for bit") {
  const std::vector<PoolLayoutCase> cases = pool_layout_cases();
  for (size_t k = 0; k < cases.size(); ++k) {
    const PoolLayoutCase& c = cases[k];
    for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
      INFO(c.name << ", " << dtype_name(dtype));
      const Tensor x = tensor<double>(random_values(shape_numel(c.shape), 71 + k), c.shape).to(dtype);
      const Tensor x_cl = x.contiguous(MemoryFormat::channels_last);
      REQUIRE(x_cl.strides() == channels_last_strides(c.shape));
      const Tensor probe = c.pool(x);
      const Tensor g = tensor<double>(random_values(probe.numel(), 90 + k), probe.shape()).to(dtype);
      const PoolLayoutResult nchw = run_pool_layout_case(c, x, g), cl = run_pool_layout_case(c, x_cl, g);
      CHECK(nchw.y.is_contiguous());
      CHECK(nchw.dx_from_channels_last_grad.is_contiguous());
      CHECK(cl.y.strides() == channels_last_strides(cl.y.shape()));
      CHECK(cl.dx_from_nchw_grad.strides() == channels_last_strides(c.shape));
      CHECK(cl.dx_from_channels_last_grad.strides() == channels_last_strides(c.shape));
      KILN_CHECK_CLOSE(cl.y, nchw.y, 0.0, 0.0);
      KILN_CHECK_CLOSE(cl.dx_from_nchw_grad, nchw.dx_from_nchw_grad, 0.0, 0.0);
      KILN_CHECK_CLOSE(cl.dx_from_channels_last_grad, nchw.dx_from_nchw_grad, 0.0, 0.0);
      KILN_CHECK_CLOSE(nchw.dx_from_channels_last_grad, nchw.dx_from_nchw_grad, 0.0, 0.0);
    }
  }
  // A view that is not dense channels-last (a channel slice) takes the NCHW path.
  const Tensor wide = tensor<double>(random_values(2 * 6 * 4 * 4, 99), {2, 6, 4, 4})
                          .contiguous(MemoryFormat::channels_last)
                          .narrow(1, 1, 3);
  REQUIRE_FALSE(is_channels_last(wide));
  const Tensor pooled = max_pool2d(wide, 2);
  CHECK(pooled.is_contiguous());
  KILN_CHECK_CLOSE(pooled, max_pool2d(wide.contiguous(), 2), 0.0, 0.0);
}

// CUDA, channels-last against NCHW on the GPU (the same kernels, so the same
// bits) and against the CPU: max's y bit for bit, the rest within a few
// roundings (the GPU gathers each dx element in float and rounds once where the
// CPU's max scatter rounds 16-bit sums at each add, and it sums the windows
// covering an input in another order).
TEST_CASE("pooling on CUDA: a channels-last input gives channels-last y and dx, equal to NCHW and the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  const std::vector<PoolLayoutCase> cases = pool_layout_cases();
  for (size_t k = 0; k < cases.size(); ++k) {
    const PoolLayoutCase& c = cases[k];
    for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
      INFO(c.name << ", " << dtype_name(dtype));
      const Tensor x = tensor<double>(random_values(shape_numel(c.shape), 71 + k), c.shape).to(dtype);
      const Tensor g = tensor<double>(random_values(c.pool(x).numel(), 90 + k), c.pool(x).shape()).to(dtype);
      const Tensor x_cl_gpu = x.cuda().contiguous(MemoryFormat::channels_last);
      REQUIRE(x_cl_gpu.strides() == channels_last_strides(c.shape));
      const PoolLayoutResult cpu = run_pool_layout_case(c, x, g);
      const PoolLayoutResult nchw = run_pool_layout_case(c, x.cuda(), g.cuda());
      const PoolLayoutResult cl = run_pool_layout_case(c, x_cl_gpu, g.cuda());
      CHECK(cl.y.strides() == channels_last_strides(cl.y.shape()));
      CHECK(cl.dx_from_nchw_grad.strides() == channels_last_strides(c.shape));
      CHECK(cl.dx_from_channels_last_grad.strides() == channels_last_strides(c.shape));
      KILN_CHECK_CLOSE(cl.y.cpu(), nchw.y.cpu(), 0.0, 0.0);
      KILN_CHECK_CLOSE(cl.dx_from_nchw_grad.cpu(), nchw.dx_from_nchw_grad.cpu(), 0.0, 0.0);
      KILN_CHECK_CLOSE(cl.dx_from_channels_last_grad.cpu(), nchw.dx_from_nchw_grad.cpu(), 0.0, 0.0);
      {
        // The same kernels with 64-bit index division (tensors of 2^30 elements or more) give the same bits.
        const Force64BitIndex force;
        const PoolLayoutResult nchw64 = run_pool_layout_case(c, x.cuda(), g.cuda());
        const PoolLayoutResult cl64 = run_pool_layout_case(c, x_cl_gpu, g.cuda());
        KILN_CHECK_CLOSE(nchw64.y.cpu(), nchw.y.cpu(), 0.0, 0.0);
        KILN_CHECK_CLOSE(nchw64.dx_from_nchw_grad.cpu(), nchw.dx_from_nchw_grad.cpu(), 0.0, 0.0);
        KILN_CHECK_CLOSE(nchw64.dx_from_channels_last_grad.cpu(), nchw.dx_from_channels_last_grad.cpu(), 0.0, 0.0);
        KILN_CHECK_CLOSE(cl64.y.cpu(), cl.y.cpu(), 0.0, 0.0);
        KILN_CHECK_CLOSE(cl64.dx_from_nchw_grad.cpu(), cl.dx_from_nchw_grad.cpu(), 0.0, 0.0);
        KILN_CHECK_CLOSE(cl64.dx_from_channels_last_grad.cpu(), cl.dx_from_channels_last_grad.cpu(), 0.0, 0.0);
      }
      // eps: one unit in the last place at 1. dx: the CPU's 16-bit max scatter
      // rounds each of up to 9 adds of partial sums up to ~8: 32 eps absolute.
      const double eps = dtype == DType::f16    ? 0x1p-10
                         : dtype == DType::bf16 ? 0x1p-7
                         : dtype == DType::f32  ? 0x1p-22
                                                : 0x1p-50;
      const bool is_max = std::string(c.name).starts_with("max");
      KILN_CHECK_CLOSE(cl.y.cpu(), cpu.y, is_max ? 0.0 : 4 * eps, is_max ? 0.0 : 4 * eps);
      KILN_CHECK_CLOSE(cl.dx_from_nchw_grad.cpu(), cpu.dx_from_nchw_grad, 4 * eps, 32 * eps);
    }
  }
}

TEST_CASE("MaxPool2d keeps a channels-last tensor channels-last through forward and backward") {
  nn::MaxPool2d pool(3, Size2(2), 1);
  const Tensor x = tensor<double>(random_values(2 * 8 * 9 * 7, 81), {2, 8, 9, 7}).to(DType::f32);
  Tensor x_cl = x.contiguous(MemoryFormat::channels_last).detach().requires_grad_();
  const Tensor y = pool.forward(x_cl);
  CHECK(is_channels_last(y));
  KILN_CHECK_CLOSE(y, pool.forward(x), 0.0, 0.0);
  const Tensor dx = autograd::grad({relu(y)}, {x_cl}, {ones_like(y)})[0];
  CHECK(is_channels_last(dx));
  Tensor x_nchw = x.detach().requires_grad_();
  const Tensor dx_nchw = autograd::grad({relu(pool.forward(x_nchw))}, {x_nchw}, {ones_like(y)})[0];
  KILN_CHECK_CLOSE(dx, dx_nchw, 0.0, 0.0);
}

}  // namespace kiln::testing
