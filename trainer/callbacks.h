// Callbacks with Lightning's hook names, and the two every run uses:
// EarlyStopping and ModelCheckpoint.
#pragma once

#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace kiln {

class Trainer;
class TrainModule;
namespace optim {
class Optimizer;
}

class Callback {
 public:
  virtual ~Callback() = default;
  virtual std::string name() const = 0;
  virtual void on_fit_start(Trainer&, TrainModule&) {}
  virtual void on_fit_end(Trainer&, TrainModule&) {}
  virtual void on_train_start(Trainer&, TrainModule&) {}
  virtual void on_train_end(Trainer&, TrainModule&) {}
  virtual void on_train_epoch_start(Trainer&, TrainModule&) {}
  virtual void on_train_epoch_end(Trainer&, TrainModule&) {}
  virtual void on_train_batch_start(Trainer&, TrainModule&, int64_t /*batch_idx*/) {}
  // After every micro-batch (Lightning calls it per batch, accumulation included).
  virtual void on_train_batch_end(Trainer&, TrainModule&, int64_t /*batch_idx*/) {}
  // Before each optimizer step, after gradients are complete (and synchronized).
  virtual void on_before_optimizer_step(Trainer&, TrainModule&, optim::Optimizer&) {}
  // Around every validation pass, in fit and in Trainer::validate (Trainer::fitting() tells them apart).
  virtual void on_validation_start(Trainer&, TrainModule&) {}
  virtual void on_validation_end(Trainer&, TrainModule&) {}
  virtual void on_test_start(Trainer&, TrainModule&) {}
  virtual void on_test_end(Trainer&, TrainModule&) {}
  virtual void on_predict_start(Trainer&, TrainModule&) {}
  virtual void on_predict_end(Trainer&, TrainModule&) {}
  // fit(ckpt_path) with `own_state` (what state_dict() wrote): after the model
  // weights are restored, before load_state_dict and before the optimizers'
  // and schedules' states are, so a callback can install what those states
  // must load into (StochasticWeightAveraging's SWALR).
  virtual void on_load_checkpoint(Trainer&, TrainModule&, const nlohmann::json& /*own_state*/) {}
  virtual nlohmann::json state_dict() const { return nlohmann::json::object(); }
  virtual void load_state_dict(const nlohmann::json&) {}
};

struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  double min_delta = 0.0;
  int patience = 3;  // validation checks with no improvement
  std::string mode = "min";
  bool strict = true;  // the monitored metric must exist
  bool check_finite = true;
  std::optional<double> stopping_threshold;
  std::optional<double> divergence_threshold;
  bool check_on_train_epoch_end = false;
};

// Stops training when the monitored metric stops improving (Lightning's rules).
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options = {});
  std::string name() const override { return "EarlyStopping"; }
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

  // Feeds one value; returns whether training should stop and why (also used by tests).
  bool update(double value, std::string* reason);
  int wait_count() const { return wait_count_; }
  double best_score() const { return best_score_; }

 private:
  void check(Trainer& trainer);
  EarlyStoppingOptions options_;
  int wait_count_ = 0;
  double best_score_;
  int64_t stopped_epoch_ = 0;
};

struct ModelCheckpointOptions {
  std::string dirpath;  // empty: <log dir>/checkpoints
  std::string filename = "epoch={epoch}-step={step}";
  std::string monitor;  // empty: keep the latest
  std::string mode = "min";
  int save_top_k = 1;   // -1: all; 0: none
  bool save_last = false;
  int64_t every_n_train_steps = 0;
  int64_t every_n_epochs = 1;
};

// Saves checkpoints (safetensors) after validation or every n steps; keeps
// the best `save_top_k` by the monitored metric. A file is removed only after
// its replacement was written durably.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});
  std::string name() const override { return "ModelCheckpoint"; }
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

  const std::string& best_model_path() const { return best_path_; }
  const std::string& last_model_path() const { return last_path_; }
  // Expands "{epoch}", "{step}" and "{metric}" placeholders (metric values with 4 decimals).
  static std::string format_filename(const std::string& pattern, int64_t epoch, int64_t step,
                                     const std::map<std::string, double>& metrics);

 private:
  void save(Trainer& trainer, TrainModule& module);
  std::string folder(Trainer& trainer) const;
  ModelCheckpointOptions options_;
  std::map<std::string, double> kept_;  // path -> score
  std::string best_path_, last_path_;
  int64_t last_saved_step_ = -1;
};

}  // namespace kiln
