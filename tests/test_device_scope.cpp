// Ops run on their tensors' device, whichever device the thread has current:
// every CUDA launch holds a cuda::DeviceScope (core/launch.h), and events,
// copies and memsets run on their stream's device.
#include <doctest/doctest.h>

#include <memory>

#include "core/autograd.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "core/profiler.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/device_prefetcher.h"
#include "kernels/cuda/runtime.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"

using namespace kiln;
using doctest::Contains;
using testing::random_values;

namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  return tensor<double>(random_values(shape_numel(shape), seed), shape).to(DType::f32);
}

// One training step through every op family, on `device`; returns what it
// computed (loss, gradients, updated parameters) on the CPU.
std::vector<Tensor> step_on(Device device) {
  Tensor x = random_tensor({4, 3, 8, 8}, 1).to(device);
  Tensor conv_w = random_tensor({5, 3, 3, 3}, 2).to(device).requires_grad_();
  Tensor conv_b = random_tensor({5}, 3).to(device).requires_grad_();
  Tensor bn_w = ones({5}, {.device = device}).requires_grad_();
  Tensor bn_b = zeros({5}, {.device = device}).requires_grad_();
  Tensor running_mean = zeros({5}, {.device = device}), running_var = ones({5}, {.device = device});
  Tensor fc = random_tensor({10, 5 * 4 * 4}, 4).to(device).requires_grad_();
  Tensor table = random_tensor({7, 10}, 5).to(device).requires_grad_();
  Tensor target = tensor<int64_t>({1, 0, 9, 3}, {4}).to(device);
  Tensor rows = tensor<int64_t>({6, 2, 2, 0}, {4}).to(device);

  Tensor h = conv2d(x, conv_w, conv_b, 1, 1);                        // cuDNN + the bias add
  h = batch_norm_relu(h, running_mean, running_var, bn_w, bn_b, true);  // norm
  h = max_pool2d(h, 2);                                               // pool
  h = layer_norm(h.flatten(1), {5 * 4 * 4});                          // norm
  Tensor logits = linear(h, fc) + embedding(table, rows);             // GEMM, indexing
  logits = where(gt(logits, 10.0), logits * 0.5, logits);             // elementwise
  Tensor loss = cross_entropy(logits, target) + mean(gather(logits, 1, target.unsqueeze(1)));  // softmax, reduction
  loss.backward();

  const std::vector<Tensor> params = {conv_w, conv_b, bn_w, bn_b, fc, table};
  optim::GradScaler scaler;
  optim::AdamW adamw(params, optim::AdamWOptions{});
  (void)optim::clip_grad_norm_(params, 1.0);  // multi-tensor norm and scale
  adamw.step();                               // fused multi-tensor AdamW
  std::vector<Tensor> out = {loss.detach().cpu(), running_mean.cpu(), running_var.cpu()};
  for (const Tensor& p : params) out.push_back(p.detach().cpu());
  return out;
}

}  // namespace

TEST_CASE("DeviceScope makes its device current for its scope and gives the device's stream [gpu]") {
  KILN_REQUIRE_GPU();
  const int before = cuda::current_device();
  {
    const cuda::DeviceScope scope(0, "test scope");
    CHECK(cuda::current_device() == 0);
    CHECK(scope.stream == cuda::current_stream(0));
  }
  CHECK(cuda::current_device() == before);
  CHECK_THROWS_WITH_AS(cuda::DeviceScope(cuda::device_count(), "test scope"), Contains("test scope: device cuda:"), Error);
  // Events belong to a device; one records on that device's stream.
  cuda::Event event = cuda::create_event(0, /*timing=*/false);
  cuda::record_event(event, cuda::current_stream(0));
  cuda::event_synchronize(event);
  CHECK(cuda::event_query(event));
  cuda::destroy_event(event);
}

TEST_CASE("every op family, the optimizer, events and the prefetcher run on cuda:1 while cuda:0 is current [gpu2]") {
  KILN_REQUIRE_GPUS(2);
  cuda::set_device(0);
  const std::vector<Tensor> expected = step_on(Device::cpu());
  const std::vector<Tensor> got = step_on(Device::cuda(1));
  CHECK(cuda::current_device() == 0);  // every scope restored the caller's device
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i);
    KILN_CHECK_CLOSE(got[i], expected[i], 1e-4, 1e-4);
  }
  // Random numbers, fills and copies on cuda:1.
  Tensor noise = rand({1000}, {.device = Device::cuda(1)});
  CHECK(noise.device() == Device::cuda(1));
  CHECK(amax(noise, {0}).item<float>() < 1.0f);
  Tensor filled = full({33}, 2.5, {.device = Device::cuda(1)});
  CHECK(sum(filled.cpu()).item<float>() == doctest::Approx(33 * 2.5));
  // The op profiler records its events on cuda:1's stream.
  OpProfiler profiler;
  profiler.start();
  Tensor a = random_tensor({64, 64}, 9).to(Device::cuda(1)).requires_grad_();
  sum(matmul(a, a)).backward();
  profiler.stop();
  CHECK_FALSE(profiler.op_stats().empty());
  // The device prefetcher: its copy stream and events are cuda:1's.
  auto data = std::make_shared<TensorDataset>(random_tensor({12, 3}, 10), tensor<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {12}));
  DataLoader loader(data, {.batch_size = 4});
  DevicePrefetcher prefetcher(loader, Device::cuda(1));
  int64_t seen = 0;
  while (auto batch = prefetcher.next()) {
    CHECK(batch->input.device() == Device::cuda(1));
    seen += batch->target.numel();
  }
  CHECK(seen == 12);
  CHECK(cuda::current_device() == 0);
}
