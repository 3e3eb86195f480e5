// The autograd engine: recording, saved tensors, and the backward pass.
#include "core/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/autocast.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "core/profiler.h"

namespace kiln {

namespace {
thread_local bool grad_mode = true;
std::atomic<bool> anomaly_mode{false};
std::atomic<bool> deterministic_mode{false};
std::atomic<uint64_t> next_sequence_nr{0};
}  // namespace

bool grad_mode_enabled() { return grad_mode; }
void set_grad_mode(bool enabled) { grad_mode = enabled; }
bool anomaly_mode_enabled() { return anomaly_mode.load(); }
void set_detect_anomaly(bool enabled) { anomaly_mode.store(enabled); }
bool deterministic_algorithms_enabled() { return deterministic_mode.load(); }
void set_deterministic_algorithms(bool enabled) { deterministic_mode.store(enabled); }
void alert_not_deterministic(const char* op) {
  KILN_CHECK(!deterministic_algorithms_enabled(), op,
             ": this op has no deterministic implementation on this device, and deterministic algorithms are on "
             "(set_deterministic_algorithms(true) / --deterministic)");
}

namespace autograd {

Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1)) {}

AutogradMeta& meta(const Tensor& tensor) {
  KILN_CHECK(tensor.defined(), "autograd: undefined tensor");
  auto& slot = tensor.impl()->autograd;
  if (!slot) slot = std::make_unique<AutogradMeta>();
  return *slot;
}

AutogradMeta* meta_if(const Tensor& tensor) { return tensor.defined() ? tensor.impl()->autograd.get() : nullptr; }

// ---------------------------------------------------------------- saved tensors

SavedTensor::SavedTensor(const Tensor& tensor, const char* op) : op_(op), was_defined_(tensor.defined()) {
  if (!tensor.defined()) return;
  tensor_ = tensor.detach();  // cuts the graph: saving an output creates no cycle
  saved_version_ = tensor.version();
}

Tensor SavedTensor::unpack() const {
  if (!was_defined_) return Tensor();
  KILN_CHECK(tensor_.defined(), "backward of '", op_,
             "': its saved tensors were freed by an earlier backward; pass retain_graph=true to the first backward");
  KILN_CHECK(tensor_.version() == saved_version_, "backward of '", op_,
             "': a tensor it saved for backward (shape ", shape_str(tensor_.shape()),
             ") was modified by an in-place operation: saved at version ", saved_version_, ", now at version ",
             tensor_.version());
  return tensor_;
}

// ---------------------------------------------------------------- nodes

namespace {

// A gradient hook may replace the gradient, not change what it describes (torch: "hook 'hook' has changed the size of value").
const Tensor& checked_hook_result(const Tensor& replaced, const Tensor& gradient) {
  KILN_CHECK(replaced.shape() == gradient.shape() && replaced.dtype() == gradient.dtype() &&
                 replaced.device() == gradient.device(),
             "backward: a gradient hook returned a tensor of shape ", shape_str(replaced.shape()), ", ",
             dtype_name(replaced.dtype()), " on ", replaced.device(), " for a gradient of shape ",
             shape_str(gradient.shape()), ", ", dtype_name(gradient.dtype()), " on ", gradient.device(),
             "; a hook must keep the shape, dtype and device");
  return replaced;
}

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn backward) : name_(name), backward_(std::move(backward)) {}
  TensorList apply(TensorList&& grads) override {
    KILN_CHECK(backward_ != nullptr, "backward of '", name_,
               "' called a second time after its saved tensors were freed; pass retain_graph=true to the first "
               "backward");
    return backward_(grads);
  }
  std::string name() const override { return name_; }
  void release_saved() override { backward_ = nullptr; }

 private:
  const char* name_;
  BackwardFn backward_;
};

// Accumulates the incoming gradient into a leaf's .grad.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  TensorList apply(TensorList&& grads) override {
    Tensor leaf(leaf_);
    AutogradMeta& m = meta(leaf);
    Tensor incoming = grads[0];
    for (auto& hook : m.hooks) {
      Tensor replaced = hook(incoming);
      if (replaced.defined()) incoming = checked_hook_result(replaced, incoming);
    }
    if (!m.grad.defined()) {
      // Keep the incoming buffer when nothing else refers to it; otherwise copy,
      // so that an in-place accumulation later cannot write into another tensor.
      // The gradient takes the leaf's layout, as torch's: row-major, or
      // channels-last for a channels-last leaf (parameters are row-major).
      const bool leaf_channels_last = is_channels_last(leaf);
      const bool in_layout = leaf_channels_last ? incoming.strides() == leaf.strides() : incoming.is_contiguous();
      const bool sole_owner =
          incoming.impl_ptr().use_count() == 2 && incoming.storage().use_count() == 1 && in_layout;
      if (sole_owner) {
        m.grad = incoming.detach();
      } else if (leaf_channels_last) {
        Tensor copy = empty_in_layout_of(leaf, leaf.shape(), {.dtype = incoming.dtype(), .device = incoming.device()});
        {
          NoGradGuard no_grad;
          copy.copy_(incoming);
        }
        m.grad = copy;
      } else {
        m.grad = incoming.clone();
      }
    } else {
      m.grad.add_(incoming);
    }
    for (auto& hook : m.post_accumulate_hooks) hook(leaf);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& m = meta(leaf);
  if (auto existing = m.grad_accumulator.lock()) return existing;
  auto node = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
  node->outputs.push_back({leaf.shape(), leaf.dtype(), leaf.device()});
  node->pre_hooks.resize(1);
  m.grad_accumulator = node;
  return node;
}

}  // namespace

std::shared_ptr<Node> gradient_edge_node(const Tensor& tensor, uint32_t* input_nr) {
  *input_nr = 0;
  AutogradMeta* m = meta_if(tensor);
  if (m == nullptr || !m->requires_grad) return nullptr;
  if (m->grad_fn) {
    *input_nr = m->output_nr;
    return m->grad_fn;
  }
  return grad_accumulator(tensor);
}

bool any_requires_grad(std::initializer_list<const Tensor*> tensors) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor* tensor : tensors) {
    if (tensor->defined() && tensor->requires_grad()) return true;
  }
  return false;
}

bool any_requires_grad(const TensorList& tensors) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor& tensor : tensors) {
    if (tensor.defined() && tensor.requires_grad()) return true;
  }
  return false;
}

void record(const char* name, const TensorList& inputs, const TensorList& outputs, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return;
  if (OpProfiler* profiler = active_op_profiler()) profiler->count_forward(name);
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->next_edges.reserve(inputs.size());
  for (const Tensor& input : inputs) {
    Edge edge;
    if (input.defined()) edge.node = gradient_edge_node(input, &edge.input_nr);
    node->next_edges.push_back(edge);
    node->input_shapes.push_back(input.defined() ? input.shape() : Shape{});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& output = outputs[i];
    KILN_ASSERT(is_floating(output.dtype()), "op '", name, "' recorded a non-floating output");
    AutogradMeta& m = meta(output);
    KILN_ASSERT(m.grad_fn == nullptr, "op '", name, "' output already has a grad_fn");
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(i);
    node->outputs.push_back({output.shape(), output.dtype(), output.device()});
  }
  node->pre_hooks.resize(outputs.size());
}

// ---------------------------------------------------------------- engine

namespace {

struct CompareSequence {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

void check_finite_for_anomaly(const Node& node, const TensorList& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() || grads[i].numel() == 0) continue;
    const bool finite = all(isfinite(grads[i])).item<bool>();
    KILN_CHECK(finite, "anomaly detected: the backward of '", node.name(), "' returned NaN or inf in its gradient ",
               i, " (shape ", shape_str(grads[i].shape()), ")");
  }
}

// Executes the graph reachable from `roots`. With `captures` non-null, the
// gradients flowing into those edges are stored there instead of being
// accumulated into leaves (autograd::grad).
void execute(const std::vector<Edge>& roots, const TensorList& grad_roots, bool retain_graph,
             std::vector<std::pair<Edge, Tensor>>* captures) {
  NoGradGuard no_grad;
  // Backward formulas run in the dtypes their forward ops chose, never under
  // autocast: inside a guard a reduction (sum_to) would hand a 16-bit product a
  // float32 gradient. nn::checkpoint's recompute re-enters the forward's state.
  AutocastGuard no_cpu_autocast(DeviceType::cpu, autocast_dtype(DeviceType::cpu), /*enabled=*/false);
  AutocastGuard no_cuda_autocast(DeviceType::cuda, autocast_dtype(DeviceType::cuda), /*enabled=*/false);
  // Dependencies: how many edges from reachable nodes point at each node.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Edge& root : roots) {
    if (root.valid() && seen.insert(root.node.get()).second) stack.push_back(root.node.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges) {
      if (!edge.valid()) continue;
      ++dependencies[edge.node.get()];
      if (seen.insert(edge.node.get()).second) stack.push_back(edge.node.get());
    }
  }

  std::unordered_map<Node*, TensorList> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  auto add_to_buffer = [&](const Edge& edge, const Tensor& grad) {
    TensorList& buffer = buffers[edge.node.get()];
    if (buffer.empty()) buffer.resize(edge.node->outputs.size());
    Tensor& slot = buffer[edge.input_nr];
    slot = slot.defined() ? add(slot, grad) : grad;
    keep_alive.emplace(edge.node.get(), edge.node);
  };

  std::priority_queue<Node*, std::vector<Node*>, CompareSequence> ready;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].valid()) continue;
    add_to_buffer(roots[i], grad_roots[i]);
  }
  for (const Edge& root : roots) {
    if (root.valid() && dependencies[root.node.get()] == 0) {
      dependencies[root.node.get()] = -1;  // queued
      ready.push(root.node.get());
    }
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    TensorList grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(node->outputs.size());
    // Which outputs a gradient reached, before the others get zeros: grad()
    // reports an output no gradient reached as unused (torch's None), e.g. a
    // piece of split that the differentiated value never read.
    std::vector<bool> reached(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) reached[i] = grads[i].defined();
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) {
        const auto& info = node->outputs[i];
        grads[i] = zeros(info.shape, {.dtype = info.dtype, .device = info.device});
      }
      for (auto& hook : node->pre_hooks[i]) {
        Tensor replaced = hook(grads[i]);
        if (replaced.defined()) grads[i] = checked_hook_result(replaced, grads[i]);
      }
    }
    const bool is_leaf_accumulator = dynamic_cast<AccumulateGrad*>(node) != nullptr;
    if (captures) {
      for (auto& [edge, captured] : *captures) {
        if (edge.node.get() == node) captured = reached[edge.input_nr] ? grads[edge.input_nr] : Tensor();
      }
      if (is_leaf_accumulator) continue;  // grad() never writes .grad
    }
    TensorList input_grads;
    {
      BackwardNodeScope profiled(*node);  // one branch unless an op profiler is on
      input_grads = node->apply(std::move(grads));
    }
    if (!retain_graph) node->release_saved();
    if (anomaly_mode_enabled()) check_finite_for_anomaly(*node, input_grads);
    KILN_ASSERT(is_leaf_accumulator || input_grads.size() == node->next_edges.size(), "backward of '", node->name(),
                "' returned ", input_grads.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < node->next_edges.size() && i < input_grads.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      if (!edge.valid()) continue;
      if (input_grads[i].defined()) {
        KILN_ASSERT(input_grads[i].shape() == node->input_shapes[i], "backward of '", node->name(),
                    "' returned a gradient of shape ", shape_str(input_grads[i].shape()), " for input ", i,
                    " of shape ", shape_str(node->input_shapes[i]));
        add_to_buffer(edge, input_grads[i]);
      }
    }
    for (const Edge& edge : node->next_edges) {
      if (!edge.valid()) continue;
      int& count = dependencies[edge.node.get()];
      if (--count == 0) {
        count = -1;
        ready.push(edge.node.get());
        keep_alive.emplace(edge.node.get(), edge.node);
      }
    }
  }
}

// The gradient `gradient` given for `root` (output i of `what`): the same shape
// and device, cast to the root's dtype as torch does (validate_outputs).
Tensor checked_root_gradient(const Tensor& root, const Tensor& gradient, size_t i, const char* what) {
  KILN_CHECK(gradient.defined(), what, ": the gradient for output ", i, " is undefined");
  KILN_CHECK(gradient.shape() == root.shape(), what, ": the gradient for output ", i, " has shape ",
             shape_str(gradient.shape()), " but the output has shape ", shape_str(root.shape()));
  KILN_CHECK(gradient.device() == root.device(), what, ": the gradient for output ", i, " is on ", gradient.device(),
             " but the output is on ", root.device());
  if (gradient.dtype() == root.dtype()) return gradient;
  NoGradGuard no_grad;
  return gradient.to(root.dtype());
}

Edge edge_of(const Tensor& tensor, const char* what) {
  KILN_CHECK(tensor.defined(), what, ": undefined tensor");
  Edge edge;
  edge.node = gradient_edge_node(tensor, &edge.input_nr);
  KILN_CHECK(edge.valid(), what, ": the tensor does not require grad and has no grad_fn");
  return edge;
}

}  // namespace

void run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph) {
  KILN_CHECK(roots.size() == grad_roots.size(), "backward: ", roots.size(), " tensors but ", grad_roots.size(),
             " gradients");
  std::vector<Edge> edges;
  TensorList seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    edges.push_back(edge_of(roots[i], "backward"));
    seeds.push_back(checked_root_gradient(roots[i], grad_roots[i], i, "backward"));
  }
  execute(edges, seeds, retain_graph, nullptr);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph, bool allow_unused) {
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "grad: ", grad_outputs.size(),
             " grad_outputs for ", outputs.size(), " outputs (expected one per output, or none)");
  std::vector<Edge> edges;
  TensorList seeds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    edges.push_back(edge_of(outputs[i], "grad"));
    if (i < grad_outputs.size() && grad_outputs[i].defined()) {
      seeds.push_back(checked_root_gradient(outputs[i], grad_outputs[i], i, "grad"));
    } else {
      KILN_CHECK(outputs[i].numel() == 1, "grad: a grad_output is needed for output ", i, " of shape ",
                 shape_str(outputs[i].shape()));
      seeds.push_back(ones_like(outputs[i]));
    }
  }
  std::vector<std::pair<Edge, Tensor>> captures;
  for (const Tensor& input : inputs) captures.emplace_back(edge_of(input, "grad"), Tensor());
  execute(edges, seeds, retain_graph, &captures);
  TensorList result;
  for (size_t i = 0; i < captures.size(); ++i) {
    KILN_CHECK(captures[i].second.defined() || allow_unused, "grad: input ", i,
               " was not used in the graph; pass allow_unused=true");
    result.push_back(captures[i].second);
  }
  return result;
}

}  // namespace autograd

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  KILN_ASSERT(lead >= 0, "sum_to: cannot reduce ", shape_str(grad.shape()), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < grad.dim(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && grad.shape()[i] != 1)) dims.push_back(i);
  }
  Tensor reduced = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reduced.reshape(shape);
}

}  // namespace kiln
