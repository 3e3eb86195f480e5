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
  // Whether on_before_optimizer_step does host work that must run at every
  // step (reading gradients to the host, say). With cuda_graph the step is
  // captured once and replayed, its host work not run again: such a callback
  // keeps the fit's steps eager, said once (trainer/cuda_graph_step.h).
  virtual bool host_work_before_optimizer_step() const { return false; }
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
  // Large byte arrays belong in binary values (nlohmann::json::binary): a
  // checkpoint stores those in its tensor section, not in its JSON header.
  virtual nlohmann::json state_dict() const { return nlohmann::json::object(); }
  // Throws kiln::Error when load_state_dict would refuse `state`; changes
  // nothing. fit(ckpt_path) checks every callback's saved state with it before
  // it applies any part of the checkpoint (the default accepts anything).
  virtual void check_state_dict(const nlohmann::json& /*state*/) const {}
  // The built-in callbacks' load_state_dict check everything before they
  // change anything (kiln::Error naming the key).
  virtual void load_state_dict(const nlohmann::json&) {}
};

// EarlyStopping and ModelCheckpoint: Lightning calls their on_train_epoch_end
// after the module's (so they see what it logs), the other callbacks' before.
bool is_monitoring_callback(const Callback& callback);

struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  double min_delta = 0.0;
  int patience = 3;  // validation checks with no improvement
  std::string mode = "min";
  bool strict = true;  // the monitored metric must exist
  bool check_finite = true;
  std::optional<double> stopping_threshold;
  std::optional<double> divergence_threshold;
  // nullopt (Lightning's None): at the training epoch's end when validation
  // runs once per epoch (val_check_interval 1.0, check_val_every_n_epoch 1),
  // after each validation otherwise.
  std::optional<bool> check_on_train_epoch_end;
  bool verbose = false;  // print improvements and the stop reason (to stderr)
};

// Stops training when the monitored metric stops improving (Lightning's rules).
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options = {});
  std::string name() const override { return "EarlyStopping"; }
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  nlohmann::json state_dict() const override;
  void check_state_dict(const nlohmann::json& state) const override;
  void load_state_dict(const nlohmann::json& state) override;

  // Feeds one value; returns whether training should stop and why (also used by tests).
  bool update(double value, std::string* reason);
  int wait_count() const { return wait_count_; }
  double best_score() const { return best_score_; }
  int64_t stopped_epoch() const { return stopped_epoch_; }
  // Where the check runs in `trainer`'s fit (check_on_train_epoch_end resolved as Lightning's setup does).
  bool checks_on_train_epoch_end(const Trainer& trainer) const;

 private:
  void check(Trainer& trainer);
  EarlyStoppingOptions options_;
  int wait_count_ = 0;
  double best_score_;
  int64_t stopped_epoch_ = 0;
};

struct ModelCheckpointOptions {
  std::string dirpath;  // empty: <log dir>/checkpoints
  std::string filename = "{epoch}-{step}";  // "epoch=3-step=120" with auto_insert_metric_name
  // "{val_loss}" is written "val_loss=0.1234" (Lightning's default; false: "0.1234").
  bool auto_insert_metric_name = true;
  std::string monitor;  // empty: keep the latest
  std::string mode = "min";
  int save_top_k = 1;   // -1: all; 0: none
  bool save_last = false;
  // At most one of the two may be >= 1 (as Lightning). Both nullopt
  // (Lightning's None): every epoch. One set: the other is 0 (off).
  std::optional<int64_t> every_n_train_steps;
  std::optional<int64_t> every_n_epochs;
  // nullopt (Lightning's None): at the training epoch's end when there is no
  // validation or it runs once per epoch (val_check_interval 1.0,
  // check_val_every_n_epoch 1), after each validation otherwise.
  std::optional<bool> save_on_train_epoch_end;
};

// Saves checkpoints (safetensors) after validation, at the training epoch's
// end (saves_on_train_epoch_end) or every n steps; keeps the best
// `save_top_k` by the monitored metric (a NaN score ranks worst), naming a
// file whose name is taken "<name>-v1", "-v2", ... A file is removed only after
// its replacement was written durably.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});
  std::string name() const override { return "ModelCheckpoint"; }
  void on_fit_start(Trainer& trainer, TrainModule& module) override;
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  // Saved with the state: the folder this fit writes to ("dirpath", null before a fit).
  // A resumed fit that writes to another folder reloads only best_model_path (Lightning's rule).
  void on_load_checkpoint(Trainer& trainer, TrainModule& module, const nlohmann::json& own_state) override;
  nlohmann::json state_dict() const override;
  void check_state_dict(const nlohmann::json& state) const override;
  void load_state_dict(const nlohmann::json& state) override;

  const std::string& best_model_path() const { return best_path_; }
  const std::string& last_model_path() const { return last_path_; }
  // The monitored score of best_model_path (nullopt without a monitor or before a save).
  std::optional<double> best_model_score() const;
  // Kept checkpoints and their scores (Lightning's best_k_models).
  const std::map<std::string, double>& best_k_models() const { return kept_; }
  // Whether the top-k checkpoints are written at the training epoch's end
  // rather than after validation, in `trainer`'s fit (Lightning's rule).
  bool saves_on_train_epoch_end(const Trainer& trainer) const;
  // Expands "{epoch}", "{step}" and "{metric}" placeholders (metric values with
  // 4 decimals, a metric not logged as 0), with Python's format specs of the
  // forms "{epoch:02d}" and "{val_loss:.2f}"; with auto_insert_metric_name each
  // is preceded by "<name>=", as Lightning's (so "epoch={epoch}" gives "epoch=epoch=3" there too).
  static std::string format_filename(const std::string& pattern, int64_t epoch, int64_t step,
                                     const std::map<std::string, double>& metrics,
                                     bool auto_insert_metric_name = true);

 private:
  // Lightning's _should_skip_saving_checkpoint: fast_dev_run, outside fit, or this step already saved.
  bool skip_saving(const Trainer& trainer) const;
  // The top-k checkpoint when `top_k`, then last.safetensors (save_last).
  void save(Trainer& trainer, bool top_k);
  // dirpath, or <log dir>/checkpoints, as an absolute path without "..", "." or links.
  std::string folder(Trainer& trainer) const;
  ModelCheckpointOptions options_;
  int64_t every_n_train_steps_ = 0, every_n_epochs_ = 1;  // resolved as Lightning's __init_triggers
  std::map<std::string, double> kept_;  // path -> score
  std::string best_path_, last_path_;
  std::string dirpath_;  // the folder of the current (or last) fit, resolved at its start
  bool only_best_path_on_load_ = false;  // set by on_load_checkpoint for the load_state_dict that follows
  // Lightning's _last_global_step_saved starts at 0: nothing is saved before the first step.
  int64_t last_saved_step_ = 0;
  bool validated_ = false;  // a validation ran in this fit: a missing monitor is an error, not a skip
};

}  // namespace kiln
