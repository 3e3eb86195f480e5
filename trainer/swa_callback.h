// StochasticWeightAveraging: Lightning's callback over optim/swa.h. From
// epoch swa_start on it swaps the schedule for SWALR (stepped per epoch),
// averages the weights after every training epoch through the last one
// (max_epochs - 1), and when training ends there it copies the average into
// the model and recomputes the BatchNorm statistics with one pass over the
// training loader (update_bn).
//
// Lightning updates the average at the start of epochs swa_start..swa_end, so
// its average holds the weights before each of those epochs and misses the
// last epoch's; this one averages after each of them (torch's documented SWA
// loop), so the last epoch's weights count.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "optim/swa.h"
#include "trainer/callbacks.h"

namespace kiln {

struct StochasticWeightAveragingOptions {
  std::vector<double> swa_lrs;  // one value, or one per parameter group; each > 0
  // int64_t: the (1-based) epoch to start from; double in [0, 1]: that fraction of max_epochs.
  std::variant<int64_t, double> swa_epoch_start = 0.8;
  int64_t annealing_epochs = 10;
  std::string annealing_strategy = "cos";  // "cos" or "linear"
  optim::AvgFn avg_fn;                     // empty: the equal-weight mean
  // Where the average lives (Lightning keeps it on the CPU to spare GPU memory);
  // nullopt: the model's device.
  std::optional<Device> device = Device::cpu();
};

class StochasticWeightAveraging : public Callback {
 public:
  // Throws kiln::Error for Lightning's invalid arguments.
  explicit StochasticWeightAveraging(StochasticWeightAveragingOptions options);
  std::string name() const override { return "StochasticWeightAveraging"; }
  // Needs max_epochs (the average ends with the last epoch).
  void on_fit_start(Trainer& trainer, TrainModule& module) override;
  // A checkpoint written after SWA started: installs SWALR, whose state the
  // Trainer then loads from the checkpoint (resume continues the annealing exactly).
  void on_load_checkpoint(Trainer& trainer, TrainModule& module, const nlohmann::json& own_state) override;
  void on_train_epoch_start(Trainer& trainer, TrainModule& module) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  // n_averaged, latest_update_epoch, whether SWA started, and the averaged
  // tensors (their bytes as JSON binary values, exact, which a checkpoint keeps in
  // its tensor section; base64 text from older files still loads). The SWALR schedule's state
  // is the Trainer's (its checkpoint holds the schedule).
  nlohmann::json state_dict() const override;
  void check_state_dict(const nlohmann::json& state) const override;
  void load_state_dict(const nlohmann::json& state) override;

  // 0-based first and last averaged epochs (valid from on_fit_start).
  int64_t swa_start() const { return swa_start_; }
  int64_t swa_end() const { return swa_end_; }
  int64_t n_averaged() const;  // the restored average's count before on_fit_start rebuilds it
  // The running average (null before swa_start).
  const optim::AveragedModel* averaged_model() const { return average_.get(); }

 private:
  void start(Trainer& trainer, TrainModule& module);
  void install_swalr(Trainer& trainer);

  StochasticWeightAveragingOptions options_;
  int64_t swa_start_ = 0, swa_end_ = 0;
  bool initialized_ = false;
  std::unique_ptr<optim::AveragedModel> average_;
  int64_t latest_update_epoch_ = -1;
  std::optional<optim::StateDict> restored_average_;  // decoded by load_state_dict, applied in on_fit_start
};

}  // namespace kiln
