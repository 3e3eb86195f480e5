#include "trainer/train_module.h"

#include <unordered_set>

#include "core/autograd.h"
#include "core/ops.h"
#include "optim/clip_grad.h"
#include "trainer/trainer.h"

namespace kiln {

void TrainModule::log(const std::string& name, const Tensor& value, std::optional<bool> on_step,
                      std::optional<bool> on_epoch, bool prog_bar, int64_t batch_size) {
  KILN_CHECK(value.defined() && value.numel() == 1, "log('", name, "'): expected a one-element tensor, got ",
             value.defined() ? shape_str(value.shape()) : std::string("an undefined tensor"));
  KILN_CHECK(batch_size > 0, "log('", name, "'): batch_size must be positive, got ", batch_size);
  if (log_recording_ != nullptr) {
    log_recording_->push_back({name, value.detach(), on_step, on_epoch, prog_bar, batch_size});
    return;
  }
  const bool training = stage_ == "train";
  const std::string& key = name;
  NoGradGuard no_grad;
  Tensor scalar = value.detach().reshape({}).to(DType::f64);
  auto [it, inserted] = logged_.try_emplace(key);
  LoggedValue& entry = it->second;
  if (inserted) order_.push_back(key);
  entry.on_step = on_step.value_or(training);
  entry.on_epoch = on_epoch.value_or(!training);
  entry.prog_bar = prog_bar;
  Tensor weighted = mul(scalar, static_cast<double>(batch_size));
  entry.sum = entry.sum.defined() ? add(entry.sum, weighted) : weighted;
  entry.count += batch_size;
  entry.last = scalar;
}

LogRecording::LogRecording(TrainModule& module) : module_(module) {
  KILN_CHECK(module.log_recording_ == nullptr, "LogRecording: the module's log calls are already being recorded");
  module.log_recording_ = &calls_;
}

LogRecording::~LogRecording() { stop(); }

void LogRecording::stop() {
  if (!recording_) return;
  module_.log_recording_ = nullptr;
  recording_ = false;
}

void LogRecording::apply() const {
  KILN_CHECK(!recording_, "LogRecording::apply: stop the recording first");
  for (const RecordedLog& call : calls_) {
    module_.log(call.name, call.value, call.on_step, call.on_epoch, call.prog_bar, call.batch_size);
  }
}

OptimizerConfigs::operator OptimizerConfig() && {
  KILN_CHECK(configs.size() == 1, "configure_optimizers returned ", configs.size(),
             " optimizers where one was expected (several need manual optimization in Trainer::fit)");
  return std::move(configs.front());
}

// ---------------------------------------------------------------- manual optimization

Trainer& TrainModule::attached_trainer(const char* what) const {
  KILN_CHECK(trainer_ != nullptr && trainer_->num_optimizers() > 0, what,
             ": no optimizers yet; call it from training_step (or a hook) while Trainer::fit runs");
  return *trainer_;
}

void TrainModule::check_optimizer_count(size_t expected) const {
  const Trainer& trainer = attached_trainer("optimizers<N>()");
  KILN_CHECK(static_cast<size_t>(trainer.num_optimizers()) == expected, "optimizers<", expected,
             ">(): configure_optimizers returned ", trainer.num_optimizers(), " optimizer(s)");
}

std::vector<OptimizerHandle> TrainModule::optimizers() {
  const Trainer& trainer = attached_trainer("optimizers()");
  std::vector<OptimizerHandle> handles;
  for (int64_t i = 0; i < trainer.num_optimizers(); ++i) handles.emplace_back(*this, static_cast<size_t>(i));
  return handles;
}

std::vector<optim::LRScheduler*> TrainModule::lr_schedulers() {
  Trainer& trainer = attached_trainer("lr_schedulers()");
  std::vector<optim::LRScheduler*> schedulers;
  for (int64_t i = 0; i < trainer.num_optimizers(); ++i) {
    if (optim::LRScheduler* scheduler = trainer.lr_scheduler(static_cast<size_t>(i))) schedulers.push_back(scheduler);
  }
  return schedulers;
}

void TrainModule::manual_backward(const Tensor& loss) {
  KILN_CHECK(!automatic_optimization, "manual_backward: to use manual_backward, disable automatic optimization: "
             "set automatic_optimization = false in the module's constructor");
  KILN_CHECK(loss.defined(), "manual_backward: the loss is an undefined tensor");
  optim::GradScaler* scaler = trainer_ != nullptr ? trainer_->scaler() : nullptr;  // "16-mixed"
  (scaler != nullptr ? scaler->scale(loss) : loss).backward();
}

std::vector<std::pair<Tensor, bool>> TrainModule::freeze_other_optimizers(size_t index) {
  Trainer& trainer = attached_trainer("toggle_optimizer");
  const optim::Optimizer& current = trainer.optimizer(index);
  std::unordered_set<const TensorImpl*> kept;  // the current optimizer's parameters keep their flags
  for (int64_t g = 0; g < current.num_groups(); ++g) {
    for (const Tensor& p : current.params(g)) kept.insert(p.impl());
  }
  std::vector<std::pair<Tensor, bool>> frozen;
  for (int64_t i = 0; i < trainer.num_optimizers(); ++i) {
    if (static_cast<size_t>(i) == index) continue;
    const optim::Optimizer& other = trainer.optimizer(static_cast<size_t>(i));
    for (int64_t g = 0; g < other.num_groups(); ++g) {
      for (Tensor p : other.params(g)) {
        if (!kept.insert(p.impl()).second) continue;  // shared with the current optimizer, or already seen
        frozen.emplace_back(p, p.requires_grad());
        p.requires_grad_(false);
      }
    }
  }
  return frozen;
}

void TrainModule::toggle_optimizer(const OptimizerHandle& optimizer) {
  untoggle_optimizer(optimizer);  // a toggle without its untoggle must not leave parameters frozen
  toggled_state_ = freeze_other_optimizers(optimizer.index());
}

void TrainModule::untoggle_optimizer(const OptimizerHandle&) {
  for (auto& [param, requires_grad] : toggled_state_) param.requires_grad_(requires_grad);
  toggled_state_.clear();
}

void TrainModule::clip_gradients(const OptimizerHandle& optimizer, double gradient_clip_val,
                                 const std::string& gradient_clip_algorithm) {
  KILN_CHECK(gradient_clip_val >= 0, "clip_gradients: gradient_clip_val must be >= 0, got ", gradient_clip_val);
  KILN_CHECK(gradient_clip_algorithm == "norm" || gradient_clip_algorithm == "value",
             "clip_gradients: gradient_clip_algorithm must be \"norm\" or \"value\", got '", gradient_clip_algorithm,
             "'");
  Trainer& trainer = attached_trainer("clip_gradients");
  trainer.finish_pending_gradient_sync();  // clip the averaged gradients, not this rank's
  if (gradient_clip_val == 0) return;
  optim::Optimizer& target = optimizer.optimizer();
  trainer.unscale_gradients(target);  // "16-mixed": clip the true gradients, not the scaled ones
  optim::clip_gradients(target, gradient_clip_val, gradient_clip_algorithm);
}

// ---------------------------------------------------------------- OptimizerHandle

optim::Optimizer& OptimizerHandle::optimizer() const {
  return module_->attached_trainer("OptimizerHandle").optimizer(index_);
}

void OptimizerHandle::step() {
  Trainer& trainer = module_->attached_trainer("OptimizerHandle::step()");
  KILN_CHECK(trainer.manual_, "OptimizerHandle::step(): the trainer steps the optimizer itself in automatic "
             "optimization; set automatic_optimization = false to step it in training_step");
  trainer.manual_optimizer_step(index_);
}

void OptimizerHandle::zero_grad(bool set_to_none) { optimizer().zero_grad(set_to_none); }

ToggledModel OptimizerHandle::toggle_model(bool sync_grad) {
  Trainer& trainer = module_->attached_trainer("OptimizerHandle::toggle_model()");
  ToggledModel toggled;
  toggled.active_ = true;
  if (nn::DistributedDataParallel* ddp = trainer.ddp()) {
    toggled.trainer_ = &trainer;
    toggled.previous_sync_ = ddp->require_backward_grad_sync();
    ddp->set_require_backward_grad_sync(sync_grad);
  }
  toggled.saved_ = module_->freeze_other_optimizers(index_);
  return toggled;
}

ToggledModel::ToggledModel(ToggledModel&& other) noexcept
    : saved_(std::move(other.saved_)),
      trainer_(other.trainer_),
      previous_sync_(other.previous_sync_),
      active_(other.active_) {
  other.active_ = false;
}

ToggledModel::~ToggledModel() {
  if (!active_) return;
  for (auto& [param, requires_grad] : saved_) param.requires_grad_(requires_grad);
  if (trainer_ != nullptr) {
    if (nn::DistributedDataParallel* ddp = trainer_->ddp()) ddp->set_require_backward_grad_sync(previous_sync_);
  }
}

DType module_input_dtype(const Batch& batch, DType param_dtype) {
  return is_floating(batch.input.dtype()) ? param_dtype : batch.input.dtype();
}

DType module_target_dtype(const Batch& batch, DType param_dtype) {
  return is_floating(batch.target.dtype()) ? param_dtype : DType::i64;
}

Batch batch_to_module(const Batch& batch, Device device, DType param_dtype) {
  Batch moved;
  moved.input = batch.input.to(device, module_input_dtype(batch, param_dtype), /*non_blocking=*/true);
  moved.target = batch.target.to(device, module_target_dtype(batch, param_dtype), /*non_blocking=*/true);
  return moved;
}

}  // namespace kiln
