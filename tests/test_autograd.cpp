// The autograd engine (core/autograd.cpp): .grad life cycle, accumulation,
// retain_graph, no_grad, hooks, retain_grad, diamonds, autograd::grad, the
// version counter, anomaly mode and the deterministic switch.
//
// Cases marked "(views only)" use nothing but core view ops and a custom
// recorded op, so they test the engine alone; the others use ops from the op
// families (mul, exp, sum, ...).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/test_util.h"

namespace kiln {
namespace {

using doctest::Contains;

const TensorOptions kF64{.dtype = DType::f64};

Tensor leaf(const std::vector<double>& values, const Shape& shape) {
  return tensor<double>(values, shape, kF64).requires_grad_(true);
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// A copy of `g` with every element multiplied by `factor`, computed on the host
// (hooks below use it so that they do not depend on the mul op).
Tensor scaled(const Tensor& g, double factor) {
  std::vector<double> v = values(g);
  for (double& x : v) x *= factor;
  return tensor<double>(v, g.shape(), {.dtype = g.dtype()});
}

// out = x * factor, recorded with a SavedTensor of `saved` (its backward reads
// it only to check the version), so the engine is tested without op families.
Tensor scale_op(const Tensor& x, double factor, const Tensor& saved) {
  Tensor out = scaled(x.detach(), factor);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("scale_op", {x}, {out},
                     [factor, keep = autograd::SavedTensor(saved, "scale_op")](const autograd::TensorList& g) {
                       (void)keep.unpack();
                       return autograd::TensorList{scaled(g[0], factor)};
                     });
  }
  return out;
}

struct AnomalyGuard {
  AnomalyGuard() { set_detect_anomaly(true); }
  ~AnomalyGuard() { set_detect_anomaly(false); }
};
struct DeterministicGuard {
  DeterministicGuard() { set_deterministic_algorithms(true); }
  ~DeterministicGuard() { set_deterministic_algorithms(false); }
};

}  // namespace

TEST_CASE("autograd: leaf .grad is undefined until backward (views only)") {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  CHECK(x.is_leaf());
  CHECK(x.requires_grad());
  CHECK_FALSE(x.grad().defined());
  CHECK(x.grad_fn() == nullptr);
  Tensor y = x.t().reshape({4});
  CHECK_FALSE(y.is_leaf());
  REQUIRE(y.grad_fn() != nullptr);
  CHECK_FALSE(x.grad().defined());
  y.backward(tensor<double>({10, 20, 30, 40}, {4}, kF64));
  REQUIRE(x.grad().defined());
  CHECK(x.grad().shape() == Shape{2, 2});
  CHECK(values(x.grad()) == std::vector<double>{10, 30, 20, 40});
  CHECK_FALSE(y.grad().defined());  // non-leaf: not retained
  x.zero_grad_();
  CHECK_FALSE(x.grad().defined());
  CHECK_THROWS_WITH_AS(y.backward(), Contains("a gradient is needed for a tensor of shape [4]"), Error);
  CHECK_THROWS_WITH_AS(tensor<double>({1}, {1}, kF64).backward(), Contains("does not require grad"), Error);
}

TEST_CASE("autograd: gradients accumulate across backward calls") {
  Tensor x = leaf({1, 2, 3}, {3});
  sum(mul(x, x)).backward();
  CHECK(values(x.grad()) == std::vector<double>{2, 4, 6});
  sum(mul(x, 3.0)).backward();
  CHECK(values(x.grad()) == std::vector<double>{5, 7, 9});
  x.zero_grad_(/*set_to_none=*/false);
  REQUIRE(x.grad().defined());
  CHECK(values(x.grad()) == std::vector<double>{0, 0, 0});
}

TEST_CASE("autograd: retain_graph (views only)") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = scale_op(x.view({2, 1}), 2.0, x);
  Tensor seed = ones({2, 1}, kF64);
  y.backward(seed, /*retain_graph=*/true);
  CHECK(values(x.grad()) == std::vector<double>{2, 2});
  x.zero_grad_();    // (accumulating would need the add op)
  y.backward(seed);  // allowed: the graph was retained
  CHECK(values(x.grad()) == std::vector<double>{2, 2});
  CHECK_THROWS_WITH_AS(y.backward(seed), Contains("retain_graph=true"), Error);
}

TEST_CASE("autograd: retain_graph with ops") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  CHECK(values(x.grad()) == std::vector<double>{4, 8});
  try {
    y.backward();
    FAIL("a second backward without retain_graph did not throw");
  } catch (const Error& error) {
    CHECK(std::string(error.what()).find("retain_graph=true") != std::string::npos);
  }
}

TEST_CASE("autograd: NoGradGuard records nothing (views only)") {
  Tensor x = leaf({1, 2}, {2});
  {
    NoGradGuard no_grad;
    CHECK_FALSE(grad_mode_enabled());
    Tensor v = x.view({2, 1});
    CHECK_FALSE(v.requires_grad());
    CHECK(v.grad_fn() == nullptr);
    Tensor s = scale_op(x, 2.0, x);
    CHECK(s.grad_fn() == nullptr);
    {
      EnableGradGuard enable;
      CHECK(x.view({2}).requires_grad());
    }
    CHECK_FALSE(grad_mode_enabled());
  }
  CHECK(grad_mode_enabled());
  CHECK(x.view({2}).requires_grad());
}

TEST_CASE("autograd: NoGradGuard records nothing, with ops") {
  Tensor x = leaf({1, 2}, {2});
  Tensor m;
  {
    NoGradGuard no_grad;
    m = exp(mul(x, x));
  }
  CHECK_FALSE(m.requires_grad());
  CHECK(m.grad_fn() == nullptr);
  CHECK(mul(x, x).requires_grad());
}

TEST_CASE("autograd: requires_grad_ on a non-leaf throws (views only)") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x.view({1, 2});
  CHECK_THROWS_WITH_AS(y.requires_grad_(), Contains("only leaf tensors can change requires_grad"), Error);
  CHECK_THROWS_WITH_AS(y.requires_grad_(), Contains("'view'"), Error);
  CHECK_THROWS_WITH_AS(arange(3).requires_grad_(), Contains("only floating tensors can require grad"), Error);
  Tensor d = y.detach();
  CHECK(d.is_leaf());
  CHECK_FALSE(d.requires_grad());
  d.requires_grad_();
  CHECK(d.requires_grad());
}

TEST_CASE("autograd: register_hook modifies the gradient (views only)") {
  SUBCASE("leaf") {
    Tensor x = leaf({1, 2, 3}, {3});
    int calls = 0;
    x.register_hook([&](const Tensor& g) {
      ++calls;
      return scaled(g, 2.0);
    });
    x.register_hook([&](const Tensor& g) {  // sees the first hook's result; keeps it
      CHECK(values(g) == std::vector<double>{2, 2, 2});
      return Tensor();
    });
    x.view({3, 1}).backward(ones({3, 1}, kF64));
    CHECK(calls == 1);
    CHECK(values(x.grad()) == std::vector<double>{2, 2, 2});
  }
  SUBCASE("non-leaf") {
    Tensor x = leaf({1, 2, 3}, {3});
    Tensor y = x.view({3, 1});
    y.register_hook([](const Tensor& g) { return scaled(g, 3.0); });
    y.view({3}).backward(tensor<double>({1, 2, 3}, {3}, kF64));
    CHECK(values(x.grad()) == std::vector<double>{3, 6, 9});
  }
  CHECK_THROWS_WITH_AS(zeros({2}).register_hook([](const Tensor& g) { return g; }),
                       Contains("does not require grad"), Error);
}

TEST_CASE("autograd: post-accumulate-grad hook runs once per accumulation") {
  Tensor x = leaf({1, 2}, {2});
  std::vector<std::vector<double>> seen;
  x.register_post_accumulate_grad_hook([&](const Tensor& t) {
    CHECK(t.same(x));
    seen.push_back(values(t.grad()));
  });
  x.view({2, 1}).backward(ones({2, 1}, kF64));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<double>{1, 1});
  // The second accumulation adds into .grad (needs the add op); the hook sees the sum.
  x.view({1, 2}).backward(tensor<double>({2, 3}, {1, 2}, kF64));
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == std::vector<double>{3, 4});
  CHECK_THROWS_WITH_AS(x.view({2}).register_post_accumulate_grad_hook([](const Tensor&) {}),
                       Contains("expected a leaf"), Error);
}

TEST_CASE("autograd: retain_grad keeps .grad of a non-leaf (views only)") {
  Tensor x = leaf({1, 2, 3, 4}, {4});
  Tensor y = x.view({2, 2});
  y.retain_grad();
  Tensor z = y.t();
  z.backward(tensor<double>({1, 2, 3, 4}, {2, 2}, kF64));
  REQUIRE(y.grad().defined());
  CHECK(y.grad().shape() == Shape{2, 2});
  CHECK(values(y.grad()) == std::vector<double>{1, 3, 2, 4});
  CHECK(values(x.grad()) == std::vector<double>{1, 3, 2, 4});
  CHECK_FALSE(z.grad().defined());
}

TEST_CASE("autograd: a diamond graph sums its gradients") {
  SUBCASE("x used twice by one op") {
    Tensor x = leaf({1, 2, 3}, {3});
    sum(mul(x, x)).backward();
    CHECK(values(x.grad()) == std::vector<double>{2, 4, 6});
  }
  SUBCASE("two paths through an intermediate") {
    Tensor x = leaf({0.5, -1.0}, {2});
    Tensor h = exp(x);
    Tensor y = sum(add(mul(h, h), h));  // d/dx = 2 e^{2x} + e^x
    y.backward();
    std::vector<double> g = values(x.grad());
    for (size_t i = 0; i < 2; ++i) {
      const double xi = i == 0 ? 0.5 : -1.0;
      CHECK(g[i] == doctest::Approx(2 * std::exp(2 * xi) + std::exp(xi)).epsilon(1e-12));
    }
  }
  SUBCASE("two views of one leaf (views only)") {
    Tensor x = leaf({1, 2}, {2});
    Tensor a = x.view({2, 1});
    Tensor b = x.view({1, 2});
    // Both roots flow into the same accumulator; the engine adds them (add op).
    autograd::run_backward({a, b}, {ones({2, 1}, kF64), tensor<double>({5, 7}, {1, 2}, kF64)}, false);
    CHECK(values(x.grad()) == std::vector<double>{6, 8});
  }
}

TEST_CASE("autograd: autograd::grad returns gradients without touching .grad") {
  SUBCASE("views only") {
    Tensor x = leaf({1, 2}, {2});
    Tensor y = scale_op(x.view({1, 2}), 5.0, x);
    autograd::TensorList g = autograd::grad({y}, {x}, {ones({1, 2}, kF64)});
    REQUIRE(g.size() == 1);
    CHECK(values(g[0]) == std::vector<double>{5, 5});
    CHECK_FALSE(x.grad().defined());
    Tensor unused = leaf({1}, {1});
    Tensor y2 = x.view({2, 1});
    CHECK_THROWS_WITH_AS(autograd::grad({y2}, {unused}, {ones({2, 1}, kF64)}), Contains("allow_unused"), Error);
    Tensor y3 = x.view({2, 1});
    autograd::TensorList allowed = autograd::grad({y3}, {x, unused}, {ones({2, 1}, kF64)}, false, true);
    CHECK(allowed[0].defined());
    CHECK_FALSE(allowed[1].defined());
  }
  SUBCASE("with ops, intermediate input") {
    Tensor x = leaf({1, 2, 3}, {3});
    Tensor h = mul(x, x);
    Tensor y = sum(exp(h));
    autograd::TensorList g = autograd::grad({y}, {x, h});
    REQUIRE(g.size() == 2);
    std::vector<double> gx = values(g[0]), gh = values(g[1]);
    for (int i = 0; i < 3; ++i) {
      const double xi = i + 1;
      CHECK(gh[i] == doctest::Approx(std::exp(xi * xi)).epsilon(1e-12));
      CHECK(gx[i] == doctest::Approx(2 * xi * std::exp(xi * xi)).epsilon(1e-12));
    }
    CHECK_FALSE(x.grad().defined());
    CHECK_FALSE(h.grad().defined());
  }
}

TEST_CASE("autograd: modifying a saved tensor in place makes backward throw") {
  SUBCASE("views only") {
    Tensor x = leaf({1, 2}, {2});
    Tensor saved = tensor<double>({3, 4}, {2}, kF64);
    Tensor y = scale_op(x, 2.0, saved);
    const uint64_t saved_at = saved.version();
    {
      NoGradGuard no_grad;
      saved.fill_(0.0);
    }
    CHECK(saved.version() == saved_at + 1);
    try {
      y.backward(ones({2}, kF64));
      FAIL("backward after an in-place write to a saved tensor did not throw");
    } catch (const Error& error) {
      const std::string message = error.what();
      CHECK(message.find("backward of 'scale_op'") != std::string::npos);
      CHECK(message.find("modified by an in-place operation") != std::string::npos);
      CHECK(message.find("saved at version " + std::to_string(saved_at)) != std::string::npos);
      CHECK(message.find("now at version " + std::to_string(saved_at + 1)) != std::string::npos);
    }
  }
  SUBCASE("mul saves its other operand") {
    Tensor w = leaf({1, 2}, {2});
    Tensor b = tensor<double>({3, 4}, {2}, kF64);
    Tensor y = sum(mul(w, b));
    const uint64_t saved_at = b.version();
    {
      NoGradGuard no_grad;
      b.mul_(2.0);
    }
    try {
      y.backward();
      FAIL("backward after b.mul_() did not throw");
    } catch (const Error& error) {
      const std::string message = error.what();
      CHECK(message.find("'mul'") != std::string::npos);
      CHECK(message.find("saved at version " + std::to_string(saved_at)) != std::string::npos);
      CHECK(message.find("now at version " + std::to_string(saved_at + 1)) != std::string::npos);
    }
  }
  SUBCASE("an in-place write to a tensor that requires grad is refused") {
    Tensor x = leaf({1, 2}, {2});
    CHECK_THROWS_WITH_AS(x.fill_(1.0), Contains("in-place write to a tensor that requires grad"), Error);
  }
}

TEST_CASE("autograd: anomaly mode names the forward op that produced NaN") {
  SUBCASE("sqrt at 0, then * 0") {
    auto run = [] {
      Tensor x = leaf({0.0, 4.0}, {2});
      Tensor y = sum(mul(sqrt(x), 0.0));
      y.backward();
      return x.grad();
    };
    {
      AnomalyGuard anomaly;
      CHECK(anomaly_mode_enabled());
      CHECK_THROWS_WITH_AS(run(), Contains("backward of 'sqrt'"), Error);
      CHECK_THROWS_WITH_AS(run(), Contains("NaN"), Error);
    }
    CHECK_FALSE(anomaly_mode_enabled());
    Tensor g;
    CHECK_NOTHROW(g = run());
    REQUIRE(g.defined());
    CHECK(std::isnan(values(g)[0]));  // 0 * inf: NaN flows through silently
  }
  SUBCASE("log(0)") {
    auto run = [] {
      Tensor x = leaf({0.0, 1.0}, {2});
      sum(mul(log(x), 0.0)).backward();
    };
    {
      AnomalyGuard anomaly;
      CHECK_THROWS_WITH_AS(run(), Contains("'log'"), Error);
    }
    CHECK_NOTHROW(run());
  }
}

TEST_CASE("autograd: deterministic switch") {
  CHECK_FALSE(deterministic_algorithms_enabled());
  CHECK_NOTHROW(alert_not_deterministic("scatter_add_cuda"));
  {
    DeterministicGuard deterministic;
    CHECK(deterministic_algorithms_enabled());
    CHECK_THROWS_WITH_AS(alert_not_deterministic("scatter_add_cuda"), Contains("scatter_add_cuda"), Error);
    CHECK_THROWS_WITH_AS(alert_not_deterministic("scatter_add_cuda"), Contains("deterministic"), Error);
  }
  CHECK_FALSE(deterministic_algorithms_enabled());
  CHECK_NOTHROW(alert_not_deterministic("scatter_add_cuda"));
}

TEST_CASE("autograd: gradients flow through to(dtype) and clone (views only)") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x.to(DType::f32).clone().view({2, 1});
  CHECK(y.dtype() == DType::f32);
  y.backward(tensor<float>({0.5f, 0.25f}, {2, 1}));
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::f64);
  CHECK(values(x.grad()) == std::vector<double>{0.5, 0.25});
}

TEST_CASE("autograd: backward on the GPU accumulates on the device [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor x = tensor<double>({1, 2, 3}, {3}, {.dtype = DType::f32, .device = Device::cuda(0)}).requires_grad_(true);
  sum(mul(x, x)).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().is_cuda());
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2, 4, 6});
}

}  // namespace kiln

namespace kiln::testing {

// split records one node for all its pieces; its backward is one cat, with
// zeros for the pieces that got no gradient.
TEST_CASE("autograd: split's pieces share one node; unused pieces get zero gradient") {
  const Tensor x = tensor<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 6}).requires_grad_();
  const std::vector<Tensor> pieces = split(x, 2, 1);
  REQUIRE(pieces.size() == 3);
  REQUIRE(pieces[0].grad_fn() != nullptr);
  CHECK(pieces[0].grad_fn() == pieces[2].grad_fn());
  CHECK(pieces[1].grad_fn()->name() == "split");
  sum(mul(pieces[1], 3.0)).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 0, 3, 3, 0, 0, 0, 0, 3, 3, 0, 0});
  x.set_grad(Tensor());
  const std::vector<Tensor> uneven = chunk(x, 4, 0);  // 2 rows in 4 chunks: two pieces of one row
  REQUIRE(uneven.size() == 2);
  sum(add(mul(uneven[0], 2.0), uneven[1])).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1});
  // grad() of a piece the value never read: unused (torch's None), not zeros from the shared node.
  const std::vector<Tensor> again = split(x, 2, 1);
  const Tensor only_first = sum(again[0]);
  CHECK_THROWS_WITH_AS(autograd::grad({only_first}, {again[1]}, {}, /*retain_graph=*/true), doctest::Contains("not used"),
                       Error);
  const std::vector<Tensor> grads = autograd::grad({only_first}, {again[0], again[1]}, {}, false, /*allow_unused=*/true);
  CHECK(grads[0].to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  CHECK_FALSE(grads[1].defined());
}

}  // namespace kiln::testing
