// GEMM throughput of kiln's kernels (kernels/linalg.h), with a peer on the
// same machine:
//   CPU: kernels::gemm_cpu vs a direct Eigen product with Eigen's own OpenMP
//        threading on the same shapes (the ratio is kiln vs Eigen's peak here);
//        FashionCNN shapes (batch 128) first, then squares; the two are timed
//        alternately (median of each) so that both see the same machine load.
//   GPU: kernels::gemm_cuda (cuBLASLt) in float32, TF32, bfloat16 and float16
//        (float32 accumulation): CUDA events around each call after warm-up,
//        median of the repeats, inputs rotated through more than twice the L2
//        so no repeat reads a warm cache, random (never zero) inputs. With
//        --json, one JSON object per row on stdout instead of the table
//        (precision, what, m, n, k, trans_a, trans_b, median_ms, tflops,
//        repeats, warmup, sets, device, l2_bytes), or {"skipped": why} without
//        a GPU; bench/compare_gemm.py times torch.matmul on those rows.
// Usage: bench_gemm [--cpu] [--gpu] [--json]   (both by default; --gpu skips
//        without a GPU; --json applies to the GPU part only)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#if __has_include(<Eigen/Core>)
#include <Eigen/Core>
#else
#include <eigen3/Eigen/Core>  // the bench target does not link Eigen3::Eigen
#endif
#include <omp.h>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "kernels/linalg.h"

using namespace kiln;

namespace {

struct Shape3 {
  int64_t m, n, k;
  bool trans_a, trans_b;
  const char* what;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Median seconds of `first` and of `second` over `repeats` runs each after
// one warm-up, alternating the two so that both see the same machine load.
template <typename First, typename Second>
std::pair<double, double> time_host_pair(First first, Second second, int repeats) {
  first();
  second();
  std::vector<double> first_seconds, second_seconds;
  auto seconds_of = [](auto& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (int i = 0; i < repeats; ++i) {
    first_seconds.push_back(seconds_of(first));
    second_seconds.push_back(seconds_of(second));
  }
  return {median(first_seconds), median(second_seconds)};
}

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void bench_cpu() {
  const Shape3 shapes[] = {
      {128, 128, 3136, false, true, "linear fwd x @ W^T (fc 3136->128)"},
      {128, 3136, 128, false, false, "linear dx = dout @ W"},
      {128, 3136, 128, true, false, "linear dW = dout^T @ x"},
      {25088, 64, 288, false, true, "conv 32->64 3x3 im2col fwd"},
      {64, 288, 25088, true, false, "conv 32->64 3x3 dW"},
      {100352, 32, 25, false, true, "conv 1->32 5x5 im2col fwd"},
      {512, 512, 512, false, false, "square 512"},
      {1024, 1024, 1024, false, false, "square 1024"},
  };
  std::printf("CPU GEMM, float32, %d OpenMP threads (%s)\n", omp_get_max_threads(), "kiln: shape-fixed tiles, one "
              "thread each; Eigen: its own threading");
  std::printf("%-36s %7s %7s %7s %11s %11s %7s\n", "shape", "m", "n", "k", "kiln GF/s", "Eigen GF/s", "ratio");
  std::mt19937 engine(1);
  std::normal_distribution<float> normal;
  for (const Shape3& s : shapes) {
    RowMatrix a(s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k), b(s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n);
    for (int64_t i = 0; i < a.size(); ++i) a.data()[i] = normal(engine);
    for (int64_t i = 0; i < b.size(); ++i) b.data()[i] = normal(engine);
    RowMatrix c(s.m, s.n);
    kernels::GemmProblem problem;
    problem.dtype = DType::f32;
    problem.m = s.m;
    problem.n = s.n;
    problem.k = s.k;
    problem.a = {a.data(), a.cols(), 0, s.trans_a};
    problem.b = {b.data(), b.cols(), 0, s.trans_b};
    problem.c = {c.data(), s.n, 0, false};
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const int repeats = std::clamp(static_cast<int>(2e10 / flops), 5, 50);
    const auto [kiln_s, eigen_s] = time_host_pair(
        [&] { kernels::gemm_cpu(problem); },
        [&] {
          if (s.trans_a && s.trans_b) {
            c.noalias() = a.transpose() * b.transpose();
          } else if (s.trans_a) {
            c.noalias() = a.transpose() * b;
          } else if (s.trans_b) {
            c.noalias() = a * b.transpose();
          } else {
            c.noalias() = a * b;
          }
        },
        repeats);
    std::printf("%-36s %7ld %7ld %7ld %11.1f %11.1f %7.2f\n", s.what, static_cast<long>(s.m), static_cast<long>(s.n),
                static_cast<long>(s.k), flops / kiln_s / 1e9, flops / eigen_s / 1e9, eigen_s / kiln_s);
  }
}

void bench_gpu(bool json) {
  if (!cuda::is_available()) {
    const std::string why =
        std::string("no GPU") + (cuda::compiled_with_cuda() ? "" : "; kiln was built without CUDA");
    if (json) {
      std::printf("%s\n", nlohmann::json{{"bench", "gemm"}, {"skipped", why}}.dump().c_str());
    } else {
      std::printf("GPU GEMM: skipped (%s)\n", why.c_str());
    }
    return;
  }
  const int device = 0;
  const cuda::DeviceProperties properties = cuda::device_properties(device);
  const cuda::Stream stream = cuda::current_stream(device);
  const size_t workspace_bytes = kernels::gemm_cuda_workspace_bytes(device);
  std::shared_ptr<void> workspace = allocate_cuda(workspace_bytes, device, stream);
  if (!json) {
    std::printf("GPU GEMM on %s (%d SMs, L2 %zu MiB), cuBLASLt through kernels::gemm_cuda\n", properties.name,
                properties.multiprocessor_count, properties.l2_cache_bytes >> 20);
    std::printf("%-10s %-36s %6s %6s %6s %10s %10s\n", "precision", "shape", "m", "n", "k", "median ms", "TFLOP/s");
  }
  struct Precision {
    const char* name;
    DType dtype;
    bool tf32;
  };
  const Precision precisions[] = {{"float32", DType::f32, false}, {"tf32", DType::f32, true},
                                  {"bfloat16", DType::bf16, false}, {"float16", DType::f16, false}};
  const Shape3 shapes[] = {{128, 128, 3136, false, true, "linear fwd (fc 3136->128, batch 128)"},
                           {25088, 64, 288, false, true, "conv 32->64 3x3 im2col fwd"},
                           {4096, 4096, 4096, false, false, "square 4096"},
                           {8192, 8192, 8192, false, false, "square 8192"},
                           {8192, 8192, 8192, false, true, "square 8192, B transposed"}};
  cuda::Event start = cuda::create_event(device, true), stop = cuda::create_event(device, true);
  for (const Precision& precision : precisions) {
    for (const Shape3& s : shapes) {
      const TensorOptions options{.dtype = precision.dtype, .device = Device::cuda(device)};
      const size_t set_bytes = static_cast<size_t>(s.m * s.k + s.k * s.n + s.m * s.n) * dtype_size(precision.dtype);
      const int sets = static_cast<int>(std::clamp<size_t>(2 * properties.l2_cache_bytes / set_bytes + 1, 1, 8));
      std::vector<Tensor> as, bs, cs;
      for (int i = 0; i < sets; ++i) {
        as.push_back(randn({s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k}, options));
        bs.push_back(randn({s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n}, options));
        cs.push_back(empty({s.m, s.n}, options));
      }
      auto problem_for = [&](int i) {
        kernels::GemmProblem p;
        p.dtype = precision.dtype;
        p.m = s.m;
        p.n = s.n;
        p.k = s.k;
        p.a = {as[i].data_ptr(), as[i].size(1), 0, s.trans_a};
        p.b = {bs[i].data_ptr(), bs[i].size(1), 0, s.trans_b};
        p.c = {cs[i].data_ptr(), s.n, 0, false};
        return p;
      };
      const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
      const int warmup = 5;
      for (int i = 0; i < warmup; ++i) {  // also fills the algorithm cache
        kernels::gemm_cuda(problem_for(i % sets), precision.tf32, workspace.get(), workspace_bytes, device, stream);
      }
      const int repeats = std::clamp(static_cast<int>(2e14 / flops), 20, 200);
      std::vector<double> ms;
      for (int i = 0; i < repeats; ++i) {
        const kernels::GemmProblem p = problem_for(i % sets);
        cuda::record_event(start, stream);
        kernels::gemm_cuda(p, precision.tf32, workspace.get(), workspace_bytes, device, stream);
        cuda::record_event(stop, stream);
        cuda::event_synchronize(stop);
        ms.push_back(cuda::event_elapsed_ms(start, stop));
      }
      const double median_ms = median(ms);
      const double tflops = flops / (median_ms * 1e-3) / 1e12;
      if (json) {
        const nlohmann::json row = {{"precision", precision.name}, {"what", s.what},
                                    {"m", s.m}, {"n", s.n}, {"k", s.k},
                                    {"trans_a", s.trans_a}, {"trans_b", s.trans_b},
                                    {"median_ms", median_ms}, {"tflops", tflops},
                                    {"repeats", repeats}, {"warmup", warmup}, {"sets", sets},
                                    {"device", std::string(properties.name)}, {"l2_bytes", properties.l2_cache_bytes}};
        std::printf("%s\n", row.dump().c_str());
        std::fflush(stdout);
      } else {
        std::printf("%-10s %-36s %6ld %6ld %6ld %10.4f %10.1f\n", precision.name, s.what, static_cast<long>(s.m),
                    static_cast<long>(s.n), static_cast<long>(s.k), median_ms, tflops);
      }
    }
  }
  cuda::destroy_event(start);
  cuda::destroy_event(stop);
}

}  // namespace

int main(int argc, char** argv) {
  bool cpu = false, gpu = false, json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cpu") == 0) {
      cpu = true;
    } else if (std::strcmp(argv[i], "--gpu") == 0) {
      gpu = true;
    } else if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      std::fprintf(stderr, "usage: %s [--cpu] [--gpu] [--json]\n", argv[0]);
      return 2;
    }
  }
  if (!cpu && !gpu) cpu = gpu = true;
  try {
    if (cpu) bench_cpu();
    if (gpu) bench_gpu(json);
  } catch (const Error& error) {
    std::fprintf(stderr, "bench_gemm: %s\n", error.what());
    return 1;
  }
  return 0;
}
