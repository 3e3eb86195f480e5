#include "trainer/swa_callback.h"

#include <cstdio>

#include "core/autograd.h"
#include "core/saved_json.h"
#include "trainer/averaged_model_state.h"
#include "trainer/trainer.h"

namespace kiln {

namespace {
constexpr std::string_view kLoadWhere = "StochasticWeightAveraging.load_state_dict";

// The callback's state_dict, read and checked (the average against the model
// only in on_load_checkpoint, which sees the model). Keys older files lack take defaults.
struct SwaState {
  int64_t latest_update_epoch = -1;
  bool swa_started = false;
  std::optional<optim::StateDict> average;
};

SwaState read_swa_state(const nlohmann::json& state) {
  saved_json::object(state, "state", kLoadWhere);
  SwaState out;
  if (state.contains("latest_update_epoch")) {
    out.latest_update_epoch = saved_json::integer_at(state, "latest_update_epoch", kLoadWhere, -1);
  }
  if (state.contains("swa_started")) out.swa_started = saved_json::boolean_at(state, "swa_started", kLoadWhere);
  if (state.contains("n_averaged")) saved_json::integer_at(state, "n_averaged", kLoadWhere, 0);
  if (!state.contains("average_model_state") || state.at("average_model_state").is_null()) {
    // SWA starts by making its average: a started one without it would average into nothing.
    KILN_CHECK(!out.swa_started, kLoadWhere, ": \"swa_started\" is true but there is no \"average_model_state\"");
    return out;
  }
  out.average = read_averaged_model_json(state.at("average_model_state"), kLoadWhere);
  return out;
}

optim::AnnealStrategy anneal_strategy(const std::string& name) {
  return name == "cos" ? optim::AnnealStrategy::cos : optim::AnnealStrategy::linear;
}
}  // namespace

StochasticWeightAveraging::StochasticWeightAveraging(StochasticWeightAveragingOptions options)
    : options_(std::move(options)) {
  bool positive = !options_.swa_lrs.empty();
  for (double lr : options_.swa_lrs) positive = positive && lr > 0;
  KILN_CHECK(positive, "StochasticWeightAveraging: swa_lrs should be a positive float, or a list of positive floats");
  if (const auto* epoch = std::get_if<int64_t>(&options_.swa_epoch_start)) {
    KILN_CHECK(*epoch >= 1, "StochasticWeightAveraging: swa_epoch_start should be a >0 integer or a float between 0 "
                            "and 1, got ", *epoch);
  } else {
    const double fraction = std::get<double>(options_.swa_epoch_start);
    KILN_CHECK(fraction >= 0 && fraction <= 1, "StochasticWeightAveraging: swa_epoch_start should be a >0 integer "
                                               "or a float between 0 and 1, got ", fraction);
  }
  KILN_CHECK(options_.annealing_epochs > 0, "StochasticWeightAveraging: annealing_epochs should be a positive "
                                            "integer, got ", options_.annealing_epochs);
  KILN_CHECK(options_.annealing_strategy == "cos" || options_.annealing_strategy == "linear",
             "StochasticWeightAveraging: annealing_strategy should be \"cos\" or \"linear\", got '",
             options_.annealing_strategy, "'");
}

void StochasticWeightAveraging::on_fit_start(Trainer& trainer, TrainModule& module) {
  const int64_t max_epochs = trainer.max_epochs();
  KILN_CHECK(max_epochs >= 1, "StochasticWeightAveraging needs max_epochs (the average ends with the last epoch)");
  int64_t start_epoch = 0;  // 1-based, as Lightning's swa_epoch_start
  if (const auto* epoch = std::get_if<int64_t>(&options_.swa_epoch_start)) {
    start_epoch = *epoch;
  } else {
    start_epoch = static_cast<int64_t>(static_cast<double>(max_epochs) * std::get<double>(options_.swa_epoch_start));
  }
  swa_start_ = std::max<int64_t>(start_epoch - 1, 0);
  swa_end_ = max_epochs - 1;
  if (restored_average_) {
    average_ = std::make_unique<optim::AveragedModel>(
        module.model(), optim::AveragedModelOptions{options_.device, options_.avg_fn, false});
    average_->load_state_dict(*restored_average_);
    restored_average_.reset();
  }
  // A run resumed inside the SWA phase continues with the SWALR schedule
  // on_load_checkpoint installed; state loaded otherwise (load_state_dict
  // alone) has none, so SWALR starts anew at the next epoch (annealing from the
  // current lr) and the average continues.
  if (initialized_ && (trainer.lr_scheduler() == nullptr || trainer.lr_scheduler()->name() != "SWALR")) {
    initialized_ = false;
  }
}

void StochasticWeightAveraging::install_swalr(Trainer& trainer) {
  KILN_CHECK(trainer.num_optimizers() == 1, "StochasticWeightAveraging works with 1 optimizer, the module configured ",
             trainer.num_optimizers());
  optim::Optimizer& optimizer = trainer.optimizer();
  std::vector<double> swa_lrs = options_.swa_lrs;
  if (swa_lrs.size() == 1) swa_lrs.assign(static_cast<size_t>(optimizer.num_groups()), swa_lrs.front());
  auto scheduler = std::make_unique<optim::SWALR>(optimizer, swa_lrs, options_.annealing_epochs,
                                                  anneal_strategy(options_.annealing_strategy));
  trainer.set_lr_scheduler(std::move(scheduler), "epoch");
}

void StochasticWeightAveraging::on_load_checkpoint(Trainer& trainer, TrainModule& module,
                                                   const nlohmann::json& own_state) {
  // The average is checked against the model here, where the Trainer's error names the file.
  const SwaState saved = read_swa_state(own_state);
  if (saved.average) check_averaged_model_fits(*saved.average, module.model(), "StochasticWeightAveraging");
  if (saved.swa_started) install_swalr(trainer);
}

void StochasticWeightAveraging::start(Trainer& trainer, TrainModule& module) {
  if (trainer.lr_scheduler() != nullptr) {
    std::fprintf(stderr, "Swapping scheduler `%s` for `SWALR`\n", trainer.lr_scheduler()->name().c_str());
  }
  install_swalr(trainer);
  if (!average_) {
    average_ = std::make_unique<optim::AveragedModel>(
        module.model(), optim::AveragedModelOptions{options_.device, options_.avg_fn, false});
  }
}

void StochasticWeightAveraging::on_train_epoch_start(Trainer& trainer, TrainModule& module) {
  const int64_t epoch = trainer.current_epoch();
  if (!initialized_ && swa_start_ <= epoch && epoch <= swa_end_) {
    start(trainer, module);
    initialized_ = true;
  }
}

void StochasticWeightAveraging::on_train_epoch_end(Trainer& trainer, TrainModule& module) {
  const int64_t epoch = trainer.current_epoch();
  if (initialized_ && swa_start_ <= epoch && epoch <= swa_end_ && epoch > latest_update_epoch_) {
    average_->update_parameters(module.model());
    latest_update_epoch_ = epoch;
  }
}

void StochasticWeightAveraging::on_train_end(Trainer& trainer, TrainModule& module) {
  // Only a run that trained through the last epoch has the full average (as Lightning).
  if (!average_ || latest_update_epoch_ != swa_end_) return;
  nn::Module& model = module.model();
  average_->copy_to(model);
  if (optim::contains_batch_norm(model) && trainer.train_loader() != nullptr) {
    optim::update_bn(*trainer.train_loader(), model, trainer.device(), trainer.num_training_batches());
  }
}

int64_t StochasticWeightAveraging::n_averaged() const {
  if (average_) return average_->n_averaged();
  return restored_average_ ? restored_average_->meta.at("n_averaged").get<int64_t>() : 0;  // checked when read
}

nlohmann::json StochasticWeightAveraging::state_dict() const {
  nlohmann::json state = {{"n_averaged", n_averaged()},
                          {"latest_update_epoch", latest_update_epoch_},
                          {"swa_started", initialized_},
                          {"average_model_state", nullptr}};
  const std::optional<optim::StateDict> average =
      average_ ? std::optional<optim::StateDict>(average_->state_dict()) : restored_average_;
  if (average) state["average_model_state"] = averaged_model_json(*average);
  return state;
}

void StochasticWeightAveraging::check_state_dict(const nlohmann::json& state) const { read_swa_state(state); }

void StochasticWeightAveraging::load_state_dict(const nlohmann::json& state) {
  SwaState saved = read_swa_state(state);
  latest_update_epoch_ = saved.latest_update_epoch;
  initialized_ = saved.swa_started;
  average_.reset();
  restored_average_ = std::move(saved.average);
}

}  // namespace kiln
