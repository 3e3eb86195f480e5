// CPU layer norm.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/float_convert.h"
#include "kernels/cpu/lane_sum.h"
#include "kernels/norm.h"

namespace kiln::kernels {

namespace {

using cpu::kRowChunks;
using cpu::lane_sum;

// Rows in the compute type (cpu::compute_row: float rows in place, 16-bit rows
// widened once into a buffer), so that every pass over a row is a vectorized
// loop in L1 and the sums are the same as over the stored values. Results go
// to a buffer of their own (an in-place write over the widened row kept the
// loop scalar). The backward computes dx and accumulates dweight/dbias in the
// same pass over x and dy, in the fixed chunks of kRowChunks rows (no
// dependence on the thread count).

// weight or bias (n values, or null) in the compute type; empty for null.
template <typename T>
std::vector<compute_t<T>> widened(const T* values, int64_t n) {
  if (values == nullptr) return {};
  std::vector<float> buffer;
  const compute_t<T>* row = cpu::compute_row(values, n, buffer);
  return std::vector<compute_t<T>>(row, row + n);
}

template <typename T>
void layer_norm_forward(const LayerNormArgs& args, const T* x, const T* weight, const T* bias, T* y,
                        compute_t<T>* save_mean, compute_t<T>* save_rstd) {
  using A = compute_t<T>;
  const int64_t rows = args.rows, D = args.cols;
  const std::vector<A> w = widened(weight, D), b = widened(bias, D);
  const A* __restrict__ ws = weight != nullptr ? w.data() : nullptr;
  const A* __restrict__ bs = bias != nullptr ? b.data() : nullptr;
#pragma omp parallel if (rows * D > (1 << 15))
  {
    std::vector<float> x_buffer, out_buffer;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const A* __restrict__ xs = cpu::compute_row(x + r * D, D, x_buffer);
      A* __restrict__ out = cpu::result_row(y + r * D, D, out_buffer);
      const double mean = lane_sum<A>(D, [&](int64_t i) { return xs[i]; }) / static_cast<double>(D);
      const A mean_a = static_cast<A>(mean);
      const double var = lane_sum<A>(D, [&](int64_t i) {
                           const A d = xs[i] - mean_a;
                           return d * d;
                         }) / static_cast<double>(D);
      const A rstd = static_cast<A>(1.0 / std::sqrt(var + args.eps));
      save_mean[r] = mean_a;
      save_rstd[r] = rstd;
      // One loop per affine case: each vectorizes without a test per element.
      if (ws != nullptr && bs != nullptr) {
        for (int64_t i = 0; i < D; ++i) out[i] = (xs[i] - mean_a) * rstd * ws[i] + bs[i];
      } else if (ws != nullptr) {
        for (int64_t i = 0; i < D; ++i) out[i] = (xs[i] - mean_a) * rstd * ws[i];
      } else if (bs != nullptr) {
        for (int64_t i = 0; i < D; ++i) out[i] = (xs[i] - mean_a) * rstd + bs[i];
      } else {
        for (int64_t i = 0; i < D; ++i) out[i] = (xs[i] - mean_a) * rstd;
      }
      cpu::store_result_row(out, y + r * D, D);
    }
  }
}

template <typename T>
void layer_norm_backward(const LayerNormArgs& args, const T* x, const T* dy, const T* weight,
                         const compute_t<T>* save_mean, const compute_t<T>* save_rstd, T* dx, T* dweight,
                         T* dbias) {
  using A = compute_t<T>;
  const int64_t rows = args.rows, D = args.cols;
  const bool want_params = dweight != nullptr || dbias != nullptr;
  if (dx == nullptr && !want_params) return;
  const std::vector<A> w = widened(weight, D);
  const A* __restrict__ ws = weight != nullptr ? w.data() : nullptr;
  const int64_t chunks = std::max<int64_t>(1, std::min(rows, kRowChunks));
  const int64_t per_chunk = (rows + chunks - 1) / chunks;
  std::vector<double> partial(want_params ? static_cast<size_t>(2 * chunks * D) : 0);
#pragma omp parallel if (rows * D > (1 << 15))
  {
    std::vector<float> x_buffer, dy_buffer, out_buffer;
    std::vector<A> g_buffer(ws != nullptr && dx != nullptr ? static_cast<size_t>(D) : 0);  // dy * weight
#pragma omp for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      double* __restrict__ acc_w = want_params ? partial.data() + 2 * chunk * D : nullptr;
      double* __restrict__ acc_b = want_params ? acc_w + D : nullptr;
      if (want_params) std::fill(acc_w, acc_w + 2 * D, 0.0);
      const int64_t end = std::min(rows, (chunk + 1) * per_chunk);
      for (int64_t r = chunk * per_chunk; r < end; ++r) {
        const A mean = save_mean[r], rstd = save_rstd[r];
        const A* __restrict__ xs = cpu::compute_row(x + r * D, D, x_buffer);
        const A* __restrict__ dys = cpu::compute_row(dy + r * D, D, dy_buffer);
        if (want_params) {
          for (int64_t i = 0; i < D; ++i) {
            acc_w[i] += static_cast<double>(dys[i] * ((xs[i] - mean) * rstd));
            acc_b[i] += static_cast<double>(dys[i]);
          }
        }
        if (dx == nullptr) continue;
        // g = dy * weight (dy itself without a weight).
        A* __restrict__ g_weighted = g_buffer.data();
        if (ws != nullptr) {
          for (int64_t i = 0; i < D; ++i) g_weighted[i] = dys[i] * ws[i];
        }
        const A* __restrict__ gs = ws != nullptr ? g_weighted : dys;
        const A mean_g = static_cast<A>(lane_sum<A>(D, [&](int64_t i) { return gs[i]; }) / static_cast<double>(D));
        const A mean_g_xhat = static_cast<A>(
            lane_sum<A>(D, [&](int64_t i) { return gs[i] * (xs[i] - mean) * rstd; }) / static_cast<double>(D));
        A* __restrict__ out = cpu::result_row(dx + r * D, D, out_buffer);
        for (int64_t i = 0; i < D; ++i) {
          const A xhat = (xs[i] - mean) * rstd;
          out[i] = rstd * (gs[i] - mean_g - xhat * mean_g_xhat);
        }
        cpu::store_result_row(out, dx + r * D, D);
      }
    }
  }
  if (!want_params) return;
  for (int64_t i = 0; i < D; ++i) {
    double total_w = 0, total_b = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      total_w += partial[2 * chunk * D + i];
      total_b += partial[2 * chunk * D + D + i];
    }
    if (dweight != nullptr) dweight[i] = static_cast<T>(total_w);
    if (dbias != nullptr) dbias[i] = static_cast<T>(total_b);
  }
}

}  // namespace

void layer_norm_forward_cpu(const LayerNormArgs& args, const void* x, const void* weight, const void* bias, void* y,
                            void* save_mean, void* save_rstd) {
  dispatch_floating(args.dtype, "layer_norm (cpu kernel)", [&]<typename T>() {
    using A = compute_t<T>;
    layer_norm_forward<T>(args, static_cast<const T*>(x), static_cast<const T*>(weight),
                          static_cast<const T*>(bias), static_cast<T*>(y), static_cast<A*>(save_mean),
                          static_cast<A*>(save_rstd));
  });
}

void layer_norm_backward_cpu(const LayerNormArgs& args, const void* x, const void* dy, const void* weight,
                             const void* save_mean, const void* save_rstd, void* dx, void* dweight, void* dbias) {
  dispatch_floating(args.dtype, "layer_norm backward (cpu kernel)", [&]<typename T>() {
    using A = compute_t<T>;
    layer_norm_backward<T>(args, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<const T*>(weight),
                           static_cast<const A*>(save_mean), static_cast<const A*>(save_rstd), static_cast<T*>(dx),
                           static_cast<T*>(dweight), static_cast<T*>(dbias));
  });
}

}  // namespace kiln::kernels
