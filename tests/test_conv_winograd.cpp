// The Winograd F(2x2, 3x3) and F(3x3, 3x3) CPU convolution
// (kernels/cpu/conv_winograd.cpp), each tile size forced in turn, against a
// direct convolution in double: forward, input and weight gradient, float32
// and float64, odd planes, padding 0/1/2, several blocks and chunks;
// bit-identical results for 1 and 2 threads; the dispatch of conv2d_*_cpu,
// its tile choice and policy switch; conv2d's float64 gradients through
// autograd on the path.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/nn_ops.h"
#include "kernels/conv.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/error.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

using kernels::Conv2dParams;
using kernels::WinogradPolicy;
using kernels::WinogradTile;

// Sets the process-wide Winograd policy for a scope.
struct PolicyScope {
  explicit PolicyScope(WinogradPolicy policy) { kernels::conv2d_winograd_set_policy(policy); }
  ~PolicyScope() { kernels::conv2d_winograd_set_policy(WinogradPolicy::kWhenFaster); }
};

// Forces the Winograd tile size for a scope.
struct TileScope {
  explicit TileScope(WinogradTile tile) { kernels::conv2d_winograd_set_tile(tile); }
  ~TileScope() { kernels::conv2d_winograd_set_tile(WinogradTile::kWhenFaster); }
};
constexpr WinogradTile kForcedTiles[] = {WinogradTile::k2x2, WinogradTile::k3x3};

Conv2dParams conv_params(int64_t batch, int64_t in_channels, int64_t out_channels, int64_t h, int64_t w,
                         int64_t kernel = 3, int64_t pad = 1, int64_t stride = 1, int64_t groups = 1) {
  Conv2dParams p;
  p.batch = batch;
  p.in_channels = in_channels;
  p.out_channels = out_channels;
  p.in_h = h;
  p.in_w = w;
  p.kernel_h = p.kernel_w = kernel;
  p.pad_h = p.pad_w = pad;
  p.stride_h = p.stride_w = stride;
  p.groups = groups;
  p.out_h = (h + 2 * pad - kernel) / stride + 1;
  p.out_w = (w + 2 * pad - kernel) / stride + 1;
  return p;
}

// A direct convolution in double with its gradients for the upstream gradient
// dy. Beside each value, the sum of the absolute values of its terms
// (|x * w|, |dy * w|, |dy * x|): the scale a rounding error is relative to.
struct Direct {
  std::vector<double> y, dx, dw, db, y_scale, dx_scale, dw_scale;
};
Direct direct_conv(const Conv2dParams& p, const std::vector<double>& x, const std::vector<double>& w,
                   const std::vector<double>& bias, const std::vector<double>& dy) {
  const int64_t Cg = p.in_channels / p.groups, Og = p.out_channels / p.groups, K = p.kernel_h;
  Direct r;
  r.y.assign(static_cast<size_t>(p.batch * p.out_channels * p.out_h * p.out_w), 0.0);
  r.y_scale = r.y;
  r.dx.assign(x.size(), 0.0);
  r.dx_scale = r.dx;
  r.dw.assign(w.size(), 0.0);
  r.dw_scale = r.dw;
  r.db.assign(static_cast<size_t>(p.out_channels), 0.0);
  for (int64_t n = 0; n < p.batch; ++n)
    for (int64_t o = 0; o < p.out_channels; ++o)
      for (int64_t oh = 0; oh < p.out_h; ++oh)
        for (int64_t ow = 0; ow < p.out_w; ++ow) {
          const size_t yi = static_cast<size_t>(((n * p.out_channels + o) * p.out_h + oh) * p.out_w + ow);
          r.y[yi] = bias.empty() ? 0.0 : bias[static_cast<size_t>(o)];
          r.db[static_cast<size_t>(o)] += dy[yi];
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t ki = 0; ki < K; ++ki)
              for (int64_t kj = 0; kj < K; ++kj) {
                const int64_t ih = oh * p.stride_h - p.pad_h + ki, iw = ow * p.stride_w - p.pad_w + kj;
                if (ih < 0 || ih >= p.in_h || iw < 0 || iw >= p.in_w) continue;
                const size_t xi =
                    static_cast<size_t>(((n * p.in_channels + (o / Og) * Cg + ci) * p.in_h + ih) * p.in_w + iw);
                const size_t wi = static_cast<size_t>(((o * Cg + ci) * K + ki) * K + kj);
                r.y[yi] += x[xi] * w[wi];
                r.y_scale[yi] += std::abs(x[xi] * w[wi]);
                r.dx[xi] += dy[yi] * w[wi];
                r.dx_scale[xi] += std::abs(dy[yi] * w[wi]);
                r.dw[wi] += dy[yi] * x[xi];
                r.dw_scale[wi] += std::abs(dy[yi] * x[xi]);
              }
        }
  return r;
}

// Empty when |actual - expected| <= bound * the largest scale elementwise (NaN
// fails); else the first element out of bounds. One scale for the tensor, not
// per element: a Winograd tile mixes the 16 inputs of its window, so an
// element's rounding error follows its neighbours' magnitudes too (an output
// plane of 1x1 has weight gradients of one term each, computed from a whole
// 4x4 window).
template <typename T>
std::string compare_scaled(const char* what, const std::vector<T>& actual, const std::vector<double>& expected,
                           const std::vector<double>& scale, double bound) {
  const double allowed = bound * *std::max_element(scale.begin(), scale.end());
  for (size_t i = 0; i < expected.size(); ++i) {
    const double error = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (!(error <= allowed)) {
      return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(static_cast<double>(actual[i])) +
             ", expected " + std::to_string(expected[i]) + " (error " + std::to_string(error) + ", allowed " +
             std::to_string(allowed) + ")";
    }
  }
  return "";
}

template <typename T>
std::vector<T> cast(const std::vector<double>& values) {
  return std::vector<T>(values.begin(), values.end());
}

template <typename T>
std::vector<T> poisoned(size_t count) {
  return std::vector<T>(count, std::numeric_limits<T>::quiet_NaN());
}

template <typename T>
constexpr DType kernel_dtype() {
  return sizeof(T) == 4 ? DType::f32 : DType::f64;
}

// Rounding bound, in units of the unit roundoff u, on |error| / (the
// tensor's largest sum of absolute terms). A direct dot product of K terms is
// bounded by K u (in practice ~sqrt(K) u, and both sides are summed in
// blocks); Winograd adds the transforms' growth: B^T d B sums up to 4 inputs,
// G and A^T combine up to 3 values each way. Measured over these cases, float32
// and float64 alike: at most 3.5 u. 64 u leaves room for other compilers and
// blockings, while a wrong transform or a missed tile (errors of the order of
// the values) fails by orders of magnitude. F(3x3) sums up to 5 values in each
// transform with coefficients up to 4 (A^T) and rounded thirds and sixths (G):
// measured at most 9.9 u (float32) and 9.3 u (float64) here, against 3.0 u
// for F(2x2) in the same run; 192 u keeps the same ~20x margin.
constexpr double kRoundoffMultiple = 64;
constexpr double kRoundoffMultiple3 = 192;
double roundoff_multiple(const Conv2dParams& p) {
  return kernels::conv2d_winograd_tile_size(p) == 3 ? kRoundoffMultiple3 : kRoundoffMultiple;
}

template <typename T>
void check_against_direct(const Conv2dParams& p, bool winograd_entry, bool with_bias, uint64_t seed) {
  CAPTURE(p.batch);
  CAPTURE(p.in_channels);
  CAPTURE(p.out_channels);
  CAPTURE(p.in_h);
  CAPTURE(p.in_w);
  CAPTURE(p.pad_h);
  CAPTURE(sizeof(T));
  const int64_t x_count = p.batch * p.in_channels * p.in_h * p.in_w;
  const int64_t y_count = p.batch * p.out_channels * p.out_h * p.out_w;
  const int64_t w_count = p.out_channels * (p.in_channels / p.groups) * p.kernel_h * p.kernel_w;
  const auto xv = random_values(x_count, seed), wv = random_values(w_count, seed + 1);
  const auto dyv = random_values(y_count, seed + 2);
  const auto bv = with_bias ? random_values(p.out_channels, seed + 3) : std::vector<double>();
  // Inputs rounded to T first, so the reference sees the values the kernel sees.
  const std::vector<T> x = cast<T>(xv), w = cast<T>(wv), dy = cast<T>(dyv), b = cast<T>(bv);
  const Direct ref = direct_conv(p, std::vector<double>(x.begin(), x.end()), std::vector<double>(w.begin(), w.end()),
                                 std::vector<double>(b.begin(), b.end()), std::vector<double>(dy.begin(), dy.end()));
  auto y = poisoned<T>(static_cast<size_t>(y_count)), dx = poisoned<T>(static_cast<size_t>(x_count));
  auto dw = poisoned<T>(static_cast<size_t>(w_count)), db = poisoned<T>(static_cast<size_t>(p.out_channels));
  const T* bias = with_bias ? b.data() : nullptr;
  if (winograd_entry) {
    kernels::conv2d_winograd_forward_cpu(kernel_dtype<T>(), p, x.data(), w.data(), bias, y.data());
    kernels::conv2d_winograd_backward_cpu(kernel_dtype<T>(), p, x.data(), w.data(), dy.data(), dx.data(), dw.data());
  } else {
    kernels::conv2d_forward_cpu(kernel_dtype<T>(), p, x.data(), w.data(), bias, y.data());
    kernels::conv2d_backward_cpu(kernel_dtype<T>(), p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
    // Each is a sum of batch * plane draws of N(0, 1), computed by the im2col file.
    const std::string mismatch = compare_scaled("dbias", db, ref.db, std::vector<double>(db.size(), 1.0), 1e-4);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
  const double bound = roundoff_multiple(p) * std::numeric_limits<T>::epsilon() / 2;
  // The bias enters the output once: its magnitude joins the scale.
  std::vector<double> y_scale = ref.y_scale;
  if (with_bias) {
    for (size_t i = 0; i < y_scale.size(); ++i) y_scale[i] += std::abs(bv[(i / (p.out_h * p.out_w)) % p.out_channels]);
  }
  const std::string mismatches[] = {compare_scaled("y", y, ref.y, y_scale, bound),
                                    compare_scaled("dx", dx, ref.dx, ref.dx_scale, bound),
                                    compare_scaled("dweight", dw, ref.dw, ref.dw_scale, bound)};
  for (const std::string& mismatch : mismatches) CHECK_MESSAGE(mismatch.empty(), mismatch);
}

TEST_CASE("conv2d winograd: matches a direct convolution (forward, input and weight gradient)") {
  struct Case {
    int64_t batch, in_channels, out_channels, h, w, pad;
  };
  // Odd planes (the last tile half outside), pad 0, 1 and 2 (an even plane
  // with pad 0 is the one whose last input row and column lie in the last
  // tile's window), batch 1, channel counts that are no multiple of 8; 40
  // samples of 28x28 (196 tiles each) are 8 chunks of 5 blocks, 20 samples of
  // 8x8 2 chunks of 2 blocks of 5 samples (F(2x2); F(3x3) has 100 tiles in
  // a 28x28 sample: 8 chunks of 5 blocks too). 3x3 and 9x9 planes are whole
  // F(3x3) tiles.
  const Case cases[] = {{1, 3, 5, 7, 7, 1},   {2, 5, 7, 5, 9, 0},    {2, 5, 7, 5, 9, 1},    {2, 3, 4, 6, 8, 0},
                        {3, 4, 6, 6, 6, 2},   {1, 2, 3, 3, 3, 0},    {20, 9, 11, 8, 8, 1},  {40, 3, 5, 28, 28, 1},
                        {3, 6, 5, 3, 3, 1},   {1, 4, 3, 9, 9, 1}};
  for (WinogradTile tile : kForcedTiles) {
    const TileScope forced(tile);
    uint64_t seed = 10;
    for (const Case& c : cases) {
      const Conv2dParams p = conv_params(c.batch, c.in_channels, c.out_channels, c.h, c.w, 3, c.pad);
      CAPTURE(kernels::conv2d_winograd_tile_size(p));
      check_against_direct<float>(p, true, c.batch == 2, seed);
      check_against_direct<double>(p, true, c.batch != 2, seed);
      seed += 10;
    }
  }
}

TEST_CASE("conv2d winograd: results independent of the thread count, outputs written not accumulated") {
  // 24 samples of 14x14: 8 chunks of blocks of 2 and 1 samples (F(2x2); F(3x3)
  // 4 chunks of 2 blocks of 3), so both threads work on the weight gradient.
  const Conv2dParams p = conv_params(24, 6, 10, 14, 14);
  const auto x = cast<float>(random_values(p.batch * 6 * 14 * 14, 1));
  const auto w = cast<float>(random_values(10 * 6 * 9, 2)), dy = cast<float>(random_values(p.batch * 10 * 14 * 14, 3));
  for (WinogradTile tile : kForcedTiles) {
    const TileScope forced(tile);
    CAPTURE(kernels::conv2d_winograd_tile_size(p));
    std::vector<std::vector<float>> runs;
    const int threads_before = omp_get_max_threads();
    for (int threads : {1, 2, 2}) {
      omp_set_num_threads(threads);
      // Garbage in the outputs, different per run: a kernel that accumulates would differ.
      std::vector<float> y(dy.size(), static_cast<float>(threads)), dx(x.size(), 7.0f), dw(w.size(), -3.0f);
      kernels::conv2d_winograd_forward_cpu(DType::f32, p, x.data(), w.data(), nullptr, y.data());
      kernels::conv2d_winograd_backward_cpu(DType::f32, p, x.data(), w.data(), dy.data(), dx.data(), dw.data());
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), dw.begin(), dw.end());
      runs.push_back(y);
      // Only the input gradient, then only the weight gradient: the same values.
      std::vector<float> dx_alone(x.size()), dw_alone(w.size());
      kernels::conv2d_winograd_backward_cpu(DType::f32, p, x.data(), w.data(), dy.data(), dx_alone.data(), nullptr);
      kernels::conv2d_winograd_backward_cpu(DType::f32, p, x.data(), w.data(), dy.data(), nullptr, dw_alone.data());
      CHECK(dx_alone == dx);
      CHECK(dw_alone == dw);
    }
    omp_set_num_threads(threads_before);
    REQUIRE(runs[0].size() == runs[1].size());
    CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(runs[1].data(), runs[2].data(), runs[1].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("conv2d winograd: dispatch of conv2d_*_cpu") {
  // ResNet-9's wide layers take the path with F(2x2), its 3x3-plane layer with
  // F(3x3), the 1-channel stem not at all.
  for (int64_t size : {28, 14, 7}) {
    CHECK(kernels::conv2d_winograd_pays(conv_params(128, 128, 128, size, size)));
    CHECK(kernels::conv2d_winograd_tile_size(conv_params(128, 128, 128, size, size)) == 2);
  }
  CHECK(kernels::conv2d_winograd_pays(conv_params(128, 512, 512, 3, 3)));
  CHECK(kernels::conv2d_winograd_tile_size(conv_params(128, 512, 512, 3, 3)) == 3);
  CHECK_FALSE(kernels::conv2d_winograd_pays(conv_params(128, 1, 64, 28, 28)));
  // 6x6 and 9x9 planes are whole F(3x3) tiles too, but measured faster with F(2x2).
  CHECK(kernels::conv2d_winograd_tile_size(conv_params(128, 256, 256, 6, 6)) == 2);
  CHECK(kernels::conv2d_winograd_tile_size(conv_params(128, 256, 256, 9, 9)) == 2);
  {
    const TileScope forced(WinogradTile::k2x2);
    CHECK(kernels::conv2d_winograd_tile_size(conv_params(128, 512, 512, 3, 3)) == 2);
  }

  // Shapes the path does not support are refused by it and computed by im2col
  // + GEMM through the public entry points.
  const Conv2dParams unsupported[] = {conv_params(2, 64, 64, 9, 9, 3, 1, 2), conv_params(2, 64, 64, 9, 9, 3, 1, 1, 2),
                                      conv_params(2, 64, 64, 9, 9, 5, 2)};
  for (const Conv2dParams& p : unsupported) {
    CHECK_FALSE(kernels::conv2d_winograd_supports(p));
    CHECK_FALSE(kernels::conv2d_winograd_pays(p));
    std::vector<float> buffer(1 << 16);
    CHECK_THROWS_AS(kernels::conv2d_winograd_forward_cpu(DType::f32, p, buffer.data(), buffer.data(), nullptr,
                                                         buffer.data()),
                    Error);
    check_against_direct<float>(p, false, true, 77);
  }

  // A supported shape that pays goes through the path (bit-identical to the
  // entry point) and the public backward still writes the bias gradient.
  const Conv2dParams p = conv_params(4, 32, 40, 8, 8);
  REQUIRE(kernels::conv2d_winograd_pays(p));
  CHECK_FALSE(kernels::conv2d_winograd_pays(conv_params(2, 32, 40, 8, 8)));  // 32 tiles in the batch
  const auto x = cast<float>(random_values(4 * 32 * 64, 4)), w = cast<float>(random_values(40 * 32 * 9, 5));
  std::vector<float> via_dispatch(4 * 40 * 64), via_entry(4 * 40 * 64);
  kernels::conv2d_forward_cpu(DType::f32, p, x.data(), w.data(), nullptr, via_dispatch.data());
  kernels::conv2d_winograd_forward_cpu(DType::f32, p, x.data(), w.data(), nullptr, via_entry.data());
  CHECK(via_dispatch == via_entry);
  // Both paths compute in float32 or float64 only, and say so.
  for (const auto& run : {kernels::conv2d_forward_cpu, kernels::conv2d_winograd_forward_cpu}) {
    CHECK_THROWS_WITH_AS(run(DType::f16, p, x.data(), w.data(), nullptr, via_entry.data()),
                         doctest::Contains("expected float32 or float64, got float16"), Error);
  }
  check_against_direct<float>(p, false, true, 88);
}

TEST_CASE("conv2d winograd: the policy switch, and the autograd front end on the path") {
  const Conv2dParams small = conv_params(2, 3, 4, 5, 6);
  CHECK_FALSE(kernels::conv2d_winograd_selected(small));  // too small to pay
  const auto x = cast<float>(random_values(2 * 3 * 30, 6)), w = cast<float>(random_values(4 * 3 * 9, 7));
  std::vector<float> via_entry(2 * 4 * 30), via_dispatch(2 * 4 * 30);
  kernels::conv2d_winograd_forward_cpu(DType::f32, small, x.data(), w.data(), nullptr, via_entry.data());
  {
    PolicyScope always(WinogradPolicy::kAlways);
    CHECK(kernels::conv2d_winograd_selected(small));
    CHECK_FALSE(kernels::conv2d_winograd_selected(conv_params(2, 3, 4, 5, 6, 3, 1, 2)));  // stride 2
    kernels::conv2d_forward_cpu(DType::f32, small, x.data(), w.data(), nullptr, via_dispatch.data());
    CHECK(via_dispatch == via_entry);

    // conv2d's float64 gradients on the path, bias included (its gradient
    // comes from the im2col file), by central differences.
    Tensor xt = tensor<double>(random_values(2 * 3 * 5 * 6, 8), {2, 3, 5, 6}).requires_grad_();
    Tensor wt = tensor<double>(random_values(4 * 3 * 9, 9), {4, 3, 3, 3}).requires_grad_();
    Tensor bt = tensor<double>(random_values(4, 10), {4}).requires_grad_();
    for (WinogradTile tile : kForcedTiles) {
      const TileScope forced(tile);
      for (int64_t pad : {0, 1}) {
        CAPTURE(pad);
        CAPTURE(kernels::conv2d_winograd_tile_size(small));
        CHECK(gradcheck([pad](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], 1, pad); },
                        {xt, wt, bt}) == "");
      }
    }
  }
  const Conv2dParams paying = conv_params(128, 64, 128, 28, 28);
  CHECK(kernels::conv2d_winograd_selected(paying));
  PolicyScope never(WinogradPolicy::kNever);
  CHECK_FALSE(kernels::conv2d_winograd_selected(paying));
}

}  // namespace
}  // namespace kiln::testing
