// Reverse-mode autograd over a dynamic graph of nodes.
//
// An op that produces a differentiable result records one Node whose
// next_edges point at the nodes of its inputs (or at their AccumulateGrad node
// for leaves). backward() runs nodes in dependency order with grad mode off
// (no double backward), accumulates into leaf .grad (absent until first
// written) and runs the hooks. Saved tensors carry the version they were saved
// at, so an in-place write after saving gives a clear error.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// --- grad mode
bool grad_mode_enabled();
void set_grad_mode(bool enabled);
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
class EnableGradGuard {
 public:
  explicit EnableGradGuard(bool enabled = true) : previous_(grad_mode_enabled()) { set_grad_mode(enabled); }
  ~EnableGradGuard() { set_grad_mode(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// --- anomaly mode: after each backward node, check its outputs for NaN/inf and
// throw naming the forward op (this reads values from the device: debug only).
bool anomaly_mode_enabled();
void set_detect_anomaly(bool enabled);

// --- determinism: ops that cannot be deterministic throw naming themselves.
bool deterministic_algorithms_enabled();
void set_deterministic_algorithms(bool enabled);
// Throws kiln::Error naming `op` when the deterministic switch is on.
void alert_not_deterministic(const char* op);

namespace autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

using TensorList = std::vector<Tensor>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  // Gradients w.r.t. this node's forward inputs (one per next_edge; undefined
  // means "no gradient") from the gradients w.r.t. its outputs.
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // The forward op's name, e.g. "mul"; used in error messages.
  virtual std::string name() const = 0;
  // Frees saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  uint64_t sequence_nr;
  // Shapes, dtypes and devices of the forward outputs, to materialize zero
  // gradients for outputs that got none and to check returned gradients.
  struct OutputInfo {
    Shape shape;
    DType dtype;
    Device device;
  };
  std::vector<OutputInfo> outputs;
  std::vector<std::vector<std::function<Tensor(const Tensor&)>>> pre_hooks;  // per output
  // Shapes of the forward inputs, to check gradients returned by apply().
  std::vector<Shape> input_shapes;
  bool released = false;
};

// A tensor saved for backward: a detached alias plus the version it had.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& tensor, const char* op);
  // Throws kiln::Error if the tensor was modified in place since it was saved.
  Tensor unpack() const;
  void reset() { tensor_ = Tensor(); }
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint64_t saved_version_ = 0;
  const char* op_ = "";
  bool was_defined_ = false;
};

struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;
  std::vector<std::function<Tensor(const Tensor&)>> hooks;  // leaf hooks
  std::vector<std::function<void(const Tensor&)>> post_accumulate_hooks;
};

// True when grad mode is on and any of the tensors requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> tensors);
bool any_requires_grad(const TensorList& tensors);

using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

// Records a node named `name` for outputs computed from `inputs`. `backward`
// receives one gradient per output (zeros where an output got none) and
// returns one per input (undefined where an input needs none). Returns without
// recording when no input requires grad or grad mode is off.
//   if (autograd::any_requires_grad({&a, &b})) {
//     autograd::record("mul", {a, b}, {out}, [sa = SavedTensor(a, "mul"), ...](const TensorList& g) {...});
//   }
void record(const char* name, const TensorList& inputs, const TensorList& outputs, BackwardFn backward);

// Whether input i of the current backward needs a gradient; backward
// functions receive this through needs_input_grad() of the recording helper.
std::shared_ptr<Node> gradient_edge_node(const Tensor& tensor, uint32_t* input_nr);

// Runs backward from `roots` with `grad_roots` (defined, the roots' shapes and
// devices; another dtype is cast to the root's, as torch does).
void run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph);

// Gradients of `outputs` w.r.t. `inputs` without touching .grad (torch.autograd.grad).
// `grad_outputs`: none, or one per output (undefined for a one-element output),
// checked as run_backward's `grad_roots`.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false, bool allow_unused = false);

AutogradMeta& meta(const Tensor& tensor);  // creates it when absent
AutogradMeta* meta_if(const Tensor& tensor);

}  // namespace autograd

// Sums `grad` down to `shape` (undoing broadcasting) — the backward of expand.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace kiln
