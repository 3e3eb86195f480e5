// Learning-rate (and momentum) schedules as closed-form functions of the step.
//
// The CPU code and the CUDA schedule kernel both evaluate these functions, so
// a schedule gives the same value on either device. Each formula follows the
// PyTorch scheduler of the same name step for step (torch.optim.lr_scheduler,
// documented formulas); where PyTorch's step() is recursive ("chainable") the
// closed form here is its exact solution when nothing else changes the lr.
// A ScheduleProgram is a sequence of formulas switched at milestones, like
// SequentialLR: segment k runs its formula at (step - boundary[k-1]). What
// differs between parameter groups (their lrs and momenta) is kept apart from
// the formulas, one ScheduleGroup per group, so the number of groups is not
// bounded: the CUDA kernel takes one group per launch.
#pragma once

#include <math.h>

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"  // KILN_HOST_DEVICE

namespace kiln::kernels {

constexpr int kScheduleMaxMilestones = 32;
constexpr int kScheduleMaxSegments = 4;

enum class ScheduleKind : int32_t {
  constant,              // base_lr
  step,                  // StepLR: base_lr * gamma^(t / period)
  multi_step,            // MultiStepLR: base_lr * gamma^(milestones <= t)
  exponential,           // ExponentialLR: base_lr * gamma^t
  linear,                // LinearLR (linear warmup): base_lr * (start + (end - start) * min(t, period) / period)
  cosine,                // CosineAnnealingLR: T_max = period
  cosine_warm_restarts,  // CosineAnnealingWarmRestarts: T_0 = period, T_mult = period2
  one_cycle,             // OneCycleLR: total_steps = period
  cyclic,                // CyclicLR: step_size_up = period, step_size_down = period2
  swa,                   // SWALR: anneal_epochs = period, swa_lr = max_lr
};

enum class AnnealMode : int32_t { cos, linear };
enum class CyclicMode : int32_t { triangular, triangular2, exp_range };

struct ScheduleFormula {
  ScheduleKind kind = ScheduleKind::constant;
  int64_t period = 1;
  int64_t period2 = 1;
  AnnealMode anneal = AnnealMode::cos;  // one_cycle, swa
  CyclicMode cyclic = CyclicMode::triangular;
  int32_t three_phase = 0;              // one_cycle
  int32_t cycle_momentum = 0;           // one_cycle, cyclic: the formula also sets momentum (beta1)
  int32_t n_milestones = 0;
  int64_t milestones[kScheduleMaxMilestones] = {};  // sorted
  double gamma = 1.0;
  double start_factor = 1.0, end_factor = 1.0;  // linear
  double eta_min = 0.0;                         // cosine, cosine_warm_restarts
  double pct_start = 0.3;                       // one_cycle
};

// One parameter group's values for one formula. base_lr is the initial lr
// (one_cycle: max_lr / div_factor; cyclic: the lower bound); max_lr is
// one_cycle/cyclic's peak and swa's swa_lr; min_lr is one_cycle's final lr.
struct ScheduleGroupValues {
  double base_lr = 0;
  double max_lr = 0;
  double min_lr = 0;
  double base_momentum = 0;
  double max_momentum = 0;
};

// A group's values in each segment (what one CUDA launch takes by value).
struct ScheduleGroup {
  ScheduleGroupValues segments[kScheduleMaxSegments];
};

// The formulas and where they switch: the same for every group.
struct ScheduleSegments {
  int32_t n_segments = 1;
  int64_t boundaries[kScheduleMaxSegments - 1] = {};  // step where segment k+1 starts
  ScheduleFormula segments[kScheduleMaxSegments];
};

// Host side: the segments and one ScheduleGroup per parameter group.
struct ScheduleProgram : ScheduleSegments {
  std::vector<ScheduleGroup> groups;
};

struct ScheduleValue {
  double lr = 0;
  double momentum = 0;
  bool has_momentum = false;
};

namespace schedule_detail {
constexpr double kPi = 3.14159265358979323846;

KILN_HOST_DEVICE inline double anneal(AnnealMode mode, double start, double end, double pct) {
  if (mode == AnnealMode::cos) return end + (start - end) / 2.0 * (::cos(kPi * pct) + 1.0);
  return (end - start) * pct + start;
}

KILN_HOST_DEVICE inline ScheduleValue one_cycle(const ScheduleFormula& f, const ScheduleGroupValues& g, int64_t step) {
  // Phases as in OneCycleLR._schedule_phases: (end_step, start/end lr, start/end momentum).
  const double total = static_cast<double>(f.period);
  const double initial = g.base_lr, peak = g.max_lr, final_lr = g.min_lr;
  const double m_lo = g.base_momentum, m_hi = g.max_momentum;
  double end_step[3], lr_from[3], lr_to[3], m_from[3], m_to[3];
  int phases;
  if (f.three_phase) {
    phases = 3;
    end_step[0] = f.pct_start * total - 1.0;
    end_step[1] = 2.0 * f.pct_start * total - 2.0;
    end_step[2] = total - 1.0;
    lr_from[0] = initial, lr_to[0] = peak, m_from[0] = m_hi, m_to[0] = m_lo;
    lr_from[1] = peak, lr_to[1] = initial, m_from[1] = m_lo, m_to[1] = m_hi;
    lr_from[2] = initial, lr_to[2] = final_lr, m_from[2] = m_hi, m_to[2] = m_hi;
  } else {
    phases = 2;
    end_step[0] = f.pct_start * total - 1.0;
    end_step[1] = total - 1.0;
    lr_from[0] = initial, lr_to[0] = peak, m_from[0] = m_hi, m_to[0] = m_lo;
    lr_from[1] = peak, lr_to[1] = final_lr, m_from[1] = m_lo, m_to[1] = m_hi;
  }
  // PyTorch raises past total_steps; a device cannot, so the value holds there.
  const double t = static_cast<double>(step < f.period ? step : f.period);
  double start_step = 0.0;
  ScheduleValue value;
  for (int i = 0; i < phases; ++i) {
    if (t <= end_step[i] || i == phases - 1) {
      const double pct = (t - start_step) / (end_step[i] - start_step);
      value.lr = anneal(f.anneal, lr_from[i], lr_to[i], pct);
      value.momentum = anneal(f.anneal, m_from[i], m_to[i], pct);
      value.has_momentum = f.cycle_momentum != 0;
      break;
    }
    start_step = end_step[i];
  }
  return value;
}

KILN_HOST_DEVICE inline ScheduleValue cyclic(const ScheduleFormula& f, const ScheduleGroupValues& g, int64_t step) {
  const double up = static_cast<double>(f.period), down = static_cast<double>(f.period2);
  const double total_size = up + down;
  const double step_ratio = up / total_size;
  const double t = static_cast<double>(step);
  const double cycle = ::floor(1.0 + t / total_size);
  const double x = 1.0 + t / total_size - cycle;
  const double scale_factor = x <= step_ratio ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
  double scale;
  switch (f.cyclic) {
    case CyclicMode::triangular: scale = 1.0; break;
    case CyclicMode::triangular2: scale = 1.0 / ::pow(2.0, cycle - 1.0); break;
    default: scale = ::pow(f.gamma, t); break;  // exp_range scales by iterations
  }
  ScheduleValue value;
  value.lr = g.base_lr + (g.max_lr - g.base_lr) * scale_factor * scale;
  value.momentum = g.max_momentum - (g.max_momentum - g.base_momentum) * scale_factor * scale;
  value.has_momentum = f.cycle_momentum != 0;
  return value;
}
}  // namespace schedule_detail

// The value of one formula at `step` for a group with values g. base_override
// (when not NaN) replaces g.base_lr (SWALR anneals from the lr found at its
// construction).
KILN_HOST_DEVICE inline ScheduleValue schedule_formula_value(const ScheduleFormula& f, const ScheduleGroupValues& g,
                                                             int64_t step, double base_override) {
  using namespace schedule_detail;
  const double base = ::isnan(base_override) ? g.base_lr : base_override;
  ScheduleValue value;
  switch (f.kind) {
    case ScheduleKind::constant: value.lr = base; break;
    case ScheduleKind::step: value.lr = base * ::pow(f.gamma, static_cast<double>(step / f.period)); break;
    case ScheduleKind::multi_step: {
      int passed = 0;  // bisect_right(milestones, step)
      while (passed < f.n_milestones && f.milestones[passed] <= step) ++passed;
      value.lr = base * ::pow(f.gamma, static_cast<double>(passed));
      break;
    }
    case ScheduleKind::exponential: value.lr = base * ::pow(f.gamma, static_cast<double>(step)); break;
    case ScheduleKind::linear: {
      const int64_t done = step < f.period ? step : f.period;
      value.lr = base * (f.start_factor + (f.end_factor - f.start_factor) * static_cast<double>(done) /
                                              static_cast<double>(f.period));
      break;
    }
    case ScheduleKind::cosine:
      value.lr = f.eta_min + (base - f.eta_min) *
                                 (1.0 + ::cos(kPi * static_cast<double>(step) / static_cast<double>(f.period))) / 2.0;
      break;
    case ScheduleKind::cosine_warm_restarts: {
      int64_t t_cur = step, t_i = f.period;
      double period = static_cast<double>(t_i);
      if (f.period2 == 1) {
        t_cur = step % f.period;
      } else {
        while (t_cur >= t_i) {  // the restarts of step(): T_cur -= T_i; T_i *= T_mult
          t_cur -= t_i;
          // A T_i beyond int64 exceeds every step count: this period is the last.
          const bool last = t_i > INT64_MAX / f.period2;
          period = static_cast<double>(t_i) * static_cast<double>(f.period2);
          if (last) break;
          t_i *= f.period2;
        }
      }
      value.lr = f.eta_min + (base - f.eta_min) * (1.0 + ::cos(kPi * static_cast<double>(t_cur) / period)) / 2.0;
      break;
    }
    case ScheduleKind::one_cycle: return one_cycle(f, g, step);
    case ScheduleKind::cyclic: return cyclic(f, g, step);
    case ScheduleKind::swa: {
      int64_t s = step;
      if (f.period == 0 && s < 1) s = 1;
      double t = static_cast<double>(s) / static_cast<double>(f.period > 1 ? f.period : 1);
      t = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);
      const double alpha = f.anneal == AnnealMode::cos ? (1.0 - ::cos(kPi * t)) / 2.0 : t;
      value.lr = g.max_lr * alpha + base * (1.0 - alpha);
      break;
    }
  }
  return value;
}

KILN_HOST_DEVICE inline ScheduleValue schedule_program_value(const ScheduleSegments& program,
                                                             const ScheduleGroup& group, int64_t step,
                                                             double base_override) {
  int k = 0;
  while (k + 1 < program.n_segments && step >= program.boundaries[k]) ++k;
  const int64_t local = k == 0 ? step : step - program.boundaries[k - 1];
  return schedule_formula_value(program.segments[k], group.segments[k], local, base_override);
}

}  // namespace kiln::kernels
