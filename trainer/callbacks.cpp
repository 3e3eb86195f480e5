#include "trainer/callbacks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <utility>

#include "core/saved_json.h"
#include "kernels/error.h"
#include "trainer/trainer.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {
// Whether fit validates once per epoch, at its end: Lightning's `val_check_interval
// == 1.0 and check_val_every_n_epoch == 1` (Python's 1 == 1.0: one batch counts too).
bool validates_once_per_epoch(const TrainerOptions& o) {
  return o.val_check_interval.value() == 1.0 && o.check_val_every_n_epoch == int64_t{1};
}

// "'a', 'b'" (or "none"): the names a monitor could have used, for its error message.
std::string logged_metric_names(const std::map<std::string, double>& metrics) {
  if (metrics.empty()) return "none";
  std::string names;
  for (const auto& [name, value] : metrics) names += (names.empty() ? "'" : ", '") + name + "'";
  return names;
}

// A saved score: a number, or null for the worst (a file has no infinity; a
// state_dict() that was not written to one holds it as a number).
double saved_score(const nlohmann::json& value, const std::string& name, std::string_view where, double worst) {
  if (value.is_null()) return worst;
  if (!value.is_number() || std::isnan(value.get<double>())) saved_json::refuse(value, name, where, "a number or null");
  return value.get<double>();
}

// EarlyStopping's state_dict, read and checked (as Lightning's, the saved patience wins).
struct EarlyStoppingState {
  int wait_count;
  double best_score;
  int64_t stopped_epoch;
  std::optional<int> patience;  // files may lack it
};

EarlyStoppingState read_early_stopping(const nlohmann::json& state, const std::string& mode) {
  constexpr std::string_view where = "EarlyStopping.load_state_dict";
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  EarlyStoppingState out;
  out.wait_count = static_cast<int>(saved_json::integer_at(state, "wait_count", where, 0, kMaxInt));
  out.best_score = saved_score(saved_json::member(state, "best_score", where), "best_score", where,
                               mode == "min" ? INFINITY : -INFINITY);
  out.stopped_epoch = saved_json::integer_at(state, "stopped_epoch", where, 0);
  if (state.contains("patience")) {
    out.patience = static_cast<int>(saved_json::integer_at(state, "patience", where, 0, kMaxInt));
  }
  return out;
}

// ModelCheckpoint's state_dict, read and checked; keys that older files lack take defaults.
struct ModelCheckpointState {
  std::optional<std::string> dirpath;  // absent in files written before it was saved
  std::string best_path, last_path;
  std::map<std::string, double> kept;
  int64_t last_saved_step;
};

ModelCheckpointState read_model_checkpoint(const nlohmann::json& state, const std::string& mode) {
  constexpr std::string_view where = "ModelCheckpoint.load_state_dict";
  saved_json::object(state, "state", where);
  auto optional_string = [&](const char* key) {
    return state.contains(key) ? saved_json::string_at(state, key, where) : std::string();
  };
  ModelCheckpointState out;
  optional_string("monitor");  // not loaded (the callback's own wins), but part of a well-formed state
  if (state.contains("dirpath") && !state.at("dirpath").is_null()) out.dirpath = optional_string("dirpath");
  out.best_path = optional_string("best_model_path");
  out.last_path = optional_string("last_model_path");
  const double worst = mode == "min" ? INFINITY : -INFINITY;
  if (state.contains("best_model_score")) saved_score(state.at("best_model_score"), "best_model_score", where, worst);
  // "kept": the key of files written before Lightning's name was used.
  const char* kept_key = state.contains("best_k_models") ? "best_k_models" : "kept";
  if (state.contains(kept_key)) {
    for (const auto& [path, score] : saved_json::object(state.at(kept_key), kept_key, where).items()) {
      out.kept[path] = saved_score(score, path, where, worst);
    }
  }
  out.last_saved_step = state.contains("last_saved_step") ? saved_json::integer_at(state, "last_saved_step", where, -1)
                                                          : -1;
  return out;
}

// `folder` absolute and without "." or ".." or links (Lightning keeps dirpath as
// os.path.realpath), so that the same folder reached another way compares equal.
std::string normal_folder(const std::string& folder) {
  std::error_code error;
  const fs::path absolute = fs::absolute(folder, error);
  if (error) return folder;
  const fs::path canonical = fs::weakly_canonical(absolute, error);
  return error ? absolute.lexically_normal().string() : canonical.string();
}

// Removes a checkpoint this callback wrote: only a .safetensors file directly
// in `dir`. The kept paths come from saved states, and a crafted or foreign
// checkpoint must not make a run delete files elsewhere (a run resumed into
// another folder leaves the old one's files, as Lightning does).
void remove_own_checkpoint(const std::string& path, const std::string& dir) {
  std::error_code error;
  const fs::path file = fs::weakly_canonical(path, error);
  if (error) return;
  const fs::path folder = fs::weakly_canonical(dir, error);
  if (error || file.parent_path() != folder || file.extension() != ".safetensors") return;
  fs::remove(file, error);
}
}  // namespace

bool is_monitoring_callback(const Callback& callback) {
  return dynamic_cast<const EarlyStopping*>(&callback) != nullptr ||
         dynamic_cast<const ModelCheckpoint*>(&callback) != nullptr;
}

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
  // As Lightning: min_delta with its sign as given, negated for "min" (a
  // negative min_delta tolerates a slightly worse value as an improvement).
  const double delta = minimize ? -options_.min_delta : options_.min_delta;
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
    if (std::isfinite(best_score_)) {
      std::snprintf(text, sizeof text, "Metric %s improved by %.3f >= min_delta = %g. New best score: %.3f",
                    options_.monitor.c_str(), std::abs(best_score_ - current), std::abs(options_.min_delta), current);
    } else {
      std::snprintf(text, sizeof text, "Metric %s improved. New best score: %.3f", options_.monitor.c_str(), current);
    }
    *reason = text;
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

bool EarlyStopping::checks_on_train_epoch_end(const Trainer& trainer) const {
  // Lightning's setup().
  return options_.check_on_train_epoch_end.value_or(validates_once_per_epoch(trainer.options()));
}

void EarlyStopping::check(Trainer& trainer) {
  if (trainer.options().fast_dev_run > 0) return;  // Lightning disables early stopping under fast_dev_run
  const auto& metrics = trainer.callback_metrics();
  auto it = metrics.find(options_.monitor);
  if (it == metrics.end()) {
    KILN_CHECK(!options_.strict, "EarlyStopping: the monitored metric '", options_.monitor,
               "' was not logged (log it in validation_step, or set strict=false); logged: ",
               logged_metric_names(metrics));
    return;
  }
  std::string reason;
  const bool stop = update(it->second, &reason);
  if (stop) {
    trainer.should_stop = true;
    trainer.stop_reason = reason;
    stopped_epoch_ = trainer.current_epoch();
  }
  // Lightning logs its messages only with verbose=True.
  if (options_.verbose && !reason.empty() && trainer.is_global_zero()) {
    std::cerr << "EarlyStopping: " << reason << (stop ? " Signaling Trainer to stop." : "") << "\n";
  }
}

void EarlyStopping::on_validation_end(Trainer& trainer, TrainModule&) {
  // Trainer::validate() outside fit decides nothing (as Lightning).
  if (trainer.fitting() && !checks_on_train_epoch_end(trainer)) check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, TrainModule&) {
  if (checks_on_train_epoch_end(trainer)) check(trainer);
}

nlohmann::json EarlyStopping::state_dict() const {
  return {{"wait_count", wait_count_}, {"best_score", best_score_}, {"stopped_epoch", stopped_epoch_},
          {"patience", options_.patience}};
}

void EarlyStopping::check_state_dict(const nlohmann::json& state) const { read_early_stopping(state, options_.mode); }

void EarlyStopping::load_state_dict(const nlohmann::json& state) {
  const EarlyStoppingState saved = read_early_stopping(state, options_.mode);
  wait_count_ = saved.wait_count;
  best_score_ = saved.best_score;
  stopped_epoch_ = saved.stopped_epoch;
  // As Lightning's load_state_dict: the checkpoint's patience wins.
  if (saved.patience) options_.patience = *saved.patience;
}

// ---------------------------------------------------------------- ModelCheckpoint

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  KILN_CHECK(options_.mode == "min" || options_.mode == "max",
             "ModelCheckpoint: mode must be \"min\" or \"max\", got '", options_.mode, "'");
  KILN_CHECK(options_.save_top_k >= -1, "ModelCheckpoint: invalid value for save_top_k=", options_.save_top_k,
             ". Must be >= -1");
  KILN_CHECK(options_.monitor.empty() ? options_.save_top_k <= 1 || options_.save_top_k == -1 : true,
             "ModelCheckpoint(save_top_k=", options_.save_top_k, ", monitor=None) is not a valid configuration. "
             "No quantity for top_k to track (save_top_k > 1 needs a monitored metric)");
  // Lightning's __init_triggers: both unset means every epoch; setting one turns the other off.
  if (options_.every_n_train_steps || options_.every_n_epochs) {
    every_n_train_steps_ = options_.every_n_train_steps.value_or(0);
    every_n_epochs_ = options_.every_n_epochs.value_or(0);
  }
  KILN_CHECK(every_n_train_steps_ >= 0, "ModelCheckpoint: invalid value for every_n_train_steps=",
             every_n_train_steps_, ". Must be >= 0");
  KILN_CHECK(every_n_epochs_ >= 0, "ModelCheckpoint: invalid value for every_n_epochs=", every_n_epochs_,
             ". Must be >= 0");
  KILN_CHECK(every_n_train_steps_ == 0 || every_n_epochs_ == 0, "ModelCheckpoint: combination of parameters "
             "every_n_train_steps=", every_n_train_steps_, " and every_n_epochs=", every_n_epochs_,
             " should be mutually exclusive");
}

std::string ModelCheckpoint::format_filename(const std::string& pattern, int64_t epoch, int64_t step,
                                             const std::map<std::string, double>& metrics,
                                             bool auto_insert_metric_name) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') {
      out += pattern[i];
      continue;
    }
    const size_t close = pattern.find('}', i);
    KILN_CHECK(close != std::string::npos, "ModelCheckpoint: unclosed '{' in filename '", pattern, "'");
    const std::string field = pattern.substr(i + 1, close - i - 1);
    // Python's "{name:spec}" as Lightning's str.format: "{epoch:02d}", "{val_loss:.2f}".
    const size_t colon = field.find(':');
    const std::string key = field.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    const bool whole = key == "epoch" || key == "step";
    auto it = metrics.find(key);
    // As Lightning, a metric not logged (yet) is written as 0.
    const double value = key == "epoch" ? static_cast<double>(epoch)
                         : key == "step" ? static_cast<double>(step)
                         : it == metrics.end() ? 0.0 : it->second;
    KILN_CHECK(spec.empty() || (spec.find_first_not_of("0123456789.") == spec.size() - 1 &&
                                std::count(spec.begin(), spec.end(), '.') <= 1 &&
                                std::string("dfeg").find(spec.back()) != std::string::npos),
               "ModelCheckpoint: filename '", pattern, "': unsupported format '", spec,
               "' (expected forms like 02d, .2f, .3e, g)");
    if (auto_insert_metric_name) out += key + "=";
    char text[64];
    if (spec.empty() ? whole : spec.back() == 'd') {
      const std::string format = "%" + (spec.empty() ? std::string() : spec.substr(0, spec.size() - 1)) + "lld";
      std::snprintf(text, sizeof text, format.c_str(), static_cast<long long>(value));
    } else {
      std::snprintf(text, sizeof text, ("%" + (spec.empty() ? std::string(".4f") : spec)).c_str(), value);
    }
    out += text;
    i = close;
  }
  return out;
}

std::string ModelCheckpoint::folder(Trainer& trainer) const {
  return normal_folder(options_.dirpath.empty() ? (fs::path(trainer.log_dir()) / "checkpoints").string()
                                                : options_.dirpath);
}

std::optional<double> ModelCheckpoint::best_model_score() const {
  auto it = kept_.find(best_path_);
  if (options_.monitor.empty() || it == kept_.end()) return std::nullopt;
  return it->second;
}

bool ModelCheckpoint::saves_on_train_epoch_end(const Trainer& trainer) const {
  if (options_.save_on_train_epoch_end) return *options_.save_on_train_epoch_end;
  // Lightning's _should_save_on_train_epoch_end: also without validation (at the training epoch's end).
  const TrainerOptions& o = trainer.options();
  return validates_once_per_epoch(o) || (o.check_val_every_n_epoch == int64_t{1} && trainer.num_val_batches() == 0);
}

bool ModelCheckpoint::skip_saving(const Trainer& trainer) const {
  return !trainer.options().enable_checkpointing || trainer.options().fast_dev_run > 0 || !trainer.fitting() ||
         last_saved_step_ == trainer.global_step();
}

void ModelCheckpoint::save(Trainer& trainer, bool top_k) {
  const std::string dir = folder(trainer);
  std::error_code error;
  fs::create_directories(dir, error);
  KILN_CHECK(!error, "ModelCheckpoint: cannot create '", dir, "': ", error.message());
  const auto& metrics = trainer.callback_metrics();
  const bool minimize = options_.mode == "min";
  std::optional<double> score;
  if (top_k && options_.save_top_k != 0 && !options_.monitor.empty()) {
    auto it = metrics.find(options_.monitor);
    // As Lightning: an error once a validation has run, before that no top-k checkpoint (Lightning warns).
    KILN_CHECK(it != metrics.end() || !validated_, "ModelCheckpoint(monitor='", options_.monitor,
               "') could not find the monitored key in the returned metrics: ", logged_metric_names(metrics),
               ". HINT: did you call log('", options_.monitor, "', value) in the TrainModule?");
    if (it == metrics.end()) top_k = false;
    // As Lightning: a NaN score is kept as the worst possible one.
    if (it != metrics.end()) score = std::isnan(it->second) ? (minimize ? INFINITY : -INFINITY) : it->second;
  }
  if (top_k && options_.save_top_k != 0) {
    auto worse = [minimize](double a, double b) { return minimize ? a > b : a < b; };
    bool keep = options_.monitor.empty() || options_.save_top_k == -1 ||
                static_cast<int>(kept_.size()) < options_.save_top_k;
    std::string worst;
    for (const auto& [kept_path, kept_score] : kept_) {
      if (worst.empty() || worse(kept_score, kept_.at(worst))) worst = kept_path;
    }
    if (!keep && !worst.empty() && worse(kept_.at(worst), score.value_or(0))) keep = true;
    // The file this save replaces, if any (Lightning's del_filepath).
    const std::string replaced = options_.monitor.empty() ? (options_.save_top_k == 1 ? best_path_ : "")
                                 : static_cast<int>(kept_.size()) == options_.save_top_k ? worst
                                                                                         : "";
    const std::string stem =
        format_filename(options_.filename, trainer.current_epoch(), trainer.global_step(), metrics,
                        options_.auto_insert_metric_name);
    std::string path = (fs::path(dir) / (stem + ".safetensors")).string();
    // As Lightning's version counter: a name taken by another file gets "-v1", "-v2", ...
    for (int version = 1; fs::exists(path) && path != replaced; ++version) {
      path = (fs::path(dir) / (stem + "-v" + std::to_string(version) + ".safetensors")).string();
    }
    if (keep) {
      last_saved_step_ = trainer.global_step();
      trainer.save_checkpoint(path);  // durable before anything is removed
      kept_[path] = score.value_or(0);
      if (options_.monitor.empty() && options_.save_top_k == 1) {
        for (auto it = kept_.begin(); it != kept_.end();) {
          if (it->first != path) {
            remove_own_checkpoint(it->first, dir);
            it = kept_.erase(it);
          } else {
            ++it;
          }
        }
      } else if (options_.save_top_k > 0 && static_cast<int>(kept_.size()) > options_.save_top_k) {
        remove_own_checkpoint(worst, dir);
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
    last_saved_step_ = trainer.global_step();
    last_path_ = (fs::path(dir) / "last.safetensors").string();
    trainer.save_checkpoint(last_path_);
  }
}

void ModelCheckpoint::on_fit_start(Trainer& trainer, TrainModule&) {
  validated_ = false;
  dirpath_ = folder(trainer);
}

void ModelCheckpoint::on_load_checkpoint(Trainer& trainer, TrainModule&, const nlohmann::json& own_state) {
  // Lightning's load_state_dict: the kept files and scores belong to the folder
  // they were written to; a run that saves elsewhere (a new version_N folder,
  // another dirpath) starts its top-k afresh and keeps only best_model_path.
  const ModelCheckpointState saved = read_model_checkpoint(own_state, options_.mode);
  const std::string current = folder(trainer);
  const bool moved = saved.dirpath && *saved.dirpath != current;
  if (moved && trainer.is_global_zero()) {
    std::cerr << "ModelCheckpoint: the dirpath has changed from '" << *saved.dirpath << "' to '" << current
              << "', therefore best_model_score, last_model_path and best_k_models won't be reloaded. Only "
                 "best_model_path will be reloaded.\n";
  }
  only_best_path_on_load_ = moved;  // for the load_state_dict the Trainer calls next
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, TrainModule&) {
  if (trainer.fitting()) validated_ = true;
  if (skip_saving(trainer) || saves_on_train_epoch_end(trainer)) return;
  save(trainer, every_n_epochs_ >= 1 && (trainer.current_epoch() + 1) % every_n_epochs_ == 0);
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, TrainModule&, int64_t) {
  // Called after every micro-batch: skip_saving saves once per optimizer step.
  if (every_n_train_steps_ < 1 || trainer.global_step() % every_n_train_steps_ != 0 || skip_saving(trainer)) return;
  save(trainer, true);
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, TrainModule&) {
  if (skip_saving(trainer) || !saves_on_train_epoch_end(trainer)) return;
  save(trainer, every_n_epochs_ >= 1 && (trainer.current_epoch() + 1) % every_n_epochs_ == 0);
}

nlohmann::json ModelCheckpoint::state_dict() const {
  // last_saved_step: a run resumed from a checkpoint written at an epoch's end
  // does not write that step's checkpoint again from its epoch-end hook.
  // Lightning's keys. JSON has no infinity: a NaN score kept as the worst (+-inf) is written as null.
  const std::optional<double> best_score = best_model_score();
  return {{"monitor", options_.monitor},
          {"dirpath", dirpath_.empty() ? nlohmann::json(nullptr) : nlohmann::json(dirpath_)},
          {"best_model_path", best_path_},
          {"best_model_score", best_score ? nlohmann::json(*best_score) : nlohmann::json(nullptr)},
          {"best_k_models", kept_},
          {"last_model_path", last_path_},
          {"last_saved_step", last_saved_step_}};
}

void ModelCheckpoint::check_state_dict(const nlohmann::json& state) const {
  read_model_checkpoint(state, options_.mode);
}

void ModelCheckpoint::load_state_dict(const nlohmann::json& state) {
  const bool only_best_path = std::exchange(only_best_path_on_load_, false);  // first: consumed even if this throws
  ModelCheckpointState saved = read_model_checkpoint(state, options_.mode);
  best_path_ = std::move(saved.best_path);
  if (!only_best_path) {  // else, as Lightning, the kept files and last path stay this callback's own
    last_path_ = std::move(saved.last_path);
    kept_ = std::move(saved.kept);
  }
  last_saved_step_ = saved.last_saved_step;
}

}  // namespace kiln
