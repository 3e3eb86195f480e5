// The Trainer's cuda_graph option: a whole optimizer step (training_step,
// backward, unscale and inf check, clipping, the optimizer, the LR schedule
// and the loss-scale update) recorded once as a CUDA graph and replayed for
// every later batch, so that a small model's step costs one launch instead of
// hundreds. It works because kiln's step is sync-free: lr, step count, loss
// scale, found-inf and clip coefficient live on the device (DESIGN.md).
//
// The Trainer runs kCudaGraphWarmupSteps eager steps first (optimizer state,
// cuDNN's benchmark search, cuBLAS workspaces: every allocation a step makes
// once), then copies the batch into static buffers, captures one step on
// them and replays it; each later batch is copied into the same buffers and
// the graph replayed. What a capture cannot hold makes the fit fall back to
// eager steps, said once on stderr with the reason (cuda_graph_obstacle, a
// failed capture, a batch of another shape or dtype).
//
// Semantics, as torch.cuda.graph's: host work inside the step runs once, at
// the capture. So callbacks' on_before_optimizer_step runs once (its device
// work is replayed), while TrainModule::log calls are recorded at the capture
// and re-applied after every replay (LogRecording), so logged values are
// each step's. Gradients are set to None at the end of each step, as eager.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"

namespace kiln {

namespace cuda {
class Graph;
}
class LogRecording;

// What the Trainer knows of a fit when it decides whether its steps can be a graph.
struct CudaGraphConditions {
  bool on_gpu = false;
  bool manual_optimization = false;
  int64_t accumulate_grad_batches = 1;  // the largest factor any epoch uses
  bool distributed = false;             // more than one process
  bool profiler = false;                // a profiler that times scopes or ops
  bool anomaly_mode = false;
};

// Why the optimizer steps of such a fit cannot be captured, or "" when they can.
std::string cuda_graph_obstacle(const CudaGraphConditions& conditions);

constexpr int64_t kCudaGraphWarmupSteps = 3;

// The state of one fit's graphed steps: warm-up count, the static batch, the
// graph, and whether the fit gave up on it.
class CudaGraphStep {
 public:
  explicit CudaGraphStep(int device);
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // True while eager warm-up steps remain; counts one.
  bool take_warmup_step();
  bool captured() const;
  // Why `batch` cannot go through the captured graph ("" when it can): the
  // static buffers have another shape or dtype.
  std::string mismatch(const Batch& batch) const;
  // The static buffers, allocated as copies of `batch` on the first call.
  const Batch& static_batch(const Batch& batch);
  // Copies `batch` into the static buffers (mismatch(batch) must be "").
  void load(const Batch& batch);
  cuda::Graph& graph();
  // The log calls the captured step made; apply_logs() re-applies them after a replay.
  void keep_logs(std::unique_ptr<LogRecording> logs);
  void apply_logs() const;
  // Eager steps from now on; the reason is said once on stderr (rank 0).
  void give_up(const std::string& reason, bool say);
  bool given_up() const { return given_up_; }
  // Says once (rank 0) that a batch ran eagerly, and why.
  void note_eager_batch(const std::string& reason, bool say);

 private:
  int device_;
  int64_t warmup_left_ = kCudaGraphWarmupSteps;
  std::unique_ptr<cuda::Graph> graph_;
  std::unique_ptr<LogRecording> logs_;
  Batch static_;
  bool given_up_ = false;
  bool eager_batch_said_ = false;
};

}  // namespace kiln
