#include "trainer/trainer.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/cuda/runtime.h"
#include "trainer/accumulation_scheduler.h"
#include "trainer/timer.h"

namespace kiln {

namespace {
// The accumulation factor of `epoch` under `schedule` (1 before its first key).
int64_t scheduled_factor(const std::map<int64_t, int64_t>& schedule, int64_t epoch) {
  int64_t k = 1;
  for (const auto& [from, value] : schedule) {
    if (epoch >= from) k = value;
  }
  return k;
}

bool same_accumulation(const std::map<int64_t, int64_t>& a, const std::map<int64_t, int64_t>& b) {
  const int64_t last = std::max(a.empty() ? 0 : a.rbegin()->first, b.empty() ? 0 : b.rbegin()->first);
  for (int64_t epoch = 0; epoch <= last; ++epoch) {
    if (scheduled_factor(a, epoch) != scheduled_factor(b, epoch)) return false;
  }
  return true;
}

std::string describe_schedule(const std::map<int64_t, int64_t>& schedule) {
  std::string text = "{";
  for (const auto& [epoch, factor] : schedule) {
    text += (text.size() > 1 ? ", " : "") + std::to_string(epoch) + ": " + std::to_string(factor);
  }
  return text + "}";
}

// A GradientAccumulationScheduler callback becomes the Trainer's accumulation_schedule.
void adopt_accumulation_scheduler(TrainerOptions& options) {
  for (const auto& callback : options.callbacks) {
    const auto* scheduler = dynamic_cast<const GradientAccumulationScheduler*>(callback.get());
    if (scheduler == nullptr) continue;
    KILN_CHECK(options.accumulate_grad_batches == 1, "You set accumulate_grad_batches=",
               options.accumulate_grad_batches, " and are using the GradientAccumulationScheduler; remove one");
    KILN_CHECK(options.accumulation_schedule.empty() ||
                   same_accumulation(options.accumulation_schedule, scheduler->scheduling()),
               "GradientAccumulationScheduler: the Trainer was given accumulation_schedule ",
               describe_schedule(options.accumulation_schedule), " but this callback schedules ",
               describe_schedule(scheduler->scheduling()), "; remove one");
    options.accumulation_schedule = scheduler->scheduling();
  }
}
}  // namespace

Trainer::Trainer(TrainerOptions options)
    : options_(std::move(options)), strategy_(options_.strategy, options_.devices, options_.num_nodes) {
  const auto& o = options_;
  KILN_CHECK(o.accumulate_grad_batches >= 1, "Trainer: accumulate_grad_batches must be >= 1, got ",
             o.accumulate_grad_batches);
  // Lightning refuses the same values (-1 is its "no limit").
  KILN_CHECK(o.max_epochs.value_or(0) >= -1, "Trainer: max_epochs must be >= 0, -1 for no limit, or None, got ",
             o.max_epochs.value_or(0));
  KILN_CHECK(o.max_steps >= -1, "Trainer: max_steps must be >= 0, or -1 for no limit, got ", o.max_steps);
  KILN_CHECK(o.min_epochs >= 0, "Trainer: min_epochs must be >= 0, got ", o.min_epochs);
  KILN_CHECK(o.min_steps >= 0, "Trainer: min_steps must be >= 0, got ", o.min_steps);
  KILN_CHECK(o.fast_dev_run >= 0, "Trainer: fast_dev_run must be >= 0 (0: off, n: n batches), got ", o.fast_dev_run);
  KILN_CHECK(o.num_sanity_val_steps >= -1, "Trainer: num_sanity_val_steps must be >= 0, or -1 for every batch, got ",
             o.num_sanity_val_steps);
  KILN_CHECK(o.gradient_clip_val >= 0, "Trainer: gradient_clip_val must be >= 0, got ", o.gradient_clip_val);
  KILN_CHECK(o.gradient_clip_algorithm == "norm" || o.gradient_clip_algorithm == "value",
             "Trainer: gradient_clip_algorithm must be \"norm\" or \"value\", got '", o.gradient_clip_algorithm, "'");
  o.val_check_interval.check("val_check_interval");
  KILN_CHECK(o.val_check_interval.positive(), "Trainer: val_check_interval must be positive, got ",
             o.val_check_interval.to_string());
  KILN_CHECK(!o.check_val_every_n_epoch || *o.check_val_every_n_epoch >= 1,
             "Trainer: check_val_every_n_epoch must be >= 1 or None (nullopt), got ",
             o.check_val_every_n_epoch.value_or(0));
  KILN_CHECK(o.check_val_every_n_epoch || o.val_check_interval.is_count(), "Trainer: val_check_interval (",
             o.val_check_interval.to_string(), ") must be a number of batches when check_val_every_n_epoch is None");
  KILN_CHECK(o.log_every_n_steps >= 1, "Trainer: log_every_n_steps must be >= 1");
  o.limit_train_batches.check("limit_train_batches");
  o.limit_val_batches.check("limit_val_batches");
  o.limit_test_batches.check("limit_test_batches");
  o.overfit_batches.check("overfit_batches");
  for (const auto& [epoch, k] : o.accumulation_schedule) {
    KILN_CHECK(epoch >= 0 && k >= 1, "Trainer: accumulation_schedule: invalid entry {", epoch, ": ", k, "}");
  }
  for (size_t i = 0; i < o.callbacks.size(); ++i) {
    KILN_CHECK(o.callbacks[i] != nullptr, "Trainer: callback ", i, " of ", o.callbacks.size(), " is null");
  }
  for (size_t i = 0; i < o.loggers.size(); ++i) {
    KILN_CHECK(o.loggers[i] != nullptr, "Trainer: logger ", i, " of ", o.loggers.size(), " is null");
  }
  adopt_accumulation_scheduler(options_);
  resolve_trainer_flags(options_);  // after the checks: they judge the flags as given
  // Lightning's order: ModelCheckpoint callbacks last.
  std::stable_partition(options_.callbacks.begin(), options_.callbacks.end(), [](const auto& callback) {
    return dynamic_cast<const ModelCheckpoint*>(callback.get()) == nullptr;
  });
  // Device.
  if (o.accelerator == "cpu") {
    device_ = Device::cpu();
  } else if (o.accelerator == "gpu" || o.accelerator == "cuda") {
    KILN_CHECK(cuda::is_available(), "Trainer: accelerator \"", o.accelerator, "\" but no GPU is available",
               cuda::compiled_with_cuda() ? "" : " (kiln was built without CUDA)");
    device_ = Device::cuda(strategy_.local_rank());
  } else {
    KILN_CHECK(o.accelerator == "auto", "Trainer: accelerator must be \"cpu\", \"gpu\" or \"auto\", got '",
               o.accelerator, "'");
    device_ = cuda::is_available() ? Device::cuda(strategy_.local_rank()) : Device::cpu();
  }
  KILN_CHECK(!device_.is_cuda() || device_.index < cuda::device_count(), "Trainer: process LOCAL_RANK=",
             strategy_.local_rank(), " needs GPU ", device_.index, " but this machine has ", cuda::device_count(),
             " (one process per GPU: --nproc-per-node must not exceed the GPUs)");
  // Precision.
  if (o.precision == "32-true" || o.precision == "32") {
    param_dtype_ = DType::f32;
  } else if (o.precision == "64-true" || o.precision == "64") {
    param_dtype_ = DType::f64;
  } else if (o.precision == "bf16-true" || o.precision == "bf16-true-fp32-master") {
    // bf16-true: bf16 parameters and optimizer state (apply_precision); the
    // other keeps fp32 master weights and state in the optimizers.
    param_dtype_ = DType::bf16;
  } else if (o.precision == "16-mixed" || o.precision == "16") {
    KILN_CHECK(device_.is_cuda(), "Trainer: precision \"", o.precision, "\" needs a GPU (fp16 on the CPU is slow "
               "and inexact); use \"bf16-mixed\" or \"32-true\" on the CPU");
    // float32 master weights (param_dtype_), float16 matmuls and convolutions
    // under autocast, and loss scaling so that small float16 gradients survive.
    autocast_dtype_ = DType::f16;
    scaler_ = std::make_unique<optim::GradScaler>();
  } else if (o.precision == "bf16-mixed" || o.precision == "bf16") {
    autocast_dtype_ = DType::bf16;  // bfloat16 has float32's range: no loss scaling (as Lightning)
  } else {
    KILN_THROW("Trainer: unknown precision '", o.precision,
               "' (expected 32-true, 64-true, bf16-true, bf16-true-fp32-master, 16-mixed or bf16-mixed)");
  }
  if (!o.max_time.empty()) max_time_ = parse_max_time(o.max_time);
  KILN_CHECK(!o.cuda_graph.value_or(false) || device_.is_cuda(),
             "Trainer: cuda_graph=true needs a GPU, and this fit runs on the CPU (accelerator \"", o.accelerator,
             "\"): CUDA graphs record GPU work. Set cuda_graph=false (--cuda-graph false) or train on a GPU");
  profiler_ = o.profiler_instance ? o.profiler_instance : make_profiler(o.profiler, device_);
  if (auto* op_level = dynamic_cast<PyTorchProfiler*>(profiler_.get())) op_level->set_device(device_);
}

std::string Trainer::module_action(const char* hook) const {
  return "[LightningModule]" + module_name_ + "." + hook;
}

std::string Trainer::strategy_action(const char* hook) const {
  return std::string(strategy_.name() == "ddp" ? "[Strategy]DDPStrategy." : "[Strategy]SingleDeviceStrategy.") + hook;
}

void Trainer::call_callbacks(const char* hook_name, const std::function<void(Callback&)>& hook,
                             std::optional<bool> monitoring) {
  for (auto& callback : options_.callbacks) {
    if (monitoring && is_monitoring_callback(*callback) != *monitoring) continue;
    auto scope = profiler_->profile("[Callback]" + callback->name() + "." + hook_name);
    hook(*callback);
  }
}

std::string Trainer::log_dir() {
  if (log_dir_.empty()) {
    if (!options_.logger || options_.fast_dev_run > 0) {
      log_dir_ = options_.default_root_dir;
    } else if (is_global_zero()) {
      loggers_ = options_.loggers;
      if (loggers_.empty()) loggers_.push_back(std::make_shared<CSVLogger>(options_.default_root_dir));
      log_dir_ = loggers_.front()->log_dir();
    } else {
      return options_.default_root_dir;  // rank 0's folder arrives with share_log_dir()
    }
  }
  return log_dir_;
}

void Trainer::share_log_dir() {
  if (log_dir_shared_) return;
  log_dir_shared_ = true;  // the same on every rank, so every rank takes part in the broadcast below
  if (!options_.logger || options_.fast_dev_run > 0) return;
  if (!strategy_.distributed()) {
    log_dir();
    return;
  }
  // Only rank 0 makes loggers (a new version_N folder); the others learn its folder.
  const std::string dir = is_global_zero() ? log_dir() : std::string();
  log_dir_ = strategy_.broadcast_string(dir);
}

int64_t Trainer::limit(const BatchesOrFraction& value, int64_t available, std::string_view name) const {
  if (options_.fast_dev_run > 0) return std::min<int64_t>(options_.fast_dev_run, available);
  return value.of(available, name);
}

int64_t Trainer::train_limit(int64_t available) const {
  if (options_.overfit_batches.positive() && options_.fast_dev_run == 0) {
    return limit(options_.overfit_batches, available, "overfit_batches");
  }
  return limit(options_.limit_train_batches, available, "limit_train_batches");
}

int64_t Trainer::val_limit(int64_t available) const {
  return limit(options_.limit_val_batches, available, "limit_val_batches");
}

int64_t Trainer::accumulation_for_epoch(int64_t epoch) const {
  int64_t k = options_.accumulate_grad_batches;
  for (const auto& [from, value] : options_.accumulation_schedule) {
    if (epoch >= from) k = value;
  }
  return k;
}

int64_t Trainer::estimated_stepping_batches(const DataLoader& train_loader) const {
  int64_t available = train_loader.size();
  if (strategy_.distributed() && (train_loader.options().sampler == nullptr || options_.overfit_batches.positive())) {
    // The batches of this rank's DistributedSampler share (fit inserts one).
    const int64_t world = strategy_.world_size(), batch = train_loader.options().batch_size;
    const int64_t samples = (train_loader.dataset().size() + world - 1) / world;
    available = train_loader.options().drop_last ? samples / batch : (samples + batch - 1) / batch;
  }
  const int64_t batches = train_limit(available);
  const int64_t epochs = max_epochs();
  if (epochs < 0) return options_.max_steps;
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    const int64_t k = accumulation_for_epoch(epoch);
    steps += (batches + k - 1) / k;
  }
  return options_.max_steps >= 0 ? std::min(steps, options_.max_steps) : steps;
}

int64_t Trainer::max_epochs() const {
  if (options_.fast_dev_run > 0) return 1;
  if (options_.max_epochs) return *options_.max_epochs;
  const bool timed = !options_.max_time.empty() ||
                     std::any_of(options_.callbacks.begin(), options_.callbacks.end(),
                                 [](const auto& callback) { return dynamic_cast<const Timer*>(callback.get()); });
  return options_.max_steps == -1 && !timed ? 1000 : -1;
}

bool Trainer::time_exceeded() const {
  return max_time_ && std::chrono::steady_clock::now() - start_ >= *max_time_;
}

bool Trainer::minimum_done() const {
  // Mid-epoch: the epochs already finished count (Lightning's _can_stop_early).
  return epoch_ >= options_.min_epochs && global_step_ >= options_.min_steps;
}

Batch Trainer::to_device(const Batch& batch) const { return batch_to_module(batch, device_, param_dtype_); }

Batch Trainer::stage_training_batch(const Batch& batch, int64_t accumulate) {
  CudaGraphStep* graph = graph_step_.get();
  if (graph != nullptr && !manual_ &&
      graph->fits_static(batch, module_input_dtype(batch, param_dtype_), module_target_dtype(batch, param_dtype_),
                         accumulate)) {
    graph->load_from_host(batch);
    return graph->static_batch();
  }
  return to_device(batch);
}

void Trainer::hold_host_batch(Batch&& host) {
  if (device_.is_cuda()) host_batches_.hold_until_done(std::move(host), device_.index, cuda::current_stream(device_.index));
}

void Trainer::setup(TrainModule& module) {
  if (options_.seed) manual_seed(*options_.seed);
  set_deterministic_algorithms(options_.deterministic);
  if (device_.is_cuda()) {
    cuda::set_device(device_.index);
    set_cudnn_benchmark(options_.benchmark);
  }
  strategy_.setup_environment();
  module.trainer_ = this;
  module_ = &module;
  module_name_ = class_name(typeid(module));
  module.model().to(device_, param_dtype_);
}

void Trainer::configure_optimizers(TrainModule& module) {
  optimizers_ = std::move(module.configure_optimizers().configs);
  KILN_CHECK(!optimizers_.empty(), "configure_optimizers returned no optimizer");
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    const OptimizerConfig& config = optimizers_[i];
    KILN_CHECK(config.optimizer != nullptr, "configure_optimizers: optimizer ", i, " is null");
    KILN_CHECK(config.interval == "step" || config.interval == "epoch", "configure_optimizers: interval must be "
               "\"step\" or \"epoch\", got '", config.interval, "' (optimizer ", i, ")");
    KILN_CHECK(config.scheduler == nullptr || &config.scheduler->optimizer() == config.optimizer.get(),
               "configure_optimizers: the schedule of optimizer ", i, " drives another optimizer");
    apply_precision(*config.optimizer);
  }
  KILN_CHECK(manual_ || optimizers_.size() == 1, "configure_optimizers returned ", optimizers_.size(),
             " optimizers: training with several optimizers is only supported with manual optimization (as in "
             "Lightning). Set automatic_optimization = false in the module's constructor and step each optimizer "
             "in training_step: auto [opt_a, opt_b] = optimizers<2>(); manual_backward(loss); opt_a.step(); ...");
}

void Trainer::log_step_metrics(TrainModule& module) {
  std::map<std::string, double> row;
  std::vector<std::string> prog_bar;
  for (const std::string& name : module.order_) {
    LoggedValue& value = module.logged_[name];
    if (!value.on_step || !value.last.defined()) continue;
    const std::string key = value.on_epoch ? name + "_step" : name;
    row[key] = value.last.item<double>();
    if (value.prog_bar) prog_bar.push_back(key);
  }
  if (strategy_.distributed()) {  // the mean over the ranks, so every rank decides alike
    std::vector<std::string> names;
    std::vector<double> values;
    for (const auto& [key, value] : row) names.push_back(key), values.push_back(value);
    values = strategy_.sum_over_ranks(names, values);
    for (size_t i = 0; i < names.size(); ++i) row[names[i]] = values[i] / strategy_.world_size();
  }
  for (const auto& [key, value] : row) callback_metrics_[key] = value;
  if (!row.empty()) log_to_loggers(row, global_step_ - 1);
  for (const std::string& key : prog_bar) progress_bar_.set_metrics({{key, row[key]}});
}

std::map<std::string, double> Trainer::collect_epoch_metrics(TrainModule& module, const std::string& prefix) {
  std::map<std::string, std::pair<double, double>> sums;  // name -> (weighted sum, count)
  std::vector<std::string> prog_bar;
  for (const std::string& name : module.order_) {
    LoggedValue& value = module.logged_[name];
    // Under ddp a value restored with a zero share (load_checkpoint) still
    // takes part: every rank must sum the same names.
    if (!value.on_epoch || (value.count == 0 && !strategy_.distributed())) continue;
    const std::string key = prefix + (value.on_step ? name + "_epoch" : name);
    sums[key] = {value.sum.item<double>(), static_cast<double>(value.count)};
    if (value.prog_bar) prog_bar.push_back(key);
  }
  module.logged_.clear();
  module.order_.clear();
  if (strategy_.distributed()) {  // weighted by every rank's counts: the mean over the global batch
    std::vector<std::string> names;
    std::vector<double> values;
    for (const auto& [key, sum_count] : sums) names.push_back(key), values.push_back(sum_count.first);
    for (const auto& [key, sum_count] : sums) values.push_back(sum_count.second);
    values = strategy_.sum_over_ranks(names, values);
    for (size_t i = 0; i < names.size(); ++i) sums[names[i]] = {values[i], values[names.size() + i]};
  }
  std::map<std::string, double> epoch_metrics;
  for (const auto& [key, sum_count] : sums) epoch_metrics[key] = sum_count.first / sum_count.second;
  for (const auto& [key, value] : epoch_metrics) callback_metrics_[key] = value;
  for (const std::string& key : prog_bar) progress_bar_.set_metrics({{key, epoch_metrics[key]}});
  return epoch_metrics;
}

void Trainer::log_epoch_metrics(TrainModule& module) {
  const std::map<std::string, double> metrics = collect_epoch_metrics(module, "");
  if (!metrics.empty()) log_to_loggers(metrics, global_step_ - 1);
}

std::map<std::string, double> Trainer::evaluate(TrainModule& module, DataLoader& loader, const std::string& stage,
                                                int64_t limit_batches, bool log_metrics) {
  nn::Module& model = module.model();
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  module.stage_ = stage;
  // The training epoch's logged values wait aside (a validation in the middle
  // of an epoch neither reports nor resets them).
  std::map<std::string, LoggedValue> training_logged = std::move(module.logged_);
  std::vector<std::string> training_order = std::move(module.order_);
  module.logged_.clear();
  module.order_.clear();
  // An evaluation pass always starts at the first batch of its loader.
  loader.set_epoch(loader.epoch());
  int64_t index = 0;
  const std::string next_action = stage == "test" ? "[_EvaluationLoop].test_next" : "[_EvaluationLoop].val_next";
  const std::string step_action = strategy_action(stage == "test" ? "test_step" : "validation_step");
  while (index < limit_batches) {
    std::optional<Batch> batch;
    {
      auto next_scope = profiler_->profile(next_action);
      batch = loader.next();
    }
    if (!batch) break;
    Batch moved;
    {
      auto to_device_scope = profiler_->profile(strategy_action("batch_to_device"));
      moved = to_device(*batch);
      hold_host_batch(std::move(*batch));
    }
    auto step_scope = profiler_->profile(step_action);
    const auto autocast = autocast_region();
    if (stage == "test") {
      module.test_step(moved, index);
    } else {
      module.validation_step(moved, index);
    }
    ++index;
  }
  host_batches_.release_all();
  if (stage != "test") {
    // Lightning's order: on_validation_epoch_end, then the epoch's metrics
    // (what it logs included), then on_validation_end (in the callers).
    auto hook_scope = profiler_->profile(module_action("on_validation_epoch_end"));
    module.on_validation_epoch_end();
  }
  std::map<std::string, double> metrics = collect_epoch_metrics(module, "");
  module.logged_ = std::move(training_logged);
  module.order_ = std::move(training_order);
  module.stage_ = "train";
  if (was_training) model.train();
  if (log_metrics && !metrics.empty()) {
    log_to_loggers(metrics, std::max<int64_t>(global_step_ - 1, 0));
    save_loggers();
  }
  return metrics;
}

bool Trainer::agree_to_stop() {
  bool out_of_time = time_exceeded();
  if (strategy_.distributed()) {  // one rank's request stops every rank at this same batch
    const std::vector<bool> any = strategy_.reduce_any({should_stop, out_of_time});
    if (any[0] && !should_stop) {
      should_stop = true;
      stop_reason = "another rank requested the stop";
    }
    out_of_time = any[1];
  }
  if (options_.max_steps >= 0 && global_step_ >= options_.max_steps) {
    should_stop = true;
    stop_reason = "max_steps=" + std::to_string(options_.max_steps) + " reached";
    return true;
  }
  if (out_of_time) {
    should_stop = true;
    stop_reason = "max_time reached";
    return true;
  }
  return should_stop && minimum_done();
}

void Trainer::train_epoch(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader) {
  const int64_t accumulate = manual_ ? 1 : accumulation_for_epoch(epoch_);
  int64_t val_batches = 0;
  if (val_loader) {
    val_batches = options_.overfit_batches.positive() ? train_limit(val_loader->size()) : val_limit(val_loader->size());
  }
  val_batches_ = val_batches;
  // As Lightning: limit_val_batches=0 turns validation (and its callbacks) off.
  const bool validate_this_epoch =
      val_batches > 0 &&
      (!options_.check_val_every_n_epoch || (epoch_ + 1) % *options_.check_val_every_n_epoch == 0);
  // As Lightning's val_check_batch: a count as given, a fraction of the
  // epoch's batches rounded down (at least 1).
  int64_t val_every = 0;
  if (options_.val_check_interval.is_count()) {
    val_every = static_cast<int64_t>(options_.val_check_interval.value());
    // As Lightning's FitLoop.setup_data: refused with or without validation.
    KILN_CHECK(!options_.check_val_every_n_epoch || val_every <= train_batches_, "Trainer: val_check_interval (",
               val_every, ") must be less than or equal to the number of the training batches (", train_batches_,
               "). If you want to disable validation set limit_val_batches to 0.0 instead. If you want to validate "
               "based on the total training batches, set check_val_every_n_epoch=None");
  } else {
    val_every = std::max<int64_t>(
        1, static_cast<int64_t>(options_.val_check_interval.value() * static_cast<double>(train_batches_)));
  }
  const int64_t log_every = options_.log_every_n_steps;
  progress_bar_.start_epoch(epoch_, train_batches_, batch_in_epoch_);
  // A run resumed from a checkpoint written after the epoch's last batch only finishes the epoch.
  if (batch_in_epoch_ == 0 || batch_in_epoch_ < train_batches_) {
    call_callbacks("on_train_epoch_start", [&](Callback& c) { c.on_train_epoch_start(*this, module); });
    auto hook_scope = profiler_->profile(module_action("on_train_epoch_start"));
    module.on_train_epoch_start();
  }
  module.model().train();
  auto validate = [&] {
    validation_pending_ = false;
    call_callbacks("on_validation_start", [&](Callback& c) { c.on_validation_start(*this, module); });
    evaluate(module, *val_loader, "validate", val_batches, true);  // on_validation_epoch_end included
    call_callbacks("on_validation_end", [&](Callback& c) { c.on_validation_end(*this, module); });
    module.model().train();
  };
  // Resumed from a checkpoint written between a batch and the validation due after it.
  if (validation_pending_ && validate_this_epoch) validate();
  validation_pending_ = false;

  while (batch_in_epoch_ < train_batches_) {
    if (options_.max_steps >= 0 && global_step_ >= options_.max_steps) {
      should_stop = true;
      stop_reason = "max_steps=" + std::to_string(options_.max_steps) + " reached";
      break;
    }
    std::optional<Batch> batch;
    {
      auto next_scope = profiler_->profile("[_TrainingEpochLoop].train_dataloader_next");
      batch = train_loader.next();
    }
    if (!batch) break;
    const int64_t batch_idx = batch_in_epoch_;
    Batch moved;
    {
      auto to_device_scope = profiler_->profile(strategy_action("batch_to_device"));
      moved = stage_training_batch(*batch, accumulate);
      hold_host_batch(std::move(*batch));
    }
    // Lightning's run_training_batch: the batch-start hooks, training_step, backward, the optimizer step.
    std::optional<Profiler::Scope> batch_scope;
    batch_scope.emplace(*profiler_, "run_training_batch");
    call_callbacks("on_train_batch_start", [&](Callback& c) { c.on_train_batch_start(*this, module, batch_idx); });
    module.stage_ = "train";
    is_last_batch_ = batch_idx + 1 == train_batches_;
    // Manual optimization decides itself when to step (and to sync, through toggle_model).
    const bool step_now = manual_ || (batch_idx + 1) % accumulate == 0 || is_last_batch_;
    if (nn::DistributedDataParallel* ddp = strategy_.ddp()) {
      // As Lightning, whose DDP forward runs training_step: rank 0's buffers
      // (BatchNorm statistics) first, once per step, whichever way the module
      // calls its model; gradients synchronized only in the backward of the
      // last micro-batch of an accumulation.
      if (ddp->options().broadcast_buffers) ddp->sync_buffers();
      ddp->set_require_backward_grad_sync(step_now);
    }
    const int64_t steps_before = global_step_;
    if (!graphed_step(module, moved, batch_idx, accumulate)) {
      run_step(module, moved, batch_idx, accumulate, step_now);
    }
    batch_scope.reset();
    is_last_batch_ = false;
    // Every log_every_n_steps optimizer steps (manual optimization may take several per batch).
    const bool stepped = global_step_ != steps_before;
    if (stepped && global_step_ / log_every != steps_before / log_every) log_step_metrics(module);
    // As Lightning's _should_check_val_fx: every val_every batches of the epoch,
    // the last batch included when it is a multiple (always, for fractions);
    // with check_val_every_n_epoch None, every val_every batches of the run.
    const int64_t batches_counted = options_.check_val_every_n_epoch ? batch_in_epoch_ : total_batches_;
    const bool validation_due = validate_this_epoch && batches_counted % val_every == 0;
    validation_pending_ = validation_due;  // a checkpoint written by these hooks records it
    call_callbacks("on_train_batch_end", [&](Callback& c) { c.on_train_batch_end(*this, module, batch_idx); });
    validation_pending_ = false;
    progress_bar_.batch_end(batch_in_epoch_);
    // As Lightning's _should_check_val_fx: a stop request (max_steps aside) validates first.
    bool stop = agree_to_stop();
    if (validation_due || (stop && validate_this_epoch && stop_reason.rfind("max_steps", 0) != 0)) {
      validate();
      stop = agree_to_stop();
    }
    if (stop) break;
  }
  host_batches_.release_all();  // the loader's pinned buffers back before its next epoch
  progress_bar_.end_epoch();
  log_epoch_metrics(module);
  if (batch_in_epoch_ >= train_batches_) {  // not when a limit stopped the epoch midway
    if (!epoch_end_hooks_done_) {  // a checkpoint written by these hooks resumes after them
      epoch_end_hooks_done_ = true;
      // Lightning's order: the other callbacks, the module, then EarlyStopping
      // and ModelCheckpoint, which so see the epoch values the module's hook logs.
      const auto epoch_end = [&](Callback& c) { c.on_train_epoch_end(*this, module); };
      call_callbacks("on_train_epoch_end", epoch_end, /*monitoring=*/false);
      {
        auto hook_scope = profiler_->profile(module_action("on_train_epoch_end"));
        module.stage_ = "train_epoch_end";  // log() defaults to on_epoch there
        module.on_train_epoch_end();
        module.stage_ = "train";
      }
      log_epoch_metrics(module);  // what the module's hook logged
      call_callbacks("on_train_epoch_end", epoch_end, /*monitoring=*/true);
    }
    for (OptimizerConfig& config : optimizers_) {
      // Manual optimization steps its schedules itself (Lightning).
      if (!manual_ && config.scheduler && config.interval == "epoch") config.scheduler->step_unconditionally();
    }
  }
  save_loggers();
}

void Trainer::run_step(TrainModule& module, const Batch& moved, int64_t batch_idx, int64_t accumulate,
                       bool step_now) {
  Tensor loss;
  {
    auto step_scope = profiler_->profile(strategy_action("training_step"));
    const auto autocast = autocast_region();  // backward runs outside it (core/autocast.h)
    loss = module.training_step(moved, batch_idx);
  }
  if (!manual_) {
    KILN_CHECK(loss.defined() && loss.numel() == 1, "training_step must return a one-element loss tensor");
    auto backward_scope = profiler_->profile(strategy_action("backward"));
    // As Lightning: each micro-batch's loss is divided by the accumulation
    // factor, so k micro-batches of a mean loss equal one batch k times larger.
    const Tensor micro_batch_loss = accumulate > 1 ? div(loss, static_cast<double>(accumulate)) : loss;
    (scaler_ ? scaler_->scale(micro_batch_loss) : micro_batch_loss).backward();
  }
  ++batch_in_epoch_;
  ++total_batches_;
  if (!manual_ && step_now) optimizer_step(module);
}

DataLoader& Trainer::prepare_loader(DataLoader& loader, bool overfit, std::unique_ptr<DataLoader>& replacement) {
  replacement.reset();
  const DataLoaderOptions& given = loader.options();
  const bool needs_sampler = strategy_.distributed() && given.sampler == nullptr;
  if (!overfit && !needs_sampler) return loader;
  const int64_t n = loader.dataset().size();
  std::shared_ptr<const Sampler> sampler;
  if (strategy_.distributed()) {
    // As Lightning: the loader's own shuffling carries over; overfitting never shuffles.
    sampler = std::make_shared<DistributedSampler>(n, strategy_.world_size(), strategy_.global_rank(),
                                                   given.shuffle && !overfit, given.seed);
  } else {
    sampler = std::make_shared<SequentialSampler>(n);
  }
  DataLoaderOptions options = given;
  options.sampler = std::move(sampler);
  options.shuffle = false;
  // Non-owning: the caller's loader keeps its data set alive for the whole run.
  std::shared_ptr<const Dataset> dataset(std::shared_ptr<const Dataset>(), &loader.dataset());
  replacement = std::make_unique<DataLoader>(std::move(dataset), std::move(options));
  return *replacement;
}

void Trainer::set_train_batch_size(int64_t batch_size) {
  KILN_CHECK(fitting_ && train_loader_ != nullptr,
             "Trainer::set_train_batch_size: only during fit (from a callback's on_fit_start or on_load_checkpoint)");
  train_loader_->set_batch_size(batch_size);  // refuses inside an epoch
  // Overfitting validates on the very batches it trains on.
  if (options_.overfit_batches.positive() && fit_val_loader_) fit_val_loader_->set_batch_size(batch_size);
  train_batches_ = train_limit(train_loader_->size());
}

void Trainer::fit(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader,
                  const std::string& ckpt_path) {
  start_ = std::chrono::steady_clock::now();
  struct Fitting {  // fitting_ ends with fit, thrown errors included
    explicit Fitting(bool& flag) : flag(flag) { flag = true; }
    ~Fitting() { flag = false; }
    Fitting(const Fitting&) = delete;
    Fitting& operator=(const Fitting&) = delete;
    bool& flag;
  } fitting_scope(fitting_);
  setup(module);
  progress_bar_.reset(options_.enable_progress_bar && is_global_zero());
  curves_.clear();
  manual_ = !module.automatic_optimization;
  if (manual_) {
    bool accumulates = options_.accumulate_grad_batches != 1;
    for (const auto& [epoch, k] : options_.accumulation_schedule) accumulates = accumulates || k != 1;
    KILN_CHECK(!accumulates, "Trainer: automatic gradient accumulation is not supported for manual optimization. "
               "Remove accumulate_grad_batches (and the accumulation schedule) or switch to automatic "
               "optimization; accumulate in training_step instead");
    KILN_CHECK(options_.gradient_clip_val == 0, "Trainer: automatic gradient clipping is not supported for manual "
               "optimization. Remove gradient_clip_val or switch to automatic optimization; call "
               "clip_gradients(optimizer, ...) in training_step instead");
  }
  // Before the optimizers exist (DDP makes every rank start from rank 0's
  // weights). Manual optimization freezes parameters by design (toggle_model),
  // so those may go without a gradient in a step.
  strategy_.wrap_model(module.model(), /*find_unused_parameters=*/manual_);
  configure_optimizers(module);
  prepare_cuda_graph();
  const bool overfit = options_.overfit_batches.positive();
  DataLoader& train = prepare_loader(train_loader, overfit, fit_train_loader_);
  DataLoader* val = nullptr;
  if (val_loader != nullptr) {
    // Overfitting validates on the very batches it trains on.
    val = &prepare_loader(overfit ? train_loader : *val_loader, overfit, fit_val_loader_);
  } else {
    fit_val_loader_.reset();  // a previous fit's
  }
  train_loader_ = &train;
  // Read and checked before the logger makes its version folder: a missing,
  // truncated or mismatched checkpoint fails having touched nothing.
  std::optional<TrainerCheckpointFile> resumed;
  ckpt_path_.clear();
  const std::string requested = ckpt_path.empty() ? checkpoint_after_restart() : ckpt_path;
  if (!requested.empty()) {
    resumed = read_trainer_checkpoint(resolve_checkpoint_path(requested), module.model(), optimizers_.size());
    ckpt_path_ = resumed->path;
  }
  share_log_dir();
  ProfilerStage profiled(*profiler_, "fit", log_dir_.empty() ? options_.default_root_dir : log_dir_);
  if (resumed) load_checkpoint(*resumed, module, train);
  train_batches_ = train_limit(train.size());
  // A file from before total_batches was saved: exact when every epoch had this many batches.
  if (resumed && total_batches_ < 0) {
    const bool overflow = __builtin_mul_overflow(epoch_, train_batches_, &total_batches_) ||
                          __builtin_add_overflow(total_batches_, batch_in_epoch_, &total_batches_);
    KILN_CHECK(!overflow, "load checkpoint '", resumed->path, "': epoch ", epoch_, " of ", train_batches_,
               " batches overflows the batch count (a corrupt checkpoint)");
  }
  const int64_t max_epochs = this->max_epochs();
  {
    // A callback's trial steps here (LearningRateFinder's sweep) log through
    // training_step: those values must not reach the first epoch's averages.
    // What a resumed checkpoint restored is kept.
    std::map<std::string, LoggedValue> resumed_logged = std::move(module.logged_);
    std::vector<std::string> resumed_order = std::move(module.order_);
    call_callbacks("on_fit_start", [&](Callback& c) { c.on_fit_start(*this, module); });
    module.logged_ = std::move(resumed_logged);
    module.order_ = std::move(resumed_order);
  }
  {
    auto hook_scope = profiler_->profile(module_action("on_fit_start"));
    module.on_fit_start();
  }
  // After on_fit_start, as Lightning: the batch size a BatchSizeFinder chose is the one logged.
  if (options_.fast_dev_run == 0 && options_.logger) {
    std::string optimizer_names, scheduler_names;
    for (const OptimizerConfig& config : optimizers_) {
      optimizer_names += (optimizer_names.empty() ? "" : ",") + config.optimizer->name();
      scheduler_names += (scheduler_names.empty() ? "" : ",") +
                         (config.scheduler ? config.scheduler->name() : std::string("none"));
    }
    for (auto& logger : loggers_) {
      logger->log_hyperparams({{"max_epochs", options_.max_epochs ? std::to_string(*options_.max_epochs) : "None"},
                               {"max_steps", std::to_string(options_.max_steps)},
                               {"accumulate_grad_batches", std::to_string(options_.accumulate_grad_batches)},
                               {"gradient_clip_val", std::to_string(options_.gradient_clip_val)},
                               {"precision", options_.precision},
                               {"accelerator", device_.str()},
                               {"strategy", strategy_.name()},
                               {"world_size", std::to_string(strategy_.world_size())},
                               {"batch_size", std::to_string(train.options().batch_size)},
                               {"optimizer", optimizer_names},
                               {"scheduler", scheduler_names}});
    }
  }
  // -1: every validation batch (Lightning).
  const int64_t sanity_batches =
      !val ? 0
           : options_.num_sanity_val_steps < 0 ? val_limit(val->size())
                                               : std::min(options_.num_sanity_val_steps, val_limit(val->size()));
  if (sanity_batches > 0 && !resumed && options_.fast_dev_run == 0) {
    evaluate(module, *val, "validate", sanity_batches, false);
    callback_metrics_.clear();
    progress_bar_.clear_metrics();
  }
  should_stop = false;
  // As Lightning's FitLoop.skip: without training batches (limit_train_batches=0) no training hooks or epochs.
  const bool trains = train_batches_ > 0;
  if (trains) call_callbacks("on_train_start", [&](Callback& c) { c.on_train_start(*this, module); });
  while (trains && (max_epochs < 0 || epoch_ < max_epochs)) {
    // A resumed run continues its epoch where the loader stopped.
    if (batch_in_epoch_ == 0) train.set_epoch(static_cast<uint64_t>(epoch_));
    {
      auto epoch_scope = profiler_->profile("run_training_epoch");
      train_epoch(module, train, val);
    }
    // Epoch-end callbacks may have asked one rank to stop: every rank follows.
    if (strategy_.distributed() && strategy_.reduce_any({should_stop})[0] && !should_stop) {
      should_stop = true;
      stop_reason = "another rank requested the stop";
    }
    const bool epoch_done = batch_in_epoch_ >= train_batches_;
    const bool minimum = epoch_ + 1 >= options_.min_epochs && global_step_ >= options_.min_steps;
    if (epoch_done) {
      ++epoch_;
      batch_in_epoch_ = 0;
      epoch_end_hooks_done_ = false;
    }
    const bool hard_limit = stop_reason.rfind("max_", 0) == 0;
    // Otherwise a request stays (Lightning never clears should_stop): training
    // stops as soon as min_epochs and min_steps are met, mid-epoch included.
    if (should_stop && (minimum || hard_limit)) break;
  }
  if (trains) call_callbacks("on_train_end", [&](Callback& c) { c.on_train_end(*this, module); });
  call_callbacks("on_fit_end", [&](Callback& c) { c.on_fit_end(*this, module); });
  {
    auto hook_scope = profiler_->profile(module_action("on_fit_end"));
    module.on_fit_end();
  }
  if (graph_step_ && graph_step_->keeps_gradients() && !graph_step_->window_open()) {
    // As an eager fit leaves them after its last step: None (kept, they hold -0.0).
    for (OptimizerConfig& config : optimizers_) config.optimizer->zero_grad(true);
  }
  graph_step_.reset();  // the graphs' memory pools go with it
  save_loggers();
  write_training_curves();
  profiled.finish(/*report=*/is_global_zero());  // Lightning prints the report when fit ends
  strategy_.release_model();
  strategy_.barrier();  // rank 0's files are complete when fit returns anywhere
}

std::map<std::string, double> Trainer::validate(TrainModule& module, DataLoader& loader) {
  if (module_ != &module) setup(module);
  share_log_dir();
  DataLoader& eval = prepare_loader(loader, false, eval_loader_);
  ProfilerStage profiled(*profiler_, "validate", log_dir_.empty() ? options_.default_root_dir : log_dir_);
  call_callbacks("on_validation_start", [&](Callback& c) { c.on_validation_start(*this, module); });
  std::map<std::string, double> metrics =
      evaluate(module, eval, "validate", val_limit(eval.size()), true);
  call_callbacks("on_validation_end", [&](Callback& c) { c.on_validation_end(*this, module); });
  profiled.finish(/*report=*/is_global_zero());
  return metrics;
}

std::map<std::string, double> Trainer::test(TrainModule& module, DataLoader& loader) {
  if (module_ != &module) setup(module);
  share_log_dir();
  DataLoader& eval = prepare_loader(loader, false, eval_loader_);
  ProfilerStage profiled(*profiler_, "test", log_dir_.empty() ? options_.default_root_dir : log_dir_);
  call_callbacks("on_test_start", [&](Callback& c) { c.on_test_start(*this, module); });
  std::map<std::string, double> metrics =
      evaluate(module, eval, "test", limit(options_.limit_test_batches, eval.size(), "limit_test_batches"), true);
  call_callbacks("on_test_end", [&](Callback& c) { c.on_test_end(*this, module); });
  profiled.finish(/*report=*/is_global_zero());
  return metrics;
}

std::vector<Tensor> Trainer::predict(TrainModule& module, DataLoader& loader) {
  if (module_ != &module) setup(module);
  ProfilerStage profiled(*profiler_, "predict", log_dir_.empty() ? options_.default_root_dir : log_dir_);
  call_callbacks("on_predict_start", [&](Callback& c) { c.on_predict_start(*this, module); });
  nn::Module& model = module.model();
  model.eval();
  std::vector<Tensor> predictions;
  {
    NoGradGuard no_grad;
    loader.set_epoch(loader.epoch());
    int64_t index = 0;
    while (std::optional<Batch> batch = loader.next()) {
      auto step_scope = profiler_->profile(strategy_action("predict_step"));
      const auto autocast = autocast_region();
      Batch moved = to_device(*batch);
      hold_host_batch(std::move(*batch));
      predictions.push_back(module.predict_step(moved, index++));
    }
    host_batches_.release_all();
  }
  call_callbacks("on_predict_end", [&](Callback& c) { c.on_predict_end(*this, module); });
  profiled.finish(/*report=*/is_global_zero());
  return predictions;
}

}  // namespace kiln
