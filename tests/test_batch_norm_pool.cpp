// batch_norm_relu_max_pool2d (core/nn_ops.h): the fused conv -> BN -> ReLU ->
// 2x2 max pool op against the two ops it replaces, and Sequential's use of it.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/generator.h"
#include "core/nn_ops.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "tests/support/test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Every element the same bits (a NaN equals a NaN with the same payload; -0.0 is not +0.0).
void check_same_bits(const Tensor& got, const Tensor& want, const char* what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<double> a = got.to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> b = want.to(DType::f64).contiguous().to_vector<double>();
  int64_t differing = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint64_t>(a[i]) == std::bit_cast<uint64_t>(b[i])) continue;
    if (first < 0) first = static_cast<int64_t>(i);
    ++differing;
  }
  INFO("first difference at " << first << ": " << (first < 0 ? 0.0 : a[first]) << " vs "
                              << (first < 0 ? 0.0 : b[first]));
  CHECK(differing == 0);
}

Tensor in_layout(const Tensor& x, bool channels_last) {
  return channels_last ? x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}) : x.contiguous();
}

struct Run {
  Tensor y, dx, dw, db, running_mean, running_var;
};

// One training or eval call and its backward, fused or as the two ops.
Run run_once(bool fused, const Tensor& x0, const Tensor& dy, const Tensor& weight, const Tensor& bias, bool training,
             bool affine) {
  Tensor x = x0.detach().requires_grad_();
  Tensor w = affine ? weight.detach().clone().requires_grad_() : Tensor();
  Tensor b = affine ? bias.detach().clone().requires_grad_() : Tensor();
  const int64_t C = x0.size(1);
  Tensor rm = tensor<double>(random_values(C, 7), {C}).to(DType::f32);
  Tensor rv = add(abs(tensor<double>(random_values(C, 8), {C})), 0.5).to(DType::f32);
  if (x0.dtype() == DType::f64) {
    rm = rm.to(DType::f64);
    rv = rv.to(DType::f64);
  }
  if (x0.is_cuda()) {
    rm = rm.cuda();
    rv = rv.cuda();
  }
  Tensor y = fused ? batch_norm_relu_max_pool2d(x, rm, rv, w, b, training, 0.1, 1e-5)
                   : max_pool2d(batch_norm_relu(x, rm, rv, w, b, training, 0.1, 1e-5), 2);
  y.backward(dy);
  return {y, x.grad(), affine ? w.grad() : Tensor(), affine ? b.grad() : Tensor(), rm, rv};
}

}  // namespace

TEST_CASE("batch_norm_relu_max_pool2d equals max_pool2d(batch_norm_relu(x), 2) bit for bit, with its gradients") {
  struct Case {
    Shape shape;
    const char* what;
  };
  // Even planes, odd planes (the last row and column are in the statistics and
  // get a gradient, but no window), the smallest plane, and FashionCNN's second
  // layer's 14x14 planes.
  const Case cases[] = {{{4, 3, 6, 8}, "6x8"}, {{3, 2, 7, 9}, "7x9, odd"}, {{5, 4, 2, 2}, "2x2"},
                        {{2, 16, 14, 14}, "14x14, 16 channels"}};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      for (bool channels_last : {false, true}) {
        for (bool training : {true, false}) {
          for (bool affine : {true, false}) {
            INFO(dtype_name(dtype) << " " << c.what << (channels_last ? " channels-last" : " NCHW")
                                   << (training ? " training" : " eval") << (affine ? " affine" : " no affine"));
            const Shape& s = c.shape;
            const int64_t n = s[0] * s[1] * s[2] * s[3], C = s[1];
            // Repeated values make ties inside windows (first maximum wins) besides ReLU's zeros.
            std::vector<double> xv = random_values(n, 21);
            for (int64_t i = 0; i < n; i += 5) xv[i] = xv[i / 2];
            const Tensor x = in_layout(tensor<double>(xv, s).to(dtype), channels_last);
            const Shape pooled{s[0], C, s[2] / 2, s[3] / 2};
            const Tensor dy = tensor<double>(random_values(s[0] * C * pooled[2] * pooled[3], 22), pooled).to(dtype);
            const Tensor weight = tensor<double>(random_values(C, 23), {C});
            const Tensor bias = tensor<double>(random_values(C, 24), {C});
            const DType channel_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
            const Run fused = run_once(true, x, dy, weight.to(channel_dtype), bias.to(channel_dtype), training, affine);
            const Run split =
                run_once(false, x, dy, weight.to(channel_dtype), bias.to(channel_dtype), training, affine);
            CHECK(fused.y.shape() == pooled);
            if (channels_last) {
              CHECK(is_channels_last(fused.y));
              CHECK(fused.dx.strides() == x.strides());
            }
            check_same_bits(fused.y, split.y, "y");
            check_same_bits(fused.dx, split.dx, "dx");
            check_same_bits(fused.running_mean, split.running_mean, "running_mean");
            check_same_bits(fused.running_var, split.running_var, "running_var");
            if (affine) {
              check_same_bits(fused.dw, split.dw, "dweight");
              check_same_bits(fused.db, split.db, "dbias");
            }
          }
        }
      }
    }
  }
}

TEST_CASE("batch_norm_relu_max_pool2d: a NaN propagates to its window, as max_pool2d's rule") {
  const int64_t N = 2, C = 2, H = 4, W = 4;
  std::vector<double> xv = random_values(N * C * H * W, 31);
  xv[5] = std::numeric_limits<double>::quiet_NaN();  // image 0, channel 0, row 1, column 1: window (0, 0)
  const Tensor x = tensor<double>(xv, {N, C, H, W}).to(DType::f32);
  const Tensor rm = zeros({C}), rv = ones({C});
  const Tensor fused = batch_norm_relu_max_pool2d(x, rm, rv, Tensor(), Tensor(), false);
  const Tensor split = max_pool2d(batch_norm_relu(x, rm, rv, Tensor(), Tensor(), false), 2);
  check_same_bits(fused, split, "y");
  const std::vector<float> y = fused.to_vector<float>();
  CHECK(std::isnan(y[0]));
  for (size_t i = 1; i < y.size(); ++i) CHECK_FALSE(std::isnan(y[i]));
}

TEST_CASE("batch_norm_relu_max_pool2d: checks name the problem") {
  auto error = [](const Tensor& x, const Tensor& running_mean, const Tensor& running_var) {
    return error_of([&] { (void)batch_norm_relu_max_pool2d(x, running_mean, running_var, Tensor(), Tensor(), true); });
  };
  CHECK(error(zeros({4, 3, 5}), Tensor(), Tensor()).find("expected input (N, C, H, W) with H and W at least 2") !=
        std::string::npos);
  CHECK(error(zeros({4, 3, 1, 6}), Tensor(), Tensor()).find("got shape [4, 3, 1, 6]") != std::string::npos);
  CHECK(error(zeros({4, 3, 2, 2}), zeros({4}), ones({4})).find("running_mean of shape [3]") != std::string::npos);
  CHECK(error(zeros({4, 3, 2, 2}).to(DType::i32), Tensor(), Tensor()).find("expected a floating input") !=
        std::string::npos);
}

TEST_CASE("Sequential runs BatchNorm2d, ReLU, MaxPool2d(2) as the fused op, with the modules' results") {
  auto make = [] {
    kiln::manual_seed(5);
    return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Conv2d>(2, 6, 3, 1, 1, 1, 1, false), std::make_shared<nn::BatchNorm2d>(6),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2)});
  };
  const Tensor x = tensor<double>(random_values(3 * 2 * 9 * 10, 41), {3, 2, 9, 10}).to(DType::f32);
  auto fused = make(), modules = make();
  for (bool training : {true, false}) {
    INFO((training ? "training" : "eval"));
    fused->train(training);
    modules->train(training);
    Tensor a = fused->forward(x);
    // The same modules one at a time: conv, BN, ReLU, pool as separate ops.
    Tensor b = x;
    for (const auto& [name, child] : modules->named_children()) b = child->forward(b);
    CHECK(a.grad_fn() != nullptr);
    if (a.grad_fn() != nullptr) CHECK(a.grad_fn()->name() == "batch_norm_relu_max_pool2d");
    CHECK(b.grad_fn()->name() == "max_pool2d");
    check_same_bits(a, b, "y");
    sum(a).backward();
    sum(b).backward();
    const auto pa = fused->named_parameters(), pb = modules->named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      check_same_bits(pa[i].second.grad(), pb[i].second.grad(), pa[i].first.c_str());
    }
    const auto ba = fused->named_buffers(), bb = modules->named_buffers();
    REQUIRE(ba.size() == bb.size());
    for (size_t i = 0; i < ba.size(); ++i) check_same_bits(ba[i].second, bb[i].second, ba[i].first.c_str());
  }
  // A pool with other windows is not fused.
  auto other = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::BatchNorm2d>(2), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(3, 2, 1)});
  CHECK(other->forward(x).grad_fn()->name() == "max_pool2d");
}

// CUDA's fused kernels (NCHW and channels-last, 16-byte packs at 24 channels)
// against CUDA's two ops bit for bit, and against the CPU's fused kernels.
TEST_CASE("batch_norm_relu_max_pool2d on CUDA equals its two ops and matches the CPU, NCHW and channels-last [gpu]") {
  KILN_REQUIRE_GPU();
  const int64_t N = 4, C = 24, H = 14, W = 14;
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (bool channels_last : {false, true}) {
      INFO(dtype_name(dtype) << (channels_last ? " channels-last" : " NCHW"));
      const Tensor x =
          in_layout(tensor<double>(random_values(N * C * H * W, 51), {N, C, H, W}).to(dtype), channels_last);
      const Tensor dy = tensor<double>(random_values(N * C * 49, 52), {N, C, 7, 7}).to(dtype);
      const Tensor weight = tensor<double>(random_values(C, 53), {C}).to(DType::f32);
      const Tensor bias = tensor<double>(random_values(C, 54), {C}).to(DType::f32);
      const Run cpu = run_once(true, x, dy, weight, bias, true, true);
      const Run gpu = run_once(true, x.cuda(), dy.cuda(), weight.cuda(), bias.cuda(), true, true);
      const Run gpu_split = run_once(false, x.cuda(), dy.cuda(), weight.cuda(), bias.cuda(), true, true);
      if (channels_last) CHECK(is_channels_last(gpu.y));
      // The fused kernels against CUDA's batch norm and pooling kernels: the same bits.
      check_same_bits(gpu.y.cpu(), gpu_split.y.cpu(), "cuda y");
      check_same_bits(gpu.dx.cpu(), gpu_split.dx.cpu(), "cuda dx");
      check_same_bits(gpu.dw.cpu(), gpu_split.dw.cpu(), "cuda dweight");
      check_same_bits(gpu.db.cpu(), gpu_split.db.cpu(), "cuda dbias");
      check_same_bits(gpu.running_var.cpu(), gpu_split.running_var.cpu(), "cuda running_var");
      const double tol = dtype == DType::f32 ? 1e-4 : 2e-2;
      KILN_CHECK_CLOSE(gpu.y.cpu(), cpu.y, tol, tol);
      KILN_CHECK_CLOSE(gpu.dx.cpu(), cpu.dx, tol, tol);
      KILN_CHECK_CLOSE(gpu.dw.cpu(), cpu.dw, tol, tol);
      KILN_CHECK_CLOSE(gpu.db.cpu(), cpu.db, tol, tol);
    }
  }
}
