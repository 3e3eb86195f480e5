// softmax, log_softmax, cross_entropy and nll_loss: hand-computed values, a
// float64 reference for cross_entropy written straight from torch's
// definitions, gradients, error paths, and CUDA parity (skipped without a GPU).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/autocast.h"
#include "tests/support/op_info.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

Tensor random(const Shape& shape, DType dtype = DType::f64, uint64_t seed = 3) {
  return default_inputs(OpSample{{shape}, ""}, dtype, seed)[0];
}

// Targets in [0, classes), with every `ignore_every`-th one set to ignore_index.
Tensor targets(const Shape& shape, int64_t classes, uint64_t seed, int64_t ignore_every = 0,
               int64_t ignore_index = -100) {
  std::mt19937_64 engine(seed);
  std::vector<int64_t> t(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<int64_t>(engine() % static_cast<uint64_t>(classes));
    if (ignore_every > 0 && i % ignore_every == 1) t[i] = ignore_index;
  }
  return tensor<int64_t>(t, shape);
}

// cross_entropy from its definition, in double: logits (N, C, d...) or (C).
// Per element: (1 - ls) * w[t] * -logp[t] + ls / C * sum_c w[c] * -logp[c],
// 0 where ignored; mean divides the sum by the sum of w[t] over kept elements.
std::vector<double> reference_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                            int64_t ignore_index, double ls, Reduction reduction) {
  const std::vector<double> x = values(logits);
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  const int64_t C = logits.dim() == 1 ? logits.size(0) : logits.size(1);
  const int64_t N = logits.dim() == 1 ? 1 : logits.size(0);
  const int64_t inner = logits.numel() / std::max<int64_t>(N * C, 1);
  std::vector<double> w = weight.defined() ? values(weight) : std::vector<double>(C, 1.0);
  std::vector<double> losses;
  double total = 0, total_weight = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t target_class = t[n * inner + i];
      if (target_class == ignore_index) {
        losses.push_back(0.0);
        continue;
      }
      auto at = [&](int64_t c) { return x[(n * C + c) * inner + i]; };
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < C; ++c) m = std::max(m, at(c));
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += std::exp(at(c) - m);
      const double lse = m + std::log(s);
      double smooth = 0;
      for (int64_t c = 0; c < C; ++c) smooth += w[c] * (lse - at(c));
      const double loss = (1 - ls) * w[target_class] * (lse - at(target_class)) + ls / C * smooth;
      losses.push_back(loss);
      total += loss;
      total_weight += w[target_class];
    }
  }
  if (reduction == Reduction::none) return losses;
  if (reduction == Reduction::sum) return {total};
  return {total / total_weight};
}

void check_close(const std::vector<double>& got, const std::vector<double>& expected, double tol) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK_MESSAGE(std::abs(got[i] - expected[i]) <= tol * (1 + std::abs(expected[i])),
                  "element " << i << ": got " << got[i] << ", expected " << expected[i]);
  }
}

}  // namespace

TEST_CASE("softmax and log_softmax: hand-computed values, any dim") {
  Tensor x = tensor<double>({1, 2, 3}, {3});
  check_close(values(softmax(x, 0)), {0.09003057317038046, 0.24472847105479764, 0.6652409557748219}, 1e-14);
  check_close(values(log_softmax(x, -1)),
              {std::log(0.09003057317038046), std::log(0.24472847105479764), std::log(0.6652409557748219)}, 1e-14);
  // Large logits stay finite; -inf gives exactly 0.
  Tensor big = tensor<float>({1000, 1001, -std::numeric_limits<float>::infinity()}, {3});
  std::vector<double> p = values(softmax(big, 0));
  CHECK(p[2] == 0.0);
  CHECK(std::abs(p[1] - 0.7310585786) < 1e-6);
  CHECK(std::isinf(values(log_softmax(big, 0))[2]));
  // Over a middle dim of (2, 3, 4) and the first dim: every column sums to 1.
  Tensor m = random({2, 3, 4});
  Tensor s1 = softmax(m, 1);
  CHECK(s1.shape() == Shape{2, 3, 4});
  check_close(values(sum(s1, {1})), std::vector<double>(8, 1.0), 1e-14);
  std::vector<double> mv = values(m), sv = values(s1);
  for (int a = 0; a < 2; ++a) {
    for (int c = 0; c < 4; ++c) {
      double z = 0;
      for (int b = 0; b < 3; ++b) z += std::exp(mv[a * 12 + b * 4 + c]);
      for (int b = 0; b < 3; ++b) CHECK(std::abs(sv[a * 12 + b * 4 + c] - std::exp(mv[a * 12 + b * 4 + c]) / z) < 1e-14);
    }
  }
  check_close(values(sum(softmax(m, 0), {0})), std::vector<double>(12, 1.0), 1e-14);
  check_close(values(log_softmax(m, 1)), values(log(s1)), 1e-13);
  // A long odd row, float16: computed in float, rows sum to ~1.
  Tensor h = random({3, 1031}, DType::f16);
  check_close(values(sum(softmax(h, 1).to(DType::f32), {1})), {1, 1, 1}, 2e-3);
  // 0-d input: softmax is 1, log_softmax 0.
  CHECK(softmax(scalar_tensor(5.0), 0).item<float>() == 1.0f);
  CHECK(log_softmax(scalar_tensor(5.0), 0).item<float>() == 0.0f);
  CHECK(softmax(zeros({0, 4}), 1).shape() == Shape{0, 4});
}

TEST_CASE("softmax: gradients") {
  Tensor x = random({4, 5}).requires_grad_();
  // sum(softmax) == 1 for every row: its gradient is 0.
  Tensor s = sum(softmax(x, 1));
  s.backward();
  check_close(values(x.grad()), std::vector<double>(20, 0.0), 1e-14);
  for (int dim : {0, 1, -1}) {
    INFO("dim " << dim);
    CHECK(gradcheck([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x}) == "");
    CHECK(gradcheck([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x}) == "");
  }
  Tensor y = random({2, 3, 4}).requires_grad_();
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {y}) == "");
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); }, {non_contiguous_copy(y)}) == "");
}

TEST_CASE("cross_entropy: matches the float64 definition") {
  Tensor logits = random({6, 5});
  Tensor target = targets({6}, 5, 1);
  Tensor weight = tensor<double>({0.5, 2.0, 1.0, 0.25, 3.0}, {5});
  Tensor target_ignored = targets({6}, 5, 1, 2, -100);   // rows 1, 3, 5 ignored
  Tensor target_custom = targets({6}, 5, 1, 3, 2);       // ignore_index = 2 (a real class)
  struct Case {
    const char* name;
    Tensor target;
    Tensor weight;
    int64_t ignore_index;
    double ls;
  };
  const std::vector<Case> cases = {
      {"plain", target, Tensor(), -100, 0.0},
      {"weights", target, weight, -100, 0.0},
      {"ignore_index", target_ignored, Tensor(), -100, 0.0},
      {"ignore_index = a class", target_custom, Tensor(), 2, 0.0},
      {"label_smoothing", target, Tensor(), -100, 0.1},
      {"weights + label_smoothing", target, weight, -100, 0.1},
      {"weights + ignore + smoothing", target_ignored, weight, -100, 0.3},
  };
  for (const Case& c : cases) {
    for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
      INFO(c.name << ", reduction " << static_cast<int>(reduction));
      Tensor out = cross_entropy(logits, c.target, c.weight, c.ignore_index, c.ls, reduction);
      CHECK(out.shape() == (reduction == Reduction::none ? Shape{6} : Shape{}));
      check_close(values(out), reference_cross_entropy(logits, c.target, c.weight, c.ignore_index, c.ls, reduction),
                  1e-13);
      // float32 and bfloat16 logits compute in float.
      Tensor out32 = cross_entropy(logits.to(DType::f32), c.target, c.weight.defined() ? c.weight.to(DType::f32) : Tensor(),
                                   c.ignore_index, c.ls, reduction);
      CHECK(out32.dtype() == DType::f32);
      check_close(values(out32), reference_cross_entropy(logits, c.target, c.weight, c.ignore_index, c.ls, reduction),
                  1e-6);
    }
  }
  // A case small enough to check by hand: lse(1, 2, 3) = 3.4076059644443806.
  Tensor one = tensor<double>({1, 2, 3}, {1, 3});
  Tensor two = tensor<int64_t>({2}, {1});
  CHECK(std::abs(cross_entropy(one, two).item<double>() - 0.4076059644443806) < 1e-14);
  const double smooth = 3 * 3.4076059644443806 - 6;
  CHECK(std::abs(cross_entropy(one, two, Tensor(), -100, 0.1).item<double>() -
                 (0.9 * 0.4076059644443806 + 0.1 / 3 * smooth)) < 1e-14);
}

TEST_CASE("cross_entropy: (N, C, H, W) and (C) layouts") {
  Tensor logits = random({2, 4, 3, 5});
  Tensor target = targets({2, 3, 5}, 4, 9, 4);
  Tensor weight = tensor<double>({1.0, 0.5, 2.0, 1.5}, {4});
  for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (double ls : {0.0, 0.1}) {
      INFO("reduction " << static_cast<int>(reduction) << " ls " << ls);
      Tensor out = cross_entropy(logits, target, weight, -100, ls, reduction);
      if (reduction == Reduction::none) CHECK(out.shape() == Shape{2, 3, 5});
      check_close(values(out), reference_cross_entropy(logits, target, weight, -100, ls, reduction), 1e-13);
    }
  }
  Tensor single = tensor<double>({1, 2, 3}, {3});
  CHECK(std::abs(cross_entropy(single, scalar_tensor(2, {.dtype = DType::i64})).item<double>() - 0.4076059644443806) <
        1e-14);
  // Every target ignored: mean is 0 / 0 = NaN, like torch; sum is 0.
  Tensor all_ignored = full({3}, -100, {.dtype = DType::i64});
  CHECK(std::isnan(cross_entropy(random({3, 4}), all_ignored).item<double>()));
  CHECK(cross_entropy(random({3, 4}), all_ignored, Tensor(), -100, 0.0, Reduction::sum).item<double>() == 0.0);
}

TEST_CASE("cross_entropy: gradients") {
  // mean, no weights: (softmax - onehot) / N.
  Tensor logits = random({3, 4}).requires_grad_();
  Tensor target = tensor<int64_t>({0, 3, 1}, {3});
  cross_entropy(logits, target).backward();
  std::vector<double> p = values(softmax(logits.detach(), 1)), g = values(logits.grad());
  for (int n = 0; n < 3; ++n) {
    for (int c = 0; c < 4; ++c) {
      const double expected = (p[n * 4 + c] - (c == target.to_vector<int64_t>()[n] ? 1.0 : 0.0)) / 3.0;
      CHECK(std::abs(g[n * 4 + c] - expected) < 1e-14);
    }
  }
  Tensor weight = tensor<double>({0.5, 2.0, 1.0, 0.25}, {4});
  Tensor ignored = tensor<int64_t>({0, -100, 1}, {3});
  for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (double ls : {0.0, 0.2}) {
      INFO("reduction " << static_cast<int>(reduction) << " ls " << ls);
      auto fn = [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], ignored, weight, -100, ls, reduction); };
      CHECK(gradcheck(fn, {logits}) == "");
    }
  }
  Tensor image = random({2, 3, 2, 2}).requires_grad_();
  Tensor image_target = targets({2, 2, 2}, 3, 4, 3);
  CHECK(gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], image_target, weight.slice(0, 0, 3), -100, 0.1); },
                  {image}) == "");
  // Ignored rows get no gradient.
  logits.set_grad(Tensor());
  cross_entropy(logits, ignored, weight, -100, 0.1).backward();
  const std::vector<double> grad = values(logits.grad());
  check_close(std::vector<double>(grad.begin() + 4, grad.begin() + 8), {0, 0, 0, 0}, 0);
  CHECK(std::abs(grad[0]) > 0);
}

TEST_CASE("nll_loss: equals cross_entropy of log_softmax, gradients") {
  Tensor logits = random({5, 4, 3});
  Tensor target = targets({5, 3}, 4, 2, 4);
  Tensor weight = tensor<double>({1.0, 0.5, 2.0, 1.5}, {4});
  for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
    INFO("reduction " << static_cast<int>(reduction));
    check_close(values(nll_loss(log_softmax(logits, 1), target, weight, -100, reduction)),
                values(cross_entropy(logits, target, weight, -100, 0.0, reduction)), 1e-13);
    auto fn = [&](const std::vector<Tensor>& in) { return nll_loss(in[0], target, weight, -100, reduction); };
    CHECK(gradcheck(fn, {logits.detach().requires_grad_()}) == "");
  }
  Tensor lp = tensor<double>({-1.0, -2.0, -0.5, -3.0}, {2, 2});
  CHECK(nll_loss(lp, tensor<int64_t>({1, 0}, {2})).item<double>() == doctest::Approx((2.0 + 0.5) / 2));
  CHECK(nll_loss(lp, tensor<int64_t>({1, 0}, {2}), tensor<double>({3.0, 1.0}, {2})).item<double>() ==
        doctest::Approx((1.0 * 2.0 + 3.0 * 0.5) / 4.0));
}

TEST_CASE("softmax and losses: error paths") {
  Tensor logits = zeros({4, 3});
  CHECK_THROWS_WITH_AS(softmax(logits, 2), doctest::Contains("softmax: dim 2 is out of range"), Error);
  CHECK_THROWS_WITH_AS(log_softmax(tensor<int64_t>({1}, {1}), 0), doctest::Contains("expected a floating"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor<int64_t>({0, 1, 3, 2}, {4})),
                       doctest::Contains("cross_entropy: target 3 (at flat position 2) is out of range for 3 classes"),
                       Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor<int64_t>({0, -1, 0, 0}, {4})),
                       doctest::Contains("target -1 (at flat position 1) is out of range"), Error);
  CHECK_THROWS_WITH_AS(nll_loss(logits, tensor<int64_t>({0, 7, 0, 0}, {4})),
                       doctest::Contains("nll_loss: target 7"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor<int32_t>({0, 1, 2, 0}, {4})),
                       doctest::Contains("expected int64 targets (class indices), got int32"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor<int64_t>({0, 1, 2}, {3})),
                       doctest::Contains("target shape [3] does not match logits shape [4, 3]"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(zeros({2, 3, 5}), tensor<int64_t>({0, 1}, {2})),
                       doctest::Contains("expected target shape [2, 5]"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor<int64_t>({0, 1, 2, 0}, {4}), ones({2})),
                       doctest::Contains("weight of shape [2] for 3 classes"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor<int64_t>({0, 1, 2, 0}, {4}), ones({3}, {.dtype = DType::f64})),
                       doctest::Contains("weight is float64"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor<int64_t>({0, 1, 2, 0}, {4}), Tensor(), -100, 1.5),
                       doctest::Contains("label_smoothing must be in [0, 1]"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(tensor<int64_t>({1, 2}, {1, 2}), tensor<int64_t>({0}, {1})),
                       doctest::Contains("expected floating logits"), Error);
  // ignore_index outside [0, C) is not an error.
  CHECK_NOTHROW(cross_entropy(logits, tensor<int64_t>({0, -100, 2, 0}, {4})));
}

TEST_CASE("softmax and losses: CUDA matches the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tolerance tol = parity_tolerance(dtype);
    // Rows that take each CUDA path: a few lanes of a warp ({64, 10}), a block
    // holding the row in registers ({8, 4096}: whole 16-byte lines), rows too
    // long for registers ({2, 40000}: streamed, and cross-entropy's widest groups).
    for (const Shape& shape : std::vector<Shape>{{7, 1031}, {64, 10}, {3, 5000}, {8, 4096}, {2, 40000}, {2, 3, 4, 5}}) {
      INFO("dtype " << dtype_name(dtype) << " shape " << shape_str(shape));
      Tensor x = random(shape, dtype);
      for (int64_t dim : {int64_t{-1}, int64_t{0}, int64_t{1}}) {
        KILN_CHECK_CLOSE(softmax(x.cuda(), dim).cpu(), softmax(x, dim), tol.rtol, tol.atol);
        KILN_CHECK_CLOSE(log_softmax(x.cuda(), dim).cpu(), log_softmax(x, dim), tol.rtol, 1e-4);
      }
      // Backward over the last dim, in this dtype.
      const Tensor dy = random(shape, dtype, 6);
      for (bool log : {false, true}) {
        INFO("log " << log);
        Tensor xc = x.detach().requires_grad_(), xg = x.cuda().detach().requires_grad_();
        (log ? log_softmax(xc, -1) : softmax(xc, -1)).backward(dy);
        (log ? log_softmax(xg, -1) : softmax(xg, -1)).backward(dy.cuda());
        KILN_CHECK_CLOSE(xg.grad().cpu(), xc.grad(), tol.rtol * 4, 1e-4);
      }
      const int64_t C = shape[1];
      Shape target_shape = shape;
      target_shape.erase(target_shape.begin() + 1);
      Tensor t = targets(target_shape, C, 8, 5);
      Tensor w = random({C}, dtype, 4).to(DType::f32);
      w = abs(w).to(dtype);
      for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
        for (double ls : {0.0, 0.1}) {
          INFO("reduction " << static_cast<int>(reduction) << " ls " << ls);
          Tensor xc = x.detach().requires_grad_(), xg = x.cuda().detach().requires_grad_();
          Tensor cpu_loss = cross_entropy(xc, t, w, -100, ls, reduction);
          Tensor gpu_loss = cross_entropy(xg, t.cuda(), w.cuda(), -100, ls, reduction);
          KILN_CHECK_CLOSE(gpu_loss.cpu(), cpu_loss, tol.rtol * 4, 1e-4);
          Tensor seed = ones_like(cpu_loss);
          cpu_loss.backward(seed);
          gpu_loss.backward(seed.cuda());
          KILN_CHECK_CLOSE(xg.grad().cpu(), xc.grad(), tol.rtol * 4, 1e-4);
          Tensor lp = log_softmax(x, 1);
          KILN_CHECK_CLOSE(nll_loss(lp.cuda(), t.cuda(), w.cuda(), -100, reduction).cpu(),
                           nll_loss(lp, t, w, -100, reduction), tol.rtol * 4, 1e-4);
          // nll_loss's backward; then its CUDA kernel's 64-bit index path, which must give the same bits.
          const auto nll_grad = [&](const Tensor& log_probs) {
            Tensor input = log_probs.detach().requires_grad_();
            const bool cuda = input.is_cuda();
            nll_loss(input, cuda ? t.cuda() : t, cuda ? w.cuda() : w, -100, reduction).backward(cuda ? seed.cuda() : seed);
            return input.grad().cpu();
          };
          const Tensor nll_fast = nll_grad(lp.cuda());
          KILN_CHECK_CLOSE(nll_fast, nll_grad(lp), tol.rtol * 4, 1e-4);
          const Force64BitIndex force;
          KILN_CHECK_CLOSE(nll_grad(lp.cuda()), nll_fast, 0.0, 0.0);
        }
      }
    }
  }
  // Softmax gradients on the device.
  Tensor x = random({5, 37});
  Tensor xc = x.detach().requires_grad_(), xg = x.cuda().detach().requires_grad_();
  Tensor w = random({5, 37}, DType::f64, 8);
  softmax(xc, 1).backward(w);
  softmax(xg, 1).backward(w.cuda());
  KILN_CHECK_CLOSE(xg.grad().cpu(), xc.grad(), 1e-12, 1e-14);
  // Out-of-range targets on CUDA: NaN loss, and an error in anomaly mode.
  Tensor bad = tensor<int64_t>({0, 9}, {2}).cuda();
  CHECK(std::isnan(cross_entropy(zeros({2, 3}).cuda(), bad).item<float>()));
  set_detect_anomaly(true);
  CHECK_THROWS_WITH_AS(cross_entropy(zeros({2, 3}).cuda(), bad), doctest::Contains("target 9"), Error);
  set_detect_anomaly(false);
}

// Under CUDA autocast a 16-bit logits tensor goes to the kernels as it is
// (core/ops/softmax.cpp): a float32 loss and a 16-bit gradient equal to those
// of the float32 cast up to the order of float sums (the 16-bit kernels read
// 8 values per load, the float32 ones 4). GPT-2's vocabulary is one of the rows.
TEST_CASE("cross_entropy under CUDA autocast reads 16-bit logits as the float32 cast would [gpu]") {
  KILN_REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const Shape& shape : std::vector<Shape>{{64, 1031}, {3, 50257}}) {
      INFO("dtype " << dtype_name(dtype) << " shape " << shape_str(shape));
      const Tensor x = random(shape, DType::f32, 11).to(dtype).cuda();
      const Tensor t = targets({shape[0]}, shape[1], 12, 5).cuda();
      for (double ls : {0.0, 0.1}) {
        INFO("ls " << ls);
        Tensor fused_in = x.detach().requires_grad_(), cast_in = x.detach().requires_grad_();
        Tensor fused, cast;
        {
          AutocastGuard autocast(DeviceType::cuda, dtype);
          fused = cross_entropy(fused_in, t, Tensor(), -100, ls);
        }
        cast = cross_entropy(cast_in.to(DType::f32), t, Tensor(), -100, ls);
        CHECK(fused.dtype() == DType::f32);
        KILN_CHECK_CLOSE(fused.cpu(), cast.cpu(), 1e-5, 1e-6);
        fused.backward();
        cast.backward();
        CHECK(fused_in.grad().dtype() == dtype);
        // One rounding to 16 bits of nearly equal floats: at most one unit in the last place apart.
        KILN_CHECK_CLOSE(fused_in.grad().cpu().to(DType::f32), cast_in.grad().cpu().to(DType::f32),
                         dtype == DType::bf16 ? 8e-3 : 1e-3, 1e-7);
      }
    }
  }
}

}  // namespace kiln::testing
