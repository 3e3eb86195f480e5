#include "trainer/weight_averaging.h"

#include "core/autograd.h"
#include "core/saved_json.h"
#include "trainer/averaged_model_state.h"
#include "trainer/trainer.h"

namespace kiln {

namespace {
constexpr std::string_view kLoadWhere = "WeightAveraging.load_state_dict";

struct SavedAveraging {
  int64_t latest_update_step = 0;
  int64_t latest_update_epoch = -1;
  std::optional<optim::StateDict> average;
};

SavedAveraging read_saved(const nlohmann::json& state) {
  saved_json::object(state, "state", kLoadWhere);
  SavedAveraging saved;
  saved.latest_update_step = saved_json::integer_at(state, "latest_update_step", kLoadWhere, 0);
  saved.latest_update_epoch = saved_json::integer_at(state, "latest_update_epoch", kLoadWhere, -1);
  const nlohmann::json& average = saved_json::member(state, "average_model_state", kLoadWhere);
  if (!average.is_null()) saved.average = read_averaged_model_json(average, kLoadWhere);
  return saved;
}

// What the average covers of `model`: its parameters, and its buffers when they are averaged.
std::vector<Tensor> averaged_tensors(nn::Module& model, bool use_buffers) {
  std::vector<Tensor> tensors;
  for (const auto& [name, tensor] : model.named_parameters()) tensors.push_back(tensor);
  if (use_buffers) {
    for (const auto& [name, tensor] : model.named_buffers()) tensors.push_back(tensor);
  }
  return tensors;
}
}  // namespace

WeightAveraging::WeightAveraging(WeightAveragingOptions options) : options_(std::move(options)) {
  if (options_.ema_decay) {
    KILN_CHECK(*options_.ema_decay >= 0 && *options_.ema_decay <= 1, name(), ": decay must be in [0, 1], got ",
               *options_.ema_decay);
    KILN_CHECK(!options_.avg_fn, name(), ": give either avg_fn or ema_decay, not both");
  }
}

bool WeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t>) const {
  return step_idx.has_value();
}

int64_t WeightAveraging::n_averaged() const {
  if (average_) return average_->n_averaged();
  return restored_average_ ? restored_average_->meta.at("n_averaged").get<int64_t>() : 0;  // checked when read
}

void WeightAveraging::on_fit_start(Trainer&, TrainModule& module) {
  average_ = std::make_unique<optim::AveragedModel>(
      module.model(),
      optim::AveragedModelOptions{options_.device, options_.avg_fn, options_.use_buffers, options_.ema_decay});
  if (restored_average_) {
    average_->load_state_dict(*restored_average_);
    restored_average_.reset();
  }
  set_aside_.clear();
}

void WeightAveraging::on_train_batch_end(Trainer& trainer, TrainModule& module, int64_t) {
  // Once per optimizer step: an accumulating micro-batch leaves global_step where it was.
  const int64_t step = trainer.global_step();
  if (average_ && step > latest_update_step_ && should_update(step - 1, std::nullopt)) {
    average_->update_parameters(module.model());
    latest_update_step_ = step;
  }
}

void WeightAveraging::on_train_epoch_end(Trainer& trainer, TrainModule& module) {
  const int64_t epoch = trainer.current_epoch();
  if (average_ && epoch > latest_update_epoch_ && should_update(std::nullopt, epoch)) {
    average_->update_parameters(module.model());
    latest_update_epoch_ = epoch;
  }
}

void WeightAveraging::on_validation_start(Trainer& trainer, TrainModule& module) {
  // Before the first update there is no average to validate (Lightning would
  // validate the copy made when fit started).
  if (!trainer.fitting() || !average_ || average_->n_averaged() == 0) return;
  NoGradGuard no_grad;
  set_aside_.clear();
  for (const Tensor& tensor : averaged_tensors(module.model(), options_.use_buffers)) {
    set_aside_.push_back(tensor.detach().clone());
  }
  average_->copy_to(module.model());
}

void WeightAveraging::on_validation_end(Trainer&, TrainModule& module) {
  if (set_aside_.empty()) return;
  NoGradGuard no_grad;
  std::vector<Tensor> targets = averaged_tensors(module.model(), options_.use_buffers);
  KILN_ASSERT(targets.size() == set_aside_.size(), "WeightAveraging: the model changed during validation");
  for (size_t i = 0; i < targets.size(); ++i) targets[i].copy_(set_aside_[i]);
  set_aside_.clear();
}

void WeightAveraging::on_train_end(Trainer&, TrainModule& module) {
  // A run that never updated the average keeps its own weights.
  if (average_ && average_->n_averaged() > 0) average_->copy_to(module.model());
}

void WeightAveraging::on_load_checkpoint(Trainer&, TrainModule& module, const nlohmann::json& own_state) {
  // Checked against the model here, where the Trainer's error names the file.
  const SavedAveraging saved = read_saved(own_state);
  if (saved.average) check_averaged_model_fits(*saved.average, module.model(), name());
}

nlohmann::json WeightAveraging::state_dict() const {
  nlohmann::json state = {{"latest_update_step", latest_update_step_},
                          {"latest_update_epoch", latest_update_epoch_},
                          {"average_model_state", nullptr}};
  if (average_) {
    state["average_model_state"] = averaged_model_json(average_->state_dict());
  } else if (restored_average_) {
    state["average_model_state"] = averaged_model_json(*restored_average_);
  }
  return state;
}

void WeightAveraging::check_state_dict(const nlohmann::json& state) const { read_saved(state); }

void WeightAveraging::load_state_dict(const nlohmann::json& state) {
  SavedAveraging saved = read_saved(state);
  latest_update_step_ = saved.latest_update_step;
  latest_update_epoch_ = saved.latest_update_epoch;
  average_.reset();
  restored_average_ = std::move(saved.average);
}

// ---------------------------------------------------------------- EMAWeightAveraging
namespace {
WeightAveragingOptions ema_averaging(const EMAWeightAveragingOptions& options) {
  KILN_CHECK(options.decay >= 0 && options.decay <= 1, "EMAWeightAveraging: decay must be in [0, 1], got ",
             options.decay);
  KILN_CHECK(options.update_every_n_steps >= 1, "EMAWeightAveraging: update_every_n_steps must be >= 1, got ",
             options.update_every_n_steps);
  KILN_CHECK(options.update_starting_at_step.value_or(0) >= 0,
             "EMAWeightAveraging: update_starting_at_step must be >= 0, got ", options.update_starting_at_step.value_or(0));
  KILN_CHECK(options.update_starting_at_epoch.value_or(0) >= 0,
             "EMAWeightAveraging: update_starting_at_epoch must be >= 0, got ",
             options.update_starting_at_epoch.value_or(0));
  WeightAveragingOptions averaging;
  averaging.device = options.device;
  averaging.use_buffers = options.use_buffers;
  averaging.ema_decay = options.decay;
  return averaging;
}
}  // namespace

EMAWeightAveraging::EMAWeightAveraging(EMAWeightAveragingOptions options)
    : WeightAveraging(ema_averaging(options)), ema_options_(options) {}

bool EMAWeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const {
  if (step_idx && *step_idx >= ema_options_.update_starting_at_step.value_or(0) &&
      *step_idx % ema_options_.update_every_n_steps == 0) {
    return true;
  }
  return epoch_idx && ema_options_.update_starting_at_epoch && *epoch_idx >= *ema_options_.update_starting_at_epoch;
}

}  // namespace kiln
