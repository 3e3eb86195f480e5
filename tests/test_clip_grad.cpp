// clip_grad_norm_ / clip_grad_value_ against float64 references, with
// several gradients of mixed dtypes spanning several kernel chunks.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cuda/runtime.h"
#include "optim/clip_grad.h"
#include "tests/support/test_util.h"
#include "tests/test_optim_reference.h"

using namespace kiln;
using namespace kiln::optim;
using namespace kiln::testing::optim_ref;

namespace {
struct Grads {
  std::vector<Tensor> params;
  std::vector<std::vector<double>> grads;  // as stored (rounded to the dtype)
};

Grads make(uint64_t seed, double scale, Device device = Device::cpu()) {
  std::mt19937_64 rng(seed);
  Grads g;
  const std::pair<int64_t, DType> specs[] = {
      {150000, DType::f32}, {77, DType::f64}, {1000, DType::bf16}, {5, DType::f16}, {3, DType::f32}};
  for (const auto& [n, dtype] : specs) {
    Tensor p = zeros({n}, {.dtype = dtype, .device = device}).requires_grad_();
    const Tensor grad = from_doubles(normals(rng, static_cast<size_t>(n), scale), {n}, dtype, device);
    p.set_grad(grad);
    g.params.push_back(p);
    g.grads.push_back(values(grad));
  }
  // A parameter without a gradient is ignored.
  g.params.push_back(zeros({4}, {.device = device}).requires_grad_());
  return g;
}

double reference_norm(const Grads& g, double p) {
  double acc = 0;
  for (const auto& v : g.grads) {
    for (double x : v) acc = std::isinf(p) ? std::max(acc, std::abs(x)) : acc + std::pow(std::abs(x), p);
  }
  return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
}
}  // namespace

TEST_CASE("clip_grad_norm_ for norm types 1, 2, 3 and inf") {
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {1.0, 2.0, 3.0, inf}) {
    CAPTURE(p);
    Grads g = make(1, 0.1);
    const double norm = reference_norm(g, p);
    const double max_norm = norm / 4;
    const auto result = clip_grad_norm_(g.params, max_norm, p);
    CHECK(result.total_norm.dtype() == DType::f32);
    CHECK(result.total_norm.item<float>() == doctest::Approx(norm).epsilon(1e-6));
    const double coef = max_norm / (norm + 1e-6);
    CHECK(result.clip_coef.item<float>() == doctest::Approx(coef).epsilon(1e-6));
    for (size_t i = 0; i < g.grads.size(); ++i) {
      std::vector<double> expected = g.grads[i];
      for (double& x : expected) x *= coef;
      const DType dtype = g.params[i].dtype();
      const double rtol = dtype == DType::bf16 ? 8e-3 : dtype == DType::f16 ? 1e-3 : 1e-6;
      CHECK(worst_ratio(values(g.params[i].grad()), expected, rtol, 1e-12) <= 1.0);
    }
  }
}

TEST_CASE("clip_grad_norm_ leaves small gradients alone; grad_norm never writes") {
  Grads g = make(2, 0.01);
  const double norm = reference_norm(g, 2.0);
  const auto peek = grad_norm(g.params, norm / 10);
  CHECK(peek.total_norm.item<float>() == doctest::Approx(norm).epsilon(1e-6));
  CHECK(peek.clip_coef.item<float>() < 0.11f);
  CHECK(values(g.params[0].grad()) == g.grads[0]);
  const auto result = clip_grad_norm_(g.params, norm * 2);
  CHECK(result.clip_coef.item<float>() == 1.0f);
  for (size_t i = 0; i < g.grads.size(); ++i) CHECK(values(g.params[i].grad()) == g.grads[i]);
}

TEST_CASE("clip_grad_norm_ with non-finite gradients") {
  Grads g = make(3, 0.1);
  Tensor grad = g.params[1].grad();
  grad.copy_(full({77}, std::numeric_limits<double>::infinity(), {.dtype = DType::f64}));
  CHECK_THROWS_WITH_AS(clip_grad_norm_(g.params, 1.0, 2.0, true), doctest::Contains("non-finite"), Error);
  const auto result = clip_grad_norm_(g.params, 1.0);  // torch: the gradients become NaN / 0
  CHECK(std::isinf(result.total_norm.item<float>()));
  CHECK(result.clip_coef.item<float>() == 0.0f);
  CHECK(std::isnan(values(g.params[1].grad())[0]));
  CHECK(values(g.params[0].grad())[0] == 0.0);
  Grads n = make(4, 0.1);
  Tensor nan_grad = n.params[2].grad();
  nan_grad.fill_(std::nan(""));
  const auto nan_result = clip_grad_norm_(n.params, 1.0, std::numeric_limits<double>::infinity());
  CHECK(std::isnan(nan_result.total_norm.item<float>()));
  CHECK(std::isnan(values(n.params[0].grad())[0]));
}

TEST_CASE("clip_grad_value_ clamps every gradient") {
  Grads g = make(5, 1.0);
  clip_grad_value_(g.params, 0.5);
  for (size_t i = 0; i < g.grads.size(); ++i) {
    std::vector<double> expected = g.grads[i];
    for (double& x : expected) x = std::clamp(x, -0.5, 0.5);
    CHECK(values(g.params[i].grad()) == expected);
  }
}

TEST_CASE("clipping edge cases and errors") {
  Tensor p = zeros({3}).requires_grad_();
  const auto none = clip_grad_norm_({p}, 1.0);
  CHECK(none.total_norm.item<float>() == 0.0f);
  CHECK(none.clip_coef.item<float>() == 1.0f);
  p.set_grad(ones({3}));
  CHECK_THROWS_WITH_AS(clip_grad_norm_({p}, 1.0, 0.0), doctest::Contains("norm_type must be positive"), Error);
  CHECK_THROWS_WITH_AS(clip_grad_norm_({p}, -1.0), doctest::Contains("max_norm must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(clip_grad_value_({p}, -1.0), doctest::Contains("clip_value must be >= 0"), Error);
}

TEST_CASE("norms are deterministic across thread counts") {
  Grads g = make(6, 1.0);
  std::vector<float> norms;
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    norms.push_back(grad_norm(g.params, 1.0).total_norm.item<float>());
  }
  omp_set_num_threads(saved_threads);
  CHECK(norms[0] == norms[1]);
}

// ---------------------------------------------------------------- GPU
TEST_CASE("clipping on CUDA matches the CPU without synchronizing [gpu]") {
  KILN_REQUIRE_GPU();
  for (double p : {1.0, 2.0, std::numeric_limits<double>::infinity()}) {
    Grads cpu = make(7, 0.1), gpu = make(7, 0.1, Device::cuda());
    const double max_norm = reference_norm(cpu, p) / 3;
    const auto rc = clip_grad_norm_(cpu.params, max_norm, p);
    cuda::device_synchronize(0);
    const auto before = cuda::sync_counters();
    const auto rg = clip_grad_norm_(gpu.params, max_norm, p);
    clip_grad_value_(gpu.params, 0.01);
    const auto after = cuda::sync_counters();
    CHECK(after.device_to_host_copies == before.device_to_host_copies);
    CHECK(after.synchronizations == before.synchronizations);
    clip_grad_value_(cpu.params, 0.01);
    CHECK(rg.total_norm.item<float>() == doctest::Approx(rc.total_norm.item<float>()).epsilon(1e-6));
    for (size_t i = 0; i < cpu.params.size(); ++i) {
      if (!cpu.params[i].grad().defined()) continue;
      CHECK(worst_ratio(values(gpu.params[i].grad()), values(cpu.params[i].grad()), 1e-5, 1e-7) <= 1.0);
    }
  }
}

// multi_tensor_apply packs at most 512 gradients per launch: 1100 take three,
// and gradient 700 (two chunks) sits inside the second; the norm partials are
// indexed across the whole list.
TEST_CASE("clipping on CUDA matches the CPU for lists longer than one launch [gpu]") {
  KILN_REQUIRE_GPU();
  std::vector<Tensor> params[2];  // CPU, CUDA
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1100; ++i) {
    const int64_t n = i == 700 ? 70001 : 1 + (i % 5) * 3;
    const std::vector<double> g = normals(rng, static_cast<size_t>(n), 0.1);
    for (int d = 0; d < 2; ++d) {
      const Device device = d == 0 ? Device::cpu() : Device::cuda();
      Tensor p = zeros({n}, {.device = device}).requires_grad_();
      p.set_grad(from_doubles(g, {n}, DType::f32, device));
      params[d].push_back(p);
    }
  }
  for (double p : {2.0, std::numeric_limits<double>::infinity()}) {
    CAPTURE(p);
    const auto rc = clip_grad_norm_(params[0], 0.5, p);
    const auto rg = clip_grad_norm_(params[1], 0.5, p);
    CHECK(rg.total_norm.item<float>() == doctest::Approx(rc.total_norm.item<float>()).epsilon(1e-6));
    double worst = 0;
    for (size_t i = 0; i < params[0].size(); ++i) {
      worst = std::max(worst, worst_ratio(values(params[1][i].grad()), values(params[0][i].grad()), 1e-5, 1e-7));
    }
    CHECK(worst <= 1.0);
  }
}
