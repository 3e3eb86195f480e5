// The Trainer's checkpoints: what a checkpoint holds beyond the weights
// (loop progress, logged epoch values, callback states), writing it, finding
// "last", and restoring it in Lightning's order. Split from trainer.cpp to keep
// it small; the file format is checkpoint_io.cpp's.
//
// Restoring checks before it changes: the parts the Trainer reads (metrics,
// callback states) are checked first; the parts that can be checked only as
// they load (the loader's position needs the batch size a callback may set,
// the schedule's state the schedule a callback may install) undo, when they
// fail, what was applied before them. A checkpoint that does not load changes
// nothing and names the file and the part.
#include "trainer/trainer.h"

#include <bit>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/saved_json.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {
// One epoch value of metrics_state()'s "logged", read and checked.
struct SavedLoggedValue {
  std::string name;
  double sum = 0;
  int64_t count = 0;
  bool on_step = false, prog_bar = false;
};

struct SavedMetrics {
  std::map<std::string, double> callback_metrics;
  std::vector<SavedLoggedValue> logged;
};

// metrics_state()'s layout: {"callback_metrics": {name: bits},
//                            "logged": [{name, sum (bits), count, on_step, prog_bar}]}.
SavedMetrics read_metrics(const nlohmann::json& state, const std::string& path) {
  const std::string where = "load checkpoint '" + path + "': corrupt metadata: metrics";
  SavedMetrics out;
  const nlohmann::json& metrics = saved_json::member(state, "callback_metrics", where);
  for (const auto& [name, bits] : saved_json::object(metrics, "callback_metrics", where).items()) {
    out.callback_metrics[name] = std::bit_cast<double>(saved_json::unsigned_integer(bits, name, where));
  }
  const nlohmann::json& logged = saved_json::member(state, "logged", where);
  if (!logged.is_array()) saved_json::refuse(logged, "logged", where, "a list");
  std::set<std::string> names;
  for (size_t i = 0; i < logged.size(); ++i) {
    const std::string entry_where = where + ": logged[" + std::to_string(i) + "]";
    SavedLoggedValue value;
    value.name = saved_json::string_at(logged[i], "name", entry_where);
    KILN_CHECK(names.insert(value.name).second, where, ": '", value.name, "' is logged twice");
    value.sum = std::bit_cast<double>(saved_json::unsigned_integer_at(logged[i], "sum", entry_where));
    // metrics_state() keeps only values logged at least once.
    value.count = saved_json::integer_at(logged[i], "count", entry_where, 1, saved_json::kMaxCount);
    value.on_step = saved_json::boolean_at(logged[i], "on_step", entry_where);
    value.prog_bar = saved_json::boolean_at(logged[i], "prog_bar", entry_where);
    out.logged.push_back(std::move(value));
  }
  return out;
}

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Runs `load` for one part of the checkpoint at `path`; its errors (which do
// not know the file) name the file and the part.
template <typename Load>
void load_part(const std::string& path, const std::string& part, const Load& load) {
  try {
    load();
  } catch (const Error& error) {
    KILN_THROW("load checkpoint '", path, "': ", part, ": ", error.message());
  } catch (const nlohmann::json::exception& error) {
    KILN_THROW("load checkpoint '", path, "': ", part, ": ", error.what());
  }
}
}  // namespace

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
  if (strategy_.distributed()) {  // every rank's share: the file holds the totals (see load_checkpoint)
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
    write_training_curves();  // the picture as of the checkpoint, beside it
  }
  strategy_.barrier();  // durable before any rank goes on (and, say, removes an older checkpoint)
}

namespace {
// The newest last.safetensors under `base` (modified at or after `not_before`
// when given); empty when there is none.
std::string newest_last_checkpoint(const fs::path& base,
                                   std::optional<std::chrono::system_clock::time_point> not_before = {}) {
  std::string path;
  fs::file_time_type newest{};
  if (!fs::exists(base)) return path;
  for (const auto& entry : fs::recursive_directory_iterator(base)) {
    if (entry.path().filename() != "last.safetensors") continue;
    const fs::file_time_type written = entry.last_write_time();
    if (not_before && fs::file_time_type::clock::to_sys(written) < *not_before) continue;
    if (path.empty() || written > newest) {
      path = entry.path().string();
      newest = written;
    }
  }
  return path;
}
}  // namespace

std::string Trainer::resolve_checkpoint_path(const std::string& requested) const {
  if (requested != "last") return requested;
  const fs::path base = fs::path(options_.default_root_dir) / "lightning_logs";
  const std::string path = newest_last_checkpoint(base);
  KILN_CHECK(!path.empty(), "fit(ckpt_path=\"last\"): no last.safetensors under '", base.string(), "'");
  return path;
}

std::string Trainer::checkpoint_after_restart() {
  if (!options_.resume_on_restart) return "";
  const distributed::RestartRound round = distributed::read_restart_round();
  // Every rank of a process group is in the same round (the group's store keys
  // carry it), so all of them reach the broadcast below or none does.
  if (round.restart_count == 0) return "";
  std::string path;
  if (is_global_zero()) {
    const fs::path base = fs::path(options_.default_root_dir) / "lightning_logs";
    if (!round.run_start) {
      // Without the run's start, a last.safetensors of an older run could pass for this run's.
      std::fprintf(stderr, "Trainer: restart %d of the run, but the launcher does not set KILN_RUN_START_TIME "
                   "(kiln-run does): not resuming by itself; pass ckpt_path to fit\n", round.restart_count);
    } else {
      path = newest_last_checkpoint(base, round.run_start);
      if (path.empty()) {
        std::fprintf(stderr, "Trainer: restart %d of the run: no last.safetensors written since the run began "
                     "under '%s'; starting afresh\n", round.restart_count, base.string().c_str());
      } else {
        std::fprintf(stderr, "Trainer: restart %d of the run: resuming from '%s'\n", round.restart_count,
                     path.c_str());
      }
    }
  }
  return strategy_.broadcast_string(path);
}

void Trainer::load_checkpoint(const TrainerCheckpointFile& file, TrainModule& module, DataLoader& train_loader) {
  const TrainerCheckpoint& checkpoint = file.progress;
  // Checked before anything changes (read_trainer_checkpoint checked the progress and generator states).
  std::optional<SavedMetrics> metrics;
  if (!checkpoint.metrics.is_null()) metrics = read_metrics(checkpoint.metrics, file.path);
  std::vector<std::pair<Callback*, const nlohmann::json*>> saved_callbacks;  // (callback, its saved state)
  for (auto& callback : options_.callbacks) {
    auto it = checkpoint.callback_states.find(callback->name());
    if (it == checkpoint.callback_states.end()) continue;
    load_part(file.path, "callback '" + callback->name() + "'", [&] { callback->check_state_dict(it->second); });
    saved_callbacks.emplace_back(callback.get(), &it->second);
  }

  // What the parts below change, to undo them when a later one fails (the
  // weights are copied on their device: the copy is smaller than the
  // gradients training allocates next).
  nn::StateDict weights = module.model().state_dict();
  {
    NoGradGuard no_grad;
    for (auto& [name, tensor] : weights) tensor = tensor.clone();
  }
  const TrainerCheckpoint progress{epoch_, global_step_, batch_in_epoch_, total_batches_, epoch_end_hooks_done_,
                                   validation_pending_};
  const std::map<std::string, double> callback_metrics = callback_metrics_;
  const std::map<std::string, LoggedValue> logged = module.logged_;
  const std::vector<std::string> order = module.order_;
  std::vector<nlohmann::json> callback_states;
  for (const auto& [callback, state] : saved_callbacks) callback_states.push_back(callback->state_dict());
  const nlohmann::json loader_state = train_loader.state_dict();
  auto undo = [&] {
    module.model().load_state_dict(weights, /*strict=*/true);
    epoch_ = progress.epoch;
    global_step_ = progress.global_step;
    batch_in_epoch_ = progress.batch_in_epoch;
    total_batches_ = progress.total_batches;
    epoch_end_hooks_done_ = progress.epoch_end_hooks_done;
    validation_pending_ = progress.validation_pending;
    callback_metrics_ = callback_metrics;
    module.logged_ = logged;
    module.order_ = order;
    for (size_t i = 0; i < saved_callbacks.size(); ++i) saved_callbacks[i].first->load_state_dict(callback_states[i]);
    // A BatchSizeFinder's on_load_checkpoint may have set the loader's batch size (between epochs).
    const int64_t batch_size = loader_state.at("batch_size").get<int64_t>();
    if (train_loader.options().batch_size != batch_size) {
      train_loader.set_epoch(train_loader.epoch());
      set_train_batch_size(batch_size);
    }
    train_loader.load_state_dict(loader_state);
  };

  // Lightning's order: weights, loop progress, callbacks (which may install
  // schedules, e.g. SWALR, or set the batch size, BatchSizeFinder), then the
  // optimizer and schedule states. The loader's position loads after the
  // callbacks, before the states that cannot fail once checked.
  load_checkpoint_model(file, module.model());  // checks every key and shape before it writes
  try {
    epoch_ = checkpoint.epoch;
    global_step_ = checkpoint.global_step;
    batch_in_epoch_ = checkpoint.batch_in_epoch;
    total_batches_ = checkpoint.total_batches;  // -1 from older files: estimated once train_batches_ is known
    epoch_end_hooks_done_ = checkpoint.epoch_end_hooks_done;
    validation_pending_ = checkpoint.validation_pending;
    if (metrics) {
      callback_metrics_ = metrics->callback_metrics;
      module.logged_.clear();
      module.order_.clear();
      // Under ddp the file holds the totals over the ranks: rank 0 carries them
      // and the others start from zero, so the epoch's mean over the ranks
      // (collect_epoch_metrics) is the uninterrupted run's.
      const bool carries_totals = is_global_zero();
      for (const SavedLoggedValue& saved : metrics->logged) {
        LoggedValue& value = module.logged_[saved.name];
        value.sum = full({}, carries_totals ? saved.sum : 0.0, {.dtype = DType::f64, .device = device_});
        value.count = carries_totals ? saved.count : 0;
        value.on_step = saved.on_step;
        value.on_epoch = true;
        value.prog_bar = saved.prog_bar;
        module.order_.push_back(saved.name);
      }
    }
    for (const auto& saved : saved_callbacks) {
      load_part(file.path, "callback '" + saved.first->name() + "'", [&] {
        saved.first->on_load_checkpoint(*this, module, *saved.second);
        saved.first->load_state_dict(*saved.second);
      });
    }
    if (!checkpoint.loader_state.is_null()) {
      load_part(file.path, "train loader state", [&] { train_loader.load_state_dict(checkpoint.loader_state); });
    }
    load_checkpoint_optimizers(file, optimizer_slots());
    load_checkpoint_scaler(file, scaler_.get());  // checks everything before it changes the scaler
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    try {
      undo();
    } catch (const std::exception& undo_error) {  // not expected: each state restored is one the object wrote
      KILN_THROW("load checkpoint '", file.path, "': ", describe(error),
                 "; restoring the state from before the load failed as well: ", undo_error.what());
    }
    throw;
  }
  // Neither can fail: the generator states were checked when the file was read.
  unscaled_.clear();
  load_checkpoint_rng(file);
}

}  // namespace kiln
