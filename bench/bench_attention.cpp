// scaled_dot_product_attention: the fused kernels (flash-style on CUDA, tiled
// on the CPU) against the same math written with matmul + softmax (what a
// framework without a fused kernel runs), forward and forward + backward.
// Attention is compute-bound: rows report TFLOP/s, counting 4 B H L S D FLOPs
// for the forward (two products) and 2.5x that for forward + backward (the
// backward's five products; with causal masking half of each), as
// flash-attention's benchmarks do. The matmul path also writes and reads the
// B H L S scores, which the table's bytes column shows. On the GPU the fused
// rows run the default kernels (16-bit: the tensor-core kernels of
// kernels/cuda/attention_tc*.cu) and again the reference kernels of
// attention.cu (set_attention_cuda_kernels), labelled so, in the same run (bf16 only),
// and the tensor-core forward's candidate CTA shapes at head dim 64
// (set_attention_forward_shape), checked against the default shape's output.
//
//   bench_attention                 GPU (when present) and CPU tables
//   bench_attention --cpu-only | --gpu-only | --quick | --repeats N
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>

#include "bench/harness.h"
#include "core/autograd.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/attention.h"
#include "kernels/cuda/runtime.h"

namespace kiln::bench {
namespace {

using Options = DeviceBenchOptions;

struct Case {
  int64_t B, H, T, D;
  bool causal;

  std::string label() const {
    return "B" + std::to_string(B) + " H" + std::to_string(H) + " T" + std::to_string(T) + " D" + std::to_string(D) +
           (causal ? " causal" : "");
  }
  // Of the forward: q k^T and p v (a causal mask halves them).
  double forward_flops() const { return 4.0 * B * H * T * T * D * (causal ? 0.5 : 1.0); }
  // q, k, v read, out written.
  double io_bytes(DType dtype) const { return 4.0 * B * H * T * D * static_cast<double>(dtype_size(dtype)); }
};

Tensor random_tensor(const Shape& shape, DType dtype, Device device, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
  for (float& v : values) v = normal(engine);
  return tensor<float>(values, shape).to(device, dtype);
}

// softmax(q k^T / sqrt(D) + causal mask) v with separate ops.
Tensor matmul_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& causal_mask) {
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), 1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal_mask.defined()) scores = add(scores, causal_mask);
  return matmul(softmax(scores, -1), v);
}

// Runs fn with the given CUDA attention kernels, restoring the setting.
template <typename Fn>
auto with_kernels(kernels::AttentionCudaKernels which, Fn&& fn) {
  struct Restore {
    kernels::AttentionCudaKernels saved = kernels::attention_cuda_kernels();
    ~Restore() { kernels::set_attention_cuda_kernels(saved); }
  } restore;
  kernels::set_attention_cuda_kernels(which);
  return fn();
}

// with_reference: also time the fused rows on the reference CUDA kernels.
template <typename TimeFn>
void run_cases(Table& table, Device device, DType dtype, const std::vector<Case>& cases, bool with_reference,
               TimeFn&& time_fn) {
  constexpr auto kReference = kernels::AttentionCudaKernels::reference;
  for (const Case& c : cases) {
    const std::string shape = c.label();
    const std::string dtype_text(dtype_name(dtype));
    const double forward_flops = c.forward_flops();
    const double element = static_cast<double>(dtype_size(dtype));
    const double io_bytes = c.io_bytes(dtype);
    const double scores_bytes = 2.0 * c.B * c.H * c.T * c.T * element;
    try {
      Tensor q = random_tensor({c.B, c.H, c.T, c.D}, dtype, device, 1).requires_grad_();
      Tensor k = random_tensor({c.B, c.H, c.T, c.D}, dtype, device, 2).requires_grad_();
      Tensor v = random_tensor({c.B, c.H, c.T, c.D}, dtype, device, 3).requires_grad_();
      Tensor dout = random_tensor({c.B, c.H, c.T, c.D}, dtype, device, 4);
      Tensor causal_mask;
      if (c.causal) {
        causal_mask = where(gt(triu(ones({c.T, c.T}, {.dtype = dtype, .device = device}), 1), 0.0),
                            full({}, -INFINITY, {.dtype = dtype, .device = device}),
                            zeros({}, {.dtype = dtype, .device = device}));
      }
      {
        NoGradGuard no_grad;
        auto forward = [&] { (void)scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal); };
        table.add({"fused forward", shape, dtype_text, time_fn(forward), io_bytes, forward_flops, ""});
        if (with_reference) {
          table.add({"fused forward, reference kernels", shape, dtype_text,
                     with_kernels(kReference, [&] { return time_fn(forward); }), io_bytes, forward_flops, ""});
        }
        table.add({"matmul+softmax forward", shape, dtype_text,
                   time_fn([&] { (void)matmul_attention(q, k, v, causal_mask); }), io_bytes + 2 * scores_bytes,
                   forward_flops, ""});
      }
      // autograd::grad, not backward(): no accumulation into q, k and v's .grad at
      // each repeat (torch_attention.py alike): the attention alone is timed.
      auto both = [&] {
        (void)autograd::grad({scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal)}, {q, k, v}, {dout});
      };
      table.add({"fused forward+backward", shape, dtype_text, time_fn(both), 3 * io_bytes, 3.5 * forward_flops, ""});
      if (with_reference) {
        table.add({"fused fwd+bwd, reference kernels", shape, dtype_text,
                   with_kernels(kReference, [&] { return time_fn(both); }), 3 * io_bytes, 3.5 * forward_flops, ""});
      }
      table.add({"matmul+softmax fwd+bwd", shape, dtype_text,
                 time_fn([&] { (void)autograd::grad({matmul_attention(q, k, v, causal_mask)}, {q, k, v}, {dout}); }),
                 3 * io_bytes + 6 * scores_bytes, 3.0 * forward_flops, ""});
    } catch (const Error& error) {
      table.add_failure("attention", shape, dtype_text, error.what());
    }
  }
}

// The tensor-core forward's candidate CTA shapes (kernels/attention.h
// set_attention_forward_shape) in bf16 on the head dims each runs for (64,
// GPT-2's; the wgmma shapes 128 too), one row each per case, so one run
// shows which to keep. Each shape's output is checked
// against the default shape's (another key-block size sums in another
// order: equal to bf16 rounding); a row that differs more says so.
void run_forward_shapes(Device device, const std::vector<Case>& cases, const std::function<Measurement(
                                                                          const std::function<void()>&)>& time_fn) {
  // Streamed: shape 12's kernel waits on barriers, so a bug there could hang and lose the rows before it.
  Table table("GPU attention forward, tensor-core CTA shapes (bfloat16; shape 0 is the default)");
  table.print_header();
  struct Restore {
    int saved = kernels::attention_forward_shape();
    ~Restore() { kernels::set_attention_forward_shape(saved); }
  } restore;
  for (const Case& c : cases) {
    if (c.D != 64 && c.D != 128) continue;
    const std::string shape = c.label();
    const double forward_flops = c.forward_flops();
    const double io_bytes = c.io_bytes(DType::bf16);
    try {
      NoGradGuard no_grad;
      const Tensor q = random_tensor({c.B, c.H, c.T, c.D}, DType::bf16, device, 1);
      const Tensor k = random_tensor({c.B, c.H, c.T, c.D}, DType::bf16, device, 2);
      const Tensor v = random_tensor({c.B, c.H, c.T, c.D}, DType::bf16, device, 3);
      kernels::set_attention_forward_shape(0);
      const Tensor expected = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal).to(DType::f32);
      for (int index = 0; index < kernels::attention_forward_shape_count(); ++index) {
        if (!kernels::attention_forward_shape_applies(index, c.D)) continue;
        kernels::set_attention_forward_shape(index);
        const std::string op = "forward, shape " + std::to_string(index);
        const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal).to(DType::f32);
        const double error = max(abs(sub(out, expected))).item<double>();
        const double scale = max(abs(expected)).item<double>();
        const std::string note = error <= 2e-2 * scale ? "" : "WRONG: max |out - shape 0's| = " + std::to_string(error);
        const Measurement time = time_fn([&] { (void)scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal); });
        table.add_printed({op, shape, "bfloat16", time, io_bytes, forward_flops, note}, 0);
      }
    } catch (const Error& error) {
      table.add_printed(Table::failure("forward shapes", shape, "bfloat16", error.what()), 0);
    }
  }
  for (int index = 0; index < kernels::attention_forward_shape_count(); ++index) {
    std::printf("shape %d: %s\n", index, kernels::attention_forward_shape_name(index));
  }
}

// The tensor-core backward on mma.sync (the default) and on wgmma
// (set_attention_wgmma_backward, sm_90a), forward + backward in bf16 with the
// default forward, one row each per case; the wgmma rows' gradients are
// checked against the mma.sync ones ("WRONG" if they differ by more than
// bf16 rounding allows).
void run_backward_kernels(Device device, const std::vector<Case>& cases, const std::function<Measurement(
                                                                            const std::function<void()>&)>& time_fn) {
  Table table("GPU attention forward+backward, backward on mma.sync / wgmma (bfloat16)");
  struct Restore {
    bool saved = kernels::attention_wgmma_backward();
    ~Restore() { kernels::set_attention_wgmma_backward(saved); }
  } restore;
  for (const Case& c : cases) {
    if (c.D != 64 && c.D != 128) continue;
    const std::string shape = c.label();
    try {
      const Tensor q = random_tensor({c.B, c.H, c.T, c.D}, DType::bf16, device, 1).requires_grad_();
      const Tensor k = random_tensor({c.B, c.H, c.T, c.D}, DType::bf16, device, 2).requires_grad_();
      const Tensor v = random_tensor({c.B, c.H, c.T, c.D}, DType::bf16, device, 3).requires_grad_();
      const Tensor dout = random_tensor({c.B, c.H, c.T, c.D}, DType::bf16, device, 4);
      const auto grads = [&] {
        return autograd::grad({scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal)}, {q, k, v}, {dout});
      };
      kernels::set_attention_wgmma_backward(false);
      const autograd::TensorList expected = grads();
      for (bool wgmma : {false, true}) {
        kernels::set_attention_wgmma_backward(wgmma);
        std::string note;
        if (wgmma) {
          const autograd::TensorList got = grads();
          const char* names[] = {"dq", "dk", "dv"};
          for (int i = 0; i < 3; ++i) {
            const Tensor want = expected[i].to(DType::f32);
            const double error = max(abs(sub(got[i].to(DType::f32), want))).item<double>();
            const double scale = max(abs(want)).item<double>();
            if (!(error <= 3e-2 * scale)) {
              note += (note.empty() ? "WRONG: " : ", ") + std::string(names[i]) + " off by " + std::to_string(error);
            }
          }
        }
        const Measurement time = time_fn([&] { (void)grads(); });
        table.add({wgmma ? "fwd+bwd, backward on wgmma" : "fwd+bwd, backward on mma.sync", shape, "bfloat16", time,
                   3 * c.io_bytes(DType::bf16), 3.5 * c.forward_flops(), note});
      }
    } catch (const Error& error) {
      table.add_failure("backward kernels", shape, "bfloat16", error.what());
    }
  }
  table.print(0);
}

void run_gpu(const Options& options) {
  if (!cuda::is_available()) {
    std::printf("GPU benchmarks skipped: no CUDA device (%s)\n", cuda::availability().problem.c_str());
    return;
  }
  cuda::set_device(0);
  const cuda::DeviceProperties properties = cuda::device_properties(0);
  std::printf("GPU: %s, %d SMs\n", properties.name, properties.multiprocessor_count);
  const int repeats = options.repeats > 0 ? options.repeats : (options.quick ? 3 : 20);
  GpuTimer timer(0);
  auto time_fn = [&](const std::function<void()>& fn) { return timer.time(fn, repeats); };
  std::vector<Case> cases;
  if (options.quick) {
    cases = {{1, 2, 256, 64, true}};
  } else {
    for (int64_t T : {1024, 2048, 4096}) {
      for (int64_t D : {64, 128}) {
        for (bool causal : {false, true}) cases.push_back({16384 / T, 2048 / D, T, D, causal});
      }
    }
  }
  // The reference kernels' rows in bf16 only: they take most of the time (the
  // H200 kit's 3-minute bench step ended inside the float16 table), and
  // float16 runs the same kernels at the same speed.
  // The candidate CTA shapes first: the kit's 3-minute bench step ended before
  // them when they came after the bf16 table (H200, b59d5ed).
  run_forward_shapes(Device::cuda(0), cases, time_fn);
  run_backward_kernels(Device::cuda(0), cases, time_fn);
  for (DType dtype : {DType::bf16, DType::f16}) {
    Table table(std::string("GPU attention, ") + std::string(dtype_name(dtype)));
    run_cases(table, Device::cuda(0), dtype, cases, /*with_reference=*/dtype == DType::bf16, time_fn);
    table.print(0);
  }
}

void run_cpu(const Options& options) {
  const int repeats = options.repeats > 0 ? options.repeats : 3;
  CpuTimer timer;
  auto time_fn = [&](const std::function<void()>& fn) { return timer.time(fn, repeats); };
  // The shapes of train_vit (50 tokens, 4 heads of 24) and of a small GPT.
  const std::vector<Case> cases = options.quick ? std::vector<Case>{{2, 2, 64, 32, false}}
                                                : std::vector<Case>{{128, 4, 50, 24, false},
                                                                    {16, 4, 256, 64, true},
                                                                    {4, 8, 1024, 64, true},
                                                                    {4, 8, 1024, 64, false}};
  Table table("CPU attention, float32");
  run_cases(table, Device::cpu(), DType::f32, cases, /*with_reference=*/false, time_fn);
  table.print(0);
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  return kiln::bench::run_device_bench(argc, argv, "bench_attention", kiln::bench::run_gpu, kiln::bench::run_cpu);
}
