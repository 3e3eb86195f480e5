// The Trainer's cuda_graph option: a whole optimizer step (training_step,
// backward, unscale and inf check, clipping, the optimizer, the LR schedule
// and the loss-scale update) recorded once as a CUDA graph and replayed for
// every later batch, so that a small model's step costs one launch instead of
// hundreds. It works because kiln's step is sync-free: lr, step count, loss
// scale, found-inf and clip coefficient live on the device (DESIGN.md).
//
// The Trainer runs kCudaGraphWarmupSteps eager optimizer steps first
// (optimizer state, cuDNN's benchmark search, cuBLAS workspaces: every
// allocation a step makes once), then captures on static buffers (allocated
// as a copy of the warm-up's last batch: the graphs are for its shape and
// dtype) and replays; each later batch is copied into the same buffers and a
// graph replayed. What a capture cannot hold makes the fit fall back to eager
// steps, said once on stderr with the reason (cuda_graph_obstacle, a failed
// capture); a batch the graphs do not fit runs eagerly, said once per reason.
//
// Gradient accumulation (k = accumulate_grad_batches > 1): two graphs. Graph
// A is one micro-batch without the optimizer (training_step, loss / k, the
// scaled backward adding into the gradients); graph B is the micro-batch that
// ends a window, the same plus the whole optimizer step. A replayed graph
// writes the memory it recorded, so the gradients must stay where they are:
// from the warm-up's last step on, the step's zero_grad fills them with -0.0
// instead of setting them to None (clear_gradients), in graph B and in eager
// steps alike. -0.0 is IEEE 754's exact additive identity (-0 + x == x for
// every x, +0 and -0 included, while +0 + -0 == +0), so a window's first
// micro-batch adding into -0.0 leaves the very bits that an eager first
// micro-batch stores by taking its gradient as .grad: graphed and eager fits
// agree bit for bit. The gradients kept are those the warm-up's last step
// had, made by eager backwards in the common memory pool (not a graph's); a
// capture that creates one (a parameter first used later) is given up, and
// before each replay the Trainer checks that every parameter still has the
// gradient tensor the graphs add into (something that set it to None would
// otherwise be ignored). When fit ends after a step they are set to None, as
// an eager fit leaves them. Each graph has its own memory pool, so what one
// graph's replay writes (temporaries, logged values) nothing else holds.
// The warm-up is kCudaGraphWarmupSteps eager optimizer steps, i.e. whole
// windows as the eager loop cuts them (at least two from their first
// micro-batch, even when fit resumed mid-window), each of which ran both kinds
// of micro-batch whenever a window holds more than one: so each graph,
// captured on the first micro-batch of its kind after the warm-up, finds the
// optimizer state, the scaler's tensors and the workspaces made. A warm-up
// whose last step falls on a batch of another shape than its first batch's
// (an epoch's short last batch) runs one step more: the static buffers take
// the usual shape.
// The last batch of an epoch that closes a window early (fewer than k
// micro-batches) replays graph B: the eager loop runs it exactly as a k-th
// micro-batch (loss / k, backward, step), so the graph's work is the same.
// Without accumulation (k = 1) only graph B exists and the gradients are set
// to None inside it, as eager.
// Run eagerly (said once per reason): a batch of another shape or dtype (a
// last smaller batch), and an epoch whose accumulation factor is not the one
// the graphs were captured for (accumulation_schedule): a recapture would have
// to replace the graphs and their pools mid-fit and, from or to k = 1, switch
// the gradient mode at a window's edge; eager steps are exact in either mode.
//
// Semantics, as torch.cuda.graph's: host work inside the step runs once, at
// the capture. So callbacks' on_before_optimizer_step runs once (its device
// work is replayed), while TrainModule::log calls are recorded at each
// capture and re-applied after every replay of that graph (LogRecording), so
// logged values are each micro-batch's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

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
  bool distributed = false;             // more than one process
  bool profiler = false;                // a profiler that times scopes or ops
  bool anomaly_mode = false;
  // A callback whose on_before_optimizer_step must do host work at every step
  // (Callback::host_work_before_optimizer_step): its name, or "".
  std::string host_work_callback;
};

// Why the optimizer steps of such a fit cannot be captured, or "" when they
// can. Gradient accumulation is no obstacle (two graphs, see above).
std::string cuda_graph_obstacle(const CudaGraphConditions& conditions);

// Full windows (optimizer steps at the k-th micro-batch) run eagerly before the captures.
constexpr int64_t kCudaGraphWarmupSteps = 3;

// What a micro-batch does in the eager loop, which picks the graph that replays it.
enum class MicroBatchKind {
  accumulate,  // backward only: graph A
  step,        // ends its window (k = 1: every batch): backward and the optimizer step, graph B
};
// The kind of the batch at `batch_idx` of an epoch that accumulates
// `accumulate` batches, as Trainer::train_epoch decides when to step: the
// k-th of a window, or the epoch's last batch.
MicroBatchKind micro_batch_kind(int64_t batch_idx, int64_t accumulate, bool is_last_batch);

// Why a micro-batch after the warm-up runs eagerly; each is said once per fit.
enum class EagerCause { none, accumulation_changed, batch_mismatch };

struct CudaGraphDecision {
  enum class Action { warm_up, eager, capture, replay };
  Action action = Action::eager;
  EagerCause cause = EagerCause::none;  // for eager
  std::string reason;                   // for eager: what the user reads
};

// The state of one fit's graphed steps: warm-up count, the static batch, the
// graphs, the gradient mode, and whether the fit gave up on graphs.
class CudaGraphStep {
 public:
  // Touches no CUDA until a graph is asked for (the decisions run on the CPU too).
  explicit CudaGraphStep(int device);
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // What runs the micro-batch `batch` of kind `kind` in an epoch accumulating
  // `accumulate`. Counts the warm-up's steps: its last (eager) step fixes the
  // accumulation factor the graphs are for, the gradient mode (kept from this
  // step's zero_grad on when that factor is > 1) and the static buffers (a
  // copy of `batch`, allocated here, outside any capture).
  CudaGraphDecision decide(MicroBatchKind kind, int64_t accumulate, const Batch& batch);
  // The factor the graphs are for (0 during the warm-up).
  int64_t accumulation() const { return accumulation_; }
  bool captured(MicroBatchKind kind) const;
  // Why `batch` cannot go through the graphs ("" when it can): the static
  // buffers have another shape, dtype or device.
  std::string mismatch(const Batch& batch) const;
  // The static buffers (allocated when the warm-up ended).
  const Batch& static_batch() const { return static_; }
  // Copies `batch` into the static buffers (mismatch(batch) must be ""); nothing
  // when `batch` is the static batch itself (load_from_host put it there).
  void load(const Batch& batch);
  // Whether the micro-batch `host`, not yet on the device, goes straight into
  // the static buffers: the graphs are past the warm-up and not given up,
  // `accumulate` is their factor, and its tensors, converted to the dtypes
  // the Trainer gives a batch on the device (`input_dtype`, `target_dtype`),
  // fit the buffers. The Trainer then skips its own copy to the device (one
  // allocation and one device-to-device copy less per replayed step).
  bool fits_static(const Batch& host, DType input_dtype, DType target_dtype, int64_t accumulate) const;
  // Copies `host` into the static buffers, converting dtypes, without waiting
  // for the copy when the host memory is pinned (fits_static(host, ...) must hold).
  void load_from_host(const Batch& host);
  // Graph A (accumulate) or B (step); created on first use.
  cuda::Graph& graph(MicroBatchKind kind);
  // The log calls a captured graph made; apply_logs() re-applies them after its replay.
  void keep_logs(MicroBatchKind kind, std::unique_ptr<LogRecording> logs);
  void apply_logs(MicroBatchKind kind) const;
  // Whether the gradients stay allocated across steps (accumulation graphs, not given up):
  // the optimizer step then ends with clear_gradients instead of zero_grad(set_to_none).
  bool keeps_gradients() const { return keep_gradients_ && !given_up_; }
  // Fills the defined gradients of `params` with -0.0 (see above); recorded when capturing.
  static void clear_gradients(const std::vector<Tensor>& params);
  // The parameters and the gradient tensors the graphs were captured adding
  // into (held, so their memory stays while the graphs live).
  void pin_gradients(const std::vector<Tensor>& params);
  // "" while every pinned parameter still has its pinned gradient tensor, else
  // which does not (something set it to None or replaced it: a replay would
  // add into memory the parameter no longer reads).
  std::string moved_gradient() const;
  // Whether gradients are held for a window that has not stepped yet (the last
  // micro-batch decided was an accumulating one): at the end of fit the kept
  // gradients are set to None unless so, as an eager fit leaves them.
  bool window_open() const { return window_open_; }
  // Eager steps from now on; the reason is said once on stderr (rank 0).
  // Drops the graphs, their pools and the static buffers.
  void give_up(const std::string& reason, bool say);
  bool given_up() const { return given_up_; }
  // Says the decision's reason once per cause (rank 0). Returns whether this
  // was the first eager batch of its cause.
  bool note_eager_batch(const CudaGraphDecision& decision, bool say);

 private:
  int device_;
  int64_t warmup_left_ = kCudaGraphWarmupSteps;
  std::optional<Shape> warmup_input_shape_;  // the first warm-up batch's input shape: the fit's usual one
  int64_t accumulation_ = 0;
  bool keep_gradients_ = false;
  bool window_open_ = false;
  std::unique_ptr<cuda::Graph> graphs_[2];            // [0] A (accumulate), [1] B (step)
  std::unique_ptr<LogRecording> logs_[2];
  std::vector<Tensor> pinned_params_, pinned_grads_;
  Batch static_;
  bool given_up_ = false;
  std::set<EagerCause> eager_said_;
};

}  // namespace kiln
