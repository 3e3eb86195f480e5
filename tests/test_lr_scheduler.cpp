// LR schedules against values computed here from PyTorch's documented
// formulas, written as torch.optim.lr_scheduler computes them (recursive
// "chainable" forms where PyTorch uses those), step for step.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "kernels/cuda/runtime.h"
#include "kernels/schedule_formulas.h"
#include "optim/lr_scheduler.h"
#include "tests/support/test_util.h"

using namespace kiln;
using namespace kiln::optim;

namespace {
constexpr double kPi = 3.14159265358979323846;

// An SGD (momentum 0.9) with two groups of lr 0.1 and 0.05.
struct Fixture {
  explicit Fixture(Device device = Device::cpu()) {
    a = zeros({3}, {.device = device}).requires_grad_();
    b = zeros({2}, {.device = device}).requires_grad_();
    std::vector<ParamGroup> groups(2);
    groups[0].params = {a};
    groups[1].params = {b};
    groups[1].lr = 0.05;
    sgd = std::make_unique<SGD>(groups, SGDOptions{.lr = 0.1, .momentum = 0.9});
  }
  double lr(int g) const { return sgd->lr(g).item<double>(); }
  double momentum(int g) const { return sgd->momentum(g).item<double>(); }
  Tensor a, b;
  std::unique_ptr<SGD> sgd;
};

// Steps `scheduler` `steps` times and compares lr of every group with
// expected(group, step) before each step (step 0 is the value at construction).
void check_sequence(LRScheduler& scheduler, const Fixture& f, int steps,
                    const std::function<double(int, int)>& expected, double rtol = 1e-12) {
  for (int t = 0; t <= steps; ++t) {
    for (int g = 0; g < 2; ++g) {
      const double want = expected(g, t);
      CHECK_MESSAGE(std::abs(f.lr(g) - want) <= rtol * std::abs(want) + 1e-15, scheduler.name(), " group ", g,
                    " step ", t, ": ", f.lr(g), " != ", want);
    }
    scheduler.step();
  }
}

const double kBase[2] = {0.1, 0.05};
}  // namespace

TEST_CASE("StepLR, MultiStepLR, ExponentialLR follow PyTorch's chainable updates") {
  {
    Fixture f;
    StepLR s(*f.sgd, 3, 0.5);
    double lr[2] = {kBase[0], kBase[1]};  // lr *= gamma when step % step_size == 0
    std::vector<double> seq[2];
    for (int t = 0; t <= 10; ++t) {
      for (int g = 0; g < 2; ++g) {
        if (t > 0 && t % 3 == 0) lr[g] *= 0.5;
        seq[g].push_back(lr[g]);
      }
    }
    check_sequence(s, f, 10, [&](int g, int t) { return seq[g][t]; });
  }
  {
    Fixture f;
    MultiStepLR s(*f.sgd, {5, 2, 5, 9}, 0.1);  // 5 twice: gamma^2 there, as torch's Counter
    check_sequence(s, f, 12, [](int g, int t) {
      const int passed = (t >= 2) + 2 * (t >= 5) + (t >= 9);
      return kBase[g] * std::pow(0.1, passed);
    });
  }
  {
    Fixture f;
    ExponentialLR s(*f.sgd, 0.9);
    check_sequence(s, f, 20, [](int g, int t) {
      double lr = kBase[g];
      for (int k = 0; k < t; ++k) lr *= 0.9;
      return lr;
    });
  }
}

TEST_CASE("LinearLR warmup matches the chainable form") {
  Fixture f;
  LinearLR s(*f.sgd, 0.25, 1.0, 4);
  std::vector<double> seq[2];
  for (int g = 0; g < 2; ++g) {
    double lr = kBase[g] * 0.25;
    for (int t = 0; t <= 8; ++t) {
      if (t > 0 && t <= 4) lr *= 1.0 + (1.0 - 0.25) / (4 * 0.25 + (t - 1) * (1.0 - 0.25));
      seq[g].push_back(lr);
    }
  }
  check_sequence(s, f, 8, [&](int g, int t) { return seq[g][t]; });
}

TEST_CASE("CosineAnnealingLR matches PyTorch's recursion, also past T_max") {
  Fixture f;
  const int t_max = 10;
  const double eta_min = 0.001;
  CosineAnnealingLR s(*f.sgd, t_max, eta_min);
  std::vector<double> seq[2];
  for (int g = 0; g < 2; ++g) {
    double lr = kBase[g];
    for (int t = 0; t <= 25; ++t) {
      if (t == 0) {
        lr = kBase[g];
      } else if ((t - 1 - t_max) % (2 * t_max) == 0) {
        lr = lr + (kBase[g] - eta_min) * (1 - std::cos(kPi / t_max)) / 2;
      } else {
        lr = (1 + std::cos(kPi * t / t_max)) / (1 + std::cos(kPi * (t - 1) / t_max)) * (lr - eta_min) + eta_min;
      }
      seq[g].push_back(lr);
    }
  }
  check_sequence(s, f, 25, [&](int g, int t) { return seq[g][t]; }, 1e-9);
  CHECK(seq[0][10] == doctest::Approx(eta_min).epsilon(1e-12));
}

TEST_CASE("CosineAnnealingWarmRestarts restarts after T_0, T_0 * T_mult, ...") {
  for (int t_mult : {1, 2}) {
    Fixture f;
    CosineAnnealingWarmRestarts s(*f.sgd, 3, t_mult, 0.01);
    int t_cur = 0, t_i = 3;  // torch's step(): T_cur += 1; wraps when T_cur >= T_i
    std::vector<double> seq[2];
    for (int t = 0; t <= 30; ++t) {
      if (t > 0) {
        ++t_cur;
        if (t_cur >= t_i) {
          t_cur -= t_i;
          t_i *= t_mult;
        }
      }
      for (int g = 0; g < 2; ++g) seq[g].push_back(0.01 + (kBase[g] - 0.01) * (1 + std::cos(kPi * t_cur / t_i)) / 2);
    }
    check_sequence(s, f, 30, [&](int g, int t) { return seq[g][t]; });
  }
}

TEST_CASE("CosineAnnealingWarmRestarts: a period beyond int64 is the last one, not a wrapped one") {
  kernels::ScheduleFormula f;
  f.kind = kernels::ScheduleKind::cosine_warm_restarts;
  f.period = int64_t{1} << 30;
  f.period2 = (int64_t{1} << 40) + 1;  // T_1 = 2^70 + 2^30 wraps to 2^30 in int64
  kernels::ScheduleGroupValues group;
  group.base_lr = 1.0;
  const int64_t step = (int64_t{1} << 30) + (int64_t{1} << 29);
  // T_cur = 2^29 into a period of ~2^70: the lr has barely left base_lr (a wrapped T_1 gives the midpoint 0.5).
  const double expected = (1.0 + std::cos(kPi * std::ldexp(1.0, 29) / (std::ldexp(1.0, 70) + std::ldexp(1.0, 30)))) / 2;
  CHECK(kernels::schedule_formula_value(f, group, step, std::nan("")).lr == doctest::Approx(expected).epsilon(1e-15));
  CHECK(kernels::schedule_formula_value(f, group, step, std::nan("")).lr > 0.999);
}

TEST_CASE("OneCycleLR at steps 0, 29, 30, 99 of 100, with momentum cycling") {
  Fixture f;
  OneCycleLR s(*f.sgd, {.max_lr = {1.0, 0.5}, .total_steps = 100});
  const double initial = 1.0 / 25, final_lr = initial / 1e4;
  auto cos_anneal = [](double start, double end, double pct) { return end + (start - end) / 2 * (std::cos(kPi * pct) + 1); };
  for (int t = 0; t < 100; ++t) {
    if (t == 0) {
      CHECK(f.lr(0) == doctest::Approx(initial).epsilon(1e-14));
      CHECK(f.lr(1) == doctest::Approx(initial / 2).epsilon(1e-14));
      CHECK(f.momentum(0) == doctest::Approx(0.95).epsilon(1e-14));
    }
    if (t == 29) {  // the end of phase 1: float(0.3 * 100) - 1
      CHECK(f.lr(0) == doctest::Approx(1.0).epsilon(1e-14));
      CHECK(f.momentum(0) == doctest::Approx(0.85).epsilon(1e-14));
    }
    if (t == 30) {
      CHECK(f.lr(0) == doctest::Approx(cos_anneal(1.0, final_lr, 1.0 / 70)).epsilon(1e-14));
      CHECK(f.momentum(1) == doctest::Approx(cos_anneal(0.85, 0.95, 1.0 / 70)).epsilon(1e-14));
    }
    if (t == 99) {
      CHECK(f.lr(0) == doctest::Approx(final_lr).epsilon(1e-12));
      CHECK(f.lr(1) == doctest::Approx(final_lr / 2).epsilon(1e-12));
      CHECK(f.momentum(0) == doctest::Approx(0.95).epsilon(1e-14));
    }
    if (t == 15) {
      CHECK(f.lr(0) == doctest::Approx(cos_anneal(initial, 1.0, 15.0 / 29)).epsilon(1e-14));
      CHECK(f.momentum(0) == doctest::Approx(cos_anneal(0.95, 0.85, 15.0 / 29)).epsilon(1e-14));
    }
    s.step();
  }
}

TEST_CASE("OneCycleLR linear and three-phase variants; beta1 cycles for Adam") {
  Tensor p = zeros({2}).requires_grad_();
  AdamOptions o;
  o.lr = 0.01;
  Adam adam({p}, o);
  OneCycleLR s(adam, {.max_lr = {0.1},
                      .total_steps = 20,
                      .pct_start = 0.25,
                      .anneal_strategy = AnnealStrategy::linear,
                      .three_phase = true});
  const double initial = 0.1 / 25, final_lr = initial / 1e4;
  // Phases end at 4, 8, 19: initial -> max -> initial -> final; beta1 0.95 -> 0.85 -> 0.95 -> 0.95.
  auto expected = [&](int t) {
    if (t <= 4) return initial + (0.1 - initial) * t / 4.0;
    if (t <= 8) return 0.1 + (initial - 0.1) * (t - 4) / 4.0;
    return initial + (final_lr - initial) * (t - 8) / 11.0;
  };
  for (int t = 0; t < 20; ++t) {
    CHECK_MESSAGE(adam.lr(0).item<double>() == doctest::Approx(expected(t)).epsilon(1e-13), "step ", t);
    if (t == 2) CHECK(adam.momentum(0).item<double>() == doctest::Approx(0.9).epsilon(1e-13));
    if (t == 6) CHECK(adam.momentum(0).item<double>() == doctest::Approx(0.9).epsilon(1e-13));
    if (t == 12) CHECK(adam.momentum(0).item<double>() == doctest::Approx(0.95).epsilon(1e-13));
    s.step();
  }
}

TEST_CASE("CyclicLR triangular2 over 3 cycles, and exp_range") {
  Fixture f;
  CyclicLR s(*f.sgd, {.base_lr = {0.01}, .max_lr = {0.1, 0.05}, .step_size_up = 4, .mode = CyclicLRMode::triangular2});
  auto formula = [](double base, double max_lr, int t, double scale_fn_of_cycle_pow) {
    const double cycle = std::floor(1 + t / 8.0);
    const double x = 1.0 + t / 8.0 - cycle;
    const double factor = x <= 0.5 ? x / 0.5 : (x - 1) / (0.5 - 1);
    return base + (max_lr - base) * factor / std::pow(scale_fn_of_cycle_pow, cycle - 1);
  };
  const double max_lr[2] = {0.1, 0.05};
  check_sequence(s, f, 24, [&](int g, int t) { return formula(0.01, max_lr[g], t, 2.0); });
  // Peaks: 0.1, then halved each cycle.
  Fixture peaks;
  CyclicLR p(*peaks.sgd, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 4, .mode = CyclicLRMode::triangular2});
  for (int t = 0; t <= 20; ++t) {
    if (t == 4) CHECK(peaks.lr(0) == doctest::Approx(0.1));
    if (t == 8) CHECK(peaks.lr(0) == doctest::Approx(0.01));
    if (t == 12) CHECK(peaks.lr(0) == doctest::Approx(0.055));
    if (t == 20) CHECK(peaks.lr(0) == doctest::Approx(0.0325));
    if (t == 4) CHECK(peaks.momentum(0) == doctest::Approx(0.8));
    if (t == 0) CHECK(peaks.momentum(0) == doctest::Approx(0.9));
    p.step();
  }
  Fixture e;
  CyclicLR x(*e.sgd, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 3, .step_size_down = 5,
                      .mode = CyclicLRMode::exp_range, .gamma = 0.97});
  check_sequence(x, e, 20, [](int, int t) {
    const double cycle = std::floor(1 + t / 8.0);
    const double xx = 1.0 + t / 8.0 - cycle;
    const double ratio = 3.0 / 8.0;
    const double factor = xx <= ratio ? xx / ratio : (xx - 1) / (ratio - 1);
    return 0.01 + (0.1 - 0.01) * factor * std::pow(0.97, t);
  });
}

// torch allows step_size_down=0 (a sawtooth: the lr rises over step_size_up steps, then falls back at
// once). torch 2.15: CyclicLR(SGD(lr=0.1, momentum=0.9), base_lr=0.01, max_lr=0.05, step_size_up=4,
// step_size_down=0) gives lr 0.01, 0.02, 0.03, 0.04, 0.01, ... and momentum 0.9, 0.875, 0.85, 0.825, 0.9, ...
TEST_CASE("CyclicLR with step_size_down 0 is torch's sawtooth") {
  Fixture f;
  CyclicLR s(*f.sgd, {.base_lr = {0.01}, .max_lr = {0.05}, .step_size_up = 4, .step_size_down = 0});
  for (int t = 0; t < 10; ++t) {
    CHECK_MESSAGE(f.lr(0) == doctest::Approx(0.01 + 0.01 * (t % 4)), "step ", t);
    CHECK_MESSAGE(f.momentum(0) == doctest::Approx(0.9 - 0.025 * (t % 4)), "step ", t);
    s.step();
  }
  CHECK_THROWS_WITH_AS(CyclicLR(*f.sgd, {.base_lr = {0.01}, .max_lr = {0.05}, .step_size_up = 0}),
                       doctest::Contains("step_size_up must be positive"), Error);
}

TEST_CASE("SWALR matches torch's recursion from the lr at construction") {
  for (AnnealStrategy strategy : {AnnealStrategy::cos, AnnealStrategy::linear}) {
    for (int anneal_epochs : {0, 1, 5}) {
      Fixture f;
      f.sgd->lr(0).fill_(0.3);  // a schedule moved the device lr: SWALR starts from it
      SWALR s(*f.sgd, {0.02, 0.01}, anneal_epochs, strategy);
      auto anneal = [&](double t) { return strategy == AnnealStrategy::cos ? (1 - std::cos(kPi * t)) / 2 : t; };
      double lr[2] = {0.3, kBase[1]};
      const double swa[2] = {0.02, 0.01};
      std::vector<double> seq[2];
      for (int count = 1; count <= 15; ++count) {  // torch's _step_count
        int step = count - 1;
        if (anneal_epochs == 0) step = std::max(1, step);
        const double prev_t = std::max(0.0, std::min(1.0, (step - 1.0) / std::max(1, anneal_epochs)));
        const double prev_alpha = anneal(prev_t);
        const double t = std::max(0.0, std::min(1.0, static_cast<double>(step) / std::max(1, anneal_epochs)));
        const double alpha = anneal(t);
        for (int g = 0; g < 2; ++g) {
          const double prev_lr = prev_alpha == 1 ? swa[g] : (lr[g] - prev_alpha * swa[g]) / (1 - prev_alpha);
          lr[g] = swa[g] * alpha + prev_lr * (1 - alpha);
          seq[g].push_back(lr[g]);
        }
      }
      check_sequence(s, f, 14, [&](int g, int t) { return seq[g][t]; }, 1e-12);
    }
  }
}

TEST_CASE("SequentialLR: linear warmup then cosine") {
  Fixture f;
  LinearLR warmup(*f.sgd, 0.1, 1.0, 5);
  CosineAnnealingLR cosine(*f.sgd, 20, 0.0);
  SequentialLR s(*f.sgd, {&warmup, &cosine}, {5});
  check_sequence(s, f, 30, [](int g, int t) {
    if (t < 5) return kBase[g] * (0.1 + 0.9 * t / 5.0);
    return kBase[g] * (1 + std::cos(kPi * (t - 5) / 20.0)) / 2;
  });
}

TEST_CASE("a skipped optimizer step does not advance the schedule") {
  Fixture f;
  StepLR s(*f.sgd, 1, 0.5);
  f.a.set_grad(ones({3}));
  f.sgd->step();
  s.step();
  CHECK(f.lr(0) == doctest::Approx(0.05));
  // The scaler found inf: the step is skipped on the device and so is the schedule.
  f.sgd->step_state().found_inf.fill_(1.0);
  f.sgd->arm_found_inf();
  f.sgd->step();
  s.step();
  CHECK(s.last_epoch().item<int64_t>() == 1);
  CHECK(f.lr(0) == doctest::Approx(0.05));
  s.step_unconditionally();
  CHECK(s.last_epoch().item<int64_t>() == 2);
  // A later unguarded step advances again.
  f.sgd->step();
  s.step();
  CHECK(s.last_epoch().item<int64_t>() == 3);
  CHECK(f.lr(0) == doctest::Approx(0.1 * 0.125));
}

TEST_CASE("scheduler state_dict round trips") {
  Fixture a, b;
  OneCycleLR sa(*a.sgd, {.max_lr = {1.0}, .total_steps = 50});
  OneCycleLR sb(*b.sgd, {.max_lr = {1.0}, .total_steps = 50});
  for (int k = 0; k < 17; ++k) sa.step();
  StateDict dict = sa.state_dict();
  dict.meta = nlohmann::json::parse(dict.meta.dump());
  sb.load_state_dict(dict);
  CHECK(b.lr(0) == a.lr(0));
  CHECK(b.momentum(0) == a.momentum(0));
  sa.step();
  sb.step();
  CHECK(b.lr(1) == a.lr(1));
  StepLR other(*b.sgd, 2);
  CHECK_THROWS_WITH_AS(other.load_state_dict(dict), doctest::Contains("'OneCycleLR' scheduler, this is StepLR"),
                       Error);
}

TEST_CASE("ReduceLROnPlateau reduces after patience, with cooldown and min_lr") {
  Fixture f;
  ReduceLROnPlateau s(*f.sgd, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = {0.02, 0.0}});
  // best 1.0 at epoch 1; 3 bad epochs -> reduce at epoch 4; cooldown 1; then 3 more bad -> reduce.
  const double metrics[] = {1.0, 1.0, 0.99995, 1.2, 1.1, 1.1, 1.1, 1.1, 0.5};
  const double expected0[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025};
  for (int e = 0; e < 9; ++e) {
    s.step(metrics[e]);
    CHECK_MESSAGE(f.lr(0) == doctest::Approx(expected0[e]), "epoch ", e);
  }
  CHECK(s.get_last_lr()[1] == doctest::Approx(0.0125));
  for (int e = 0; e < 20; ++e) s.step(2.0);
  CHECK(f.lr(0) == doctest::Approx(0.02));  // min_lr
  ReduceLROnPlateau t(*f.sgd, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = {0.02, 0.0}});
  StateDict dict = s.state_dict();
  dict.meta = nlohmann::json::parse(dict.meta.dump());
  t.load_state_dict(dict);
  CHECK(t.best() == s.best());
  CHECK(t.get_last_lr() == s.get_last_lr());
  CHECK_THROWS_WITH_AS(ReduceLROnPlateau(*f.sgd, {.factor = 1.5}), doctest::Contains("factor should be < 1.0"), Error);
}

// torch reduces the group's current lr (float(param_group["lr"]) in _reduce_lr), whatever set it.
// torch 2.15: SGD([p], lr=0.1); s = ReduceLROnPlateau(o, factor=0.5, patience=0);
// o.param_groups[0]["lr"] = 0.4; s.step(1.0); s.step(2.0); s.step(3.0) leaves lr 0.4, 0.2, 0.1.
TEST_CASE("ReduceLROnPlateau reduces the lr the optimizer has now") {
  Fixture f;
  ReduceLROnPlateau s(*f.sgd, {.factor = 0.5, .patience = 0});
  f.sgd->set_lr(0, 0.4);
  f.sgd->lr(1).fill_(0.3);  // as a schedule would: the device value only
  const double expected[2][3] = {{0.4, 0.2, 0.1}, {0.3, 0.15, 0.075}};
  for (int e = 0; e < 3; ++e) {
    s.step(1.0 + e);
    for (int g = 0; g < 2; ++g) CHECK_MESSAGE(f.lr(g) == doctest::Approx(expected[g][e]), "group ", g, " epoch ", e);
  }
  CHECK(s.get_last_lr() == std::vector<double>{f.lr(0), f.lr(1)});
}

TEST_CASE("scheduler errors name the scheduler") {
  Fixture f;
  CHECK_THROWS_WITH_AS(StepLR(*f.sgd, 0), doctest::Contains("StepLR: step_size must be positive"), Error);
  CHECK_THROWS_WITH_AS(OneCycleLR(*f.sgd, {.max_lr = {1, 2, 3}, .total_steps = 10}),
                       doctest::Contains("expected 1 or 2 values"), Error);
  Tensor p = zeros({2}).requires_grad_();
  SGD plain({p}, {.lr = 0.1});
  CHECK_THROWS_WITH_AS(CyclicLR(plain, {.base_lr = {0.01}, .max_lr = {0.1}}),
                       doctest::Contains("cycle_momentum needs SGD configured with momentum > 0"), Error);
  CHECK_THROWS_WITH_AS(LinearLR(*f.sgd, 0.0), doctest::Contains("start_factor"), Error);
}

// ---------------------------------------------------------------- GPU
namespace {
// An SGD with `count` parameter groups, group g with lr 0.01 * (g + 1).
std::unique_ptr<SGD> many_groups(int count, std::vector<Tensor>& params, Device device = Device::cpu()) {
  std::vector<ParamGroup> groups(static_cast<size_t>(count));
  for (int g = 0; g < count; ++g) {
    params.push_back(zeros({2}, {.device = device}).requires_grad_());
    groups[static_cast<size_t>(g)].params = {params.back()};
    groups[static_cast<size_t>(g)].lr = 0.01 * (g + 1);
  }
  return std::make_unique<SGD>(groups, SGDOptions{.lr = 0.1, .momentum = 0.9});
}
}  // namespace

TEST_CASE("schedules and optimizers take any number of parameter groups (a GPT's 2, a layer-wise 30)") {
  std::vector<Tensor> params;
  std::unique_ptr<SGD> sgd = many_groups(30, params);
  std::vector<double> max_lr(30);
  for (int g = 0; g < 30; ++g) max_lr[static_cast<size_t>(g)] = 0.1 * (g + 1);
  OneCycleLR warmup(*sgd, {.max_lr = max_lr, .total_steps = 20});
  CosineAnnealingLR cosine(*sgd, 10);
  SequentialLR schedule(*sgd, {&warmup, &cosine}, {20});
  for (int t = 0; t < 25; ++t) schedule.step();
  // Step 25 is step 5 of the cosine, which anneals each group's own base lr (its configured lr).
  for (int g = 0; g < 30; ++g) {
    const double base = 0.01 * (g + 1);
    CHECK(sgd->lr(g).item<double>() == doctest::Approx(base * (1 + std::cos(kPi * 5 / 10)) / 2).epsilon(1e-12));
  }
  for (Tensor& p : params) p.set_grad(ones({2}));
  sgd->step();
  CHECK(params[29].to_vector<float>()[0] == doctest::Approx(-sgd->lr(29).item<double>()).epsilon(1e-6));
}

TEST_CASE("schedules on CUDA match the CPU and do not synchronize [gpu]") {
  KILN_REQUIRE_GPU();
  Fixture cpu, gpu(Device::cuda());
  OneCycleLR sc(*cpu.sgd, {.max_lr = {1.0, 0.5}, .total_steps = 100, .three_phase = true});
  OneCycleLR sg(*gpu.sgd, {.max_lr = {1.0, 0.5}, .total_steps = 100, .three_phase = true});
  cuda::device_synchronize(0);
  const auto before = cuda::sync_counters();
  for (int k = 0; k < 60; ++k) sg.step();
  const auto after = cuda::sync_counters();
  CHECK(after.device_to_host_copies == before.device_to_host_copies);
  CHECK(after.synchronizations == before.synchronizations);
  for (int k = 0; k < 60; ++k) sc.step();
  for (int g = 0; g < 2; ++g) {
    CHECK(gpu.lr(g) == doctest::Approx(cpu.lr(g)).epsilon(1e-14));
    CHECK(gpu.momentum(g) == doctest::Approx(cpu.momentum(g)).epsilon(1e-14));
  }
  // More groups than one launch's parameters could once hold: one launch per group.
  std::vector<Tensor> cpu_params, gpu_params;
  std::unique_ptr<SGD> cpu_sgd = many_groups(12, cpu_params), gpu_sgd = many_groups(12, gpu_params, Device::cuda());
  std::vector<double> max_lr(12, 0.5);
  OneCycleLR many_cpu(*cpu_sgd, {.max_lr = max_lr, .total_steps = 50});
  OneCycleLR many_gpu(*gpu_sgd, {.max_lr = max_lr, .total_steps = 50});
  for (int k = 0; k < 17; ++k) {
    many_cpu.step();
    many_gpu.step();
  }
  for (int g = 0; g < 12; ++g) CHECK(gpu_sgd->lr(g).item<double>() == doctest::Approx(cpu_sgd->lr(g).item<double>()).epsilon(1e-14));
}
