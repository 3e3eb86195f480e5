// CPU time per op of FashionCNN's convolutional stack at batch 128:
//   conv1 (1->32, 3x3, pad 1, no bias) - BN+ReLU - maxpool 2
//   conv2 (32->64, 3x3, pad 1, no bias) - BN+ReLU - maxpool 2
// forward and backward, through the kernels (kernels/{conv,norm,pool}.h) on
// preallocated buffers, then the same stack through the autograd front end.
// Prints median wall and CPU time, and the floor: FLOPs at Eigen's ~100
// GFLOP/s per core (conv) or bytes at a measured memcpy bandwidth
// (memory-bound ops); "of floor" = floor / (cpu time / threads). Conv FLOPs
// are the direct convolution's: conv2 takes the Winograd path
// (kernels/cpu/conv_winograd.cpp, 2.25x fewer multiply-adds), so its "of
// floor" is an effective figure and may exceed 100%.
//
//   bench_conv [--batch 128] [--repeats 30]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/nn_ops.h"
#include "bench/cpu_timing.h"
#include "kernels/conv.h"
#include "kernels/norm.h"
#include "kernels/pool.h"

namespace {

using kiln::bench::median_time;
using kiln::bench::random_floats;
using kiln::bench::Timing;

struct Row {
  std::string name;
  Timing time;
  double flops;  // 0 for memory-bound ops
  double bytes;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  int64_t N = 128;
  int repeats = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--batch") == 0) N = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(argv[i + 1]);
  }

  // Reference bandwidth: a large memcpy (read + write) split over the threads.
  std::vector<float> big_a(1 << 24, 1.0f), big_b(1 << 24);
  const int64_t copy_threads = omp_get_max_threads();
  const double copy_s = median_time(
                            [&] {
                              const int64_t part = static_cast<int64_t>(big_a.size()) / copy_threads;
#pragma omp parallel for schedule(static)
                              for (int64_t t = 0; t < copy_threads; ++t) {
                                std::memcpy(big_b.data() + t * part, big_a.data() + t * part, part * 4);
                              }
                            },
                            10)
                            .cpu;  // summed over threads: bandwidth per busy core
  const double copy_gbs = 2.0 * big_a.size() * 4 / copy_s / 1e9;

  kernels::Conv2dParams c1;
  c1.batch = N;
  c1.in_channels = 1;
  c1.in_h = c1.in_w = 28;
  c1.out_channels = 32;
  c1.kernel_h = c1.kernel_w = 3;
  c1.pad_h = c1.pad_w = 1;
  c1.out_h = c1.out_w = 28;
  kernels::Conv2dParams c2 = c1;
  c2.in_channels = 32;
  c2.in_h = c2.in_w = 14;
  c2.out_channels = 64;
  c2.out_h = c2.out_w = 14;

  const size_t x1n = N * 28 * 28, y1n = N * 32 * 28 * 28, p1n = N * 32 * 14 * 14;
  const size_t y2n = N * 64 * 14 * 14, p2n = N * 64 * 7 * 7;
  auto x1 = random_floats(x1n, 1), w1 = random_floats(32 * 9, 2), w2 = random_floats(64 * 32 * 9, 3);
  auto g1 = random_floats(y1n, 4), g2 = random_floats(y2n, 5), gp1 = random_floats(p1n, 6), gp2 = random_floats(p2n, 7);
  std::vector<float> y1(y1n), a1(y1n), p1(p1n), y2(y2n), a2(y2n), p2(p2n);
  std::vector<float> dy1(y1n), dp1(p1n), dy2(y2n), da(y2n), dw1(32 * 9), dw2(64 * 32 * 9);
  std::vector<int32_t> i1(p1n), i2(p2n);
  std::vector<float> gamma(64, 1.0f), beta(64, 0.0f), rm(64, 0.0f), rv(64, 1.0f), mean(64), invstd(64), dg(64), db(64);

  kernels::BatchNormArgs bn1;
  bn1.shape = {N, 32, 28 * 28};
  bn1.relu = true;
  kernels::BatchNormArgs bn2 = bn1;
  bn2.shape = {N, 64, 14 * 14};
  kernels::Pool2dParams pool1;
  pool1.planes = N * 32;
  pool1.in_h = pool1.in_w = 28;
  pool1.out_h = pool1.out_w = 14;
  pool1.kernel_h = pool1.kernel_w = pool1.stride_h = pool1.stride_w = 2;
  kernels::Pool2dParams pool2 = pool1;
  pool2.planes = N * 64;
  pool2.in_h = pool2.in_w = 14;
  pool2.out_h = pool2.out_w = 7;

  const double f1 = 2 * kernels::conv2d_macs(c1), f2 = 2 * kernels::conv2d_macs(c2);
  std::vector<Row> rows;
  auto add = [&](const std::string& name, double flops, double bytes, const std::function<void()>& fn) {
    rows.push_back({name, median_time(fn, repeats), flops, bytes});
  };
  add("conv1 forward", f1, 4.0 * (x1n + y1n), [&] {
    kernels::conv2d_forward_cpu(DType::f32, c1, x1.data(), w1.data(), nullptr, y1.data());
  });
  add("bn1+relu forward (train)", 0, 4.0 * 2 * y1n, [&] {
    kernels::batch_norm_forward_cpu(bn1, y1.data(), gamma.data(), beta.data(), rm.data(), rv.data(), a1.data(),
                                    mean.data(), invstd.data());
  });
  add("pool1 forward", 0, 4.0 * (y1n + 2 * p1n), [&] {
    kernels::max_pool2d_forward_cpu(DType::f32, pool1, a1.data(), p1.data(), i1.data());
  });
  add("conv2 forward", f2, 4.0 * (p1n + y2n), [&] {
    kernels::conv2d_forward_cpu(DType::f32, c2, p1.data(), w2.data(), nullptr, y2.data());
  });
  add("bn2+relu forward (train)", 0, 4.0 * 2 * y2n, [&] {
    kernels::batch_norm_forward_cpu(bn2, y2.data(), gamma.data(), beta.data(), rm.data(), rv.data(), a2.data(),
                                    mean.data(), invstd.data());
  });
  add("pool2 forward", 0, 4.0 * (y2n + 2 * p2n), [&] {
    kernels::max_pool2d_forward_cpu(DType::f32, pool2, a2.data(), p2.data(), i2.data());
  });
  add("pool2 backward", 0, 4.0 * (y2n + 2 * p2n), [&] {
    kernels::max_pool2d_backward_cpu(DType::f32, pool2, gp2.data(), i2.data(), da.data());
  });
  add("bn2+relu backward", 0, 4.0 * 3 * y2n, [&] {
    kernels::batch_norm_backward_cpu(bn2, y2.data(), g2.data(), gamma.data(), beta.data(), mean.data(), invstd.data(),
                                     dy2.data(), dg.data(), db.data());
  });
  add("conv2 backward (dx + dw)", 2 * f2, 4.0 * (2 * p1n + y2n), [&] {
    kernels::conv2d_backward_cpu(DType::f32, c2, p1.data(), w2.data(), g2.data(), dp1.data(), dw2.data(), nullptr);
  });
  add("pool1 backward", 0, 4.0 * (y1n + 2 * p1n), [&] {
    kernels::max_pool2d_backward_cpu(DType::f32, pool1, gp1.data(), i1.data(), dy1.data());
  });
  add("bn1+relu backward", 0, 4.0 * 3 * y1n, [&] {
    kernels::batch_norm_backward_cpu(bn1, y1.data(), g1.data(), gamma.data(), beta.data(), mean.data(), invstd.data(),
                                     dy1.data(), dg.data(), db.data());
  });
  add("conv1 backward (dw only)", f1, 4.0 * (x1n + y1n), [&] {
    kernels::conv2d_backward_cpu(DType::f32, c1, x1.data(), nullptr, g1.data(), nullptr, dw1.data(), nullptr);
  });

  std::printf("bench_conv: FashionCNN conv stack, batch %lld, float32, %d threads, median of %d\n",
              static_cast<long long>(N), omp_get_max_threads(), repeats);
  std::printf("reference memcpy bandwidth: %.1f GB/s per core (read + write)\n", copy_gbs);
  std::printf("conv FLOPs are the direct convolution's; a Winograd layer's rate is effective\n\n");
  const int threads = omp_get_max_threads();
  std::printf("%-28s %9s %9s %9s %12s %11s %9s\n", "op", "wall ms", "cpu ms", "floor ms", "GFLOP/s/core",
              "GB/s/core", "of floor");
  double total_wall = 0, total_cpu = 0;
  for (const Row& row : rows) {
    total_wall += row.time.wall;
    total_cpu += row.time.cpu;
    // Floor on `threads` cores: FLOPs at 100 GFLOP/s per core, or bytes at the memcpy bandwidth per core.
    const double floor_s = row.flops > 0 ? row.flops / (100e9 * threads) : row.bytes / (copy_gbs * 1e9 * threads);
    const double per_core_s = row.time.cpu / threads;  // busy time per core
    char rate[32] = "-", bandwidth[32] = "-";
    if (row.flops > 0) std::snprintf(rate, sizeof rate, "%.1f", row.flops / row.time.cpu / 1e9);
    if (row.flops == 0) std::snprintf(bandwidth, sizeof bandwidth, "%.1f", row.bytes / row.time.cpu / 1e9);
    std::printf("%-28s %9.3f %9.3f %9.3f %12s %11s %8.0f%%\n", row.name.c_str(), row.time.wall * 1e3,
                row.time.cpu * 1e3, floor_s * 1e3, rate, bandwidth, 100 * floor_s / per_core_s);
  }
  std::printf("%-28s %9.3f %9.3f\n\n", "kernels total", total_wall * 1e3, total_cpu * 1e3);

  // The same stack through the front end (allocation + autograd included).
  Tensor x = from_blob(x1.data(), {N, 1, 28, 28}, DType::f32);
  Tensor cw1 = from_blob(w1.data(), {32, 1, 3, 3}, DType::f32).clone().requires_grad_();
  Tensor cw2 = from_blob(w2.data(), {64, 32, 3, 3}, DType::f32).clone().requires_grad_();
  Tensor bw1 = ones({32}).requires_grad_(), bb1 = zeros({32}).requires_grad_();
  Tensor bw2 = ones({64}).requires_grad_(), bb2 = zeros({64}).requires_grad_();
  Tensor rm1 = zeros({32}), rv1 = ones({32}), rm2 = zeros({64}), rv2 = ones({64});
  Tensor seed = from_blob(gp2.data(), {N, 64, 7, 7}, DType::f32);
  const Timing step = median_time(
      [&] {
        Tensor h = max_pool2d(batch_norm_relu(conv2d(x, cw1, Tensor(), 1, 1), rm1, rv1, bw1, bb1, true), 2);
        h = max_pool2d(batch_norm_relu(conv2d(h, cw2, Tensor(), 1, 1), rm2, rv2, bw2, bb2, true), 2);
        h.backward(seed);
        for (Tensor* p : {&cw1, &cw2, &bw1, &bb1, &bw2, &bb2}) p->zero_grad_();
      },
      repeats);
  std::printf("front end, conv stack forward + backward: wall %.3f ms, cpu %.3f ms (%.0f samples/s by wall, %.0f by cpu/%d)\n",
              step.wall * 1e3, step.cpu * 1e3, static_cast<double>(N) / step.wall,
              static_cast<double>(N) * threads / step.cpu, threads);
  return 0;
}
