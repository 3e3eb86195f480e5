// The Trainer's checkpoints: what a checkpoint holds beyond the weights
// (loop progress, logged epoch values, callback states), writing it, finding
// "last", and restoring it in Lightning's order. Split from trainer.cpp to keep
// it small; the file format is checkpoint_io.cpp's.
#include "trainer/trainer.h"

#include <bit>
#include <filesystem>

#include "core/ops.h"

namespace kiln {

namespace fs = std::filesystem;

nlohmann::json Trainer::metrics_state() {
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, value] : callback_metrics_) metrics[name] = std::bit_cast<uint64_t>(value);
  std::vector<std::string> names;
  std::vector<double> sums, counts;
  for (const std::string& name : module_->order_) {
    const LoggedValue& value = module_->logged_.at(name);
    if (!value.on_epoch) continue;  // only epoch values outlive their step
    names.push_back(name);
    sums.push_back(value.sum.item<double>());
    counts.push_back(static_cast<double>(value.count));
  }
  if (strategy_.distributed()) {  // every rank's share: the file holds the totals (see load_metrics_state)
    std::vector<double> values = sums;
    values.insert(values.end(), counts.begin(), counts.end());
    values = strategy_.sum_over_ranks(names, values);
    std::copy(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(names.size()), sums.begin());
    std::copy(values.begin() + static_cast<std::ptrdiff_t>(names.size()), values.end(), counts.begin());
  }
  nlohmann::json logged = nlohmann::json::array();
  for (size_t i = 0; i < names.size(); ++i) {
    if (counts[i] == 0) continue;
    const LoggedValue& value = module_->logged_.at(names[i]);
    logged.push_back({{"name", names[i]},
                      {"sum", std::bit_cast<uint64_t>(sums[i])},
                      {"count", static_cast<int64_t>(counts[i])},
                      {"on_step", value.on_step},
                      {"prog_bar", value.prog_bar}});
  }
  return {{"callback_metrics", metrics}, {"logged", logged}};
}

void Trainer::load_metrics_state(const nlohmann::json& state, TrainModule& module) {
  callback_metrics_.clear();
  for (const auto& [name, bits] : state.at("callback_metrics").items()) {
    callback_metrics_[name] = std::bit_cast<double>(bits.get<uint64_t>());
  }
  module.logged_.clear();
  module.order_.clear();
  // Under ddp the file holds the totals over the ranks: rank 0 carries them
  // and the others start from zero, so the epoch's mean over the ranks
  // (collect_epoch_metrics) is the uninterrupted run's.
  const bool carries_totals = is_global_zero();
  for (const nlohmann::json& entry : state.at("logged")) {
    const std::string name = entry.at("name").get<std::string>();
    LoggedValue& value = module.logged_[name];
    const double sum = carries_totals ? std::bit_cast<double>(entry.at("sum").get<uint64_t>()) : 0.0;
    value.sum = full({}, sum, {.dtype = DType::f64, .device = device_});
    value.count = carries_totals ? entry.at("count").get<int64_t>() : 0;
    value.on_step = entry.at("on_step").get<bool>();
    value.on_epoch = true;
    value.prog_bar = entry.at("prog_bar").get<bool>();
    module.order_.push_back(name);
  }
}

std::vector<OptimizerSlot> Trainer::optimizer_slots() {
  std::vector<OptimizerSlot> slots;
  for (OptimizerConfig& config : optimizers_) slots.push_back({config.optimizer.get(), config.scheduler.get()});
  return slots;
}

void Trainer::save_checkpoint(const std::string& path) {
  KILN_CHECK(module_ != nullptr && !optimizers_.empty(), "save_checkpoint: nothing to save before fit()");
  nlohmann::json metrics = metrics_state();  // under ddp a collective: before the rank-0-only part
  if (is_global_zero()) {
    TrainerCheckpoint checkpoint;
    checkpoint.epoch = epoch_;
    checkpoint.global_step = global_step_;
    checkpoint.batch_in_epoch = batch_in_epoch_;
    checkpoint.total_batches = total_batches_;
    checkpoint.epoch_end_hooks_done = epoch_end_hooks_done_;
    checkpoint.validation_pending = validation_pending_;
    checkpoint.loader_state = train_loader_ ? train_loader_->state_dict() : nlohmann::json();
    checkpoint.metrics = std::move(metrics);
    for (auto& callback : options_.callbacks) checkpoint.callback_states[callback->name()] = callback->state_dict();
    save_trainer_checkpoint(path, module_->model(), optimizer_slots(), checkpoint, scaler_.get());
  }
  strategy_.barrier();  // durable before any rank goes on (and, say, removes an older checkpoint)
}

std::string Trainer::resolve_checkpoint_path(const std::string& requested) const {
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
  return path;
}

void Trainer::load_checkpoint(const TrainerCheckpointFile& file, TrainModule& module, DataLoader& train_loader) {
  // Lightning's order: weights, loop progress, callbacks (which may install
  // schedules, e.g. SWALR), then the optimizer and schedule states.
  load_checkpoint_model(file, module.model());
  const TrainerCheckpoint& checkpoint = file.progress;
  epoch_ = checkpoint.epoch;
  global_step_ = checkpoint.global_step;
  batch_in_epoch_ = checkpoint.batch_in_epoch;
  total_batches_ = checkpoint.total_batches;  // -1 from older files: estimated once train_batches_ is known
  epoch_end_hooks_done_ = checkpoint.epoch_end_hooks_done;
  validation_pending_ = checkpoint.validation_pending;
  if (!checkpoint.metrics.is_null()) load_metrics_state(checkpoint.metrics, module);
  for (auto& callback : options_.callbacks) {
    auto it = checkpoint.callback_states.find(callback->name());
    if (it == checkpoint.callback_states.end()) continue;
    callback->on_load_checkpoint(*this, module, it->second);
    callback->load_state_dict(it->second);
  }
  load_checkpoint_optimizers(file, optimizer_slots());
  load_checkpoint_scaler(file, scaler_.get());
  unscaled_.clear();
  load_checkpoint_rng(file);
  if (!checkpoint.loader_state.is_null()) train_loader.load_state_dict(checkpoint.loader_state);
}

}  // namespace kiln
