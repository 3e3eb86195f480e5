// A Lightning-style Trainer: the training loop with Lightning's flags and
// defaults, validation cadence, accumulation, clipping, callbacks, CSV logs,
// a progress bar, and checkpoints that resume exactly.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "trainer/callbacks.h"
#include "trainer/csv_logger.h"
#include "trainer/train_module.h"

namespace kiln {

struct TrainerOptions {
  int64_t max_epochs = -1;  // -1: 1000 when max_steps is -1 too (Lightning), else unlimited
  int64_t min_epochs = 0;
  int64_t max_steps = -1;
  int64_t min_steps = 0;
  std::string max_time;     // "DD:HH:MM:SS" or seconds; empty: no limit
  int64_t accumulate_grad_batches = 1;
  // GradientAccumulationScheduler: from epoch e on (0-based), accumulate k batches.
  std::map<int64_t, int64_t> accumulation_schedule;
  double gradient_clip_val = 0;  // 0: no clipping
  std::string gradient_clip_algorithm = "norm";  // "norm" or "value"
  std::string precision = "32-true";
  double val_check_interval = 1.0;  // <= 1: fraction of an epoch; > 1: every that many batches
  int64_t check_val_every_n_epoch = 1;
  double limit_train_batches = 1.0;  // <= 1: fraction; > 1: number of batches
  double limit_val_batches = 1.0;
  double limit_test_batches = 1.0;
  int64_t num_sanity_val_steps = 2;
  int64_t log_every_n_steps = 50;
  int64_t fast_dev_run = 0;  // n > 0: n batches of train, val and test, no checkpoints or logs
  bool deterministic = false;
  bool benchmark = false;
  std::string accelerator = "auto";  // "cpu", "gpu", "auto"
  int devices = 1;
  std::optional<uint64_t> seed;
  std::string default_root_dir = ".";
  bool enable_checkpointing = true;
  bool enable_progress_bar = true;
  bool logger = true;
  std::vector<std::shared_ptr<Callback>> callbacks;
};

// Parses "DD:HH:MM:SS" or a number of seconds; throws kiln::Error otherwise.
std::chrono::seconds parse_max_time(const std::string& text);

class Trainer {
 public:
  // Throws kiln::Error naming the flag for an invalid value (e.g. a precision
  // the device cannot do, accelerator "gpu" without a GPU).
  explicit Trainer(TrainerOptions options);

  // Trains. ckpt_path: a checkpoint file, or "last" for the newest
  // last.safetensors under the log dir; resumes exactly where it was written.
  void fit(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader = nullptr,
           const std::string& ckpt_path = "");
  // Runs one pass in eval mode without gradients and returns the epoch metrics.
  std::map<std::string, double> validate(TrainModule& module, DataLoader& loader);
  std::map<std::string, double> test(TrainModule& module, DataLoader& loader);
  std::vector<Tensor> predict(TrainModule& module, DataLoader& loader);

  // Writes a checkpoint of everything fit needs to resume (atomic).
  void save_checkpoint(const std::string& path);

  const TrainerOptions& options() const { return options_; }
  Device device() const { return device_; }
  int64_t current_epoch() const { return epoch_; }
  int64_t global_step() const { return global_step_; }
  bool should_stop = false;
  std::string stop_reason;
  // The latest value of every logged metric (epoch values after an epoch).
  const std::map<std::string, double>& callback_metrics() const { return callback_metrics_; }
  // Optimizer steps fit will take (for OneCycleLR's total_steps).
  int64_t estimated_stepping_batches(const DataLoader& train_loader) const;
  // <default_root_dir>/lightning_logs/version_N (made on first use).
  std::string log_dir();
  CSVLogger* logger() { return logger_.get(); }
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return options_.callbacks; }

 private:
  void setup(TrainModule& module);
  void train_epoch(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader);
  std::map<std::string, double> evaluate(TrainModule& module, DataLoader& loader, const std::string& stage,
                                         int64_t limit_batches, bool log_metrics);
  void optimizer_step(TrainModule& module);
  Batch to_device(const Batch& batch) const;
  int64_t limit(double value, int64_t available) const;
  int64_t accumulation_for_epoch(int64_t epoch) const;
  void log_step_metrics(TrainModule& module);
  std::map<std::string, double> collect_epoch_metrics(TrainModule& module, const std::string& prefix);
  void load_checkpoint(const std::string& path, TrainModule& module, DataLoader& train_loader);
  bool time_exceeded() const;

  TrainerOptions options_;
  Device device_ = Device::cpu();
  DType param_dtype_ = DType::f32;
  TrainModule* module_ = nullptr;
  DataLoader* train_loader_ = nullptr;
  OptimizerConfig optim_;
  int64_t epoch_ = 0;
  int64_t global_step_ = 0;
  int64_t batch_in_epoch_ = 0;
  int64_t train_batches_ = 0;
  int64_t micro_batches_ = 0;
  std::map<std::string, double> callback_metrics_;
  std::unique_ptr<CSVLogger> logger_;
  std::string log_dir_;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::seconds> max_time_;
  std::optional<std::map<std::string, double>> pending_progress_;
};

}  // namespace kiln
