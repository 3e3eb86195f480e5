// A Lightning-style Trainer: the training loop with Lightning's flags and
// defaults, validation cadence, accumulation, clipping, callbacks, CSV logs,
// a progress bar, and checkpoints that resume exactly. Manual optimization
// with several optimizers (train_module.h) and data-parallel training with
// strategy "ddp" (strategy.h: gradients synchronized on the last micro-batch
// of an accumulation, files written by rank 0, metrics averaged and stop
// decisions agreed over the ranks).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "data/dataloader.h"
#include "data/host_batch_holder.h"
#include "optim/grad_scaler.h"
#include "trainer/batches_or_fraction.h"
#include "trainer/callbacks.h"
#include "trainer/cuda_graph_step.h"
#include "trainer/checkpoint_io.h"
#include "trainer/csv_logger.h"
#include "trainer/profiler.h"
#include "trainer/progress_bar.h"
#include "trainer/strategy.h"
#include "trainer/train_module.h"
#include "trainer/training_curves.h"

namespace kiln {

struct TrainerOptions {
  // nullopt (Lightning's None): 1000, unless max_steps, max_time or a Timer
  // callback sets the limit; -1: no epoch limit.
  std::optional<int64_t> max_epochs;
  int64_t min_epochs = 0;
  int64_t max_steps = -1;
  int64_t min_steps = 0;
  std::string max_time;     // "DD:HH:MM:SS" or seconds; empty: no limit
  int64_t accumulate_grad_batches = 1;
  // From epoch e on (0-based), accumulate k batches. A GradientAccumulationScheduler
  // callback sets it (the Trainer refuses the two when they differ).
  std::map<int64_t, int64_t> accumulation_schedule;
  double gradient_clip_val = 0;  // 0: no clipping
  std::string gradient_clip_algorithm = "norm";  // "norm" or "value"
  // "32-true", "64-true", "bf16-true", "bf16-mixed" (or "bf16"; CPU and GPU)
  // and "16-mixed" (or "16"; GPU only). "bf16-true" is Lightning's: bfloat16
  // parameters, gradients and optimizer state, no float32 master copy;
  // "bf16-true-fp32-master" keeps float32 master weights and optimizer state
  // for the bfloat16 parameters (more memory; small updates are not lost to
  // rounding). The mixed precisions keep float32 parameters and run the steps
  // under autocast (core/autocast.h); "16-mixed" adds a GradScaler.
  std::string precision = "32-true";
  // Integers are numbers of batches, floating-point values fractions of an
  // epoch, as Lightning's int/float (batches_or_fraction.h): 1 validates
  // after every batch, 1.0 once per epoch.
  BatchesOrFraction val_check_interval = 1.0;
  // Validate every N epochs; nullopt (Lightning's None): by batches alone,
  // every val_check_interval batches counted across epochs (which must then be
  // a count, and may exceed an epoch).
  std::optional<int64_t> check_val_every_n_epoch = 1;
  BatchesOrFraction limit_train_batches = 1.0;  // 1.0: the whole epoch; 1: one batch
  BatchesOrFraction limit_val_batches = 1.0;
  BatchesOrFraction limit_test_batches = 1.0;
  int64_t num_sanity_val_steps = 2;  // -1: every validation batch
  int64_t log_every_n_steps = 50;
  // n > 0: n batches of train, val and test (max_steps=n, one validation at
  // the epoch's end, no sanity check), no checkpoints, logs or early stopping.
  int64_t fast_dev_run = 0;
  // > 0: train on the first batches only, the same ones every epoch (no
  // shuffling), and validate on those same training batches; a number of
  // batches or a fraction, as limit_*.
  BatchesOrFraction overfit_batches = 0.0;
  bool deterministic = false;
  bool benchmark = false;
  std::string accelerator = "auto";  // "cpu", "gpu", "auto"
  int devices = 1;    // devices (processes) per node
  int num_nodes = 1;
  // "auto" (one device; "ddp" when devices * num_nodes > 1), "ddp", or
  // "ddp_find_unused_parameters_true". With more than one process, start the
  // program with kiln-run (see trainer/strategy.h).
  std::string strategy = "auto";
  std::optional<uint64_t> seed;
  std::string default_root_dir = ".";
  // When a launcher restarted the workers (kiln-run --max-restarts sets
  // TORCHELASTIC_RESTART_COUNT > 0), fit() without a ckpt_path resumes from
  // the newest last.safetensors under default_root_dir/lightning_logs written
  // since the launcher started the run (KILN_RUN_START_TIME), and starts
  // afresh, saying so, when there is none (Lightning's resume of a requeued
  // job). Needs ModelCheckpoint(save_last=true). false: every round starts afresh.
  bool resume_on_restart = true;
  // The whole optimizer step as one CUDA graph, replayed for every batch after
  // kCudaGraphWarmupSteps eager steps; with accumulate_grad_batches > 1 two
  // graphs, a micro-batch without the optimizer and one with it
  // (trainer/cuda_graph_step.h). What cannot be captured falls back to eager
  // steps, saying why. Unset (the default): on when the fit runs on a GPU,
  // off on the CPU (every [gpu] test of it passed on an H200 at b59d5ed, and
  // FashionCNN 16-mixed ran 3.1x its eager steps). true on the CPU is refused;
  // false keeps every step eager.
  std::optional<bool> cuda_graph;
  bool enable_checkpointing = true;  // without a ModelCheckpoint among the callbacks: adds one (Lightning)
  bool enable_progress_bar = true;
  bool logger = true;  // false: no logging at all
  // Loggers to write to; empty (and logger true): one CSVLogger under default_root_dir.
  std::vector<std::shared_ptr<Logger>> loggers;
  // Called in this order, except that ModelCheckpoint callbacks go last (as
  // Lightning), so the checkpoints they write hold the other callbacks' states
  // after the same hook.
  std::vector<std::shared_ptr<Callback>> callbacks;
  // Lightning's profiler flag: "" (none), "simple" (time per hook and step,
  // Lightning's table at the end of each stage), "pytorch" (kiln's op
  // profiler: per-op calls, backward CPU and CUDA time; core/profiler.h).
  // A profiler object (e.g. SimpleProfiler with a dirpath and filename) in
  // profiler_instance wins over the name.
  std::string profiler;
  std::shared_ptr<Profiler> profiler_instance;
};

// Parses "DD:HH:MM:SS" or a number of seconds; throws kiln::Error otherwise.
std::chrono::seconds parse_max_time(const std::string& text);

// What Lightning's Trainer makes of its flags before running (trainer/setup.py,
// callback_connector.py): fast_dev_run=n sets max_steps=n and validates once
// at the epoch's end (val_check_interval 1.0, check_val_every_n_epoch 1,
// num_sanity_val_steps 0); a ModelCheckpoint with enable_checkpointing=false
// is refused, and enable_checkpointing without one adds ModelCheckpoint().
// Throws kiln::Error for a refused combination.
void resolve_trainer_flags(TrainerOptions& options);

class Trainer {
 public:
  // Throws kiln::Error naming the flag for an invalid value (e.g. a precision
  // the device cannot do, accelerator "gpu" without a GPU, devices > 1
  // without kiln-run, a GradientAccumulationScheduler callback together with
  // accumulate_grad_batches or another accumulation_schedule).
  explicit Trainer(TrainerOptions options);

  // Trains. ckpt_path: a checkpoint file, or "last" for the newest
  // last.safetensors under the log dir; resumes exactly where it was written:
  // mid-epoch, or at an epoch's end without repeating the hooks that ran
  // before it was written. Callbacks see their saved state in on_load_checkpoint
  // before the optimizer and schedule states load (callbacks.h). A checkpoint
  // that does not load is a kiln::Error naming the file and the part, and
  // leaves the model, the progress, the callbacks and the loader as they were.
  // With "ddp", every rank calls it: the loaders get a DistributedSampler when
  // they have no sampler of their own.
  void fit(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader = nullptr,
           const std::string& ckpt_path = "");
  // Runs one pass in eval mode without gradients and returns the epoch metrics
  // (averaged over the ranks with "ddp"). Calls the callbacks'
  // on_validation_start/end (on_test_start/end), as predict calls on_predict_start/end.
  std::map<std::string, double> validate(TrainModule& module, DataLoader& loader);
  std::map<std::string, double> test(TrainModule& module, DataLoader& loader);
  // Predictions of this process for every batch of `loader` (not split over ranks).
  std::vector<Tensor> predict(TrainModule& module, DataLoader& loader);

  // Writes a checkpoint of everything fit needs to resume (atomic). With
  // "ddp" every rank must call it: rank 0 writes, then all wait for it.
  void save_checkpoint(const std::string& path);

  const TrainerOptions& options() const { return options_; }
  Device device() const { return device_; }
  // The parameters' dtype under options().precision (float32 in the mixed
  // precisions, whose master weights are float32; bfloat16 under bf16-true).
  DType param_dtype() const { return param_dtype_; }
  int64_t current_epoch() const { return epoch_; }
  // Optimizer steps taken (manual optimization: every OptimizerHandle::step()).
  int64_t global_step() const { return global_step_; }
  // Whether the batch training_step is running on is the last of the epoch.
  bool is_last_batch() const { return is_last_batch_; }
  // Set by callbacks (or the module) to end fit; with "ddp" one rank's request stops every rank.
  bool should_stop = false;
  std::string stop_reason;
  // The latest value of every logged metric (epoch values after an epoch).
  const std::map<std::string, double>& callback_metrics() const { return callback_metrics_; }
  // The latest values of the metrics logged with prog_bar=true, as the progress bar shows them
  // (Lightning's progress_bar_metrics): step values at each log_every_n_steps, epoch values at the epoch's end.
  const std::map<std::string, double>& progress_bar_metrics() const { return progress_bar_.metrics(); }
  // Sets one (LearningRateMonitor's values, as Lightning's callback_metrics.update).
  void set_callback_metric(const std::string& name, double value) { callback_metrics_[name] = value; }
  // Whether fit() is running (Lightning's trainer.state.fn == "fit"): callbacks
  // that act on validation (checkpoints, early stopping) do nothing in validate().
  bool fitting() const { return fitting_; }
  // Optimizer steps fit will take (for OneCycleLR's total_steps); -1 when
  // nothing limits them (max_epochs=-1 and max_steps=-1).
  int64_t estimated_stepping_batches(const DataLoader& train_loader) const;
  // The epochs fit runs at most, -1 for no limit: max_epochs with Lightning's
  // default for None (1000 unless max_steps, max_time or a Timer callback
  // limits the run), 1 under fast_dev_run.
  int64_t max_epochs() const;
  // <default_root_dir>/lightning_logs/version_N (made on first use; with
  // "ddp" rank 0's folder, shared with the other ranks when fit starts).
  std::string log_dir();
  // The checkpoint the current fit resumed from (resolved: "last" becomes its
  // path), empty when it started afresh (Lightning's trainer.ckpt_path).
  const std::string& ckpt_path() const { return ckpt_path_; }
  // <log dir>/training_curves.svg: the run's loss, accuracy and learning-rate
  // curves (training_curves.h), written when fit ends and with every
  // checkpoint; empty where this process writes no logs (logging off, fast_dev_run, rank > 0).
  std::string training_curves_path() const;
  // The first logger (null when logging is off, and on every rank but 0); log_dir() is its folder.
  Logger* logger() { return loggers_.empty() ? nullptr : loggers_.front().get(); }
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }
  // The optimizers and schedules from configure_optimizers (valid during
  // fit); without an index, the first.
  int64_t num_optimizers() const { return static_cast<int64_t>(optimizers_.size()); }
  optim::Optimizer& optimizer(size_t index = 0);
  optim::LRScheduler* lr_scheduler(size_t index = 0);
  // When optimizer `index`'s schedule steps: "step" or "epoch" (throws
  // kiln::Error for an index configure_optimizers did not return).
  const std::string& lr_scheduler_interval(size_t index = 0) const;
  // Replaces the first optimizer's schedule (StochasticWeightAveraging swaps in SWALR).
  void set_lr_scheduler(std::unique_ptr<optim::LRScheduler> scheduler, const std::string& interval);
  // The loader fit is training on (null outside fit) and its batches per
  // epoch. With "ddp" or overfit_batches it is the trainer's copy of the
  // user's loader with another sampler.
  DataLoader* train_loader() { return train_loader_; }
  int64_t num_training_batches() const { return train_batches_; }
  // Batches each validation of fit runs (after limit_val_batches; 0 without a
  // validation loader), set when each training epoch starts.
  int64_t num_val_batches() const { return val_batches_; }
  // Makes the loader fit trains on (train_loader(); with overfit_batches also
  // the copy that validates on the same batches) yield batches of `batch_size`
  // and recomputes num_training_batches(), which the limits, the validation
  // cadence and the progress bar follow (BatchSizeFinder). The caller's loader
  // changes too unless fit trains on a copy (ddp, overfit_batches). Throws
  // kiln::Error outside fit or once the loader is inside an epoch: call it from
  // on_fit_start or on_load_checkpoint. Optimizers and schedules that
  // configure_optimizers built (a OneCycleLR total from estimated_stepping_batches)
  // are not rebuilt.
  void set_train_batch_size(int64_t batch_size);
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return options_.callbacks; }
  // The profiler (PassThroughProfiler when none was asked for); its scopes
  // are NVTX ranges in every case.
  Profiler& profiler() { return *profiler_; }
  // Gives `optimizer` the precision's state layout: under "bf16-true" no
  // float32 master weights and bfloat16 state (Optimizer::set_master_weights).
  // fit applies it to configure_optimizers' optimizers (a callback that makes
  // its own optimizer may too). Throws kiln::Error when the optimizer already holds state.
  void apply_precision(optim::Optimizer& optimizer) const;
  // The loss scaler of precision "16-mixed" (null for every other precision),
  // as Lightning's trainer.precision_plugin.scaler.
  optim::GradScaler* scaler() { return scaler_.get(); }
  const optim::GradScaler* scaler() const { return scaler_.get(); }
  // The autocast dtype of a mixed precision (nullopt otherwise), and its
  // region: the guard that training_step, validation_step, test_step and
  // predict_step run in (the finders' trial steps too); nothing for the other precisions.
  std::optional<DType> autocast_dtype() const { return autocast_dtype_; }
  std::optional<AutocastGuard> autocast_region() const;

  // --- data-parallel strategy (see trainer/strategy.h)
  const Strategy& strategy() const { return strategy_; }
  int global_rank() const { return strategy_.global_rank(); }
  int local_rank() const { return strategy_.local_rank(); }
  int world_size() const { return strategy_.world_size(); }
  bool is_global_zero() const { return strategy_.is_global_zero(); }
  // The DistributedDataParallel wrapping the model during fit (null unless "ddp" runs under kiln-run).
  nn::DistributedDataParallel* ddp() { return strategy_.ddp(); }
  // Waits for every rank (nothing with one process).
  void barrier() { strategy_.barrier(); }

 private:
  friend class OptimizerHandle;
  friend class TrainModule;

  void setup(TrainModule& module);
  void configure_optimizers(TrainModule& module);
  // `loader`, or a copy with a DistributedSampler (ddp, when it has no
  // sampler) or a sequential order (overfit) kept in `replacement`.
  DataLoader& prepare_loader(DataLoader& loader, bool overfit, std::unique_ptr<DataLoader>& replacement);
  void share_log_dir();
  void train_epoch(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader);
  std::map<std::string, double> evaluate(TrainModule& module, DataLoader& loader, const std::string& stage,
                                         int64_t limit_batches, bool log_metrics);
  void optimizer_step(TrainModule& module);
  // OptimizerHandle::step(): one manual step of optimizer `index`.
  void manual_optimizer_step(size_t index);
  // Completes a DDP gradient synchronization that a backward started.
  void finish_pending_gradient_sync();
  // Agrees the stop decisions of all ranks; returns whether the epoch must end now.
  bool agree_to_stop();
  // batch_to_module on this trainer's device in the parameters' dtype.
  Batch to_device(const Batch& batch) const;
  // A training micro-batch on the device: with cuda_graph past its warm-up,
  // copied from the host straight into the graphs' static buffers when it
  // fits them (the static batch is returned); else to_device(batch).
  Batch stage_training_batch(const Batch& batch, int64_t accumulate);
  // Keeps a batch whose pinned memory a non_blocking copy to the GPU may not
  // have read yet until the stream has run the copy (HostBatchHolder).
  void hold_host_batch(Batch&& host);
  int64_t limit(const BatchesOrFraction& value, int64_t available, std::string_view name) const;
  int64_t train_limit(int64_t available) const;
  int64_t val_limit(int64_t available) const;  // under limit_val_batches (overfit_batches aside)
  int64_t accumulation_for_epoch(int64_t epoch) const;
  void log_step_metrics(TrainModule& module);
  void log_to_loggers(const std::map<std::string, double>& metrics, int64_t step);
  void save_loggers();
  // With cuda_graph: runs the micro-batch through its graph (capturing or
  // replaying A or B) and returns true, or false when it runs eagerly (the
  // warm-up, a batch the graphs do not fit, given up).
  bool graphed_step(TrainModule& module, const Batch& moved, int64_t batch_idx, int64_t accumulate);
  // At the start of fit: graph_step_ when cuda_graph is on and nothing stands
  // in the way (cuda_graph_obstacle), else null, saying why once.
  void prepare_cuda_graph();
  // The step's region as the eager loop runs it: training_step, backward (the
  // loss scaled and divided by `accumulate`), the batch counters, and the
  // optimizer step when `step_now`.
  void run_step(TrainModule& module, const Batch& moved, int64_t batch_idx, int64_t accumulate, bool step_now);
  // Writes training_curves_path() (nothing without logs or values).
  void write_training_curves();
  std::map<std::string, double> collect_epoch_metrics(TrainModule& module, const std::string& prefix);
  // The training epoch's values logged so far (collect_epoch_metrics), written to the loggers.
  void log_epoch_metrics(TrainModule& module);
  // `requested` itself, or for "last" the newest last.safetensors under
  // default_root_dir/lightning_logs (kiln::Error when there is none).
  std::string resolve_checkpoint_path(const std::string& requested) const;
  // For a fit without ckpt_path: the checkpoint a restarted worker resumes
  // from (resume_on_restart), or empty. Rank 0 chooses; under ddp a collective.
  std::string checkpoint_after_restart();
  // Checks every part of `file` the Trainer reads (metrics, callback states),
  // then applies them in Lightning's order; a part that fails to apply (an
  // optimizer state, the loader's) undoes the parts applied before it.
  void load_checkpoint(const TrainerCheckpointFile& file, TrainModule& module, DataLoader& train_loader);
  std::vector<OptimizerSlot> optimizer_slots();
  // callback_metrics and the module's logged values of the epoch so far, exactly
  // (doubles as their bits), for checkpoints (load_checkpoint reads them back).
  nlohmann::json metrics_state();  // under ddp a collective (every rank calls it)
  bool time_exceeded() const;
  // Profiler action names, as Lightning's: "[LightningModule]<Module>.<hook>",
  // "[Strategy]<Strategy>.<hook>" (SingleDeviceStrategy or DDPStrategy).
  std::string module_action(const char* hook) const;
  std::string strategy_action(const char* hook) const;
  // Runs `hook` on every callback, each timed as "[Callback]<name>.<hook_name>";
  // with `monitoring`, only on those is_monitoring_callback says (or does not).
  void call_callbacks(const char* hook_name, const std::function<void(Callback&)>& hook,
                      std::optional<bool> monitoring = std::nullopt);
  bool minimum_done() const;
  // With a scaler: unscales `optimizer`'s gradients, once per step, before
  // callbacks and clipping look at them (Lightning's MixedPrecision plugin).
  void unscale_gradients(optim::Optimizer& optimizer);
  // The scaler's step (skipped on the device after inf/NaN) and update, or a plain step.
  void step_optimizer(optim::Optimizer& optimizer);

  TrainerOptions options_;
  Strategy strategy_;
  Device device_ = Device::cpu();
  DType param_dtype_ = DType::f32;               // float32 (master weights) in the mixed precisions too
  std::optional<DType> autocast_dtype_;           // "16-mixed": float16, "bf16-mixed": bfloat16
  std::unique_ptr<optim::GradScaler> scaler_;     // "16-mixed" only
  std::vector<const optim::Optimizer*> unscaled_;  // unscaled since the scaler's last update
  TrainModule* module_ = nullptr;
  DataLoader* train_loader_ = nullptr;
  std::unique_ptr<DataLoader> fit_train_loader_, fit_val_loader_, eval_loader_;  // sampler-replaced copies
  std::vector<OptimizerConfig> optimizers_;
  bool manual_ = false;  // the module's automatic_optimization is false
  int64_t epoch_ = 0;
  int64_t global_step_ = 0;
  int64_t batch_in_epoch_ = 0;
  int64_t total_batches_ = 0;  // batches trained over all epochs (Lightning's total_batch_idx + 1)
  // The current epoch's on_train_epoch_end hooks have run; its per-epoch
  // schedules step next. Checkpoints keep it, so a run resumed from one written
  // at the epoch's end neither repeats those hooks nor skips the step.
  bool epoch_end_hooks_done_ = false;
  // Set while on_train_batch_end runs for a batch after which a validation is
  // due (saved in checkpoints); a resumed fit validates first (train_epoch).
  bool validation_pending_ = false;
  bool fitting_ = false;
  int64_t train_batches_ = 0;
  int64_t val_batches_ = 0;
  bool is_last_batch_ = false;
  std::map<std::string, double> callback_metrics_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  std::string log_dir_;
  std::string ckpt_path_;  // ckpt_path()
  bool log_dir_shared_ = false;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::seconds> max_time_;
  ProgressBar progress_bar_;
  HostBatchHolder host_batches_;  // pinned batches until their copies to the GPU have run
  std::unique_ptr<CudaGraphStep> graph_step_;  // this fit's, with cuda_graph and nothing in the way
  TrainingCurves curves_;  // what the loggers got this fit, for training_curves_path()
  std::shared_ptr<Profiler> profiler_;
  std::string module_name_;  // the TrainModule's class name, for profiler actions
};

}  // namespace kiln
