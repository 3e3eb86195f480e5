// The Trainer's cuda_graph steps (trainer/cuda_graph_step.h): the decision at
// the start of fit, and each batch's warm-up, capture or replay.
#include <algorithm>
#include <exception>
#include <iostream>

#include "core/autograd.h"
#include "core/cuda_graph.h"
#include "trainer/trainer.h"

namespace kiln {

void Trainer::prepare_cuda_graph() {
  graph_step_.reset();
  if (!options_.cuda_graph) return;
  CudaGraphConditions conditions;
  conditions.on_gpu = device_.is_cuda();
  conditions.manual_optimization = manual_;
  conditions.accumulate_grad_batches = options_.accumulate_grad_batches;
  for (const auto& [epoch, k] : options_.accumulation_schedule) {
    conditions.accumulate_grad_batches = std::max(conditions.accumulate_grad_batches, k);
  }
  conditions.distributed = world_size() > 1;
  conditions.profiler = dynamic_cast<const PassThroughProfiler*>(profiler_.get()) == nullptr;
  conditions.anomaly_mode = anomaly_mode_enabled();
  if (const std::string obstacle = cuda_graph_obstacle(conditions); !obstacle.empty()) {
    if (is_global_zero()) std::cerr << "Trainer: cuda_graph: eager steps for this fit: " << obstacle << "\n";
    return;
  }
  graph_step_ = std::make_unique<CudaGraphStep>(device_.index);
}

bool Trainer::graphed_step(TrainModule& module, const Batch& moved, int64_t batch_idx) {
  CudaGraphStep* graph = graph_step_.get();
  if (graph == nullptr || graph->given_up() || manual_) return false;
  if (graph->take_warmup_step()) return false;  // eager: every allocation a step makes once happens here
  const bool say = is_global_zero();
  if (graph->captured()) {
    if (const std::string reason = graph->mismatch(moved); !reason.empty()) {
      graph->note_eager_batch(reason, say);  // e.g. a last, shorter batch
      return false;
    }
    graph->load(moved);
    graph->graph().replay();
    ++batch_in_epoch_;
    ++total_batches_;
    ++global_step_;
    graph->apply_logs();
    return true;
  }
  // Capture this batch's step on static copies of it (recorded, not run),
  // then replay the graph to run it. Host state the step changes (the batch
  // and step counters) changes once, here, as in an eager step.
  const Batch& input = graph->static_batch(moved);
  const int64_t batch_before = batch_in_epoch_, total_before = total_batches_, step_before = global_step_;
  auto logs = std::make_unique<LogRecording>(module);
  cuda::Graph& recorder = graph->graph();
  try {
    recorder.capture_begin();
    try {
      run_step(module, input, batch_idx, /*accumulate=*/1, /*step_now=*/true);
    } catch (...) {
      try {
        recorder.capture_end();  // ends the invalidated capture; its own error says less
      } catch (const std::exception&) {
      }
      throw;
    }
    recorder.capture_end();
  } catch (const Error& error) {
    // Nothing of the step ran: undo its host effects and run it eagerly.
    logs.reset();
    batch_in_epoch_ = batch_before;
    total_batches_ = total_before;
    global_step_ = step_before;
    unscaled_.clear();
    for (OptimizerConfig& config : optimizers_) config.optimizer->zero_grad(true);
    graph->give_up("the step could not be captured: " + error.message(), say);
    return false;
  }
  logs->stop();
  recorder.replay();
  logs->apply();
  graph->keep_logs(std::move(logs));
  return true;
}

}  // namespace kiln
