#include "trainer/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/cuda/runtime.h"
#include "optim/clip_grad.h"
#include "trainer/checkpoint_io.h"

namespace kiln {

namespace fs = std::filesystem;

std::chrono::seconds parse_max_time(const std::string& text) {
  int64_t parts[4] = {0, 0, 0, 0};
  int count = 0;
  std::string current;
  for (char c : text + ":") {
    if (c == ':') {
      KILN_CHECK(!current.empty() && count < 4, "max_time: expected \"DD:HH:MM:SS\" or seconds, got '", text, "'");
      parts[count++] = std::stoll(current);
      current.clear();
    } else {
      KILN_CHECK(std::isdigit(static_cast<unsigned char>(c)), "max_time: expected \"DD:HH:MM:SS\" or seconds, got '",
                 text, "'");
      current += c;
    }
  }
  if (count == 1) return std::chrono::seconds(parts[0]);
  KILN_CHECK(count == 4, "max_time: expected \"DD:HH:MM:SS\" or seconds, got '", text, "'");
  return std::chrono::seconds(((parts[0] * 24 + parts[1]) * 60 + parts[2]) * 60 + parts[3]);
}

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  KILN_CHECK(o.accumulate_grad_batches >= 1, "Trainer: accumulate_grad_batches must be >= 1, got ",
             o.accumulate_grad_batches);
  KILN_CHECK(o.gradient_clip_val >= 0, "Trainer: gradient_clip_val must be >= 0, got ", o.gradient_clip_val);
  KILN_CHECK(o.gradient_clip_algorithm == "norm" || o.gradient_clip_algorithm == "value",
             "Trainer: gradient_clip_algorithm must be \"norm\" or \"value\", got '", o.gradient_clip_algorithm, "'");
  KILN_CHECK(o.val_check_interval > 0, "Trainer: val_check_interval must be positive, got ", o.val_check_interval);
  KILN_CHECK(o.check_val_every_n_epoch >= 1, "Trainer: check_val_every_n_epoch must be >= 1");
  KILN_CHECK(o.log_every_n_steps >= 1, "Trainer: log_every_n_steps must be >= 1");
  KILN_CHECK(o.limit_train_batches >= 0 && o.limit_val_batches >= 0 && o.limit_test_batches >= 0,
             "Trainer: limit_*_batches must be >= 0");
  KILN_CHECK(o.devices == 1, "Trainer: devices=", o.devices,
             " needs the \"ddp\" strategy, which is not available yet; use devices=1");
  for (const auto& [epoch, k] : o.accumulation_schedule) {
    KILN_CHECK(epoch >= 0 && k >= 1, "GradientAccumulationScheduler: invalid entry {", epoch, ": ", k, "}");
  }
  // Device.
  if (o.accelerator == "cpu") {
    device_ = Device::cpu();
  } else if (o.accelerator == "gpu" || o.accelerator == "cuda") {
    KILN_CHECK(cuda::is_available(), "Trainer: accelerator \"", o.accelerator, "\" but no GPU is available",
               cuda::compiled_with_cuda() ? "" : " (kiln was built without CUDA)");
    device_ = Device::cuda(0);
  } else {
    KILN_CHECK(o.accelerator == "auto", "Trainer: accelerator must be \"cpu\", \"gpu\" or \"auto\", got '",
               o.accelerator, "'");
    device_ = cuda::is_available() ? Device::cuda(0) : Device::cpu();
  }
  // Precision.
  if (o.precision == "32-true" || o.precision == "32") {
    param_dtype_ = DType::f32;
  } else if (o.precision == "64-true" || o.precision == "64") {
    param_dtype_ = DType::f64;
  } else if (o.precision == "bf16-true") {
    param_dtype_ = DType::bf16;
  } else if (o.precision == "16-mixed") {
    KILN_CHECK(device_.is_cuda(), "Trainer: precision \"16-mixed\" needs a GPU (fp16 on the CPU is slow and "
                                  "inexact); use \"bf16-mixed\" or \"32-true\" on the CPU");
    KILN_THROW("Trainer: precision \"16-mixed\" is not available yet (autocast is not written)");
  } else if (o.precision == "bf16-mixed") {
    KILN_THROW("Trainer: precision \"bf16-mixed\" is not available yet (autocast is not written); use \"bf16-true\" "
               "or \"32-true\"");
  } else {
    KILN_THROW("Trainer: unknown precision '", o.precision,
               "' (expected 32-true, 64-true, bf16-true, 16-mixed or bf16-mixed)");
  }
  if (!o.max_time.empty()) max_time_ = parse_max_time(o.max_time);
}

std::string Trainer::log_dir() {
  if (log_dir_.empty()) {
    if (options_.logger && options_.fast_dev_run == 0) {
      logger_ = std::make_unique<CSVLogger>(options_.default_root_dir);
      log_dir_ = logger_->log_dir();
    } else {
      log_dir_ = options_.default_root_dir;
    }
  }
  return log_dir_;
}

int64_t Trainer::limit(double value, int64_t available) const {
  if (options_.fast_dev_run > 0) return std::min<int64_t>(options_.fast_dev_run, available);
  if (value > 1.0) return std::min<int64_t>(static_cast<int64_t>(value), available);
  return static_cast<int64_t>(std::floor(value * static_cast<double>(available)));
}

int64_t Trainer::accumulation_for_epoch(int64_t epoch) const {
  int64_t k = options_.accumulate_grad_batches;
  for (const auto& [from, value] : options_.accumulation_schedule) {
    if (epoch >= from) k = value;
  }
  return k;
}

int64_t Trainer::estimated_stepping_batches(const DataLoader& train_loader) const {
  const int64_t batches = limit(options_.limit_train_batches, train_loader.size());
  int64_t max_epochs = options_.max_epochs;
  if (options_.fast_dev_run > 0) max_epochs = 1;
  if (max_epochs < 0) max_epochs = options_.max_steps < 0 ? 1000 : -1;
  if (max_epochs < 0) return options_.max_steps;
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < max_epochs; ++epoch) {
    const int64_t k = accumulation_for_epoch(epoch);
    steps += (batches + k - 1) / k;
  }
  return options_.max_steps >= 0 ? std::min(steps, options_.max_steps) : steps;
}

bool Trainer::time_exceeded() const {
  return max_time_ && std::chrono::steady_clock::now() - start_ >= *max_time_;
}

Batch Trainer::to_device(const Batch& batch) const {
  Batch moved;
  const DType input_dtype = is_floating(batch.input.dtype()) ? param_dtype_ : batch.input.dtype();
  moved.input = batch.input.to(device_, input_dtype, /*non_blocking=*/true);
  moved.target = batch.target.to(device_, is_floating(batch.target.dtype()) ? batch.target.dtype() : DType::i64,
                                 /*non_blocking=*/true);
  return moved;
}

void Trainer::setup(TrainModule& module) {
  if (options_.seed) manual_seed(*options_.seed);
  set_deterministic_algorithms(options_.deterministic);
  if (device_.is_cuda()) set_cudnn_benchmark(options_.benchmark);
  module.trainer_ = this;
  module_ = &module;
  module.model().to(device_, param_dtype_);
}

void Trainer::log_step_metrics(TrainModule& module) {
  std::map<std::string, double> row;
  for (const std::string& name : module.order_) {
    LoggedValue& value = module.logged_[name];
    if (!value.on_step || !value.last.defined()) continue;
    const std::string key = value.on_epoch ? name + "_step" : name;
    row[key] = value.last.item<double>();
    callback_metrics_[key] = row[key];
  }
  if (!row.empty() && logger_) logger_->log_metrics(row, global_step_ - 1, epoch_);
  pending_progress_ = row;
}

std::map<std::string, double> Trainer::collect_epoch_metrics(TrainModule& module, const std::string& prefix) {
  std::map<std::string, double> epoch_metrics;
  for (const std::string& name : module.order_) {
    LoggedValue& value = module.logged_[name];
    if (!value.on_epoch || value.count == 0) continue;
    const std::string key = value.on_step ? name + "_epoch" : name;
    epoch_metrics[prefix + key] = value.sum.item<double>() / static_cast<double>(value.count);
  }
  module.logged_.clear();
  module.order_.clear();
  for (const auto& [key, value] : epoch_metrics) callback_metrics_[key] = value;
  return epoch_metrics;
}

void Trainer::optimizer_step(TrainModule&) {
  optim::Optimizer& optimizer = *optim_.optimizer;
  if (options_.gradient_clip_val > 0) {
    if (options_.gradient_clip_algorithm == "norm") {
      optimizer.clip_grad_norm_(options_.gradient_clip_val);  // applied by step(), on the device
    } else {
      optim::clip_grad_value_(optimizer.params_with_grad(), options_.gradient_clip_val);
    }
  }
  optimizer.step();
  optimizer.zero_grad(true);
  if (optim_.scheduler && optim_.interval == "step") optim_.scheduler->step();
  ++global_step_;
}

std::map<std::string, double> Trainer::evaluate(TrainModule& module, DataLoader& loader, const std::string& stage,
                                                int64_t limit_batches, bool log_metrics) {
  nn::Module& model = module.model();
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  module.stage_ = stage;
  // An evaluation pass always starts at the first batch of its loader.
  loader.set_epoch(loader.epoch());
  int64_t index = 0;
  while (index < limit_batches) {
    std::optional<Batch> batch = loader.next();
    if (!batch) break;
    Batch moved = to_device(*batch);
    if (stage == "test") {
      module.test_step(moved, index);
    } else {
      module.validation_step(moved, index);
    }
    ++index;
  }
  std::map<std::string, double> metrics = collect_epoch_metrics(module, "");
  module.stage_ = "train";
  if (was_training) model.train();
  if (log_metrics && logger_ && !metrics.empty()) {
    logger_->log_metrics(metrics, std::max<int64_t>(global_step_ - 1, 0), epoch_);
    logger_->save();
  }
  return metrics;
}

void Trainer::train_epoch(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader) {
  const int64_t accumulate = accumulation_for_epoch(epoch_);
  const bool validate_this_epoch = val_loader != nullptr && (epoch_ + 1) % options_.check_val_every_n_epoch == 0;
  const int64_t val_batches = val_loader ? limit(options_.limit_val_batches, val_loader->size()) : 0;
  int64_t val_every = train_batches_;
  if (options_.val_check_interval > 1.0) {
    val_every = static_cast<int64_t>(options_.val_check_interval);
  } else {
    val_every = std::max<int64_t>(1, static_cast<int64_t>(std::round(options_.val_check_interval * train_batches_)));
  }
  const bool terminal = options_.enable_progress_bar && ::isatty(STDERR_FILENO);
  const auto epoch_start = std::chrono::steady_clock::now();
  for (auto& callback : options_.callbacks) callback->on_train_epoch_start(*this, module);
  module.on_train_epoch_start();
  module.model().train();

  while (batch_in_epoch_ < train_batches_) {
    if (options_.max_steps >= 0 && global_step_ >= options_.max_steps) {
      should_stop = true;
      stop_reason = "max_steps=" + std::to_string(options_.max_steps) + " reached";
      break;
    }
    std::optional<Batch> batch = train_loader.next();
    if (!batch) break;
    const int64_t batch_idx = batch_in_epoch_;
    Batch moved = to_device(*batch);
    module.stage_ = "train";
    Tensor loss = module.training_step(moved, batch_idx);
    KILN_CHECK(loss.defined() && loss.numel() == 1, "training_step must return a one-element loss tensor");
    const bool last_batch = batch_idx + 1 == train_batches_;
    // As Lightning: each micro-batch's loss is divided by the accumulation
    // factor, so k micro-batches of a mean loss equal one batch k times larger.
    (accumulate > 1 ? div(loss, static_cast<double>(accumulate)) : loss).backward();
    ++batch_in_epoch_;
    const bool step_now = (batch_idx + 1) % accumulate == 0 || last_batch;
    if (step_now) {
      optimizer_step(module);
      if (global_step_ % options_.log_every_n_steps == 0) log_step_metrics(module);
      for (auto& callback : options_.callbacks) callback->on_train_batch_end(*this, module, batch_idx);
    }
    if (options_.enable_progress_bar && (terminal || step_now)) {
      const bool refresh = terminal || batch_in_epoch_ % std::max<int64_t>(1, train_batches_ / 10) == 0 || last_batch;
      if (refresh && pending_progress_) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
        const double rate = static_cast<double>(batch_in_epoch_) / std::max(seconds, 1e-9);
        const double eta = static_cast<double>(train_batches_ - batch_in_epoch_) / std::max(rate, 1e-9);
        std::fprintf(stderr, "%sEpoch %lld: %lld/%lld [%.1f it/s, eta %.0fs]", terminal ? "\r" : "",
                     static_cast<long long>(epoch_), static_cast<long long>(batch_in_epoch_),
                     static_cast<long long>(train_batches_), rate, eta);
        for (const auto& [key, value] : *pending_progress_) std::fprintf(stderr, " %s=%.4f", key.c_str(), value);
        std::fprintf(stderr, terminal ? "   " : "\n");
        std::fflush(stderr);
      }
    }
    if (validate_this_epoch && batch_in_epoch_ % val_every == 0 &&
        (batch_in_epoch_ < train_batches_ || options_.val_check_interval <= 1.0)) {
      evaluate(module, *val_loader, "validate", val_batches, true);
      for (auto& callback : options_.callbacks) callback->on_validation_end(*this, module);
      module.on_validation_epoch_end();
      module.model().train();
    }
    if (options_.max_steps >= 0 && global_step_ >= options_.max_steps) {
      should_stop = true;
      stop_reason = "max_steps=" + std::to_string(options_.max_steps) + " reached";
      break;
    }
    if (time_exceeded()) {
      should_stop = true;
      stop_reason = "max_time reached";
      break;
    }
  }
  if (terminal) std::fprintf(stderr, "\n");
  std::map<std::string, double> train_metrics = collect_epoch_metrics(module, "");
  if (logger_ && !train_metrics.empty()) logger_->log_metrics(train_metrics, global_step_ - 1, epoch_);
  if (batch_in_epoch_ >= train_batches_) {  // not when a limit stopped the epoch midway
    module.on_train_epoch_end();
    for (auto& callback : options_.callbacks) callback->on_train_epoch_end(*this, module);
    if (optim_.scheduler && optim_.interval == "epoch") optim_.scheduler->step_unconditionally();
  }
  if (logger_) logger_->save();
}

void Trainer::fit(TrainModule& module, DataLoader& train_loader, DataLoader* val_loader,
                  const std::string& ckpt_path) {
  start_ = std::chrono::steady_clock::now();
  setup(module);
  train_loader_ = &train_loader;
  optim_ = module.configure_optimizers();
  KILN_CHECK(optim_.optimizer != nullptr, "configure_optimizers returned no optimizer");
  KILN_CHECK(optim_.interval == "step" || optim_.interval == "epoch", "configure_optimizers: interval must be "
                                                                         "\"step\" or \"epoch\", got '",
             optim_.interval, "'");
  if (options_.fast_dev_run == 0 && options_.logger) {
    log_dir();
    logger_->log_hyperparams({{"max_epochs", std::to_string(options_.max_epochs)},
                              {"max_steps", std::to_string(options_.max_steps)},
                              {"accumulate_grad_batches", std::to_string(options_.accumulate_grad_batches)},
                              {"gradient_clip_val", std::to_string(options_.gradient_clip_val)},
                              {"precision", options_.precision},
                              {"accelerator", device_.str()},
                              {"batch_size", std::to_string(train_loader.options().batch_size)},
                              {"optimizer", optim_.optimizer->name()},
                              {"scheduler", optim_.scheduler ? optim_.scheduler->name() : std::string("none")}});
  }
  if (!ckpt_path.empty()) load_checkpoint(ckpt_path, module, train_loader);
  train_batches_ = limit(options_.limit_train_batches, train_loader.size());
  int64_t max_epochs = options_.max_epochs;
  if (options_.fast_dev_run > 0) max_epochs = 1;
  if (max_epochs < 0 && options_.max_steps < 0) max_epochs = 1000;
  for (auto& callback : options_.callbacks) callback->on_fit_start(*this, module);
  module.on_fit_start();
  if (val_loader && options_.num_sanity_val_steps > 0 && ckpt_path.empty() && options_.fast_dev_run == 0) {
    evaluate(module, *val_loader, "validate", std::min(options_.num_sanity_val_steps, val_loader->size()), false);
    callback_metrics_.clear();
  }
  should_stop = false;
  while (max_epochs < 0 || epoch_ < max_epochs) {
    // A resumed run continues its epoch where the loader stopped.
    if (batch_in_epoch_ == 0) train_loader.set_epoch(static_cast<uint64_t>(epoch_));
    train_epoch(module, train_loader, val_loader);
    const bool epoch_done = batch_in_epoch_ >= train_batches_;
    const bool minimum_done = epoch_ + 1 >= options_.min_epochs && global_step_ >= options_.min_steps;
    if (epoch_done) {
      ++epoch_;
      batch_in_epoch_ = 0;
    }
    const bool hard_limit = stop_reason.rfind("max_", 0) == 0;
    if (should_stop && (minimum_done || hard_limit)) break;
    should_stop = false;
    stop_reason.clear();
  }
  for (auto& callback : options_.callbacks) callback->on_fit_end(*this, module);
  module.on_fit_end();
  if (logger_) logger_->save();
}

std::map<std::string, double> Trainer::validate(TrainModule& module, DataLoader& loader) {
  if (module_ != &module) setup(module);
  return evaluate(module, loader, "validate", limit(options_.limit_val_batches, loader.size()), true);
}

std::map<std::string, double> Trainer::test(TrainModule& module, DataLoader& loader) {
  if (module_ != &module) setup(module);
  if (options_.fast_dev_run == 0 && options_.logger) log_dir();
  return evaluate(module, loader, "test", limit(options_.limit_test_batches, loader.size()), true);
}

std::vector<Tensor> Trainer::predict(TrainModule& module, DataLoader& loader) {
  if (module_ != &module) setup(module);
  nn::Module& model = module.model();
  model.eval();
  NoGradGuard no_grad;
  loader.set_epoch(loader.epoch());
  std::vector<Tensor> predictions;
  int64_t index = 0;
  while (std::optional<Batch> batch = loader.next()) predictions.push_back(module.predict_step(to_device(*batch), index++));
  return predictions;
}

void Trainer::save_checkpoint(const std::string& path) {
  KILN_CHECK(module_ != nullptr && optim_.optimizer != nullptr, "save_checkpoint: nothing to save before fit()");
  TrainerCheckpoint checkpoint;
  checkpoint.epoch = epoch_;
  checkpoint.global_step = global_step_;
  checkpoint.batch_in_epoch = batch_in_epoch_;
  checkpoint.loader_state = train_loader_ ? train_loader_->state_dict() : nlohmann::json();
  for (auto& callback : options_.callbacks) checkpoint.callback_states[callback->name()] = callback->state_dict();
  save_trainer_checkpoint(path, module_->model(), *optim_.optimizer, optim_.scheduler.get(), checkpoint);
}

void Trainer::load_checkpoint(const std::string& requested, TrainModule& module, DataLoader& train_loader) {
  std::string path = requested;
  if (path == "last") {
    path.clear();
    const fs::path base = fs::path(options_.default_root_dir) / "lightning_logs";
    fs::file_time_type newest{};
    if (fs::exists(base)) {
      for (const auto& entry : fs::recursive_directory_iterator(base)) {
        if (entry.path().filename() == "last.safetensors" && (path.empty() || entry.last_write_time() > newest)) {
          path = entry.path().string();
          newest = entry.last_write_time();
        }
      }
    }
    KILN_CHECK(!path.empty(), "fit(ckpt_path=\"last\"): no last.safetensors under '", base.string(), "'");
  }
  TrainerCheckpoint checkpoint =
      load_trainer_checkpoint(path, module.model(), *optim_.optimizer, optim_.scheduler.get());
  epoch_ = checkpoint.epoch;
  global_step_ = checkpoint.global_step;
  batch_in_epoch_ = checkpoint.batch_in_epoch;
  if (!checkpoint.loader_state.is_null()) train_loader.load_state_dict(checkpoint.loader_state);
  for (auto& callback : options_.callbacks) {
    auto it = checkpoint.callback_states.find(callback->name());
    if (it != checkpoint.callback_states.end()) callback->load_state_dict(it->second);
  }
}

}  // namespace kiln
