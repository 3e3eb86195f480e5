#include "trainer/swa_callback.h"

#include <cstdio>
#include <cstring>

#include "core/autograd.h"
#include "trainer/trainer.h"

namespace kiln {

namespace {
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const unsigned char* data, size_t size) {
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  for (size_t i = 0; i < size; i += 3) {
    const uint32_t chunk = (uint32_t{data[i]} << 16) | (i + 1 < size ? uint32_t{data[i + 1]} << 8 : 0) |
                           (i + 2 < size ? uint32_t{data[i + 2]} : 0);
    out += kBase64[(chunk >> 18) & 63];
    out += kBase64[(chunk >> 12) & 63];
    out += i + 1 < size ? kBase64[(chunk >> 6) & 63] : '=';
    out += i + 2 < size ? kBase64[chunk & 63] : '=';
  }
  return out;
}

std::vector<unsigned char> base64_decode(const std::string& text) {
  KILN_CHECK(text.size() % 4 == 0, "StochasticWeightAveraging state: corrupt tensor data (base64 length ",
             text.size(), ")");
  std::vector<unsigned char> out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t chunk = 0;
    int padding = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const char* found = c == '=' ? nullptr : std::strchr(kBase64, c);
      KILN_CHECK(c == '=' || (found != nullptr && c != '\0'), "StochasticWeightAveraging state: corrupt tensor data");
      padding += c == '=';
      chunk = (chunk << 6) | (found ? static_cast<uint32_t>(found - kBase64) : 0);
    }
    out.push_back(static_cast<unsigned char>(chunk >> 16));
    if (padding < 2) out.push_back(static_cast<unsigned char>(chunk >> 8));
    if (padding < 1) out.push_back(static_cast<unsigned char>(chunk));
  }
  return out;
}

// A tensor as {"dtype", "shape", "data": base64 of its little-endian bytes}:
// exact, and it fits the callback state's JSON.
nlohmann::json tensor_json(const Tensor& tensor) {
  const Tensor host = tensor.detach().to(Device::cpu()).contiguous();
  return {{"dtype", std::string(dtype_name(host.dtype()))},
          {"shape", host.shape()},
          {"data", base64_encode(static_cast<const unsigned char*>(host.data_ptr()), host.nbytes())}};
}

Tensor tensor_from_json(const nlohmann::json& json) {
  Tensor tensor = empty(json.at("shape").get<Shape>(), {.dtype = parse_dtype(json.at("dtype").get<std::string>())});
  const std::vector<unsigned char> bytes = base64_decode(json.at("data").get<std::string>());
  KILN_CHECK(bytes.size() == tensor.nbytes(), "StochasticWeightAveraging state: tensor data has ", bytes.size(),
             " bytes, its shape needs ", tensor.nbytes());
  std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  return tensor;
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
  if (!restored_average_.is_null()) {
    average_ = std::make_unique<optim::AveragedModel>(
        module.model(), optim::AveragedModelOptions{options_.device, options_.avg_fn, false});
    optim::StateDict state;
    state.meta = restored_average_.at("meta");
    for (const auto& entry : restored_average_.at("tensors").items()) {
      state.tensors[entry.key()] = tensor_from_json(entry.value());
    }
    average_->load_state_dict(state);
    restored_average_ = nullptr;
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

void StochasticWeightAveraging::on_load_checkpoint(Trainer& trainer, TrainModule&, const nlohmann::json& own_state) {
  if (own_state.value("swa_started", false)) install_swalr(trainer);
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

nlohmann::json StochasticWeightAveraging::state_dict() const {
  nlohmann::json state = {{"n_averaged", n_averaged()},
                          {"latest_update_epoch", latest_update_epoch_},
                          {"swa_started", initialized_},
                          {"average_model_state", nullptr}};
  if (!average_) {
    state["average_model_state"] = restored_average_;
  } else {
    const optim::StateDict average = average_->state_dict();
    nlohmann::json tensors = nlohmann::json::object();
    for (const auto& [name, tensor] : average.tensors) tensors[name] = tensor_json(tensor);
    state["average_model_state"] = {{"meta", average.meta}, {"tensors", tensors}};
  }
  return state;
}

void StochasticWeightAveraging::load_state_dict(const nlohmann::json& state) {
  latest_update_epoch_ = state.value("latest_update_epoch", int64_t{-1});
  initialized_ = state.value("swa_started", false);
  average_.reset();
  restored_average_ = state.value("average_model_state", nlohmann::json());
}

}  // namespace kiln
