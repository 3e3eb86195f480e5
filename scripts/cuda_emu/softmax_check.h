// softmax.cu's softmax/log-softmax forward and backward run on emulated
// buffers, and their float64 reference: one copy for the two softmax drivers
// (test_softmax.cpp, the fidelity check, and softmax_paths.cpp). Include after
// emu_softmax.inc.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "emu_test.h"

namespace emu_test {

// softmax_cuda from x into y, then softmax_grad_cuda from y and dy into dx.
template <typename T>
void launch_softmax_and_grad(emu::Buffer<T>& x, emu::Buffer<T>& y, emu::Buffer<T>& dy, emu::Buffer<T>& dx,
                             int64_t rows, int64_t cols, bool log) {
  kiln::kernels::SoftmaxArgs args;
  args.dtype = emu_dtype<T>();
  args.x = x.data;
  args.y = y.data;
  args.rows = rows;
  args.cols = cols;
  args.log = log;
  kiln::kernels::softmax_cuda(args, nullptr);
  kiln::kernels::SoftmaxGradArgs grad;
  grad.dtype = args.dtype;
  grad.y = y.data;
  grad.dy = dy.data;
  grad.dx = dx.data;
  grad.rows = rows;
  grad.cols = cols;
  grad.log = log;
  kiln::kernels::softmax_grad_cuda(grad, nullptr);
}

template <typename T>
std::vector<double> values_of(const emu::Buffer<T>& buffer) {
  std::vector<double> values(buffer.n);
  for (size_t i = 0; i < buffer.n; ++i) values[i] = to_double(buffer[i]);
  return values;
}

// Row-wise softmax (or log-softmax) of x in float64 into ref_y, and the
// backward from the kernel's own y (its input) and dy into ref_dx. A row of
// all -inf gives NaN, as the kernels do.
inline void softmax_reference(const std::vector<double>& x, const std::vector<double>& dy,
                              const std::vector<double>& kernel_y, int64_t rows, int64_t cols, bool log,
                              std::vector<double>& ref_y, std::vector<double>& ref_dx) {
  ref_y.assign(x.size(), 0.0);
  ref_dx.assign(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    double m = -INFINITY, s = 0, total = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, x[base + c]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[base + c] - m);
    for (int64_t c = 0; c < cols; ++c) {
      const double v = x[base + c] - m;
      ref_y[base + c] = log ? v - std::log(s) : std::exp(v) / s;
    }
    for (int64_t c = 0; c < cols; ++c) total += log ? dy[base + c] : dy[base + c] * kernel_y[base + c];
    for (int64_t c = 0; c < cols; ++c) {
      const double yv = kernel_y[base + c], g = dy[base + c];
      ref_dx[base + c] = log ? g - std::exp(yv) * total : yv * (g - total);
    }
  }
}

}  // namespace emu_test
