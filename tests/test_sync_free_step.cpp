// The proof that a GPU training step is sync-free (shared/DESIGN.md): a whole
// mixed-precision step -- forward under float16 autocast, backward of the
// scaled loss, unscale, clip_grad_norm_, AdamW, OneCycle schedule -- leaves
// kiln's counters of device-to-host copies and synchronizations (every such
// call goes through kernels/cuda/runtime.h) unchanged, and asks the caching
// allocator for no new device memory (cudaMalloc synchronizes implicitly).
// A step whose gradients overflow is skipped on the device, still without a
// sync, and neither the optimizer's step counter nor the schedule advances.
#include <limits>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/generator.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"

namespace kiln::testing {

namespace {

struct MixedPrecisionSetup {
  explicit MixedPrecisionSetup(Device device)
      : model({nn::conv_bn_act(1, 8, 3, 1, 1), std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(512, 32),
               std::make_shared<nn::ReLU>(), std::make_shared<nn::LayerNorm>(Shape{32}),
               std::make_shared<nn::Linear>(32, 10)}) {
    model.to(device);
    optim::AdamWOptions adamw_options;
    adamw_options.lr = 1e-3;
    adamw = std::make_unique<optim::AdamW>(model.parameters(), adamw_options);
    optim::OneCycleLROptions schedule_options;
    schedule_options.max_lr = {1e-2};
    schedule_options.total_steps = 100;
    schedule = std::make_unique<optim::OneCycleLR>(*adamw, schedule_options);
    inputs = randn({16, 1, 8, 8}, {.device = device});
    labels = randint(0, 10, {16}, {.dtype = DType::i64, .device = device});
  }

  // One training step as the Trainer runs it with precision "16-mixed" and gradient clipping.
  void step(const Tensor& batch) {
    Tensor loss;
    {
      AutocastGuard autocast(DeviceType::cuda, DType::f16);
      logits = model.forward(batch);
      loss = cross_entropy(logits, labels);
    }
    scaler.scale(loss).backward();
    scaler.unscale_(*adamw);
    adamw->clip_grad_norm_(1.0);  // on unscaled gradients; applied by step() on the device
    scaler.step(*adamw);
    scaler.update();
    schedule->step();
    adamw->zero_grad();
  }

  nn::Sequential model;
  std::unique_ptr<optim::AdamW> adamw;
  std::unique_ptr<optim::OneCycleLR> schedule;
  optim::GradScaler scaler{{.init_scale = 1024.0}};  // no overflow in the finite steps
  Tensor inputs, labels, logits;
};

struct Counts {
  cuda::SyncCounters sync;
  uint64_t device_mallocs;
};

Counts counts() { return {cuda::sync_counters(), cuda_allocator(0).stats().device_malloc_calls}; }

void check_sync_free(const Counts& before, const Counts& after) {
  CHECK(after.sync.device_to_host_copies == before.sync.device_to_host_copies);
  CHECK(after.sync.synchronizations == before.sync.synchronizations);
  // With caching off (KILN_NO_CUDA_MEMORY_CACHING, the sanitizer runs) every tensor is a cudaMalloc.
  if (cuda_allocator(0).caching()) CHECK(after.device_mallocs == before.device_mallocs);
}

}  // namespace

TEST_CASE("a mixed-precision training step on the GPU neither copies to the host nor synchronizes [gpu]") {
  KILN_REQUIRE_GPU();
  manual_seed(21);
  MixedPrecisionSetup setup(Device::cuda(0));
  // Warm-up: optimizer state, scaler and schedule tensors, allocator cache,
  // cuBLAS/cuDNN handles, until three steps in a row take no new block (the
  // H200 runs: 61 cudaMallocs after the first step, 76 after the second and
  // none after). Each step's count is reported so that a failing run shows it.
  int64_t steps = 0, steps_without_malloc = 0;
  for (uint64_t previous = counts().device_mallocs; steps < 12 && steps_without_malloc < 3;) {
    setup.step(setup.inputs);
    cuda::device_synchronize(0);
    ++steps;
    const uint64_t now = counts().device_mallocs;
    MESSAGE("after warm-up step " << steps << ": " << now << " cudaMalloc calls, "
                                  << cuda_allocator(0).stats().reserved_bytes << " bytes reserved");
    steps_without_malloc = now == previous ? steps_without_malloc + 1 : 0;
    previous = now;
  }
  CHECK(steps_without_malloc == 3);  // settled within 12 steps

  const Counts before = counts();
  setup.step(setup.inputs);
  const Counts after = counts();
  MESSAGE("measured step: " << after.device_mallocs << " cudaMalloc calls, "
                            << cuda_allocator(0).stats().reserved_bytes << " bytes reserved");
  check_sync_free(before, after);
  CHECK(setup.logits.dtype() == DType::f16);  // the step really ran in mixed precision
  CHECK(setup.model.parameters()[0].dtype() == DType::f32);
  CHECK(setup.adamw->step_state().step.item<int64_t>() == steps + 1);
  CHECK(setup.schedule->last_epoch().item<int64_t>() == steps + 1);
  CHECK(setup.scaler.get_scale() == 1024.0);

  // A step whose gradients hold inf/NaN: skipped on the device, still sync-free.
  // The weights are kept on the host and the inputs poisoned in place: a copy
  // on the device would hold a cached block the step needs, and the step would
  // take a new one (the H200 runs took 7, one per parameter cloned on the device).
  std::vector<Tensor> weights_before;
  for (const Tensor& p : setup.model.parameters()) weights_before.push_back(p.detach().cpu());
  setup.inputs.select(0, 0).select(0, 0).select(0, 0).fill_(std::numeric_limits<double>::infinity());
  cuda::device_synchronize(0);
  const Counts before_skip = counts();
  setup.step(setup.inputs);
  const Counts after_skip = counts();
  check_sync_free(before_skip, after_skip);
  CHECK(setup.adamw->step_state().step.item<int64_t>() == steps + 1);
  CHECK(setup.schedule->last_epoch().item<int64_t>() == steps + 1);
  CHECK(setup.scaler.get_scale() == 512.0);  // backoff 0.5
  const std::vector<Tensor> params = setup.model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    KILN_CHECK_CLOSE(params[i].cpu(), weights_before[i], 0, 0);
  }
}

}  // namespace kiln::testing
