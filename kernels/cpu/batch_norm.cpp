// CPU batch norm (optionally fused with ReLU).
//
// Over (outer, C, inner) planes it runs one channel per task: its planes
// (N*H*W elements; 400 KB for FashionCNN's first layer at batch 128) stay in
// the core's L2 between the passes, so the training forward (mean, centred
// variance, apply) and the backward (two sums, then dx) read memory once and
// write once. For inner == 1 ((N, C) and channels-last NHWC) rows are reduced
// in fixed chunks instead. Sums run in float lanes within a plane and in double
// across planes, in a fixed order: no dependence on the thread count.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/cpu/float_convert.h"
#include "kernels/cpu/lane_sum.h"
#include "kernels/cpu/max_pool_plane.h"
#include "kernels/error.h"
#include "kernels/norm.h"

namespace kiln::kernels {

namespace {

using cpu::kRowChunks;
using cpu::lane_sum;
using cpu::lane_sum2;

template <typename T>
inline compute_t<T> load(const T* p, int64_t i) {
  return static_cast<compute_t<T>>(p[i]);
}

template <typename T>
struct ChannelAffine {
  using A = compute_t<T>;
  A scale, shift;  // bn(x) = x * scale + shift
};

// The affine forms as two per-channel arrays, for the rows (channels-last)
// loops, which run over a row's channels and vectorize over these.
template <typename T>
struct AffineArrays {
  std::vector<compute_t<T>> scale, shift;
  explicit AffineArrays(const std::vector<ChannelAffine<T>>& affines) : scale(affines.size()), shift(affines.size()) {
    for (size_t c = 0; c < affines.size(); ++c) {
      scale[c] = affines[c].scale;
      shift[c] = affines[c].shift;
    }
  }
};

template <typename T>
inline compute_t<T> affine(compute_t<T> x, const ChannelAffine<T>& a) {
  return x * a.scale + a.shift;
}

// The forward and the backward (which recomputes the ReLU mask) build the
// affine form the same way, so the mask matches the forward bit for bit.
template <typename T>
ChannelAffine<T> channel_affine(int64_t c, const compute_t<T>* mean, const compute_t<T>* invstd,
                                const compute_t<T>* weight, const compute_t<T>* bias) {
  using A = compute_t<T>;
  const A w = weight ? weight[c] : A(1), b = bias ? bias[c] : A(0);
  const A scale = invstd[c] * w;
  return {scale, static_cast<A>(b - mean[c] * scale)};
}

// Eval mode: the running statistics, as the saved ones.
template <typename T>
void running_statistics(const BatchNormArgs& args, const compute_t<T>* running_mean, const compute_t<T>* running_var,
                        compute_t<T>* save_mean, compute_t<T>* save_invstd) {
  using A = compute_t<T>;
  for (int64_t c = 0; c < args.shape.channels; ++c) {
    save_mean[c] = running_mean[c];
    save_invstd[c] = static_cast<A>(1.0 / std::sqrt(static_cast<double>(running_var[c]) + args.eps));
  }
}

template <typename T>
void apply_plane(const T* src, T* dst, int64_t n, const ChannelAffine<T>& a, bool relu) {
  using A = compute_t<T>;
  if (relu) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(std::max(affine(load(src, i), a), A(0)));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(affine(load(src, i), a));
  }
}

// Where the planes path writes the normalized plane (o, c): straight into y
// (DensePlanes), or into a thread's buffer that end() max-pools 2x2 into y and
// the indices (PooledPlanes: the full-size activation is never stored). Each
// thread takes its own writer().
template <typename T>
struct DensePlanes {
  T* y;
  int64_t C, inner;
  struct Writer {
    const DensePlanes& planes;
    T* begin(int64_t o, int64_t c) { return planes.y + (o * planes.C + c) * planes.inner; }
    void end(int64_t, int64_t) {}
  };
  Writer writer() const { return {*this}; }
};

template <typename T>
struct PooledPlanes {
  T* y;
  int32_t* indices;
  int64_t C, inner, W, OH, OW;
  struct Writer {
    const PooledPlanes& planes;
    std::vector<T> plane;
    cpu::MaxPool2x2Rows rows;
    T* begin(int64_t, int64_t) {
      plane.resize(static_cast<size_t>(planes.inner));
      return plane.data();
    }
    void end(int64_t o, int64_t c) {
      const int64_t at = (o * planes.C + c) * planes.OH * planes.OW;
      cpu::max_pool_plane_2x2(plane.data(), planes.W, planes.OH, planes.OW, planes.y + at, planes.indices + at,
                              rows);
    }
  };
  Writer writer() const { return {*this, {}, {}}; }
};

// (outer, C, inner) with inner > 1: one channel per task in training (see the
// file's comment); in eval one outer index per task.
template <typename T, typename Planes>
void forward_planes(const BatchNormArgs& args, const T* x, const compute_t<T>* weight, const compute_t<T>* bias,
                    compute_t<T>* running_mean, compute_t<T>* running_var, compute_t<T>* save_mean,
                    compute_t<T>* save_invstd, const Planes& out) {
  using A = compute_t<T>;
  const int64_t outer = args.shape.outer, C = args.shape.channels, inner = args.shape.inner;
  const int64_t M = args.shape.reduced();
  const int64_t numel = M * C;
  if (!args.training) {
    running_statistics<T>(args, running_mean, running_var, save_mean, save_invstd);
    std::vector<ChannelAffine<T>> affines(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) affines[c] = channel_affine<T>(c, save_mean, save_invstd, weight, bias);
#pragma omp parallel if (numel > (1 << 15))
    {
      auto writer = out.writer();
#pragma omp for schedule(static)
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t c = 0; c < C; ++c) {
          apply_plane(x + (o * C + c) * inner, writer.begin(o, c), inner, affines[c], args.relu);
          writer.end(o, c);
        }
      }
    }
    return;
  }
#pragma omp parallel if (numel > (1 << 15))
  {
    auto writer = out.writer();
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      double total = 0;
      for (int64_t o = 0; o < outer; ++o) {
        const T* plane = x + (o * C + c) * inner;
        total += lane_sum<A>(inner, [&](int64_t i) { return load(plane, i); });
      }
      const double mean = total / static_cast<double>(M);
      const A mean_a = static_cast<A>(mean);
      double squares = 0;
      for (int64_t o = 0; o < outer; ++o) {
        const T* plane = x + (o * C + c) * inner;
        squares += lane_sum<A>(inner, [&](int64_t i) {
          const A d = load(plane, i) - mean_a;
          return d * d;
        });
      }
      save_mean[c] = static_cast<A>(mean);
      save_invstd[c] = static_cast<A>(1.0 / std::sqrt(squares / static_cast<double>(M) + args.eps));
      if (running_mean != nullptr) {
        running_mean[c] = static_cast<A>((1 - args.momentum) * running_mean[c] + args.momentum * mean);
        const double unbiased = squares / static_cast<double>(M - 1);
        running_var[c] = static_cast<A>((1 - args.momentum) * running_var[c] + args.momentum * unbiased);
      }
      // Apply while the channel's planes are still in this core's cache.
      const ChannelAffine<T> a = channel_affine<T>(c, save_mean, save_invstd, weight, bias);
      for (int64_t o = 0; o < outer; ++o) {
        apply_plane(x + (o * C + c) * inner, writer.begin(o, c), inner, a, args.relu);
        writer.end(o, c);
      }
    }
  }
}

// (outer, C) rows: (N, C) and channels-last NHWC.
template <typename T>
void forward_rows(const BatchNormArgs& args, const T* x, const compute_t<T>* weight, const compute_t<T>* bias,
                  compute_t<T>* running_mean, compute_t<T>* running_var, T* y, compute_t<T>* save_mean,
                  compute_t<T>* save_invstd) {
  using A = compute_t<T>;
  const int64_t outer = args.shape.outer, C = args.shape.channels;
  const int64_t M = args.shape.reduced();
  const int64_t numel = M * C;
  if (!args.training) {
    running_statistics<T>(args, running_mean, running_var, save_mean, save_invstd);
  } else {
    // Rows (outer, C): per-chunk column sums, combined in chunk order.
    const int64_t chunks = std::max<int64_t>(1, std::min(outer, kRowChunks));
    const int64_t per_chunk = (outer + chunks - 1) / chunks;
    std::vector<double> partial(static_cast<size_t>(chunks * C));
    std::vector<double> mean(static_cast<size_t>(C), 0.0), squares(static_cast<size_t>(C), 0.0);
    for (int pass = 0; pass < 2; ++pass) {
#pragma omp parallel for schedule(static) if (numel > (1 << 15))
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        double* __restrict__ acc = partial.data() + chunk * C;
        const double* __restrict__ means = mean.data();
        std::fill(acc, acc + C, 0.0);
        std::vector<float> row_buffer;
        const int64_t end = std::min(outer, (chunk + 1) * per_chunk);
        for (int64_t r = chunk * per_chunk; r < end; ++r) {
          // A 16-bit row widened once (vectorized); the sums are the same.
          const A* __restrict__ row = cpu::compute_row(x + r * C, C, row_buffer);
          if (pass == 0) {
            for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<double>(row[c]);
          } else {
            for (int64_t c = 0; c < C; ++c) {
              const double d = static_cast<double>(row[c]) - means[c];
              acc[c] += d * d;
            }
          }
        }
      }
      std::vector<double>& target = pass == 0 ? mean : squares;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        for (int64_t c = 0; c < C; ++c) target[c] += partial[chunk * C + c];
      }
      if (pass == 0) {
        for (int64_t c = 0; c < C; ++c) mean[c] /= static_cast<double>(M);
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      save_mean[c] = static_cast<A>(mean[c]);
      save_invstd[c] = static_cast<A>(1.0 / std::sqrt(squares[c] / static_cast<double>(M) + args.eps));
      if (running_mean != nullptr) {
        running_mean[c] = static_cast<A>((1 - args.momentum) * running_mean[c] + args.momentum * mean[c]);
        const double unbiased = squares[c] / static_cast<double>(M - 1);
        running_var[c] = static_cast<A>((1 - args.momentum) * running_var[c] + args.momentum * unbiased);
      }
    }
  }

  // Apply: the channels are the contiguous dim, so the loop runs over them
  // with the scales and shifts as arrays (vectorized), each row widened and
  // narrowed once. The same x * scale + shift as affine().
  std::vector<ChannelAffine<T>> affines(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) affines[c] = channel_affine<T>(c, save_mean, save_invstd, weight, bias);
  const bool relu = args.relu;
  const AffineArrays<T> arrays(affines);
  const A* __restrict__ scale = arrays.scale.data();
  const A* __restrict__ shift = arrays.shift.data();
#pragma omp parallel if (numel > (1 << 15))
  {
    std::vector<float> in_buffer, out_buffer;
#pragma omp for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const A* __restrict__ xs = cpu::compute_row(x + o * C, C, in_buffer);
      A* __restrict__ out = cpu::result_row(y + o * C, C, out_buffer);
      if (relu) {
        for (int64_t c = 0; c < C; ++c) out[c] = std::max(xs[c] * scale[c] + shift[c], A(0));
      } else {
        for (int64_t c = 0; c < C; ++c) out[c] = xs[c] * scale[c] + shift[c];
      }
      cpu::store_result_row(out, y + o * C, C);
    }
  }
}

// The gradient through the fused ReLU: g where the recomputed pre-activation
// z = bn(x) is positive, else 0 (plain g without a ReLU).
template <bool kRelu, typename A>
inline A relu_gate(A z, A g) {
  if constexpr (kRelu) {
    return z > A(0) ? g : A(0);
  } else {
    (void)z;
    return g;
  }
}

// Where the planes path reads dy's plane (o, c): dy itself (DenseGradient), or
// max pooling's backward of the pooled dy into a thread's buffer
// (PooledGradient: the full-size gradient is never stored). Each thread takes
// its own reader().
template <typename T>
struct DenseGradient {
  const T* dy;
  int64_t C, inner;
  struct Reader {
    const DenseGradient& gradient;
    const T* plane(int64_t o, int64_t c) { return gradient.dy + (o * gradient.C + c) * gradient.inner; }
  };
  Reader reader() const { return {*this}; }
};

template <typename T>
struct PooledGradient {
  const T* dy;
  const int32_t* indices;
  int64_t C, inner, pooled;  // pooled: OH * OW
  struct Reader {
    const PooledGradient& gradient;
    std::vector<T> buffer;
    const T* plane(int64_t o, int64_t c) {
      buffer.resize(static_cast<size_t>(gradient.inner));
      const int64_t at = (o * gradient.C + c) * gradient.pooled;
      cpu::max_pool_backward_plane(gradient.dy + at, gradient.indices + at, gradient.pooled, buffer.data(),
                                   gradient.inner);
      return buffer.data();
    }
  };
  Reader reader() const { return {*this, {}}; }
};

// (outer, C, inner) with inner > 1: one channel per task, its planes in this
// core's cache for both passes. kRelu is a template argument so that the
// masked loops have no branch and vectorize.
template <typename T, bool kRelu, typename Gradient>
void backward_planes(const BatchNormArgs& args, const T* x, const Gradient& gradient, const compute_t<T>* weight,
                     const compute_t<T>* bias, const compute_t<T>* save_mean, const compute_t<T>* save_invstd, T* dx,
                     compute_t<T>* dweight, compute_t<T>* dbias) {
  using A = compute_t<T>;
  const int64_t outer = args.shape.outer, C = args.shape.channels, inner = args.shape.inner;
  const int64_t M = args.shape.reduced();
  const int64_t numel = M * C;
  // dz = dy masked by the recomputed ReLU.
  auto dz_at = [](const T* xs, const T* dys, int64_t i, const ChannelAffine<T>& a) -> A {
    return relu_gate<kRelu>(affine(load(xs, i), a), load(dys, i));
  };
#pragma omp parallel if (numel > (1 << 15))
  {
    auto reader = gradient.reader();
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      const ChannelAffine<T> a = channel_affine<T>(c, save_mean, save_invstd, weight, bias);
      const A mean = save_mean[c];
      double sum_dz = 0, sum_dz_xmu = 0;
      for (int64_t o = 0; o < outer; ++o) {
        const T* xs = x + (o * C + c) * inner;
        const T* dys = reader.plane(o, c);
        lane_sum2<A>(
            inner,
            [&](int64_t i) {
              const A dz = dz_at(xs, dys, i, a);
              return std::pair<A, A>{dz, dz * (load(xs, i) - mean)};
            },
            &sum_dz, &sum_dz_xmu);
      }
      if (dbias != nullptr) dbias[c] = static_cast<A>(sum_dz);
      if (dweight != nullptr) dweight[c] = static_cast<A>(sum_dz_xmu * static_cast<double>(save_invstd[c]));
      if (dx == nullptr) continue;
      // dx = k * (dz - sum_dz / M * training) - xmu * coef.
      const A w = weight ? weight[c] : A(1);
      const A invstd = save_invstd[c];
      const A k = invstd * w;
      const A mean_dz = args.training ? static_cast<A>(sum_dz / static_cast<double>(M)) : A(0);
      const A coef = args.training ? static_cast<A>(sum_dz_xmu / static_cast<double>(M)) * invstd * invstd : A(0);
      for (int64_t o = 0; o < outer; ++o) {
        const int64_t base = (o * C + c) * inner;
        const T* xs = x + base;
        const T* dys = reader.plane(o, c);
        T* dxs = dx + base;
        for (int64_t i = 0; i < inner; ++i) {
          const A dz = dz_at(xs, dys, i, a);
          dxs[i] = static_cast<T>(k * (dz - mean_dz - (load(xs, i) - mean) * coef));
        }
      }
    }
  }
}

// (outer, C) rows: chunked column sums, then dx row by row.
template <typename T, bool kRelu>
void backward_rows(const BatchNormArgs& args, const T* x, const T* dy, const compute_t<T>* weight,
                   const compute_t<T>* bias, const compute_t<T>* save_mean, const compute_t<T>* save_invstd, T* dx,
                   compute_t<T>* dweight, compute_t<T>* dbias) {
  using A = compute_t<T>;
  const int64_t outer = args.shape.outer, C = args.shape.channels;
  const int64_t M = args.shape.reduced();
  const int64_t numel = M * C;
  std::vector<ChannelAffine<T>> affines(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) affines[c] = channel_affine<T>(c, save_mean, save_invstd, weight, bias);
  const int64_t chunks = std::max<int64_t>(1, std::min(outer, kRowChunks));
  const int64_t per_chunk = (outer + chunks - 1) / chunks;
  std::vector<double> partial(static_cast<size_t>(2 * chunks * C));
  // Per-channel arrays, so that the loops over a row's channels vectorize.
  const AffineArrays<T> arrays(affines);
  const A* __restrict__ scale = arrays.scale.data();
  const A* __restrict__ shift = arrays.shift.data();
  // dz = dy masked by the recomputed ReLU (backward_planes' arithmetic on the per-channel arrays).
  const auto masked = [&](A xv, A g, int64_t c) -> A { return relu_gate<kRelu>(xv * scale[c] + shift[c], g); };
#pragma omp parallel for schedule(static) if (numel > (1 << 15))
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    double* __restrict__ acc_dz = partial.data() + 2 * chunk * C;
    double* __restrict__ acc_dz_xmu = acc_dz + C;
    std::fill(acc_dz, acc_dz + 2 * C, 0.0);
    std::vector<float> x_buffer, dy_buffer;
    const int64_t end = std::min(outer, (chunk + 1) * per_chunk);
    for (int64_t r = chunk * per_chunk; r < end; ++r) {
      const A* __restrict__ xs = cpu::compute_row(x + r * C, C, x_buffer);
      const A* __restrict__ dys = cpu::compute_row(dy + r * C, C, dy_buffer);
      for (int64_t c = 0; c < C; ++c) {
        const A dz = masked(xs[c], dys[c], c);
        acc_dz[c] += static_cast<double>(dz);
        acc_dz_xmu[c] += static_cast<double>(dz) * (static_cast<double>(xs[c]) - static_cast<double>(save_mean[c]));
      }
    }
  }
  std::vector<double> sum_dz(static_cast<size_t>(C), 0.0), sum_dz_xmu(static_cast<size_t>(C), 0.0);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    for (int64_t c = 0; c < C; ++c) {
      sum_dz[c] += partial[2 * chunk * C + c];
      sum_dz_xmu[c] += partial[2 * chunk * C + C + c];
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    if (dbias != nullptr) dbias[c] = static_cast<A>(sum_dz[c]);
    if (dweight != nullptr) dweight[c] = static_cast<A>(sum_dz_xmu[c] * static_cast<double>(save_invstd[c]));
  }
  if (dx != nullptr) {
    // backward_planes' per-channel dx factors, once per channel instead of per element.
    std::vector<A> ks(static_cast<size_t>(C)), mean_dzs(static_cast<size_t>(C)), coefs(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const A w = weight ? weight[c] : A(1);
      const A invstd = save_invstd[c];
      ks[c] = invstd * w;
      mean_dzs[c] = args.training ? static_cast<A>(sum_dz[c] / static_cast<double>(M)) : A(0);
      coefs[c] = args.training ? static_cast<A>(sum_dz_xmu[c] / static_cast<double>(M)) * invstd * invstd : A(0);
    }
    const A* __restrict__ k = ks.data();
    const A* __restrict__ mean_dz = mean_dzs.data();
    const A* __restrict__ coef = coefs.data();
    const A* __restrict__ mean = save_mean;
#pragma omp parallel if (numel > (1 << 15))
    {
      std::vector<float> x_buffer, dy_buffer, dx_buffer;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < outer; ++r) {
        const A* __restrict__ xs = cpu::compute_row(x + r * C, C, x_buffer);
        const A* __restrict__ dys = cpu::compute_row(dy + r * C, C, dy_buffer);
        A* __restrict__ out = cpu::result_row(dx + r * C, C, dx_buffer);
        for (int64_t c = 0; c < C; ++c) {
          const A dz = masked(xs[c], dys[c], c);
          out[c] = k[c] * (dz - mean_dz[c] - (xs[c] - mean[c]) * coef[c]);
        }
        cpu::store_result_row(out, dx + r * C, C);
      }
    }
  }
}

// kRelu as a template argument from args.relu.
template <typename F>
void with_relu(bool relu, F&& f) {
  if (relu) {
    f.template operator()<true>();
  } else {
    f.template operator()<false>();
  }
}

void check_pooled(const BatchNormArgs& args, int64_t height, int64_t width, const char* op) {
  KILN_CHECK(args.relu && height >= 2 && width >= 2 && args.shape.inner == height * width, op,
             ": expected relu on and an NCHW input of at least 2 x 2 (inner ", args.shape.inner, ", height ", height,
             ", width ", width, ")");
}

}  // namespace

void batch_norm_forward_cpu(const BatchNormArgs& args, const void* x, const void* weight, const void* bias,
                            void* running_mean, void* running_var, void* y, void* save_mean, void* save_invstd) {
  dispatch_floating(args.dtype, "batch_norm (cpu kernel)", [&]<typename T>() {
    using A = compute_t<T>;
    const auto* x_t = static_cast<const T*>(x);
    const auto *w = static_cast<const A*>(weight), *b = static_cast<const A*>(bias);
    auto *rm = static_cast<A*>(running_mean), *rv = static_cast<A*>(running_var);
    auto *mean = static_cast<A*>(save_mean), *invstd = static_cast<A*>(save_invstd);
    if (args.shape.inner > 1) {
      forward_planes(args, x_t, w, b, rm, rv, mean, invstd,
                     DensePlanes<T>{static_cast<T*>(y), args.shape.channels, args.shape.inner});
    } else {
      forward_rows(args, x_t, w, b, rm, rv, static_cast<T*>(y), mean, invstd);
    }
  });
}

void batch_norm_backward_cpu(const BatchNormArgs& args, const void* x, const void* dy, const void* weight,
                             const void* bias, const void* save_mean, const void* save_invstd, void* dx,
                             void* dweight, void* dbias) {
  dispatch_floating(args.dtype, "batch_norm backward (cpu kernel)", [&]<typename T>() {
    using A = compute_t<T>;
    const auto *x_t = static_cast<const T*>(x), *dy_t = static_cast<const T*>(dy);
    const auto *w = static_cast<const A*>(weight), *b = static_cast<const A*>(bias);
    const auto *mean = static_cast<const A*>(save_mean), *invstd = static_cast<const A*>(save_invstd);
    auto *dw = static_cast<A*>(dweight), *db = static_cast<A*>(dbias);
    with_relu(args.relu, [&]<bool kRelu>() {
      if (args.shape.inner > 1) {
        backward_planes<T, kRelu>(args, x_t, DenseGradient<T>{dy_t, args.shape.channels, args.shape.inner}, w, b,
                                  mean, invstd, static_cast<T*>(dx), dw, db);
      } else {
        backward_rows<T, kRelu>(args, x_t, dy_t, w, b, mean, invstd, static_cast<T*>(dx), dw, db);
      }
    });
  });
}

void batch_norm_relu_max_pool2d_forward_cpu(const BatchNormArgs& args, int64_t height, int64_t width, const void* x,
                                            const void* weight, const void* bias, void* running_mean,
                                            void* running_var, void* y, int32_t* indices, void* save_mean,
                                            void* save_invstd) {
  const char* op = "batch_norm_relu_max_pool2d (cpu kernel)";
  check_pooled(args, height, width, op);
  dispatch_floating(args.dtype, op, [&]<typename T>() {
    using A = compute_t<T>;
    const PooledPlanes<T> out{static_cast<T*>(y), indices, args.shape.channels, args.shape.inner, width,
                              height / 2,         width / 2};
    forward_planes(args, static_cast<const T*>(x), static_cast<const A*>(weight), static_cast<const A*>(bias),
                   static_cast<A*>(running_mean), static_cast<A*>(running_var), static_cast<A*>(save_mean),
                   static_cast<A*>(save_invstd), out);
  });
}

void batch_norm_relu_max_pool2d_backward_cpu(const BatchNormArgs& args, int64_t height, int64_t width,
                                             const void* x, const void* dy, const int32_t* indices,
                                             const void* weight, const void* bias, const void* save_mean,
                                             const void* save_invstd, void* dx, void* dweight, void* dbias) {
  const char* op = "batch_norm_relu_max_pool2d backward (cpu kernel)";
  check_pooled(args, height, width, op);
  dispatch_floating(args.dtype, op, [&]<typename T>() {
    using A = compute_t<T>;
    const PooledGradient<T> gradient{static_cast<const T*>(dy), indices, args.shape.channels, args.shape.inner,
                                     (height / 2) * (width / 2)};
    backward_planes<T, true>(args, static_cast<const T*>(x), gradient, static_cast<const A*>(weight),
                             static_cast<const A*>(bias), static_cast<const A*>(save_mean),
                             static_cast<const A*>(save_invstd), static_cast<T*>(dx), static_cast<A*>(dweight),
                             static_cast<A*>(dbias));
  });
}

}  // namespace kiln::kernels
