// The Trainer's cuda_graph steps (trainer/cuda_graph_step.h): the decision at
// the start of fit, and each micro-batch's warm-up, capture or replay of
// graph A (accumulating) or B (stepping), or its eager run.
#include <exception>
#include <iostream>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_graph.h"
#include "trainer/trainer.h"

namespace kiln {

void Trainer::prepare_cuda_graph() {
  graph_step_.reset();
  // Unset: on for a GPU fit (an explicit false keeps the steps eager).
  if (!options_.cuda_graph.value_or(device_.is_cuda())) return;
  CudaGraphConditions conditions;
  conditions.on_gpu = device_.is_cuda();
  conditions.manual_optimization = manual_;
  conditions.distributed = world_size() > 1;
  conditions.profiler = dynamic_cast<const PassThroughProfiler*>(profiler_.get()) == nullptr;
  conditions.anomaly_mode = anomaly_mode_enabled();
  for (const auto& callback : callbacks()) {
    if (callback->host_work_before_optimizer_step()) {
      conditions.host_work_callback = callback->name();
      break;
    }
  }
  if (const std::string obstacle = cuda_graph_obstacle(conditions); !obstacle.empty()) {
    if (is_global_zero()) std::cerr << "Trainer: cuda_graph: eager steps for this fit: " << obstacle << "\n";
    return;
  }
  graph_step_ = std::make_unique<CudaGraphStep>(device_.index);
}

bool Trainer::graphed_step(TrainModule& module, const Batch& moved, int64_t batch_idx, int64_t accumulate) {
  CudaGraphStep* graph = graph_step_.get();
  if (graph == nullptr || graph->given_up() || manual_) return false;
  const bool say = is_global_zero();
  const MicroBatchKind kind = micro_batch_kind(batch_idx, accumulate, is_last_batch_);
  const CudaGraphDecision decision = graph->decide(kind, accumulate, moved);
  using Action = CudaGraphDecision::Action;
  if (decision.action == Action::warm_up) return false;  // eager: every allocation a step makes once happens here
  if (decision.action == Action::eager) {
    graph->note_eager_batch(decision, say);  // e.g. a last, smaller batch
    return false;
  }
  if (const std::string moved_gradient = graph->moved_gradient(); !moved_gradient.empty()) {
    graph->give_up(moved_gradient, say);  // eager from here, from the gradients the parameters have now
    return false;
  }
  const bool step_now = kind == MicroBatchKind::step;
  graph->load(moved);  // on the current stream, before the replay or the capture (which waits for it)
  if (decision.action == Action::replay) {
    graph->graph(kind).replay();
    // The host side of the step, as run_step and optimizer_step advance it.
    ++batch_in_epoch_;
    ++total_batches_;
    if (step_now) ++global_step_;
    graph->apply_logs(kind);
    return true;
  }
  // Capture this micro-batch on the static buffers (recorded, not run), then
  // replay the graph to run it. Host state the step changes (the batch and
  // step counters) changes once, here, as in an eager step.
  const int64_t batch_before = batch_in_epoch_, total_before = total_batches_, step_before = global_step_;
  std::vector<Tensor> parameters = module.model().parameters();
  std::vector<Tensor> grads_before;
  grads_before.reserve(parameters.size());
  for (const Tensor& parameter : parameters) grads_before.push_back(parameter.grad());
  const std::vector<const optim::Optimizer*> unscaled_before = unscaled_;
  using ScalerProgress = optim::GradScaler::StepProgress;
  const ScalerProgress scaler_before = scaler_ ? scaler_->step_progress() : ScalerProgress{};
  auto logs = std::make_unique<LogRecording>(module);
  // Nothing of the captured work ran: undo its host effects, so the micro-batch can run eagerly.
  const auto undo = [&] {
    logs.reset();
    batch_in_epoch_ = batch_before;
    total_batches_ = total_before;
    global_step_ = step_before;
    unscaled_ = unscaled_before;
    if (scaler_) scaler_->restore_step_progress(scaler_before);  // else the eager unscale_ finds it done
    // The gradients the window holds so far (kept ones), or none (k = 1); a
    // gradient made during the capture is memory of the graph's pool.
    for (size_t i = 0; i < parameters.size(); ++i) parameters[i].set_grad(grads_before[i]);
  };
  cuda::Graph& recorder = graph->graph(kind);
  // The graph's pool cannot take the blocks the eager steps left cached, and
  // nothing can be returned to the device during the capture: return them now,
  // so that a model using most of the device still has room for the graph.
  empty_cache(device_);
  try {
    recorder.capture_begin();
    try {
      run_step(module, graph->static_batch(), batch_idx, accumulate, step_now);
    } catch (...) {
      try {
        recorder.capture_end();  // ends the invalidated capture; its own error says less
      } catch (const std::exception&) {
      }
      throw;
    }
    recorder.capture_end();
  } catch (const Error& error) {
    undo();
    graph->give_up("the step could not be captured: " + error.message(), say);
    return false;
  }
  if (graph->keeps_gradients()) {
    // A replay must add into the gradients it recorded: each must be the tensor it was before the capture.
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (parameters[i].grad().same(grads_before[i])) continue;
      undo();
      graph->give_up("parameter " + std::to_string(i) + " of the model got a new gradient tensor inside the "
                     "captured micro-batch (it had none at the warm-up's last step); the graphs add into the "
                     "gradients kept from then on", say);
      return false;
    }
    graph->pin_gradients(parameters);
  }
  logs->stop();
  recorder.replay();
  logs->apply();
  graph->keep_logs(kind, std::move(logs));
  return true;
}

}  // namespace kiln
