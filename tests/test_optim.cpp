// Optimizer parity: every optimizer against a float64 reference loop of its
// textbook update, for 7 steps (with a tensor spanning two kernel chunks) and
// 1000 steps, with two parameter groups, a parameter that has no gradient on
// some steps and a frozen one; float32, float64, bfloat16 and float16 params
// (the 16-bit ones through their fp32 master weights). On a GPU, CUDA against
// the CPU, and the step is checked to be free of host synchronization.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/runtime.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"
#include "tests/test_optim_reference.h"

using namespace kiln;
using namespace kiln::testing::optim_ref;

namespace {

// Four params: group 0 = {A, S}, group 1 = {B, F}. S has no gradient when
// step % 3 == 1; F is frozen (requires_grad false, never a gradient).
constexpr int kSometimes = 1, kFrozen = 3;
const int kGroupOf[4] = {0, 0, 1, 1};

struct Run {
  std::vector<Tensor> params;
  std::vector<RefState> refs;
  std::vector<Tensor> initial;
  std::unique_ptr<optim::Optimizer> optimizer;
  int64_t sometimes_steps = 0;
};

Run setup(const Config& c, DType dtype, const std::vector<int64_t>& sizes, uint64_t seed, Device device) {
  Run run;
  std::mt19937_64 rng(seed);
  std::vector<optim::ParamGroup> groups(2);
  for (int i = 0; i < 4; ++i) {
    Tensor p = from_doubles(normals(rng, static_cast<size_t>(sizes[i]), 0.5), {sizes[i]}, dtype, device);
    p.requires_grad_(i != kFrozen);
    p.set_name("p" + std::to_string(i));
    run.params.push_back(p);
    run.initial.push_back(p.clone());
    RefState ref;
    ref.p = values(p);
    run.refs.push_back(ref);
    groups[kGroupOf[i]].params.push_back(p);
  }
  run.optimizer = make_optimizer(c, std::move(groups));
  return run;
}

// Sets this step's gradients (drawn from rng, rounded to the dtype) and steps
// the reference; then the optimizer under test.
void step(const Config& c, Run& run, std::mt19937_64& rng, int64_t k, bool with_reference) {
  for (int i = 0; i < 3; ++i) {
    Tensor& p = run.params[i];
    if (i == kSometimes && k % 3 == 1) {
      p.set_grad(Tensor());
      continue;
    }
    const Tensor grad = from_doubles(normals(rng, static_cast<size_t>(p.numel()), 0.7), p.shape(), p.dtype(),
                                     p.device());
    p.set_grad(grad);
    if (i == kSometimes) ++run.sometimes_steps;
    if (with_reference) ref_step(c, c.group[kGroupOf[i]], run.refs[i], values(grad));
  }
  run.optimizer->step();
}

bool is_16bit(DType d) { return d == DType::f16 || d == DType::bf16; }

// The value the reference is compared with: the fp32 master for 16-bit params.
std::vector<double> trained_values(const Run& run, int i) {
  const Tensor& p = run.params[i];
  return is_16bit(p.dtype()) ? values(run.optimizer->state(i, "master")) : values(p);
}

void check_against_reference(const Config& c, DType dtype, int64_t steps, const std::vector<int64_t>& sizes) {
  Run run = setup(c, dtype, sizes, 1234 + static_cast<uint64_t>(steps), Device::cpu());
  std::mt19937_64 rng(99);
  for (int64_t k = 1; k <= steps; ++k) step(c, run, rng, k, true);
  // float32 arithmetic against float64: the error grows with the number of steps.
  const double rtol = dtype == DType::f64 ? 1e-10 : (steps > 100 ? 2e-4 : 5e-6);
  const double atol = dtype == DType::f64 ? 1e-12 : (steps > 100 ? 2e-5 : 5e-7);
  for (int i = 0; i < 3; ++i) {
    const double worst = worst_ratio(trained_values(run, i), run.refs[i].p, rtol, atol);
    if (getenv("OPTIM_VERBOSE")) MESSAGE(std::string(c.label), " ", dtype_name(dtype), " ", steps, " p", i, " ratio ", worst);
    CHECK_MESSAGE(worst <= 1.0, std::string(c.label), " ", dtype_name(dtype), " ", steps, " steps, param ", i,
                  ": worst error ratio ", worst);
    if (is_16bit(dtype)) {
      // The param is the master rounded to its dtype.
      const Tensor master = run.optimizer->state(i, "master");
      CHECK(values(master.to(dtype)) == values(run.params[i]));
    }
  }
  CHECK(values(run.params[kFrozen]) == values(run.initial[kFrozen]));
  CHECK_FALSE(run.optimizer->state(kFrozen, "step").defined());
  CHECK(run.optimizer->state(kSometimes, "step").item<int64_t>() == run.sometimes_steps);
  CHECK(run.optimizer->state(0, "step").item<int64_t>() == steps);
  CHECK(run.optimizer->step_state().step.item<int64_t>() == steps);
}

}  // namespace

TEST_CASE("optimizers match the float64 reference for 7 steps") {
  const std::vector<int64_t> sizes = {70001, 33, 129, 10};  // A spans two chunks
  for (const Config& c : configs()) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      CAPTURE(std::string(c.label));
      CAPTURE(dtype);
      check_against_reference(c, dtype, 7, sizes);
    }
  }
}

TEST_CASE("optimizers match the float64 reference for 1000 steps") {
  const std::vector<int64_t> sizes = {64, 33, 17, 10};
  for (const Config& c : configs()) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      CAPTURE(std::string(c.label));
      CAPTURE(dtype);
      check_against_reference(c, dtype, 1000, sizes);
    }
  }
}

TEST_CASE("optimizer results do not depend on the thread count") {
  const Config c = configs()[7];  // LAMB: per-tensor norm reductions
  std::vector<std::vector<double>> results;
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Run run = setup(c, DType::f32, {200000, 33, 129, 10}, 5, Device::cpu());
    std::mt19937_64 rng(7);
    for (int64_t k = 1; k <= 3; ++k) step(c, run, rng, k, false);
    results.push_back(values(run.params[0]));
  }
  omp_set_num_threads(saved_threads);
  CHECK(results[0] == results[1]);
}

// ---------------------------------------------------------------- GPU
TEST_CASE("optimizers on CUDA match the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  const std::vector<int64_t> sizes = {70001, 33, 129, 10};
  for (const Config& c : configs()) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      CAPTURE(std::string(c.label));
      CAPTURE(dtype);
      Run cpu = setup(c, dtype, sizes, 42, Device::cpu());
      Run gpu = setup(c, dtype, sizes, 42, Device::cuda());
      std::mt19937_64 rng_cpu(3), rng_gpu(3);
      for (int64_t k = 1; k <= 7; ++k) {
        step(c, cpu, rng_cpu, k, false);
        step(c, gpu, rng_gpu, k, false);
      }
      // CUDA contracts multiply-adds into FMAs: parity at float32 tolerance.
      const auto tol = kiln::testing::parity_tolerance(dtype == DType::f64 ? DType::f64 : DType::f32);
      for (int i = 0; i < 3; ++i) {
        const double worst = worst_ratio(trained_values(gpu, i), trained_values(cpu, i), 10 * tol.rtol, tol.atol);
        CHECK_MESSAGE(worst <= 1.0, std::string(c.label), " param ", i, " worst ratio ", worst);
        if (is_16bit(dtype)) CHECK(values(gpu.optimizer->state(i, "master").to(dtype)) == values(gpu.params[i]));
      }
      CHECK(values(gpu.params[kFrozen]) == values(cpu.params[kFrozen]));
      CHECK(gpu.optimizer->state(kSometimes, "step").item<int64_t>() == cpu.sometimes_steps);
    }
  }
}

TEST_CASE("an optimizer step on CUDA does not synchronize [gpu]") {
  KILN_REQUIRE_GPU();
  for (const Config& c : configs()) {
    CAPTURE(std::string(c.label));
    Run run = setup(c, DType::f32, {70001, 33, 129, 10}, 1, Device::cuda());
    std::mt19937_64 rng(1);
    std::vector<Tensor> grads;
    for (int i = 0; i < 3; ++i) {
      grads.push_back(from_doubles(normals(rng, static_cast<size_t>(run.params[i].numel()), 1.0),
                                   run.params[i].shape(), DType::f32, Device::cuda()));
      run.params[i].set_grad(grads.back());
    }
    run.optimizer->step();  // creates the state
    cuda::device_synchronize(0);
    const auto before = cuda::sync_counters();
    for (int k = 0; k < 5; ++k) run.optimizer->step();
    const auto after = cuda::sync_counters();
    CHECK(after.device_to_host_copies == before.device_to_host_copies);
    CHECK(after.synchronizations == before.synchronizations);
  }
}

// multi_tensor_apply packs at most 128 params per launch: 300 take three, and
// param 200 (two chunks) sits inside the second. LAMB and LARS read per-tensor
// norm partials that are indexed across the whole list.
TEST_CASE("optimizers on CUDA match the CPU for lists longer than one launch [gpu]") {
  KILN_REQUIRE_GPU();
  constexpr int kCount = 300;
  for (const Config& c : configs()) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(std::string(c.label));
      CAPTURE(dtype);
      std::vector<Tensor> params[2];  // CPU, CUDA
      std::unique_ptr<optim::Optimizer> optimizers[2];
      for (int d = 0; d < 2; ++d) {
        const Device device = d == 0 ? Device::cpu() : Device::cuda();
        std::mt19937_64 rng(11);
        std::vector<optim::ParamGroup> groups(1);
        for (int i = 0; i < kCount; ++i) {
          const int64_t n = i == 200 ? 70001 : 1 + (i % 7) * 37;
          Tensor p = from_doubles(normals(rng, static_cast<size_t>(n), 0.5), {n}, dtype, device);
          p.requires_grad_(true);
          params[d].push_back(p);
          groups[0].params.push_back(p);
        }
        optimizers[d] = make_optimizer(c, std::move(groups));
      }
      std::mt19937_64 rng(5);
      for (int k = 0; k < 3; ++k) {
        for (int i = 0; i < kCount; ++i) {
          const int64_t n = params[0][i].numel();
          const std::vector<double> g = normals(rng, static_cast<size_t>(n), 0.7);
          for (int d = 0; d < 2; ++d) params[d][i].set_grad(from_doubles(g, {n}, dtype, params[d][i].device()));
        }
        for (auto& optimizer : optimizers) optimizer->step();
      }
      const auto tol = kiln::testing::parity_tolerance(DType::f32);
      double worst = 0;
      for (int i = 0; i < kCount; ++i) {
        auto trained = [&](int d) {
          return is_16bit(dtype) ? values(optimizers[d]->state(i, "master")) : values(params[d][i]);
        };
        worst = std::max(worst, worst_ratio(trained(1), trained(0), 10 * tol.rtol, tol.atol));
      }
      CHECK_MESSAGE(worst <= 1.0, std::string(c.label), " worst ratio ", worst);
    }
  }
}
