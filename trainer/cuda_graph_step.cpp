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
  if (c.accumulate_grad_batches > 1) {
    return "gradient accumulation (accumulate_grad_batches " + std::to_string(c.accumulate_grad_batches) +
           "): a graph for a micro-batch without the step is not implemented yet";
  }
  if (c.distributed) return "distributed training (NCCL inside a captured step is not verified yet)";
  if (c.profiler) return "a profiler is on (it times each scope on the host, which a replay skips)";
  if (c.anomaly_mode) return "anomaly detection is on (it checks every backward output on the host)";
  return "";
}

CudaGraphStep::CudaGraphStep(int device) : device_(device) {}

CudaGraphStep::~CudaGraphStep() = default;

bool CudaGraphStep::take_warmup_step() {
  if (warmup_left_ == 0) return false;
  --warmup_left_;
  return true;
}

bool CudaGraphStep::captured() const { return graph_ && graph_->captured(); }

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

const Batch& CudaGraphStep::static_batch(const Batch& batch) {
  if (!static_.input.defined()) {
    static_.input = batch.input.defined() ? batch.input.detach().clone() : Tensor();
    static_.target = batch.target.defined() ? batch.target.detach().clone() : Tensor();
  }
  return static_;
}

void CudaGraphStep::load(const Batch& batch) {
  KILN_CHECK(mismatch(batch).empty(), "CudaGraphStep::load: ", mismatch(batch));
  NoGradGuard no_grad;
  if (static_.input.defined()) static_.input.copy_(batch.input);
  if (static_.target.defined()) static_.target.copy_(batch.target);
}

cuda::Graph& CudaGraphStep::graph() {
  if (!graph_) graph_ = std::make_unique<cuda::Graph>(device_);
  return *graph_;
}

void CudaGraphStep::keep_logs(std::unique_ptr<LogRecording> logs) { logs_ = std::move(logs); }

void CudaGraphStep::apply_logs() const {
  if (logs_) logs_->apply();
}

void CudaGraphStep::give_up(const std::string& reason, bool say) {
  if (given_up_) return;
  given_up_ = true;
  graph_.reset();
  logs_.reset();
  static_ = Batch{};
  if (say) std::cerr << "Trainer: cuda_graph: eager steps for this fit: " << reason << "\n";
}

void CudaGraphStep::note_eager_batch(const std::string& reason, bool say) {
  if (eager_batch_said_) return;
  eager_batch_said_ = true;
  if (say) std::cerr << "Trainer: cuda_graph: " << reason << ": that batch runs eagerly (said once)\n";
}

}  // namespace kiln
