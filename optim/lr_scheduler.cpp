// Learning-rate schedules: each builds a ScheduleProgram (closed-form formulas
// of kernels/schedule_formulas.h) and steps it with one kernel per step().
#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "kernels/optim.h"
#include "optim/detail.h"

namespace kiln::optim {

namespace {
using kernels::ScheduleFormula;
using kernels::ScheduleKind;
using kernels::ScheduleProgram;

// A one-segment program with each group's configured lr as its base.
ScheduleProgram base_program(const Optimizer& optimizer, ScheduleKind kind) {
  ScheduleProgram program;
  program.n_segments = 1;
  program.segments[0].kind = kind;
  program.groups.resize(static_cast<size_t>(optimizer.num_groups()));
  for (int64_t g = 0; g < optimizer.num_groups(); ++g) {
    program.groups[static_cast<size_t>(g)].segments[0].base_lr = optimizer.group_options(g).lr;
  }
  return program;
}

// One value per group from a list of one or num_groups values.
std::vector<double> per_group(const std::vector<double>& values, const Optimizer& optimizer, const char* what) {
  const auto groups = static_cast<size_t>(optimizer.num_groups());
  KILN_CHECK(values.size() == 1 || values.size() == groups, what, ": expected 1 or ", groups, " values (one per ",
             "parameter group), got ", values.size());
  return values.size() == 1 ? std::vector<double>(groups, values[0]) : values;
}

// Cycling momentum needs a momentum the optimizer uses: SGD/LARS groups
// configured with momentum 0 keep no buffer.
void check_momentum_cycling(const Optimizer& optimizer, const char* scheduler) {
  if (optimizer.name() != "SGD" && optimizer.name() != "LARS") return;
  for (int64_t g = 0; g < optimizer.num_groups(); ++g) {
    KILN_CHECK(optimizer.group_options(g).momentum != 0, scheduler, ": cycle_momentum needs ", optimizer.name(),
               " configured with momentum > 0 (group ", g, " has 0); pass cycle_momentum = false");
  }
}
}  // namespace

// ---------------------------------------------------------------- LRScheduler
LRScheduler::LRScheduler(Optimizer& optimizer, const ScheduleProgram& program, std::string name,
                         bool base_from_device)
    : optimizer_(optimizer), program_(program), name_(std::move(name)) {
  last_epoch_ = zeros({}, {.dtype = DType::i64, .device = optimizer.device()});
  if (base_from_device) {
    NoGradGuard no_grad;
    for (int64_t g = 0; g < optimizer.num_groups(); ++g) base_lr_.push_back(optimizer.lr(g).clone());
  }
  apply(false, false);
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::apply(bool advance, bool honour_skip) {
  std::vector<double*> lr, momentum;
  std::vector<const double*> base;
  for (int64_t g = 0; g < optimizer_.num_groups(); ++g) {
    lr.push_back(optimizer_.lr(g).data<double>());
    momentum.push_back(optimizer_.momentum(g).data<double>());
    base.push_back(base_lr_.empty() ? nullptr : base_lr_[g].data<double>());
  }
  const Tensor skip = honour_skip ? optimizer_.last_step_found_inf() : Tensor();
  const float* found_inf = skip.defined() ? skip.data<float>() : nullptr;
  int64_t* counter = last_epoch_.data<int64_t>();
  if (optimizer_.device().is_cpu()) {
    kernels::schedule_step_cpu(program_, counter, found_inf, advance, lr.data(), momentum.data(), base.data());
  } else {
    kernels::schedule_step_cuda(program_, counter, found_inf, advance, lr.data(), momentum.data(), base.data(),
                                launch_on(optimizer_.device(), "LR schedule").stream);
  }
  for (int64_t g = 0; g < optimizer_.num_groups(); ++g) {
    optimizer_.lr(g).bump_version();
    optimizer_.momentum(g).bump_version();
  }
}

void LRScheduler::step() { apply(true, true); }
void LRScheduler::step_unconditionally() { apply(true, false); }

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> lrs;
  for (int64_t g = 0; g < optimizer_.num_groups(); ++g) lrs.push_back(optimizer_.lr(g).item<double>());
  return lrs;
}

StateDict LRScheduler::state_dict() const {
  StateDict dict;
  dict.meta["scheduler"] = name_;
  dict.meta["groups"] = optimizer_.num_groups();
  dict.tensors["last_epoch"] = last_epoch_;
  for (size_t g = 0; g < base_lr_.size(); ++g) dict.tensors["base_lr." + std::to_string(g)] = base_lr_[g];
  return dict;
}

void LRScheduler::load_state_dict(const StateDict& dict) {
  NoGradGuard no_grad;
  // Members of another JSON type are mismatches (nlohmann's value() would throw its own exception).
  auto member = [&](const char* key) {
    return dict.meta.is_object() && dict.meta.contains(key) ? dict.meta.at(key) : nlohmann::json();
  };
  const nlohmann::json name = member("scheduler"), groups = member("groups");
  KILN_CHECK(name.is_string() && name.get<std::string>() == name_, "load_state_dict: the state is of a '",
             name.is_string() ? name.get<std::string>() : name.dump(), "' scheduler, this is ", name_);
  KILN_CHECK(groups.is_number_integer() && groups.get<int64_t>() == optimizer_.num_groups(),
             "load_state_dict: the state has ", groups.dump(), " parameter groups, the optimizer ",
             optimizer_.num_groups());
  auto it = dict.tensors.find("last_epoch");
  KILN_CHECK(it != dict.tensors.end() && it->second.numel() == 1, "load_state_dict: last_epoch is missing");
  detail::saved_step_count(it->second, "last_epoch");
  std::vector<Tensor> base_lr;
  for (size_t g = 0; g < base_lr_.size(); ++g) {
    auto base = dict.tensors.find("base_lr." + std::to_string(g));
    KILN_CHECK(base != dict.tensors.end() && base->second.numel() == 1, "load_state_dict: base_lr.", g,
               " is missing");
    base_lr.push_back(base->second.reshape({}));
  }
  last_epoch_.copy_(it->second.reshape({}));
  for (size_t g = 0; g < base_lr_.size(); ++g) base_lr_[g].copy_(base_lr[g]);
  apply(false, false);
}

// ---------------------------------------------------------------- the closed-form schedules
StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::step);
                    p.segments[0].period = step_size;
                    p.segments[0].gamma = gamma;
                    return p;
                  }(),
                  "StepLR") {}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(milestones.size() <= static_cast<size_t>(kernels::kScheduleMaxMilestones),
                               "MultiStepLR: ", milestones.size(), " milestones (at most ",
                               kernels::kScheduleMaxMilestones, ")");
                    std::sort(milestones.begin(), milestones.end());
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::multi_step);
                    p.segments[0].gamma = gamma;
                    p.segments[0].n_milestones = static_cast<int32_t>(milestones.size());
                    std::copy(milestones.begin(), milestones.end(), p.segments[0].milestones);
                    return p;
                  }(),
                  "MultiStepLR") {}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer,
                  [&] {
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::exponential);
                    p.segments[0].gamma = gamma;
                    return p;
                  }(),
                  "ExponentialLR") {}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR: start_factor must be in (0, 1], got ",
                               start_factor);
                    KILN_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got ",
                               end_factor);
                    KILN_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got ", total_iters);
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::linear);
                    p.segments[0].start_factor = start_factor;
                    p.segments[0].end_factor = end_factor;
                    p.segments[0].period = total_iters;
                    return p;
                  }(),
                  "LinearLR") {}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(t_max > 0, "CosineAnnealingLR: T_max must be positive, got ", t_max);
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::cosine);
                    p.segments[0].period = t_max;
                    p.segments[0].eta_min = eta_min;
                    return p;
                  }(),
                  "CosineAnnealingLR") {}

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t t_0, int64_t t_mult,
                                                         double eta_min)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(t_0 > 0, "CosineAnnealingWarmRestarts: T_0 must be positive, got ", t_0);
                    KILN_CHECK(t_mult >= 1, "CosineAnnealingWarmRestarts: T_mult must be >= 1, got ", t_mult);
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::cosine_warm_restarts);
                    p.segments[0].period = t_0;
                    p.segments[0].period2 = t_mult;
                    p.segments[0].eta_min = eta_min;
                    return p;
                  }(),
                  "CosineAnnealingWarmRestarts") {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, const OneCycleLROptions& o)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(o.total_steps > 0, "OneCycleLR: total_steps must be positive, got ", o.total_steps);
                    KILN_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got ",
                               o.pct_start);
                    KILN_CHECK(o.div_factor > 0 && o.final_div_factor > 0,
                               "OneCycleLR: div_factor and final_div_factor must be positive");
                    if (o.cycle_momentum) check_momentum_cycling(optimizer, "OneCycleLR");
                    const std::vector<double> max_lr = per_group(o.max_lr, optimizer, "OneCycleLR max_lr");
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::one_cycle);
                    ScheduleFormula& f = p.segments[0];
                    f.period = o.total_steps;
                    f.pct_start = o.pct_start;
                    f.anneal = o.anneal_strategy == AnnealStrategy::cos ? kernels::AnnealMode::cos
                                                                        : kernels::AnnealMode::linear;
                    f.three_phase = o.three_phase;
                    f.cycle_momentum = o.cycle_momentum;
                    for (size_t g = 0; g < max_lr.size(); ++g) {
                      kernels::ScheduleGroupValues& v = p.groups[g].segments[0];
                      v.base_lr = max_lr[g] / o.div_factor;
                      v.max_lr = max_lr[g];
                      v.min_lr = v.base_lr / o.final_div_factor;
                      v.base_momentum = o.base_momentum;
                      v.max_momentum = o.max_momentum;
                    }
                    // A phase of no steps (pct_start * total_steps == 1, or pct_start 1) divides 0 by 0:
                    // torch raises ZeroDivisionError there; the formula would write a NaN lr.
                    // Only the steps at the phase ends can meet it (and steps past the end hold the last one).
                    const kernels::ScheduleGroupValues probe{
                        .base_lr = 1, .max_lr = 2, .min_lr = 0.5, .base_momentum = 0.5, .max_momentum = 0.9};
                    const double total = static_cast<double>(o.total_steps);
                    for (double end : {o.pct_start * total - 1, 2 * o.pct_start * total - 2, total - 1}) {
                      for (double near : {std::floor(end), std::floor(end) + 1, 0.0, total}) {
                        const auto step = static_cast<int64_t>(std::clamp(near, 0.0, total));
                        const kernels::ScheduleValue value = kernels::schedule_detail::one_cycle(f, probe, step);
                        KILN_CHECK(std::isfinite(value.lr), "OneCycleLR: pct_start ", o.pct_start, " of total_steps ",
                                   o.total_steps, (o.three_phase ? " (three_phase)" : ""),
                                   " leaves a phase with no steps (the lr at step ", step,
                                   " would be NaN); choose another pct_start or total_steps");
                      }
                    }
                    return p;
                  }(),
                  "OneCycleLR") {}

CyclicLR::CyclicLR(Optimizer& optimizer, const CyclicLROptions& o)
    : LRScheduler(optimizer,
                  [&] {
                    const int64_t down = o.step_size_down.value_or(o.step_size_up);
                    // torch allows step_size_down 0: a sawtooth.
                    KILN_CHECK(o.step_size_up > 0, "CyclicLR: step_size_up must be positive, got ", o.step_size_up);
                    KILN_CHECK(down >= 0, "CyclicLR: step_size_down must be >= 0, got ", down);
                    if (o.cycle_momentum) check_momentum_cycling(optimizer, "CyclicLR");
                    const std::vector<double> base = per_group(o.base_lr, optimizer, "CyclicLR base_lr");
                    const std::vector<double> max_lr = per_group(o.max_lr, optimizer, "CyclicLR max_lr");
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::cyclic);
                    ScheduleFormula& f = p.segments[0];
                    f.period = o.step_size_up;
                    f.period2 = down;
                    f.cyclic = o.mode == CyclicLRMode::triangular    ? kernels::CyclicMode::triangular
                               : o.mode == CyclicLRMode::triangular2 ? kernels::CyclicMode::triangular2
                                                                     : kernels::CyclicMode::exp_range;
                    f.gamma = o.gamma;
                    f.cycle_momentum = o.cycle_momentum;
                    for (size_t g = 0; g < base.size(); ++g) {
                      kernels::ScheduleGroupValues& v = p.groups[g].segments[0];
                      v.base_lr = base[g];
                      v.max_lr = max_lr[g];
                      v.base_momentum = o.base_momentum;
                      v.max_momentum = o.max_momentum;
                    }
                    return p;
                  }(),
                  "CyclicLR") {}

SWALR::SWALR(Optimizer& optimizer, std::vector<double> swa_lr, int64_t anneal_epochs, AnnealStrategy anneal_strategy)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(anneal_epochs >= 0, "SWALR: anneal_epochs must be >= 0, got ", anneal_epochs);
                    const std::vector<double> target = per_group(swa_lr, optimizer, "SWALR swa_lr");
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::swa);
                    ScheduleFormula& f = p.segments[0];
                    f.period = anneal_epochs;
                    f.anneal = anneal_strategy == AnnealStrategy::cos ? kernels::AnnealMode::cos
                                                                      : kernels::AnnealMode::linear;
                    for (size_t g = 0; g < target.size(); ++g) p.groups[g].segments[0].max_lr = target[g];
                    return p;
                  }(),
                  "SWALR", /*base_from_device=*/true) {}

SequentialLR::SequentialLR(Optimizer& optimizer, const std::vector<const LRScheduler*>& schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer,
                  [&] {
                    KILN_CHECK(!schedulers.empty() && schedulers.size() <= kernels::kScheduleMaxSegments,
                               "SequentialLR: expected 1 to ", kernels::kScheduleMaxSegments, " schedulers, got ",
                               schedulers.size());
                    KILN_CHECK(milestones.size() == schedulers.size() - 1, "SequentialLR: expected ",
                               schedulers.size() - 1, " milestones for ", schedulers.size(), " schedulers, got ",
                               milestones.size());
                    KILN_CHECK(std::is_sorted(milestones.begin(), milestones.end()),
                               "SequentialLR: milestones must be increasing");
                    ScheduleProgram p = base_program(optimizer, ScheduleKind::constant);
                    p.n_segments = static_cast<int32_t>(schedulers.size());
                    for (size_t k = 0; k < schedulers.size(); ++k) {
                      const LRScheduler& s = *schedulers[k];
                      KILN_CHECK(&s.optimizer() == &optimizer, "SequentialLR: scheduler ", k, " (", s.name(),
                                 ") belongs to another optimizer");
                      KILN_CHECK(s.program().n_segments == 1 && s.name() != "SWALR", "SequentialLR: scheduler ", k,
                                 " (", s.name(), ") cannot be nested");
                      p.segments[k] = s.program().segments[0];
                      for (size_t g = 0; g < p.groups.size(); ++g) {
                        p.groups[g].segments[k] = s.program().groups[g].segments[0];
                      }
                      if (k > 0) p.boundaries[k - 1] = milestones[k - 1];
                    }
                    return p;
                  }(),
                  "SequentialLR") {}

// ---------------------------------------------------------------- ReduceLROnPlateau
ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, const ReduceLROnPlateauOptions& options)
    : optimizer_(optimizer), options_(options) {
  KILN_CHECK(options.factor < 1.0, "ReduceLROnPlateau: factor should be < 1.0, got ", options.factor);
  min_lrs_ = per_group(options.min_lr, optimizer, "ReduceLROnPlateau min_lr");
  for (int64_t g = 0; g < optimizer.num_groups(); ++g) lrs_.push_back(optimizer.group_options(g).lr);
  best_ = options.mode_max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
}

bool ReduceLROnPlateau::is_better(double a) const {
  const double t = options_.threshold;
  if (!options_.mode_max) return options_.threshold_mode_abs ? a < best_ - t : a < best_ * (1.0 - t);
  return options_.threshold_mode_abs ? a > best_ + t : a > best_ * (t + 1.0);
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ > options_.patience) {
    NoGradGuard no_grad;
    for (size_t g = 0; g < lrs_.size(); ++g) {
      // As torch's _reduce_lr: the lr the group has now (a schedule or set_lr may have moved it).
      lrs_[g] = optimizer_.lr(static_cast<int64_t>(g)).item<double>();
      const double new_lr = std::max(lrs_[g] * options_.factor, min_lrs_[g]);
      if (lrs_[g] - new_lr > options_.eps) {
        lrs_[g] = new_lr;
        optimizer_.lr(static_cast<int64_t>(g)).fill_(new_lr);
      }
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
}

void ReduceLROnPlateau::step(const Tensor& metric) { step(metric.item<double>()); }

StateDict ReduceLROnPlateau::state_dict() const {
  StateDict dict;
  // JSON has no infinity: an unset best (no metric seen) is saved as null.
  dict.meta = {{"scheduler", "ReduceLROnPlateau"},
               {"best", std::isfinite(best_) ? nlohmann::json(best_) : nlohmann::json()},
               {"num_bad_epochs", num_bad_epochs_}, {"cooldown_counter", cooldown_counter_},
               {"last_epoch", last_epoch_},     {"lrs", lrs_}};
  return dict;
}

void ReduceLROnPlateau::load_state_dict(const StateDict& dict) {
  NoGradGuard no_grad;
  KILN_CHECK(dict.meta.value("scheduler", std::string()) == "ReduceLROnPlateau",
             "load_state_dict: the state is not of a ReduceLROnPlateau scheduler");
  const auto lrs = dict.meta.at("lrs").get<std::vector<double>>();
  KILN_CHECK(lrs.size() == lrs_.size(), "load_state_dict: the state has ", lrs.size(), " groups, the optimizer ",
             lrs_.size());
  const nlohmann::json& best = dict.meta.at("best");
  best_ = best.is_null() ? (options_.mode_max ? -std::numeric_limits<double>::infinity()
                                               : std::numeric_limits<double>::infinity())
                         : best.get<double>();
  num_bad_epochs_ = dict.meta.at("num_bad_epochs").get<int64_t>();
  cooldown_counter_ = dict.meta.at("cooldown_counter").get<int64_t>();
  last_epoch_ = dict.meta.at("last_epoch").get<int64_t>();
  lrs_ = lrs;
  for (size_t g = 0; g < lrs_.size(); ++g) optimizer_.lr(static_cast<int64_t>(g)).fill_(lrs_[g]);
}

}  // namespace kiln::optim
