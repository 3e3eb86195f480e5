#include "trainer/cuda_graph_step.h"

#include <iostream>

#include "core/cuda_graph.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "trainer/train_module.h"

namespace kiln {

std::string cuda_graph_obstacle(const CudaGraphConditions& c) {
  if (!c.on_gpu) return "the fit runs on the CPU (CUDA graphs record GPU work)";
  if (c.manual_optimization) {
    return "manual optimization (training_step steps its optimizers itself, with host decisions between them)";
  }
  if (c.distributed) return "distributed training (NCCL inside a captured step is not verified yet)";
  if (c.profiler) return "a profiler is on (it times each scope on the host, which a replay skips)";
  if (c.anomaly_mode) return "anomaly detection is on (it checks every backward output on the host)";
  if (!c.host_work_callback.empty()) {
    return "callback " + c.host_work_callback + " does host work before every optimizer step, which a replay "
           "would skip (it would run once, at the capture)";
  }
  return "";
}

MicroBatchKind micro_batch_kind(int64_t batch_idx, int64_t accumulate, bool is_last_batch) {
  KILN_ASSERT(batch_idx >= 0 && accumulate >= 1, "micro_batch_kind: batch ", batch_idx, ", factor ", accumulate);
  return (batch_idx + 1) % accumulate == 0 || is_last_batch ? MicroBatchKind::step : MicroBatchKind::accumulate;
}

CudaGraphStep::CudaGraphStep(int device) : device_(device) {}

CudaGraphStep::~CudaGraphStep() = default;

CudaGraphDecision CudaGraphStep::decide(MicroBatchKind kind, int64_t accumulate, const Batch& batch) {
  using Action = CudaGraphDecision::Action;
  window_open_ = kind == MicroBatchKind::accumulate;
  if (warmup_left_ > 0) {
    // The static buffers take the shape of the warm-up's last batch: when that is a short last batch of an
    // epoch (another shape than the first warm-up batch's), the warm-up runs one more step instead, or
    // every full batch after it would run eagerly.
    if (!warmup_input_shape_) warmup_input_shape_ = batch.input.defined() ? batch.input.shape() : Shape{};
    const bool usual_shape = !batch.input.defined() || batch.input.shape() == *warmup_input_shape_;
    if (kind == MicroBatchKind::step && (warmup_left_ > 1 || usual_shape) && --warmup_left_ == 0) {
      accumulation_ = accumulate;
      keep_gradients_ = accumulate > 1;  // this very step's zero_grad keeps them (Trainer::optimizer_step)
      NoGradGuard no_grad;
      static_.input = batch.input.defined() ? batch.input.detach().clone() : Tensor();
      static_.target = batch.target.defined() ? batch.target.detach().clone() : Tensor();
    }
    return {Action::warm_up, EagerCause::none, ""};
  }
  if (accumulate != accumulation_) {
    return {Action::eager, EagerCause::accumulation_changed,
            "this epoch accumulates " + std::to_string(accumulate) + " batches where the graphs were captured for " +
                std::to_string(accumulation_)};
  }
  if (std::string reason = mismatch(batch); !reason.empty()) {
    return {Action::eager, EagerCause::batch_mismatch, std::move(reason)};
  }
  return {captured(kind) ? Action::replay : Action::capture, EagerCause::none, ""};
}

bool CudaGraphStep::captured(MicroBatchKind kind) const {
  const auto& graph = graphs_[kind == MicroBatchKind::step ? 1 : 0];
  return graph && graph->captured();
}

namespace {
std::string field_mismatch(const char* field, const Tensor& fixed, const Tensor& given) {
  if (fixed.defined() != given.defined()) return std::string("the batch's ") + field + " is missing or new";
  if (!fixed.defined()) return "";
  if (fixed.shape() != given.shape()) {
    return std::string("a batch's ") + field + " of shape " + shape_str(given.shape()) + " where the graph has " +
           shape_str(fixed.shape());
  }
  if (fixed.dtype() != given.dtype()) {
    return std::string("a batch's ") + field + " of dtype " + std::string(dtype_name(given.dtype())) +
           " where the graph has " + std::string(dtype_name(fixed.dtype()));
  }
  if (fixed.device() != given.device()) return std::string("a batch's ") + field + " on another device";
  return "";
}
}  // namespace

std::string CudaGraphStep::mismatch(const Batch& batch) const {
  std::string reason = field_mismatch("input", static_.input, batch.input);
  if (reason.empty()) reason = field_mismatch("target", static_.target, batch.target);
  return reason;
}

void CudaGraphStep::load(const Batch& batch) {
  KILN_CHECK(mismatch(batch).empty(), "CudaGraphStep::load: ", mismatch(batch));
  NoGradGuard no_grad;
  if (static_.input.defined() && !static_.input.same(batch.input)) static_.input.copy_(batch.input);
  if (static_.target.defined() && !static_.target.same(batch.target)) static_.target.copy_(batch.target);
}

namespace {
bool field_fits(const Tensor& fixed, const Tensor& host, DType dtype) {
  if (fixed.defined() != host.defined()) return false;
  return !fixed.defined() || (fixed.shape() == host.shape() && fixed.dtype() == dtype);
}
}  // namespace

bool CudaGraphStep::fits_static(const Batch& host, DType input_dtype, DType target_dtype, int64_t accumulate) const {
  if (given_up_ || warmup_left_ > 0 || accumulate != accumulation_) return false;
  return field_fits(static_.input, host.input, input_dtype) && field_fits(static_.target, host.target, target_dtype);
}

void CudaGraphStep::load_from_host(const Batch& host) {
  const auto dtype_of = [](const Tensor& t) { return t.defined() ? t.dtype() : DType::f32; };
  KILN_ASSERT(fits_static(host, dtype_of(static_.input), dtype_of(static_.target), accumulation_),
              "CudaGraphStep::load_from_host: a batch that does not fit the static buffers");
  NoGradGuard no_grad;
  // Ordered on the current stream after the last replay, which read the buffers.
  if (static_.input.defined()) static_.input.copy_(host.input, /*non_blocking=*/true);
  if (static_.target.defined()) static_.target.copy_(host.target, /*non_blocking=*/true);
}

cuda::Graph& CudaGraphStep::graph(MicroBatchKind kind) {
  std::unique_ptr<cuda::Graph>& graph = graphs_[kind == MicroBatchKind::step ? 1 : 0];
  // Each graph has its own memory pool: what one graph's replay writes (its
  // temporaries, its logged values) no other graph or eager step ever holds.
  if (!graph) graph = std::make_unique<cuda::Graph>(device_);
  return *graph;
}

void CudaGraphStep::keep_logs(MicroBatchKind kind, std::unique_ptr<LogRecording> logs) {
  logs_[kind == MicroBatchKind::step ? 1 : 0] = std::move(logs);
}

void CudaGraphStep::apply_logs(MicroBatchKind kind) const {
  if (const auto& logs = logs_[kind == MicroBatchKind::step ? 1 : 0]) logs->apply();
}

void CudaGraphStep::clear_gradients(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  for (const Tensor& param : params) {
    // Not zero_(): +0.0 + -0.0 is +0.0, and an eager first micro-batch keeps a -0.0 gradient as it is.
    if (Tensor grad = param.grad(); grad.defined()) grad.fill_(-0.0);
  }
}

void CudaGraphStep::pin_gradients(const std::vector<Tensor>& params) {
  pinned_params_ = params;
  pinned_grads_.clear();
  for (const Tensor& param : params) pinned_grads_.push_back(param.grad());
}

std::string CudaGraphStep::moved_gradient() const {
  for (size_t i = 0; i < pinned_params_.size(); ++i) {
    if (pinned_params_[i].grad().same(pinned_grads_[i])) continue;
    return "the gradient of parameter " + std::to_string(i) + " of the model is not the tensor the graphs add into " +
           "any more (set to None or replaced outside the Trainer's step)";
  }
  return "";
}

void CudaGraphStep::give_up(const std::string& reason, bool say) {
  if (given_up_) return;
  given_up_ = true;
  for (auto& logs : logs_) logs.reset();  // their values are blocks of the graphs' pools, released with them
  for (auto& graph : graphs_) graph.reset();
  static_ = Batch{};
  pinned_params_.clear();
  pinned_grads_.clear();
  if (say) std::cerr << "Trainer: cuda_graph: eager steps for this fit: " << reason << "\n";
}

bool CudaGraphStep::note_eager_batch(const CudaGraphDecision& decision, bool say) {
  if (!eager_said_.insert(decision.cause).second) return false;
  if (say) std::cerr << "Trainer: cuda_graph: " << decision.reason << ": such batches run eagerly (said once)\n";
  return true;
}

}  // namespace kiln
