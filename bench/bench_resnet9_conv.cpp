// CPU time of each of ResNet-9's convolutions (the shapes of nn/models.cpp on
// 28x28 Fashion-MNIST, 3x3, pad 1, no bias) through kernels/conv.h on
// preallocated buffers: forward, and backward (input + weight gradient; the
// first layer's input gradient is not needed and not timed). Prints the path
// each layer takes (Winograd F(2x2, 3x3) "wino2x2", F(3x3, 3x3) "wino3x3", or
// im2col + GEMM), median wall and
// process CPU time, GFLOP/s per busy core, and "of floor": the FLOPs at
// Eigen's ~100 GFLOP/s per core against the CPU time, which on a busy machine
// is steadier than wall time. FLOPs are always the direct convolution's, so on
// Winograd rows both figures are effective ones (above 100% when the path
// saves more multiply-adds than it loses to its transforms). --path im2col or
// winograd forces a path (winograd where supported), --tile 2 or 3 the
// Winograd tile size, to compare them.
//
//   bench_resnet9_conv [--batch 128] [--repeats 10] [--path auto|im2col|winograd] [--tile auto|2|3]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/cpu_timing.h"
#include "kernels/conv.h"
#include "kernels/cpu/conv_winograd.h"

namespace {

using kiln::bench::median_time;
using kiln::bench::random_floats;
using kiln::bench::Timing;

struct Layer {
  const char* name;
  int64_t in_channels, out_channels, size;  // square input = output (pad 1)
  bool input_gradient;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  int64_t batch = 128;
  int repeats = 10;
  std::string path = "auto", tile = "auto";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--batch") == 0) batch = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--path") == 0) path = argv[i + 1];
    if (std::strcmp(argv[i], "--tile") == 0) tile = argv[i + 1];
  }
  if (tile != "auto" && tile != "2" && tile != "3") {
    std::fprintf(stderr, "bench_resnet9_conv: --tile must be auto, 2 or 3, got %s\n", tile.c_str());
    return 2;
  }
  kernels::conv2d_winograd_set_tile(tile == "auto" ? kernels::WinogradTile::kWhenFaster
                                    : tile == "2"  ? kernels::WinogradTile::k2x2
                                                   : kernels::WinogradTile::k3x3);
  if (path != "auto" && path != "im2col" && path != "winograd") {
    std::fprintf(stderr, "bench_resnet9_conv: --path must be auto, im2col or winograd, got %s\n", path.c_str());
    return 2;
  }
  kernels::conv2d_winograd_set_policy(path == "auto"     ? kernels::WinogradPolicy::kWhenFaster
                                      : path == "im2col" ? kernels::WinogradPolicy::kNever
                                                         : kernels::WinogradPolicy::kAlways);
  const Layer layers[] = {
      {"prep 1->64 28x28", 1, 64, 28, false},        {"layer1 64->128 28x28", 64, 128, 28, true},
      {"residual1 128->128 14x14", 128, 128, 14, true}, {"layer2 128->256 14x14", 128, 256, 14, true},
      {"layer3 256->512 7x7", 256, 512, 7, true},     {"residual3 512->512 3x3", 512, 512, 3, true},
  };
  // How often each shape runs in one ResNet-9 step (the residual blocks have two convolutions).
  const int uses[] = {1, 1, 2, 1, 1, 2};

  const int threads = omp_get_max_threads();
  std::printf("bench_resnet9_conv: batch %lld, float32, %d threads, median of %d, path %s, tile %s\n",
              static_cast<long long>(batch), threads, repeats, path.c_str(), tile.c_str());
  std::printf("(FLOPs and floor are the direct convolution's: effective figures on winograd rows)\n\n");
  std::printf("%-26s %-8s %-8s %9s %9s %9s %12s %9s\n", "layer", "pass", "path", "wall ms", "cpu ms", "floor ms",
              "GFLOP/s/core", "of floor");
  double step_wall = 0, step_cpu = 0, step_floor = 0;
  for (size_t l = 0; l < std::size(layers); ++l) {
    const Layer& layer = layers[l];
    kernels::Conv2dParams p;
    p.batch = batch;
    p.in_channels = layer.in_channels;
    p.out_channels = layer.out_channels;
    p.in_h = p.in_w = p.out_h = p.out_w = layer.size;
    p.kernel_h = p.kernel_w = 3;
    p.pad_h = p.pad_w = 1;
    const size_t x_count = batch * layer.in_channels * layer.size * layer.size;
    const size_t y_count = batch * layer.out_channels * layer.size * layer.size;
    const size_t w_count = layer.out_channels * layer.in_channels * 9;
    auto x = random_floats(x_count, 1), w = random_floats(w_count, 2), dy = random_floats(y_count, 3);
    std::vector<float> y(y_count), dx(x_count), dw(w_count);
    const double flops = 2 * kernels::conv2d_macs(p);

    const char* layer_path = !kernels::conv2d_winograd_selected(p)          ? "im2col"
                             : kernels::conv2d_winograd_tile_size(p) == 3 ? "wino3x3"
                                                                          : "wino2x2";
    auto report = [&](const char* pass, double pass_flops, const Timing& t) {
      const double floor_s = pass_flops / (100e9 * threads);
      std::printf("%-26s %-8s %-8s %9.2f %9.2f %9.2f %12.1f %8.0f%%\n", layer.name, pass, layer_path, 1e3 * t.wall,
                  1e3 * t.cpu, 1e3 * floor_s, pass_flops / t.cpu / 1e9, 100 * floor_s / (t.cpu / threads));
      step_wall += uses[l] * t.wall;
      step_cpu += uses[l] * t.cpu;
      step_floor += uses[l] * floor_s;
    };
    report("forward", flops, median_time([&] {
             kernels::conv2d_forward_cpu(DType::f32, p, x.data(), w.data(), nullptr, y.data());
           }, repeats));
    const double backward_flops = layer.input_gradient ? 2 * flops : flops;
    report("backward", backward_flops, median_time([&] {
             kernels::conv2d_backward_cpu(DType::f32, p, x.data(), w.data(), dy.data(),
                                          layer.input_gradient ? dx.data() : nullptr, dw.data(), nullptr);
           }, repeats));
  }
  std::printf("\nall convolutions of one step: wall %.1f ms, cpu %.1f ms, floor %.1f ms (%.0f%% of floor by cpu)\n",
              1e3 * step_wall, 1e3 * step_cpu, 1e3 * step_floor, 100 * step_floor / (step_cpu / threads));
  return 0;
}
