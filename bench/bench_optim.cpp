// Optimizer benchmark.
//
// GPU: fused AdamW over GPT-2 small's parameters (124M fp32 in 148 tensors)
// against the floor of 28 bytes per parameter (read p, g, m, v; write p, m, v)
// and the device-to-device copy bandwidth of the same run, and against one
// launch per parameter; clip_grad_norm_ likewise (norm: 4 B/param; norm +
// scale: 12 B/param). Skips visibly without a GPU.
// CPU: AdamW throughput (params/s, GB/s) against memcpy bandwidth measured in
// the same run, with all threads and with one.
//
//   bench_optim [cpu_params_millions (default 16)]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/harness.h"
#include "kernels/optim.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"

using namespace kiln;
using namespace kiln::bench;

namespace {

// GPT-2 small (124M): token and position embeddings, 12 blocks, final norm.
std::vector<Shape> gpt2_small_shapes() {
  const int64_t d = 768, vocab = 50257, ctx = 1024;
  std::vector<Shape> shapes = {{vocab, d}, {ctx, d}};
  for (int layer = 0; layer < 12; ++layer) {
    for (const Shape& s : std::vector<Shape>{{d}, {d}, {d, 3 * d}, {3 * d}, {d, d}, {d}, {d}, {d}, {d, 4 * d}, {4 * d},
                                             {4 * d, d}, {d}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({d});
  shapes.push_back({d});
  return shapes;
}

// About `total` parameters in 100 tensors of uneven sizes.
std::vector<Shape> cpu_shapes(int64_t total) {
  std::vector<Shape> shapes;
  int64_t left = total;
  for (int i = 0; i < 100; ++i) {
    const int64_t n = i == 99 ? left : std::max<int64_t>(1, total / 100 * (1 + i % 3) / 2);
    shapes.push_back({n});
    left -= n;
    if (left <= 0) break;
  }
  return shapes;
}

struct Model {
  std::vector<Tensor> params;
  int64_t numel = 0;
};

Model make_model(const std::vector<Shape>& shapes, Device device) {
  Model m;
  for (const Shape& s : shapes) {
    Tensor p = full(s, 0.01, {.device = device}).requires_grad_();
    p.set_grad(full(s, 0.001, {.device = device}));
    m.numel += p.numel();
    m.params.push_back(p);
  }
  return m;
}

std::string millions(int64_t n, size_t tensors) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.1fM in %zu", static_cast<double>(n) * 1e-6, tensors);
  return text;
}

// The kernel lists of an AdamW whose state exists (after one step).
std::vector<kernels::OptimTensor> adam_lists(const optim::Optimizer& opt, const Model& m) {
  std::vector<kernels::OptimTensor> list;
  for (size_t i = 0; i < m.params.size(); ++i) {
    kernels::OptimTensor t;
    t.param = m.params[i].data_ptr();
    t.grad = m.params[i].grad().data_ptr();
    t.state[0] = opt.state(static_cast<int64_t>(i), "exp_avg").data_ptr();
    t.state[1] = opt.state(static_cast<int64_t>(i), "exp_avg_sq").data_ptr();
    t.step = opt.state(static_cast<int64_t>(i), "step").data<int64_t>();
    t.numel = m.params[i].numel();
    list.push_back(t);
  }
  return list;
}

void gpu_bench() {
  if (!cuda::is_available()) {
    std::printf("\nGPU part: SKIPPED (no GPU: %s)\n",
                cuda::compiled_with_cuda() ? "no device found" : "kiln was built without CUDA");
    return;
  }
  const cuda::DeviceProperties props = cuda::device_properties(0);
  std::printf("\nGPU: %s\n", props.name);
  GpuTimer timer(0);
  Model m = make_model(gpt2_small_shapes(), Device::cuda());
  const std::string shape = millions(m.numel, m.params.size());
  const double n = static_cast<double>(m.numel);

  // Copy bandwidth: a device-to-device copy of the parameters' size.
  Tensor src = full({m.numel}, 1.0, {.device = Device::cuda()}), dst = empty({m.numel}, {.device = Device::cuda()});
  const Measurement copy = timer.time([&] { dst.copy_(src); }, 20);
  const double copy_gbps = gbps(8.0 * n, copy);

  Table table("Optimizer kernels on " + std::string(props.name) + " (floor: bytes a step must move)");
  table.add({"copy (d2d)", shape, "float32", copy, 8.0 * n, 0, ""});
  optim::AdamW adamw(m.params, optim::AdamWOptions{});
  adamw.step();  // creates the state
  table.add({"AdamW fused (step)", shape, "float32", timer.time([&] { adamw.step(); }, 20), 28.0 * n, 0, ""});
  const std::vector<kernels::OptimTensor> lists = adam_lists(adamw, m);
  kernels::OptimScalars scalars;
  scalars.lr = adamw.lr(0).data<double>();
  scalars.momentum = adamw.momentum(0).data<double>();
  kernels::AdamConfig config;
  config.weight_decay = 1e-2;
  config.decoupled_weight_decay = true;
  const cuda::Stream stream = cuda::current_stream(0);
  table.add({"AdamW 1 launch/param", shape, "float32",
             timer.time([&] {
               for (const auto& t : lists) kernels::adam_step_cuda(DType::f32, &t, 1, scalars, config, stream);
             }, 20),
             28.0 * n, 0, ""});
  table.add({"grad_norm (fused)", shape, "float32", timer.time([&] { (void)optim::grad_norm(m.params, 1.0); }, 20),
             4.0 * n, 0, ""});
  // Per-parameter norms: one partials launch per tensor, then the combine.
  Tensor partials = empty({m.numel / kernels::kOptimChunk + 2 * static_cast<int64_t>(m.params.size())},
                          {.dtype = DType::f64, .device = Device::cuda()});
  Tensor total = empty({}, {.device = Device::cuda()});
  table.add({"grad_norm 1 launch/param", shape, "float32",
             timer.time([&] {
               int64_t offset = 0;
               for (const Tensor& p : m.params) {
                 const kernels::ListTensor g{p.grad().data_ptr(), p.numel()};
                 kernels::grad_norm_partials_cuda(DType::f32, &g, 1, 2.0, partials.data<double>() + offset, stream);
                 offset += kernels::optim_chunks(p.numel());
               }
               kernels::grad_norm_finish_cuda(partials.data<double>(), offset, 2.0, 1.0, total.data<float>(),
                                              nullptr, stream);
             }, 20),
             4.0 * n, 0, ""});
  // Clipping that scales: grads are reset each time so the coefficient stays < 1.
  table.add({"clip_grad_norm_ (clips)", shape, "float32",
             timer.time([&] { (void)optim::clip_grad_norm_(m.params, 1e-3); }, 20), 12.0 * n, 0,
             ""});
  table.print(copy_gbps);
  std::printf("AdamW floor at the copy bandwidth: %.1f us\n", 28.0 * n / (copy_gbps * 1e9) * 1e6);
}

void cpu_bench(int64_t total) {
  CpuTimer timer;
  Model m = make_model(cpu_shapes(total), Device::cpu());
  const std::string shape = millions(m.numel, m.params.size());
  const double n = static_cast<double>(m.numel);
  std::vector<float> a(static_cast<size_t>(m.numel), 1.0f), b(static_cast<size_t>(m.numel));
  optim::AdamW adamw(m.params, optim::AdamWOptions{});
  adamw.step();
  const int threads = omp_get_max_threads();
  Table table("CPU (" + std::to_string(threads) + " threads; memcpy of the same size is the reference)");
  const Measurement copy = timer.time([&] { std::memcpy(b.data(), a.data(), a.size() * sizeof(float)); }, 10);
  table.add({"memcpy", shape, "float32", copy, 8.0 * n, 0, ""});
  const int64_t count = m.numel;
  table.add({"copy loop (OpenMP)", shape, "float32", timer.time([&] {
               float* __restrict out = b.data();
               const float* __restrict in = a.data();
#pragma omp parallel for schedule(static)
               for (int64_t i = 0; i < count; ++i) out[i] = in[i];
             }, 10),
             8.0 * n, 0, ""});
  const Measurement step = timer.time([&] { adamw.step(); }, 10);
  table.add({"AdamW step", shape, "float32", step, 28.0 * n, 0, ""});
  omp_set_num_threads(1);
  const Measurement step1 = timer.time([&] { adamw.step(); }, 5);
  table.add({"AdamW step (1 thread)", shape, "float32", step1, 28.0 * n, 0, ""});
  omp_set_num_threads(threads);
  table.add({"grad_norm", shape, "float32", timer.time([&] { (void)optim::grad_norm(m.params, 1.0); }, 10), 4.0 * n,
             0, ""});
  table.print(gbps(8.0 * n, copy));
  std::printf("AdamW: %.1f M params/s (%d threads), %.1f M params/s (1 thread)\n",
              n / (step.median_ms * 1e-3) * 1e-6, threads, n / (step1.median_ms * 1e-3) * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t cpu_millions = argc > 1 ? std::atoll(argv[1]) : 16;
  try {
    cpu_bench(cpu_millions * 1000000);
    gpu_bench();
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_optim: %s\n", e.what());
    return 1;
  }
  return 0;
}
