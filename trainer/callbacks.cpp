#include "trainer/callbacks.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "kernels/error.h"
#include "trainer/trainer.h"

namespace kiln {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- EarlyStopping

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  KILN_CHECK(options_.mode == "min" || options_.mode == "max", "EarlyStopping: mode must be \"min\" or \"max\", got '",
             options_.mode, "'");
  KILN_CHECK(options_.patience >= 0, "EarlyStopping: patience must be >= 0");
  best_score_ = options_.mode == "min" ? INFINITY : -INFINITY;
}

bool EarlyStopping::update(double current, std::string* reason) {
  const bool minimize = options_.mode == "min";
  auto better = [minimize](double a, double b) { return minimize ? a < b : a > b; };
  const double delta = minimize ? -std::abs(options_.min_delta) : std::abs(options_.min_delta);
  char text[256];
  if (options_.check_finite && !std::isfinite(current)) {
    std::snprintf(text, sizeof text, "Monitored metric %s = %g is not finite. Previous best value was %.3f.",
                  options_.monitor.c_str(), current, best_score_);
    *reason = text;
    return true;
  }
  if (options_.stopping_threshold && better(current, *options_.stopping_threshold)) {
    std::snprintf(text, sizeof text, "Stopping threshold reached: %s = %g %s %g.", options_.monitor.c_str(), current,
                  minimize ? "<" : ">", *options_.stopping_threshold);
    *reason = text;
    return true;
  }
  if (options_.divergence_threshold && better(-current, -*options_.divergence_threshold)) {
    std::snprintf(text, sizeof text, "Divergence threshold reached: %s = %g %s %g.", options_.monitor.c_str(), current,
                  minimize ? ">" : "<", *options_.divergence_threshold);
    *reason = text;
    return true;
  }
  if (better(current - delta, best_score_)) {
    best_score_ = current;
    wait_count_ = 0;
    return false;
  }
  ++wait_count_;
  if (wait_count_ >= options_.patience) {
    std::snprintf(text, sizeof text, "Monitored metric %s did not improve in the last %d records. Best score: %.3f.",
                  options_.monitor.c_str(), wait_count_, best_score_);
    *reason = text;
    return true;
  }
  return false;
}

void EarlyStopping::check(Trainer& trainer) {
  const auto& metrics = trainer.callback_metrics();
  auto it = metrics.find(options_.monitor);
  if (it == metrics.end()) {
    KILN_CHECK(!options_.strict, "EarlyStopping: the monitored metric '", options_.monitor,
               "' was not logged (log it in validation_step, or set strict=false)");
    return;
  }
  std::string reason;
  if (update(it->second, &reason)) {
    trainer.should_stop = true;
    trainer.stop_reason = reason;
    stopped_epoch_ = trainer.current_epoch();
    std::cerr << "EarlyStopping: " << reason << " Signaling Trainer to stop.\n";
  }
}

void EarlyStopping::on_validation_end(Trainer& trainer, TrainModule&) {
  // Trainer::validate() outside fit decides nothing (as Lightning).
  if (!options_.check_on_train_epoch_end && trainer.fitting()) check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, TrainModule&) {
  if (options_.check_on_train_epoch_end) check(trainer);
}

nlohmann::json EarlyStopping::state_dict() const {
  return {{"wait_count", wait_count_}, {"best_score", best_score_}, {"stopped_epoch", stopped_epoch_},
          {"patience", options_.patience}};
}

void EarlyStopping::load_state_dict(const nlohmann::json& state) {
  wait_count_ = state.at("wait_count").get<int>();
  best_score_ = state.at("best_score").is_null() ? (options_.mode == "min" ? INFINITY : -INFINITY)
                                                  : state.at("best_score").get<double>();
  stopped_epoch_ = state.at("stopped_epoch").get<int64_t>();
}

// ---------------------------------------------------------------- ModelCheckpoint

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  KILN_CHECK(options_.mode == "min" || options_.mode == "max",
             "ModelCheckpoint: mode must be \"min\" or \"max\", got '", options_.mode, "'");
  KILN_CHECK(options_.save_top_k >= -1, "ModelCheckpoint: save_top_k must be >= -1");
  KILN_CHECK(options_.monitor.empty() ? options_.save_top_k <= 1 || options_.save_top_k == -1 : true,
             "ModelCheckpoint: save_top_k > 1 needs a monitored metric");
}

std::string ModelCheckpoint::format_filename(const std::string& pattern, int64_t epoch, int64_t step,
                                             const std::map<std::string, double>& metrics) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') {
      out += pattern[i];
      continue;
    }
    const size_t close = pattern.find('}', i);
    KILN_CHECK(close != std::string::npos, "ModelCheckpoint: unclosed '{' in filename '", pattern, "'");
    const std::string key = pattern.substr(i + 1, close - i - 1);
    if (key == "epoch") {
      out += std::to_string(epoch);
    } else if (key == "step") {
      out += std::to_string(step);
    } else {
      auto it = metrics.find(key);
      KILN_CHECK(it != metrics.end(), "ModelCheckpoint: filename '", pattern, "' uses metric '", key,
                 "' which was not logged");
      char value[64];
      std::snprintf(value, sizeof value, "%.4f", it->second);
      out += value;
    }
    i = close;
  }
  return out;
}

std::string ModelCheckpoint::folder(Trainer& trainer) const {
  return options_.dirpath.empty() ? (fs::path(trainer.log_dir()) / "checkpoints").string() : options_.dirpath;
}

void ModelCheckpoint::save(Trainer& trainer, TrainModule&) {
  if (!trainer.options().enable_checkpointing || trainer.options().fast_dev_run > 0) return;
  if (last_saved_step_ == trainer.global_step()) return;
  const std::string dir = folder(trainer);
  std::error_code error;
  fs::create_directories(dir, error);
  KILN_CHECK(!error, "ModelCheckpoint: cannot create '", dir, "': ", error.message());
  const auto& metrics = trainer.callback_metrics();
  last_saved_step_ = trainer.global_step();
  if (options_.save_top_k != 0) {
    const std::string path = (fs::path(dir) / (format_filename(options_.filename, trainer.current_epoch(),
                                                               trainer.global_step(), metrics) +
                                               ".safetensors"))
                                 .string();
    double score = 0;
    if (!options_.monitor.empty()) {
      auto it = metrics.find(options_.monitor);
      KILN_CHECK(it != metrics.end(), "ModelCheckpoint: the monitored metric '", options_.monitor, "' was not logged");
      score = it->second;
    }
    const bool minimize = options_.mode == "min";
    auto worse = [minimize](double a, double b) { return minimize ? a > b : a < b; };
    bool keep = options_.monitor.empty() || options_.save_top_k == -1 ||
                static_cast<int>(kept_.size()) < options_.save_top_k;
    std::string worst;
    for (const auto& [kept_path, kept_score] : kept_) {
      if (worst.empty() || worse(kept_score, kept_.at(worst))) worst = kept_path;
    }
    if (!keep && !worst.empty() && worse(kept_.at(worst), score)) keep = true;
    if (keep) {
      trainer.save_checkpoint(path);  // durable before anything is removed
      kept_[path] = score;
      if (options_.monitor.empty() && options_.save_top_k == 1) {
        for (auto it = kept_.begin(); it != kept_.end();) {
          if (it->first != path) {
            fs::remove(it->first, error);
            it = kept_.erase(it);
          } else {
            ++it;
          }
        }
      } else if (options_.save_top_k > 0 && static_cast<int>(kept_.size()) > options_.save_top_k) {
        fs::remove(worst, error);
        kept_.erase(worst);
      }
      best_path_.clear();
      for (const auto& [kept_path, kept_score] : kept_) {
        if (best_path_.empty() || worse(kept_.at(best_path_), kept_score)) best_path_ = kept_path;
      }
      if (options_.monitor.empty()) best_path_ = path;
    }
  }
  if (options_.save_last) {
    last_path_ = (fs::path(dir) / "last.safetensors").string();
    trainer.save_checkpoint(last_path_);
  }
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, TrainModule& module) {
  if (options_.every_n_train_steps > 0 || !trainer.fitting()) return;
  if (options_.every_n_epochs > 0 && (trainer.current_epoch() + 1) % options_.every_n_epochs == 0) save(trainer, module);
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t) {
  // Called after every micro-batch: save once per optimizer step.
  if (options_.every_n_train_steps > 0 && trainer.global_step() % options_.every_n_train_steps == 0 &&
      last_saved_step_ != trainer.global_step()) {
    save(trainer, module);
  }
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, TrainModule& module) {
  // Without validation, Lightning saves at the end of each training epoch.
  if (options_.every_n_train_steps == 0 && options_.monitor.empty() && options_.every_n_epochs > 0 &&
      (trainer.current_epoch() + 1) % options_.every_n_epochs == 0 && last_saved_step_ != trainer.global_step()) {
    save(trainer, module);
  }
}

nlohmann::json ModelCheckpoint::state_dict() const {
  // last_saved_step: a run resumed from a checkpoint written at an epoch's end
  // does not write that step's checkpoint again from its epoch-end hook.
  return {{"best_model_path", best_path_}, {"last_model_path", last_path_}, {"kept", kept_},
          {"last_saved_step", last_saved_step_}};
}

void ModelCheckpoint::load_state_dict(const nlohmann::json& state) {
  best_path_ = state.value("best_model_path", "");
  last_path_ = state.value("last_model_path", "");
  kept_ = state.value("kept", std::map<std::string, double>{});
  last_saved_step_ = state.value("last_saved_step", int64_t{-1});
}

}  // namespace kiln
