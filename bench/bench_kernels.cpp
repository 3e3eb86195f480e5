// Kernel benchmarks through the kiln ops API: elementwise add / relu / gelu,
// a full sum, softmax and cross_entropy (forward), in float32 and bfloat16;
// and the memory-bound layers of a transformer at GPT-2's activation shape
// (16 x 1024 x 768; 4 x 1024 x 768 with --quick): LayerNorm, GELU, an
// Embedding lookup and Dropout, forward and backward.
// Every op here is memory-bound, so each row reports GB/s against the copy
// bandwidth measured in the same run: device-to-device cudaMemcpy on the GPU,
// a multi-threaded memcpy on the CPU. Inputs are random (never zeros).
//
//   bench_kernels                 GPU (when present) and CPU tables
//   bench_kernels --cpu-only | --gpu-only | --quick | --repeats N
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>

#include "bench/harness.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"

namespace kiln::bench {
namespace {

using Options = DeviceBenchOptions;

// Random normal values, made on the host so that no op family is needed.
Tensor random_tensor(const Shape& shape, DType dtype, Device device, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
  for (float& v : values) v = normal(engine);
  return tensor<float>(values, shape).to(device, dtype);
}

Tensor random_targets(int64_t n, int64_t classes, Device device, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<int64_t> pick(0, classes - 1);
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (int64_t& v : values) v = pick(engine);
  return tensor<int64_t>(values, {n}).to(device);
}

std::string shape_text(const Shape& shape) { return shape_str(shape); }

// Sizes per device: large enough to leave the caches far behind.
struct Sizes {
  int64_t elementwise;  // elements
  int64_t rows, cols;   // softmax
  int64_t batch, classes;  // cross_entropy
  int64_t copy_bytes;
};

// Times fn with time_fn and adds its row to `table` (its bytes against the
// copy bandwidth), or the row's failure when it throws kiln::Error.
template <typename TimeFn>
void measure_row(Table& table, TimeFn& time_fn, const std::string& op, const std::string& shape,
                 const std::string& dtype, double bytes, const std::function<void()>& fn) {
  try {
    table.add({op, shape, dtype, time_fn(fn), bytes, 0, ""});
  } catch (const Error& error) {
    table.add_failure(op, shape, dtype, error.what());
  }
}

// Runs every case on `device` with `time_fn` and adds the rows to `table`.
template <typename TimeFn>
void run_cases(Table& table, Device device, const Sizes& sizes, TimeFn&& time_fn) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string dtype_text(dtype_name(dtype));
    const double element = static_cast<double>(dtype_size(dtype));
    const Shape flat = {sizes.elementwise};
    const double n = static_cast<double>(sizes.elementwise);
    auto measure = [&](const std::string& op, const Shape& shape, double bytes, const std::function<void()>& fn) {
      measure_row(table, time_fn, op, shape_text(shape), dtype_text, bytes, fn);
    };
    try {
      Tensor a = random_tensor(flat, dtype, device, 1);
      Tensor b = random_tensor(flat, dtype, device, 2);
      measure("add", flat, 3 * n * element, [&] { (void)add(a, b); });
      measure("relu", flat, 2 * n * element, [&] { (void)relu(a); });
      measure("gelu (erf)", flat, 2 * n * element, [&] { (void)gelu(a); });
      measure("gelu (tanh)", flat, 2 * n * element, [&] { (void)gelu(a, "tanh"); });
      measure("sum (all)", flat, n * element, [&] { (void)sum(a); });
      Tensor rows = a.view({sizes.elementwise / sizes.cols, sizes.cols});
      measure("sum (dim -1)", rows.shape(), n * element, [&] { (void)sum(rows, {-1}); });
      measure("copy_ (kiln kernel)", flat, 2 * n * element, [&] { b.copy_(a); });
      // Strided copies (the strided kernels' index math): into a column slice
      // of a 3x wider matrix (cat's copies, GPT's split backward) and a transpose.
      Tensor wide = empty({rows.size(0), 3 * rows.size(1)}, TensorOptions{.dtype = dtype, .device = device});
      Tensor slice = wide.narrow(1, rows.size(1), rows.size(1));
      measure("copy_ into a column slice", rows.shape(), 2 * n * element, [&] { slice.copy_(rows); });
      measure("transpose (contiguous of .t())", rows.shape(), 2 * n * element, [&] { (void)rows.t().contiguous(); });
      Tensor transposed = empty({rows.size(1), rows.size(0)}, TensorOptions{.dtype = dtype, .device = device});
      measure("transpose (copy_ of .t() into a tensor)", rows.shape(), 2 * n * element,
              [&] { transposed.copy_(rows.t()); });
      // The same write into existing memory and into a fresh allocation: the
      // difference is the allocator's cost (page faults on the CPU).
      measure("fill_ (existing tensor)", flat, n * element, [&] { b.fill_(0.5); });
      measure("full (new tensor)", flat, n * element,
              [&] { (void)full(flat, 0.5, TensorOptions{.dtype = dtype, .device = device}); });
    } catch (const Error& error) {
      table.add_failure("elementwise inputs", shape_text(flat), dtype_text, error.what());
    }
    try {
      const Shape shape = {sizes.rows, sizes.cols};
      Tensor x = random_tensor(shape, dtype, device, 3);
      const double bytes = 2.0 * static_cast<double>(x.numel()) * element;
      measure("softmax (dim -1)", shape, bytes, [&] { (void)softmax(x, -1); });
      measure("log_softmax (dim -1)", shape, bytes, [&] { (void)log_softmax(x, -1); });
    } catch (const Error& error) {
      table.add_failure("softmax inputs", "", dtype_text, error.what());
    }
    try {
      const Shape shape = {sizes.batch, sizes.classes};
      Tensor logits = random_tensor(shape, dtype, device, 4);
      Tensor target = random_targets(sizes.batch, sizes.classes, device, 5);
      const double bytes = static_cast<double>(logits.numel()) * element + static_cast<double>(sizes.batch) * 8;
      measure("cross_entropy (mean)", shape, bytes, [&] { (void)cross_entropy(logits, target); });
    } catch (const Error& error) {
      table.add_failure("cross_entropy inputs", "", dtype_text, error.what());
    }
  }
}

// LayerNorm, GELU, Embedding and Dropout at a transformer's activation shape
// (rows of width 768), forward and backward. Bytes: the tensors each kernel
// must read and write once (the floor); the backward of LayerNorm reads x and
// dy and writes dx (its per-column sums of dw, db are small).
template <typename TimeFn>
void run_transformer_cases(Table& table, Device device, int64_t rows, TimeFn&& time_fn) {
  const int64_t width = 768, vocab = 50257;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string dtype_text(dtype_name(dtype));
    const double element = static_cast<double>(dtype_size(dtype));
    const Shape shape = {rows, width};
    const std::string shape_text_ = shape_text({rows / 1024, 1024, width});
    const double n = static_cast<double>(rows * width);
    auto measure = [&](const std::string& op, double bytes, const std::function<void()>& fn) {
      measure_row(table, time_fn, op, shape_text_, dtype_text, bytes, fn);
    };
    try {
      Tensor x = random_tensor(shape, dtype, device, 7);
      Tensor dy = random_tensor(shape, dtype, device, 8);
      const TensorOptions params{.dtype = dtype, .device = device};
      Tensor weight = ones({width}, params), bias = zeros({width}, params);
      {
        NoGradGuard no_grad;
        measure("layer_norm fwd", 2 * n * element, [&] { (void)layer_norm(x, {width}, weight, bias); });
        measure("gelu fwd", 2 * n * element, [&] { (void)gelu(x); });
        measure("dropout fwd (p 0.1)", 2 * n * element, [&] { (void)dropout(x, 0.1); });
      }
      Tensor xg = x.detach().requires_grad_();
      // Gradients are set to None first: the leaf's gradient is then stored,
      // not added to the previous repeat's.
      measure("layer_norm fwd+bwd", 5 * n * element, [&] {
        xg.zero_grad_();
        layer_norm(xg, {width}, weight, bias).backward(dy);
      });
      measure("gelu fwd+bwd", 5 * n * element, [&] {
        xg.zero_grad_();
        gelu(xg).backward(dy);
      });
      measure("dropout fwd+bwd", 4 * n * element + 2 * n, [&] {
        xg.zero_grad_();
        dropout(xg, 0.1).backward(dy);
      });
      Tensor table_weights = random_tensor({vocab, width}, dtype, device, 9).requires_grad_();
      Tensor ids = randint(0, vocab, {rows}).to(device);
      {
        NoGradGuard no_grad;
        measure("embedding fwd", 2 * n * element + rows * 8.0, [&] { (void)embedding(table_weights, ids); });
      }
      // The backward writes the whole (vocab, width) gradient once (zeros, then the rows).
      measure("embedding fwd+bwd", 4 * n * element + static_cast<double>(vocab * width) * element, [&] {
        table_weights.zero_grad_();
        embedding(table_weights, ids).backward(dy);
      });
      if (dtype == DType::bf16) {
        // GPT-2's loss under autocast: 16-bit logits over its vocabulary (an
        // eighth of the rows). The floor reads the logits twice (forward,
        // backward) and writes their gradient; the second row is the same loss
        // through a float32 copy of the logits ("f32 copy"), as autocast's
        // float32 policy casts (what kiln did before reading 16-bit logits directly).
        const int64_t lm_rows = rows / 8;
        Tensor logits = random_tensor({lm_rows, vocab}, dtype, device, 10).requires_grad_();
        Tensor targets = randint(0, vocab, {lm_rows}).to(device);
        const double lm_bytes = 3.0 * static_cast<double>(lm_rows * vocab) * element;
        const DeviceType device_type = device.type;
        const std::string lm_shape = shape_text({lm_rows, vocab});
        measure_row(table, time_fn, "cross_entropy fwd+bwd, autocast", lm_shape, dtype_text, lm_bytes, [&] {
          logits.zero_grad_();
          Tensor loss;
          {
            AutocastGuard autocast(device_type, dtype);
            loss = cross_entropy(logits, targets);
          }
          loss.backward();
        });
        measure_row(table, time_fn, "cross_entropy fwd+bwd, f32 copy", lm_shape, dtype_text, lm_bytes, [&] {
          logits.zero_grad_();
          cross_entropy(logits.to(DType::f32), targets).backward();
        });
      }
    } catch (const Error& error) {
      table.add_failure("transformer inputs", shape_text_, dtype_text, error.what());
    }
  }
}

// The memory-bound layers between ResNet-9's convolutions at its layer1 shape
// (batch, 128, 28, 28), in NCHW and channels-last (issue 22): max pooling,
// batch norm + ReLU in training mode, the residual add + ReLU. Bytes: what
// each must read and write once (max pool also writes and reads its int32
// indices; BN reads x twice, for its statistics and to normalize, and its
// backward reads x and dy twice).
template <typename TimeFn>
void run_convnet_cases(Table& table, Device device, int64_t batch, TimeFn&& time_fn) {
  const Shape shape = {batch, 128, 28, 28};
  const Shape pooled = {batch, 128, 14, 14};
  const double n = static_cast<double>(shape_numel(shape)), n_pooled = n / 4;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const double element = static_cast<double>(dtype_size(dtype));
    for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      const std::string layout = format == MemoryFormat::channels_last ? " NHWC" : " NCHW";
      const std::string dtype_text(dtype_name(dtype));
      auto measure = [&](const std::string& op, double bytes, const std::function<void()>& fn) {
        measure_row(table, time_fn, op + layout, shape_text(shape), dtype_text, bytes, fn);
      };
      try {
        Tensor x = random_tensor(shape, dtype, device, 11).contiguous(format);
        Tensor skip = random_tensor(shape, dtype, device, 12).contiguous(format);
        Tensor dy_pooled = random_tensor(pooled, dtype, device, 13).contiguous(format);
        const TensorOptions params{.dtype = DType::f32, .device = device};
        Tensor weight = ones({128}, params), bias = zeros({128}, params);
        Tensor running_mean = zeros({128}, params), running_var = ones({128}, params);
        {
          NoGradGuard no_grad;
          measure("maxpool2 fwd", n * element + n_pooled * (element + 4), [&] { (void)max_pool2d(x, 2); });
          measure("bn+relu fwd (train)", 3 * n * element,
                  [&] { (void)batch_norm_relu(x, running_mean, running_var, weight, bias, true); });
          measure("add+relu", 3 * n * element, [&] { (void)relu(add(x, skip)); });
        }
        Tensor xg = x.detach().requires_grad_();
        measure("maxpool2 fwd+bwd", 2 * (n * element + n_pooled * (element + 4)), [&] {
          xg.zero_grad_();
          max_pool2d(xg, 2).backward(dy_pooled);
        });
        // The backward reads x and dy twice (per-channel sums, then dx) and writes dx: 8 passes in all.
        Tensor weight_g = ones({128}, params).requires_grad_(), bias_g = zeros({128}, params).requires_grad_();
        measure("bn+relu fwd+bwd (train)", 8 * n * element, [&] {
          xg.zero_grad_();
          weight_g.zero_grad_();
          bias_g.zero_grad_();
          batch_norm_relu(xg, running_mean, running_var, weight_g, bias_g, true).backward(skip);
        });
        // conv -> BN -> ReLU -> pool (FashionCNN, ResNet-9's pooled layers): the
        // fused op against the two ops, timed on the same floor: x read and dx
        // written once each in the backward, x read once in the forward, the
        // pooled y, dy and indices once each.
        const double pooled_floor = 3 * n * element + 2 * n_pooled * (element + 4);
        const auto bn_relu_pool = [&](bool fused) {
          xg.zero_grad_();
          weight_g.zero_grad_();
          bias_g.zero_grad_();
          Tensor y = fused ? batch_norm_relu_max_pool2d(xg, running_mean, running_var, weight_g, bias_g, true)
                           : max_pool2d(batch_norm_relu(xg, running_mean, running_var, weight_g, bias_g, true), 2);
          y.backward(dy_pooled);
        };
        measure("bn+relu+maxpool2 fwd+bwd, two ops", pooled_floor, [&] { bn_relu_pool(false); });
        measure("bn+relu+maxpool2 fwd+bwd, fused", pooled_floor, [&] { bn_relu_pool(true); });
      } catch (const Error& error) {
        table.add_failure("convnet inputs" + layout, shape_text(shape), dtype_text, error.what());
      }
    }
  }
}

void run_gpu(const Options& options) {
  if (!cuda::is_available()) {
    std::printf("GPU benchmarks skipped: no CUDA device (device_count() = 0, kiln %s CUDA)\n",
                cuda::compiled_with_cuda() ? "built with" : "built without");
    return;
  }
  const int device = 0;
  cuda::set_device(device);
  const cuda::DeviceProperties properties = cuda::device_properties(device);
  std::printf("GPU: %s, %d SMs, L2 %.1f MiB, sm_%d%d, %.1f GiB\n", properties.name, properties.multiprocessor_count,
              static_cast<double>(properties.l2_cache_bytes) / (1 << 20), properties.major, properties.minor,
              static_cast<double>(cuda::device_total_memory(device)) / (1 << 30));
  const int repeats = options.repeats > 0 ? options.repeats : (options.quick ? 5 : 50);
  Sizes sizes = options.quick ? Sizes{1 << 20, 1024, 1024, 1024, 1024, 16 << 20}
                              : Sizes{1 << 26, 16384, 4096, 4096, 32768, 256 << 20};
  GpuTimer timer(device);
  std::printf("timing: CUDA events, median of %d repeats after 3 warm-ups, L2 flushed (%zu MiB written) before each\n",
              repeats, timer.flush_bytes() >> 20);
  auto time_fn = [&](const std::function<void()>& fn) { return timer.time(fn, repeats); };

  // The reference: a device-to-device copy reads and writes every byte once.
  const Device cuda_device = Device::cuda(device);
  Tensor src = random_tensor({sizes.copy_bytes / 4}, DType::f32, cuda_device, 6);
  Tensor dst = empty({sizes.copy_bytes / 4}, {.device = cuda_device});
  const cuda::Stream stream = cuda::current_stream(device);
  const Measurement copy = time_fn([&] {
    cuda::memcpy_async(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(sizes.copy_bytes),
                       cuda::CopyKind::device_to_device, stream);
  });
  const double copy_bytes = 2.0 * static_cast<double>(sizes.copy_bytes);
  const double reference = gbps(copy_bytes, copy);
  src = Tensor();
  dst = Tensor();

  Table table("GPU kernels (forward), cuda:" + std::to_string(device));
  table.add({"D2D cudaMemcpy (reference)", std::to_string(sizes.copy_bytes >> 20) + " MiB", "bytes", copy, copy_bytes,
             0, ""});
  run_cases(table, cuda_device, sizes, time_fn);
  table.print(reference);
  Table transformer_table("GPU transformer layers at GPT-2's activation shape, cuda:" + std::to_string(device));
  run_transformer_cases(transformer_table, cuda_device, options.quick ? 4 * 1024 : 16 * 1024, time_fn);
  transformer_table.print(reference);
  Table convnet_table("GPU layers between ResNet-9's convolutions, NCHW and channels-last, cuda:" +
                      std::to_string(device));
  run_convnet_cases(convnet_table, cuda_device, options.quick ? 64 : 512, time_fn);
  convnet_table.print(reference);
  std::printf("reference: device-to-device copy %.1f GB/s (read + write)\n", reference);
}

void run_cpu(const Options& options) {
  const int repeats = options.repeats > 0 ? options.repeats : (options.quick ? 3 : 10);
  Sizes sizes = options.quick ? Sizes{1 << 20, 512, 1024, 256, 1024, 16 << 20}
                              : Sizes{1 << 24, 4096, 4096, 1024, 8192, 128 << 20};
  CpuTimer timer;
  const int threads = omp_get_max_threads();
  std::printf("\nCPU: %d OpenMP threads; timing: steady clock, median of %d repeats after 1 warm-up, "
              "cache flushed (%zu MiB written) before each\n",
              threads, repeats, timer.flush_bytes() >> 20);
  auto time_fn = [&](const std::function<void()>& fn) { return timer.time(fn, repeats); };

  // The reference: memcpy split over the same threads the kernels use.
  const size_t bytes = static_cast<size_t>(sizes.copy_bytes);
  std::vector<unsigned char> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 131u);
  const Measurement copy = time_fn([&] {
    const int64_t chunks = threads;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t begin = bytes * static_cast<size_t>(c) / static_cast<size_t>(chunks);
      const size_t end = bytes * static_cast<size_t>(c + 1) / static_cast<size_t>(chunks);
      std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
    }
  });
  const double copy_bytes = 2.0 * static_cast<double>(bytes);
  const double reference = gbps(copy_bytes, copy);
  std::vector<unsigned char>().swap(src);
  std::vector<unsigned char>().swap(dst);

  Table table("CPU kernels (forward)");
  table.add({"memcpy (reference)", std::to_string(bytes >> 20) + " MiB", "bytes", copy, copy_bytes, 0, ""});
  run_cases(table, Device::cpu(), sizes, time_fn);
  table.print(reference);
  Table transformer_table("CPU transformer layers at GPT-2's activation shape");
  run_transformer_cases(transformer_table, Device::cpu(), options.quick ? 4 * 1024 : 16 * 1024, time_fn);
  transformer_table.print(reference);
  Table convnet_table("CPU layers between ResNet-9's convolutions, NCHW and channels-last");
  run_convnet_cases(convnet_table, Device::cpu(), options.quick ? 16 : 128, time_fn);
  convnet_table.print(reference);
  std::printf("reference: %d-thread memcpy %.1f GB/s (read + write)\n", threads, reference);
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  return kiln::bench::run_device_bench(argc, argv, "bench_kernels", kiln::bench::run_gpu, kiln::bench::run_cpu);
}
