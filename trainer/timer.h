// Timer: measures the time spent in training, validation, testing and
// prediction, and stops training once a duration has elapsed (Lightning's Timer; Trainer's max_time
// is the same limit as a flag). The elapsed training time is part of the
// callback's state, so a resumed run keeps counting from where it stopped.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "trainer/callbacks.h"

namespace kiln {

struct TimerOptions {
  std::string interval = "step";  // check after every training batch ("step") or epoch ("epoch")
  bool verbose = true;            // say on stderr when the limit stops training
};

class Timer : public Callback {
 public:
  using Seconds = std::chrono::duration<double>;

  // No limit: only measures.
  explicit Timer(TimerOptions options = {});
  // "DD:HH:MM:SS" or a number of seconds (parse_max_time's format).
  explicit Timer(const std::string& duration, TimerOptions options = {});
  explicit Timer(Seconds duration, TimerOptions options = {});
  // timedelta's keywords: {"days", "hours", "minutes", "seconds", "milliseconds"}.
  explicit Timer(const std::map<std::string, double>& duration, TimerOptions options = {});

  std::string name() const override { return "Timer"; }
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  void on_validation_start(Trainer& trainer, TrainModule& module) override;
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_test_start(Trainer& trainer, TrainModule& module) override;
  void on_test_end(Trainer& trainer, TrainModule& module) override;
  void on_predict_start(Trainer& trainer, TrainModule& module) override;
  void on_predict_end(Trainer& trainer, TrainModule& module) override;
  // {"time_elapsed": {"train": s, "validate": s, "test": s, "predict": s}};
  // loading resumes the training count.
  nlohmann::json state_dict() const override;
  void check_state_dict(const nlohmann::json& state) const override;
  void load_state_dict(const nlohmann::json& state) override;

  // Seconds on a monotonic clock when the stage ("train", "validate", "test"
  // or "predict") last started / ended; nullopt before it did. Throws
  // kiln::Error for another stage name.
  std::optional<double> start_time(const std::string& stage = "train") const;
  std::optional<double> end_time(const std::string& stage = "train") const;
  // Seconds spent in the stage (training: plus the time restored from a checkpoint).
  double time_elapsed(const std::string& stage = "train") const;
  // duration - time_elapsed; nullopt without a duration.
  std::optional<double> time_remaining(const std::string& stage = "train") const;
  std::optional<Seconds> duration() const { return duration_; }

 private:
  struct Span {
    std::optional<double> start, end;
  };
  const Span& span(const std::string& stage) const;
  void check_time_remaining(Trainer& trainer);

  TimerOptions options_;
  std::optional<Seconds> duration_;
  Span train_, validate_, test_, predict_;
  double offset_ = 0;  // training seconds restored from a checkpoint
  bool announced_ = false;
};

}  // namespace kiln
