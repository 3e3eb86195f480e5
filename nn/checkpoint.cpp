#include "nn/checkpoint.h"

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"

namespace kiln::nn {

namespace {
thread_local bool recomputing = false;

// Marks the recomputation of a checkpointed forward (nested checkpoints included).
class RecomputeScope {
 public:
  RecomputeScope() : previous_(recomputing) { recomputing = true; }
  ~RecomputeScope() { recomputing = previous_; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  bool previous_;
};
}  // namespace

bool is_recomputing() { return recomputing; }

Tensor checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs) {
  KILN_CHECK(fn != nullptr, "checkpoint: the function is empty");
  KILN_CHECK(!inputs.empty() && inputs[0].defined(), "checkpoint: needs at least one defined input");
  if (!grad_mode_enabled()) return fn(inputs);
  const Device device = inputs[0].device();
  const GeneratorState rng_state = default_generator(device).state();
  // The recompute runs in backward, outside the forward's autocast region: it re-enters that state (as torch).
  const bool cpu_autocast = autocast_enabled(DeviceType::cpu), cuda_autocast = autocast_enabled(DeviceType::cuda);
  const DType cpu_dtype = autocast_dtype(DeviceType::cpu), cuda_dtype = autocast_dtype(DeviceType::cuda);
  Tensor output;
  {
    NoGradGuard no_grad;
    output = fn(inputs);
  }
  KILN_CHECK(output.defined(), "checkpoint: the function returned an undefined tensor");
  KILN_CHECK(is_floating(output.dtype()), "checkpoint: the function must return a floating tensor, got ",
             dtype_name(output.dtype()));
  // A fresh handle: fn may return one of its inputs or a tensor it captured,
  // which must not become the output of the node recorded below.
  output = output.detach();
  // Record one node over the inputs. Parameters used inside fn are not its
  // inputs: the reentrant backward below accumulates their gradients directly.
  std::vector<Tensor> detached_inputs;
  for (const Tensor& input : inputs) detached_inputs.push_back(input.defined() ? input.detach() : input);
  auto backward = [fn, detached_inputs, rng_state, device, cpu_autocast, cuda_autocast, cpu_dtype,
                   cuda_dtype](const autograd::TensorList& grads) {
    std::vector<Tensor> leaves;
    for (const Tensor& input : detached_inputs) {
      Tensor leaf = input.defined() ? input.detach() : input;
      if (leaf.defined() && is_floating(leaf.dtype())) leaf.requires_grad_(true);
      leaves.push_back(leaf);
    }
    Generator& generator = default_generator(device);
    const GeneratorState current = generator.state();
    generator.set_state(rng_state);
    Tensor recomputed;
    {
      EnableGradGuard enable_grad;
      AutocastGuard cpu_region(DeviceType::cpu, cpu_dtype, cpu_autocast);
      AutocastGuard cuda_region(DeviceType::cuda, cuda_dtype, cuda_autocast);
      RecomputeScope recompute;
      recomputed = fn(leaves);
    }
    generator.set_state(current);
    if (recomputed.requires_grad()) autograd::run_backward({recomputed}, {grads[0]}, /*retain_graph=*/false);
    autograd::TensorList input_grads;
    for (const Tensor& leaf : leaves) input_grads.push_back(leaf.defined() ? leaf.grad() : Tensor());
    return input_grads;
  };
  // The graph through fn must be rebuilt for the parameters inside it, so
  // record even when only parameters (not the inputs) need gradients.
  bool inputs_need_grad = autograd::any_requires_grad(inputs);
  if (!inputs_need_grad) {
    // A leaf stand-in so the node is reached by backward; it gets no gradient.
    Tensor anchor = zeros({}, {.dtype = output.dtype(), .device = device}).requires_grad_(true);
    std::vector<Tensor> with_anchor = inputs;
    with_anchor.push_back(anchor);
    autograd::record("checkpoint", with_anchor, {output}, [backward](const autograd::TensorList& grads) {
      autograd::TensorList result = backward(grads);
      result.push_back(Tensor());  // the anchor gets no gradient
      return result;
    });
    return output;
  }
  autograd::record("checkpoint", inputs, {output}, backward);
  return output;
}

Tensor checkpoint(const ModulePtr& module, const Tensor& input) {
  KILN_CHECK(module != nullptr, "checkpoint: the module is null");
  return checkpoint([module](const std::vector<Tensor>& inputs) { return module->forward(inputs[0]); }, {input});
}

Tensor checkpoint_sequential(const std::vector<ModulePtr>& layers, int segments, const Tensor& input) {
  KILN_CHECK(segments > 0, "checkpoint_sequential: segments must be positive, got ", segments);
  const size_t count = layers.size();
  const size_t per_segment = (count + static_cast<size_t>(segments) - 1) / static_cast<size_t>(segments);
  Tensor x = input;
  for (size_t start = 0; start < count; start += per_segment) {
    const size_t end = std::min(count, start + per_segment);
    auto run = [&layers, start, end](const std::vector<Tensor>& inputs) {
      Tensor y = inputs[0];
      for (size_t i = start; i < end; ++i) y = layers[i]->forward(y);
      return y;
    };
    x = end == count ? run({x}) : checkpoint(run, {x});
  }
  return x;
}

}  // namespace kiln::nn
