#include "trainer/timer.h"

#include <cstdio>

#include "core/saved_json.h"
#include "trainer/trainer.h"

namespace kiln {

namespace {
double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// timedelta(**duration)
Timer::Seconds from_parts(const std::map<std::string, double>& parts) {
  static const std::map<std::string, double> kSeconds = {{"weeks", 604800.0},  {"days", 86400.0},
                                                         {"hours", 3600.0},    {"minutes", 60.0},
                                                         {"seconds", 1.0},     {"milliseconds", 1e-3},
                                                         {"microseconds", 1e-6}};
  double total = 0;
  for (const auto& [unit, value] : parts) {
    auto it = kSeconds.find(unit);
    KILN_CHECK(it != kSeconds.end(), "Timer: unknown duration key '", unit,
               "' (expected weeks, days, hours, minutes, seconds, milliseconds or microseconds)");
    total += value * it->second;
  }
  return Timer::Seconds(total);
}

// The training seconds of a saved state, checked: every stage it holds is a
// non-negative number of seconds. Files may lack any key (0 s).
double saved_training_seconds(const nlohmann::json& state) {
  constexpr std::string_view where = "Timer.load_state_dict";
  if (!saved_json::object(state, "state", where).contains("time_elapsed")) return 0.0;
  const nlohmann::json& elapsed = saved_json::object(state.at("time_elapsed"), "time_elapsed", where);
  double train = 0.0;
  for (const char* stage : {"train", "validate", "test", "predict"}) {
    if (!elapsed.contains(stage)) continue;
    const double seconds = saved_json::finite_number_at(elapsed, stage, where);
    KILN_CHECK(seconds >= 0, where, ": \"", stage, "\" is ", seconds, " (expected seconds >= 0)");
    if (std::string_view(stage) == "train") train = seconds;
  }
  return train;
}
}  // namespace

Timer::Timer(TimerOptions options) : options_(std::move(options)) {
  KILN_CHECK(options_.interval == "step" || options_.interval == "epoch", "Unsupported parameter value Timer(interval=",
             options_.interval, "). Possible values are: step, epoch");
}

Timer::Timer(const std::string& duration, TimerOptions options) : Timer(std::move(options)) {
  if (!duration.empty()) duration_ = Seconds(parse_max_time(duration));
}

Timer::Timer(Seconds duration, TimerOptions options) : Timer(std::move(options)) {
  KILN_CHECK(duration.count() >= 0, "Timer: the duration must not be negative, got ", duration.count(), " s");
  duration_ = duration;
}

Timer::Timer(const std::map<std::string, double>& duration, TimerOptions options)
    : Timer(from_parts(duration), std::move(options)) {}

const Timer::Span& Timer::span(const std::string& stage) const {
  if (stage == "train") return train_;
  if (stage == "validate") return validate_;
  if (stage == "test") return test_;
  KILN_CHECK(stage == "predict", "Timer: unknown stage '", stage,
             "' (expected \"train\", \"validate\", \"test\" or \"predict\")");
  return predict_;
}

std::optional<double> Timer::start_time(const std::string& stage) const { return span(stage).start; }
std::optional<double> Timer::end_time(const std::string& stage) const { return span(stage).end; }

double Timer::time_elapsed(const std::string& stage) const {
  const Span& s = span(stage);
  const double offset = stage == "train" ? offset_ : 0.0;
  if (!s.start) return offset;
  if (!s.end) return monotonic_seconds() - *s.start + offset;
  return *s.end - *s.start + offset;
}

std::optional<double> Timer::time_remaining(const std::string& stage) const {
  if (!duration_) return std::nullopt;
  return duration_->count() - time_elapsed(stage);
}

void Timer::on_train_start(Trainer& trainer, TrainModule&) {
  train_ = {monotonic_seconds(), std::nullopt};
  announced_ = false;
  // A run resumed from a checkpoint whose time is already spent stops at once
  // (Lightning checks in on_fit_start; the Trainer clears should_stop after it).
  if (duration_) check_time_remaining(trainer);
}

void Timer::on_train_end(Trainer&, TrainModule&) { train_.end = monotonic_seconds(); }

void Timer::on_validation_start(Trainer&, TrainModule&) { validate_ = {monotonic_seconds(), std::nullopt}; }

void Timer::on_validation_end(Trainer&, TrainModule&) { validate_.end = monotonic_seconds(); }

void Timer::on_test_start(Trainer&, TrainModule&) { test_ = {monotonic_seconds(), std::nullopt}; }

void Timer::on_test_end(Trainer&, TrainModule&) { test_.end = monotonic_seconds(); }

void Timer::on_predict_start(Trainer&, TrainModule&) { predict_ = {monotonic_seconds(), std::nullopt}; }

void Timer::on_predict_end(Trainer&, TrainModule&) { predict_.end = monotonic_seconds(); }

void Timer::on_train_batch_end(Trainer& trainer, TrainModule&, int64_t) {
  if (options_.interval == "step" && duration_) check_time_remaining(trainer);
}

void Timer::on_train_epoch_end(Trainer& trainer, TrainModule&) {
  if (options_.interval == "epoch" && duration_) check_time_remaining(trainer);
}

void Timer::check_time_remaining(Trainer& trainer) {
  const double elapsed = time_elapsed("train");
  if (elapsed < duration_->count()) return;
  trainer.should_stop = true;
  if (trainer.stop_reason.empty()) trainer.stop_reason = "Timer: time limit reached";
  if (options_.verbose && !announced_) {
    announced_ = true;
    const auto whole = static_cast<long long>(elapsed);
    std::fprintf(stderr, "Time limit reached. Elapsed time is %lld:%02lld:%02lld. Signaling Trainer to stop.\n",
                 whole / 3600, whole / 60 % 60, whole % 60);
  }
}

nlohmann::json Timer::state_dict() const {
  nlohmann::json elapsed = nlohmann::json::object();
  for (const char* stage : {"train", "validate", "test", "predict"}) elapsed[stage] = time_elapsed(stage);
  return {{"time_elapsed", elapsed}};
}

void Timer::check_state_dict(const nlohmann::json& state) const { saved_training_seconds(state); }

void Timer::load_state_dict(const nlohmann::json& state) {
  offset_ = saved_training_seconds(state);
  // The saved time is the whole training time so far: a span measured before
  // (this fit's, not ended) no longer adds to it; on_train_start starts the next.
  train_ = {};
}

}  // namespace kiln
