// batch_norm.cu (bn_stats_rows/planes, bn_finalize_stats, bn_eval_stats,
// bn_apply_rows/planes, bn_grad_sums_rows/planes, bn_finalize_grads,
// bn_grad_input_rows/planes; plain and with the fused ReLU; the fused 2x2 max
// pool's bn_relu_pool_planes/rows, see run_pooled) through
// batch_norm_forward_cuda/backward_cuda, emulated, against a float64
// reference and against kernels/cpu/batch_norm.cpp's batch_norm_forward_cpu/
// backward_cpu (linked by run_kernels.sh) on the same inputs: y, saved
// mean/invstd, the running mean/var update (momentum, unbiased variance; read
// only and unchanged in eval mode), dx, dweight, dbias. The backward of all
// three takes the emulated forward's saved statistics, and the reference's
// ReLU mask is the kernels' own float expression x * scale + shift > 0.
// Every output and the workspace start as 0xff bytes (NaN); buffers sit
// between guard pages.
// Cases: float32/64, float16, bfloat16; training (with and without running
// stats) and eval; affine off, weight only, weight and bias; ReLU on and off;
// dx only, dweight/dbias only, all three. Shapes as the front end passes them
// (outer, C, inner): NCHW planes (inner 35, 9, 2, 12, 256, 300, 4096, 40000:
// fewer and more elements than a block's 256 threads, threads' strides that
// wrap into the next plane, several splits, a split boundary inside one
// plane), rows (inner 1: channels-last NHWC, BatchNorm1d (N, C), NCHW with 1x1
// spatial) with C = 1, 3, 130 (a partial 32-pack block) and 33000 rows (33
// splits); C = 1 and N = 1. batch_norm.cu's packs (the largest power of two
// up to 16 bytes dividing C or the plane): rows of 64 channels (8 to 32 packs
// per row by dtype), 520 (several channel blocks, the last partial), 16
// channels over 20000 rows (splits, unrolled loads with a remainder), 12 and
// 130 channels (packs of 4 and 2), planes of 2, 12 and 256; some with x, y, dy
// and dx one element past a 16-byte boundary (the packs' scalar loads).
// Tolerances (the same against float64 and against the CPU kernels, which sum
// in another order): y and dx 2 u_T |want| + 128 u_A of max |want|, dx's
// absolute part scaled by its largest term (with two values per channel dx is
// 0 up to eps: all cancellation); mean and running mean 128 u_A of max |x|;
// invstd and running var 128 u_A relative; dweight/dbias 64 u_A of the sum of
// the terms' magnitudes; eval mode's running stats unchanged bit for bit.
//   test_batch_norm [case-substring]   (only the cases whose name contains it)
#include "emu_test.h"
#include "emu_batch_norm.inc"

#include <chrono>
#include <cstring>

#include "kernels/pool.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

enum class Affine { none, weight, both };
enum class Grads { all, dx_only, params_only };

struct Shape {
  const char* name;
  int64_t outer, channels, inner;
  bool misaligned = false;  // x, y, dy and dx one element past a 16-byte boundary
};

struct Mode {
  bool training, running, relu;
  Affine affine;
  Grads grads;
};

int cpu_failures = 0;  // of the comparisons against the CPU kernels (also in emu_test::failures)

template <typename T>
void run(const Shape& shape, const Mode& mode) {
  using A = typename Acc<T>::type;
  const auto start = std::chrono::steady_clock::now();
  const int64_t N = shape.outer, C = shape.channels, I = shape.inner, M = N * I, n = M * C;
  const bool has_weight = mode.affine != Affine::none, has_bias = mode.affine == Affine::both;
  const bool want_dx = mode.grads != Grads::params_only;
  const bool want_dw = has_weight && mode.grads != Grads::dx_only, want_db = has_bias && mode.grads != Grads::dx_only;
  std::mt19937_64 engine(static_cast<uint64_t>(N * 7919 + C * 131 + I * 31 + mode.training * 2 + mode.relu));
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;

  BatchNormArgs args;
  args.shape = {N, C, I};
  args.dtype = emu_dtype<T>();
  args.training = mode.training;
  args.relu = mode.relu;
  args.momentum = 0.125;
  args.eps = 1e-5;
  const bool running = mode.running || !mode.training;

  const size_t misalign = shape.misaligned ? sizeof(T) : 0;
  emu::Buffer<T> x(n, "x", misalign, 0), dy(n, "dy", misalign, 0);
  emu::Buffer<A> weight(has_weight ? C : 0, "weight", 0, 0), bias(has_bias ? C : 0, "bias", 0, 0);
  emu::Buffer<A> rmean(running ? C : 0, "running_mean", 0, 0), rvar(running ? C : 0, "running_var", 0, 0);
  std::vector<double> xv(n), dyv(n), wv(C, 1.0), bv(C, 0.0), rm0(C), rv0(C);
  std::vector<double> centre(C), spread(C);
  for (int64_t c = 0; c < C; ++c) {
    centre[c] = -2.0 + 5.0 * uniform(engine);
    spread[c] = 0.3 + 2.7 * uniform(engine);
  }
  const auto at = [&](int64_t o, int64_t c, int64_t i) { return (o * C + c) * I + i; };
  for (int64_t o = 0; o < N; ++o) {
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t i = 0; i < I; ++i) {
        const int64_t k = at(o, c, i);
        x[k] = from_double<T>(centre[c] + spread[c] * normal(engine));
        xv[k] = to_double(x[k]);
        dy[k] = from_double<T>(0.2 + normal(engine));
        dyv[k] = to_double(dy[k]);
      }
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    if (has_weight) wv[c] = static_cast<double>(weight[c] = static_cast<A>(1.0 + 0.5 * normal(engine)));
    if (has_bias) bv[c] = static_cast<double>(bias[c] = static_cast<A>(normal(engine)));
    rm0[c] = static_cast<double>(static_cast<A>(0.5 * normal(engine)));
    rv0[c] = static_cast<double>(static_cast<A>(0.5 + 1.5 * uniform(engine)));
    if (running) {
      rmean[c] = static_cast<A>(rm0[c]);
      rvar[c] = static_cast<A>(rv0[c]);
    }
  }
  const void* w = has_weight ? weight.data : nullptr;
  const void* b = has_bias ? bias.data : nullptr;

  // Emulated CUDA, every output NaN.
  emu::Buffer<T> y(n, "y", misalign), dx(want_dx ? n : 0, "dx", misalign);
  emu::Buffer<A> mean(C, "save_mean"), invstd(C, "save_invstd");
  emu::Buffer<A> dweight(want_dw ? C : 0, "dweight"), dbias(want_db ? C : 0, "dbias");
  emu::Buffer<unsigned char> workspace(batch_norm_workspace_bytes(args), "workspace");
  batch_norm_forward_cuda(args, x.data, w, b, running ? rmean.data : nullptr, running ? rvar.data : nullptr, y.data,
                          mean.data, invstd.data, workspace.data, nullptr);
  std::memset(workspace.data, 0xff, workspace.n);  // the backward must not read the forward's partials
  batch_norm_backward_cuda(args, x.data, dy.data, w, b, mean.data, invstd.data, want_dx ? dx.data : nullptr,
                           want_dw ? dweight.data : nullptr, want_db ? dbias.data : nullptr, workspace.data, nullptr);

  // The CPU kernels on the same inputs (the backward with the emulated forward's statistics).
  const A nan_a = std::numeric_limits<A>::quiet_NaN();
  std::vector<T> cpu_y(n), cpu_dx(n);
  std::memset(cpu_y.data(), 0xff, sizeof(T) * n);
  std::memset(cpu_dx.data(), 0xff, sizeof(T) * n);
  std::vector<A> cpu_mean(C, nan_a), cpu_invstd(C, nan_a), cpu_dw(C, nan_a), cpu_db(C, nan_a), cpu_rm(C), cpu_rv(C);
  for (int64_t c = 0; c < C; ++c) {
    cpu_rm[c] = static_cast<A>(rm0[c]);
    cpu_rv[c] = static_cast<A>(rv0[c]);
  }
  batch_norm_forward_cpu(args, x.data, w, b, running ? cpu_rm.data() : nullptr, running ? cpu_rv.data() : nullptr,
                         cpu_y.data(), cpu_mean.data(), cpu_invstd.data());
  batch_norm_backward_cpu(args, x.data, dy.data, w, b, mean.data, invstd.data, want_dx ? cpu_dx.data() : nullptr,
                          want_dw ? cpu_dw.data() : nullptr, want_db ? cpu_db.data() : nullptr);

  // float64 reference.
  std::vector<double> ref_mean(C), ref_invstd(C), ref_rm(C), ref_rv(C), ref_y(n);
  std::vector<double> ref_dx(n), ref_dw(C), ref_db(C), sum_abs_dw(C), sum_abs_db(C);
  double dx_terms = 0;  // the largest magnitude of dx's terms (they cancel: with M = 2, dx is 0 up to eps)
  for (int64_t c = 0; c < C; ++c) {
    double m = rm0[c], var = rv0[c];
    ref_rm[c] = rm0[c];
    ref_rv[c] = rv0[c];
    if (mode.training) {
      double sum = 0, squares = 0;
      for (int64_t o = 0; o < N; ++o) {
        for (int64_t i = 0; i < I; ++i) sum += xv[at(o, c, i)];
      }
      m = sum / static_cast<double>(M);
      for (int64_t o = 0; o < N; ++o) {
        for (int64_t i = 0; i < I; ++i) squares += (xv[at(o, c, i)] - m) * (xv[at(o, c, i)] - m);
      }
      var = squares / static_cast<double>(M);
      if (running) {
        ref_rm[c] = (1 - args.momentum) * rm0[c] + args.momentum * m;
        ref_rv[c] = (1 - args.momentum) * rv0[c] + args.momentum * squares / static_cast<double>(M - 1);
      }
    }
    ref_mean[c] = m;
    ref_invstd[c] = 1.0 / std::sqrt(var + args.eps);
    for (int64_t o = 0; o < N; ++o) {
      for (int64_t i = 0; i < I; ++i) {
        const int64_t k = at(o, c, i);
        const double v = (xv[k] - m) * ref_invstd[c] * wv[c] + bv[c];
        ref_y[k] = mode.relu ? std::max(v, 0.0) : v;
      }
    }
    // Backward from the emulated forward's saved statistics; the ReLU mask as the kernels compute it.
    const A s_a = invstd[c], m_a = mean[c];
    const A scale = s_a * (has_weight ? weight[c] : A(1));
    const A shift = (has_bias ? bias[c] : A(0)) - m_a * scale;
    const double s = static_cast<double>(s_a), mu = static_cast<double>(m_a);
    double sum_dz = 0, sum_dz_xmu = 0, abs_dz = 0, abs_dz_xmu = 0;
    std::vector<double> dz(static_cast<size_t>(M));
    for (int64_t o = 0; o < N; ++o) {
      for (int64_t i = 0; i < I; ++i) {
        const int64_t k = at(o, c, i);
        const A z = static_cast<A>(static_cast<A>(to_acc(x[k]) * scale) + shift);
        const double g = !mode.relu || z > A(0) ? dyv[k] : 0.0;
        dz[o * I + i] = g;
        sum_dz += g;
        sum_dz_xmu += g * (xv[k] - mu);
        abs_dz += std::abs(g);
        abs_dz_xmu += std::abs(g * (xv[k] - mu));
      }
    }
    ref_db[c] = sum_dz;
    ref_dw[c] = sum_dz_xmu * s;
    sum_abs_db[c] = abs_dz;
    sum_abs_dw[c] = abs_dz_xmu * s;
    for (int64_t o = 0; o < N; ++o) {
      for (int64_t i = 0; i < I; ++i) {
        const int64_t k = at(o, c, i);
        const double g = dz[o * I + i];
        ref_dx[k] = mode.training ? s * wv[c] * (g - sum_dz / M - (xv[k] - mu) * s * s * sum_dz_xmu / M)
                                  : s * wv[c] * g;
        const double terms = std::abs(g) + std::abs(sum_dz / M) + std::abs((xv[k] - mu) * s * s * sum_dz_xmu / M);
        dx_terms = std::max(dx_terms, std::abs(s * wv[c]) * (mode.training ? terms : std::abs(g)));
      }
    }
  }

  const auto widen = [](const auto* values, size_t count) {
    std::vector<double> out(count);
    for (size_t i = 0; i < count; ++i) out[i] = to_double(values[i]);
    return out;
  };
  const char* affine = mode.affine == Affine::none ? "none" : mode.affine == Affine::weight ? "w" : "w+b";
  const char* grads = mode.grads == Grads::all ? "dx,dw,db" : mode.grads == Grads::dx_only ? "dx" : "dw,db";
  char label[200];
  std::snprintf(label, sizeof label, "%-4s %-16s (%ld, %ld, %ld) %s%s affine %-4s %s%s%s", name_of<T>(), shape.name,
                N, C, I, mode.training ? "train" : "eval", mode.training && running ? "+running" : "", affine, grads,
                mode.relu ? " relu" : "", kiln::kernels::force_64bit_index() ? " 64-bit index" : "");
  const double uT = roundoff<T>(), uA = roundoff<A>(), rtol = 2 * uT, atol = 128 * uA;
  // The sums' tolerance: 64 u_A of the sum of the terms' magnitudes (they cancel), relative to max |want|.
  const auto sum_atol = [&](const std::vector<double>& want, const std::vector<double>& magnitude) {
    double scale = 0, largest = 0;
    for (int64_t c = 0; c < C; ++c) {
      scale = std::max(scale, std::abs(want[c]));
      largest = std::max(largest, magnitude[c]);
    }
    return 64 * uA * largest / (scale > 0 ? scale : 1) + atol;
  };
  const double atol_dw = sum_atol(ref_dw, sum_abs_dw), atol_db = sum_atol(ref_db, sum_abs_db);
  // An absolute tolerance as a fraction of max |want| (compare's atol unit).
  const auto relative = [](const std::vector<double>& want, double absolute) {
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    return absolute / (scale > 0 ? scale : 1);
  };
  // The means' errors scale with |x| (a mean near 0 of large values), dx's with its terms.
  double x_max = 0;
  for (double v : xv) x_max = std::max(x_max, std::abs(v));
  const double atol_mean = atol + relative(ref_mean, atol * x_max);
  const double atol_rm = atol + relative(ref_rm, atol * x_max * args.momentum);
  const double atol_dx = atol + relative(ref_dx, atol * dx_terms);
  const int before = failures;
  const auto both = [&](const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                        const std::vector<double>& cpu, double r, double a) {
    const double e = compare(label, (std::string(what) + " vs float64").c_str(), got, ref, r, a);
    const int failed = failures;
    compare(label, (std::string(what) + " vs cpu").c_str(), got, cpu, r, a);
    cpu_failures += failures - failed;
    return e;
  };
  const double e_y = both("y", widen(y.data, n), ref_y, widen(cpu_y.data(), n), rtol, atol);
  const double e_mean = both("save_mean", widen(mean.data, C), ref_mean, widen(cpu_mean.data(), C), 0, atol_mean);
  const double e_invstd = both("save_invstd", widen(invstd.data, C), ref_invstd, widen(cpu_invstd.data(), C), atol, atol);
  double e_run = NAN;
  if (running) {
    // Eval mode reads the running stats and leaves them as they were (exactly).
    const double r = mode.training ? atol : 0, a = mode.training ? atol : 0;
    e_run = both("running_mean", widen(rmean.data, C), ref_rm, widen(cpu_rm.data(), C), r, mode.training ? atol_rm : 0);
    e_run = std::max(e_run, both("running_var", widen(rvar.data, C), ref_rv, widen(cpu_rv.data(), C), r, a));
  }
  const double e_dx = want_dx ? both("dx", widen(dx.data, n), ref_dx, widen(cpu_dx.data(), n), rtol, atol_dx) : NAN;
  const double e_dw = want_dw ? both("dweight", widen(dweight.data, C), ref_dw, widen(cpu_dw.data(), C), 0, atol_dw) : NAN;
  const double e_db = want_db ? both("dbias", widen(dbias.data, C), ref_db, widen(cpu_db.data(), C), 0, atol_db) : NAN;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto text = [](double e) {
    char buffer[16];
    std::snprintf(buffer, sizeof buffer, std::isnan(e) ? "-" : "%.1e", e);
    return std::string(buffer);
  };
  std::printf("%s %s  max err/scale vs float64: y %s mean %s invstd %s running %s dx %s dw %s db %s (%.2f s)\n",
              failures == before ? "done" : "FAILED", label, text(e_y).c_str(), text(e_mean).c_str(),
              text(e_invstd).c_str(), text(e_run).c_str(), text(e_dx).c_str(), text(e_dw).c_str(), text(e_db).c_str(),
              seconds);
  std::fflush(stdout);
}

// ---------------------------------------------------------------- fused 2x2 max pool
// batch_norm_relu_max_pool2d_forward_cuda (bn_relu_pool_planes/rows), emulated,
// against batch_norm_forward_cuda with the ReLU, emulated, whose full-size y
// then goes through kernels/cpu/pool.cpp's max_pool2d_forward_cpu: y, the
// indices, mean/invstd and the running stats the same bits. The backward
// (the grad kernels reading the pooled dy through PooledRows/PlanesGradient)
// against pool.cpp's max_pool2d_backward_cpu then batch_norm_backward_cuda:
// dx, dweight, dbias the same bits. Inputs repeat values (ties inside
// windows) and, in eval mode, hold a NaN; dy holds -0.0s (0 + dy is +0.0).
struct PooledShape {
  const char* name;
  int64_t N, C, H, W;
  bool channels_last, misaligned;
};

template <typename T>
bool same_bytes(const std::string& label, const char* what, const void* got, const void* want, size_t count,
                size_t element) {
  ++checks;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * element, static_cast<const char*>(want) + i * element,
                    element) != 0) {
      ++failures;
      ++cpu_failures;
      std::printf("FAIL %s %s: element %zu differs (of %zu)\n", label.c_str(), what, i, count);
      if (std::getenv("EMU_STOP")) std::exit(1);
      return false;
    }
  }
  return true;
}

template <typename T>
void run_pooled(const PooledShape& shape, bool training) {
  using A = typename Acc<T>::type;
  const int64_t N = shape.N, C = shape.C, H = shape.H, W = shape.W, OH = H / 2, OW = W / 2;
  const int64_t n = N * C * H * W, pooled = N * C * OH * OW;
  const std::string label = std::string(shape.name) + (training ? " training " : " eval ") + name_of<T>();
  std::mt19937_64 engine(static_cast<uint64_t>(n * 31 + training));
  std::normal_distribution<double> normal;
  BatchNormArgs args;
  args.shape = shape.channels_last ? BatchNormShape{N * H * W, C, 1} : BatchNormShape{N, C, H * W};
  args.dtype = emu_dtype<T>();
  args.training = training;
  args.relu = true;
  args.momentum = 0.125;
  args.eps = 1e-5;
  const size_t misalign = shape.misaligned ? sizeof(T) : 0;
  emu::Buffer<T> x(n, "x", misalign, 0);
  for (int64_t i = 0; i < n; ++i) x[i] = from_double<T>(0.3 + normal(engine));
  for (int64_t i = 3; i < n; i += 7) x[i] = x[i - 1];  // ties: equal neighbours in a row or across channels
  if (!training) x[n / 2] = from_double<T>(std::numeric_limits<double>::quiet_NaN());
  emu::Buffer<A> weight(C, "weight", 0, 0), bias(C, "bias", 0, 0);
  std::vector<A> rm0(C), rv0(C);
  for (int64_t c = 0; c < C; ++c) {
    weight[c] = static_cast<A>(1.0 + 0.5 * normal(engine));
    bias[c] = static_cast<A>(0.5 * normal(engine));
    rm0[c] = static_cast<A>(0.2 * normal(engine));
    rv0[c] = static_cast<A>(1.0 + 0.25 * std::abs(normal(engine)));
  }
  // Fused.
  emu::Buffer<T> y(pooled, "y", misalign);
  emu::Buffer<int32_t> indices(pooled, "indices", shape.misaligned ? sizeof(int32_t) : 0);
  emu::Buffer<A> mean(C, "save_mean"), invstd(C, "save_invstd");
  emu::Buffer<A> rm(C, "running_mean", 0, 0), rv(C, "running_var", 0, 0);
  std::copy(rm0.begin(), rm0.end(), rm.data);
  std::copy(rv0.begin(), rv0.end(), rv.data);
  emu::Buffer<unsigned char> workspace(batch_norm_workspace_bytes(args), "workspace");
  batch_norm_relu_max_pool2d_forward_cuda(args, H, W, x.data, weight.data, bias.data, rm.data, rv.data, y.data,
                                          indices.data, mean.data, invstd.data, workspace.data, nullptr);
  // batch norm with the ReLU, then the CPU's max pool.
  emu::Buffer<T> full(n, "full y", misalign);
  emu::Buffer<A> mean2(C, "save_mean"), invstd2(C, "save_invstd"), rm2(C, "running_mean", 0, 0),
      rv2(C, "running_var", 0, 0);
  std::copy(rm0.begin(), rm0.end(), rm2.data);
  std::copy(rv0.begin(), rv0.end(), rv2.data);
  std::memset(workspace.data, 0xff, workspace.n);
  batch_norm_forward_cuda(args, x.data, weight.data, bias.data, rm2.data, rv2.data, full.data, mean2.data,
                          invstd2.data, workspace.data, nullptr);
  Pool2dParams p;
  p.planes = N * C;
  p.in_h = H;
  p.in_w = W;
  p.out_h = OH;
  p.out_w = OW;
  p.kernel_h = p.kernel_w = p.stride_h = p.stride_w = 2;
  p.channels_last = shape.channels_last;
  p.channels = C;
  std::vector<T> y2(pooled);
  std::vector<int32_t> indices2(pooled);
  max_pool2d_forward_cpu(args.dtype, p, full.data, y2.data(), indices2.data());
  same_bytes<T>(label, "y", y.data, y2.data(), pooled, sizeof(T));
  same_bytes<T>(label, "indices", indices.data, indices2.data(), pooled, sizeof(int32_t));
  same_bytes<T>(label, "save_mean", mean.data, mean2.data, C, sizeof(A));
  same_bytes<T>(label, "save_invstd", invstd.data, invstd2.data, C, sizeof(A));
  same_bytes<T>(label, "running_mean", rm.data, rm2.data, C, sizeof(A));
  same_bytes<T>(label, "running_var", rv.data, rv2.data, C, sizeof(A));
  // The backward: fused, and max_pool2d's CPU backward (the full-size gradient) then batch norm's.
  emu::Buffer<T> dy(pooled, "dy", misalign, 0);
  for (int64_t i = 0; i < pooled; ++i) dy[i] = from_double<T>(i % 11 == 5 ? -0.0 : normal(engine));
  emu::Buffer<T> dx(n, "dx", misalign), dx2(n, "dx", misalign);
  emu::Buffer<A> dw(C, "dweight"), db(C, "dbias"), dw2(C, "dweight"), db2(C, "dbias");
  std::memset(workspace.data, 0xff, workspace.n);
  batch_norm_relu_max_pool2d_backward_cuda(args, H, W, x.data, dy.data, indices.data, weight.data, bias.data,
                                           mean.data, invstd.data, dx.data, dw.data, db.data, workspace.data,
                                           nullptr);
  emu::Buffer<T> dz(n, "full dz", misalign);
  max_pool2d_backward_cpu(args.dtype, p, dy.data, indices2.data(), dz.data);
  std::memset(workspace.data, 0xff, workspace.n);
  batch_norm_backward_cuda(args, x.data, dz.data, weight.data, bias.data, mean2.data, invstd2.data, dx2.data, dw2.data,
                           db2.data, workspace.data, nullptr);
  same_bytes<T>(label, "dx", dx.data, dx2.data, n, sizeof(T));
  same_bytes<T>(label, "dweight", dw.data, dw2.data, C, sizeof(A));
  same_bytes<T>(label, "dbias", db.data, db2.data, C, sizeof(A));
  // Not vacuous: the pooled values are neither all equal nor all zero.
  ++checks;
  int64_t positive = 0;
  for (int64_t i = 0; i < pooled; ++i) positive += to_double(y[i]) > 0;
  if (positive < pooled / 4) {
    ++failures;
    std::printf("FAIL %s: only %ld of %ld pooled values are positive\n", label.c_str(), static_cast<long>(positive),
                static_cast<long>(pooled));
  }
}

}  // namespace

int main(int argc, char** argv) {
  emu::install_fault_handler();
  const char* only = argc > 1 ? argv[1] : nullptr;
  // (outer, C, inner) as core/ops/normalization.cpp passes them.
  const std::vector<Shape> shapes = {
      {"nchw-5x7", 20, 3, 35},         // inner < 256, M = 700: a thread's steps wrap planes (7 planes + 11)
      {"nchw-c130-3x3", 4, 130, 9},    // many channels, tiny planes
      {"nchw-inner2", 200, 4, 2},      // step of 128 planes, no remainder
      {"nchw-inner256", 3, 5, 256},    // a block's threads exactly one plane
      {"nchw-c1-300", 3, 1, 300},      // C = 1, inner > 256: a thread's second step wraps into the next plane
      {"rows-nhwc-c130", 32, 130, 1},  // NHWC 2x4x4: 65 packs of 2 channels, 3 blocks of 32, the last with 1
      {"rows-bn1d-c3", 7, 3, 1},       // BatchNorm1d (7, 3)
      {"rows-1x1-c1", 2, 1, 1},        // NCHW (2, 1, 1, 1): two values per channel
      {"nchw-splits2", 5, 3, 4096},    // M = 20480: 2 splits of 10240 (2.5 planes each)
      {"nchw-splits3-1plane", 1, 2, 40000},  // N = 1, M = 40000: 3 splits inside one plane
      {"rows-nhwc-splits33", 33000, 3, 1},   // M = 33000 rows: 33 splits of 1000 (1024 rows per split)
      {"rows-packs-c64", 37, 64, 1},         // 8 (16-bit) to 32 (double) packs per row, one channel block
      {"rows-packs-c520", 13, 520, 1},       // 65 to 260 packs: 3 to 9 channel blocks of 32, the last partial
      {"rows-packs-splits", 20000, 16, 1},   // 2 to 8 packs per row, several splits, unroll remainders
      {"rows-packs-misaligned", 1001, 16, 1, true},  // the same packs loaded element by element
      {"nchw-packs-misaligned", 3, 5, 256, true},     // planes of 32 packs, loaded element by element
      {"nchw-inner12", 9, 3, 12},            // packs of 4 (16-bit, float) and 2 (double): 12 is no multiple of 8
      {"rows-c12-misaligned", 50, 12, 1, true},       // 3 to 6 packs of 4 or 2 channels per row
  };
  const std::vector<Mode> modes = {
      {true, true, false, Affine::both, Grads::all},
      {true, false, true, Affine::none, Grads::all},
      {true, true, true, Affine::weight, Grads::params_only},
      {false, true, false, Affine::both, Grads::dx_only},
      {false, true, true, Affine::both, Grads::all},
  };
  int cases = 0;
  for (const Shape& shape : shapes) {
    if (only != nullptr && std::strstr(shape.name, only) == nullptr) continue;
    const bool large = shape.outer * shape.channels * shape.inner > 20000;
    for (size_t k = 0; k < modes.size(); ++k) {
      // The large shapes (several splits): training with all grads, and with the ReLU; eval once.
      if (large && k == 2) continue;
      if (large && k == 3) continue;
      // The elementwise passes split their index by FastDivmod or, forced (and
      // above 2^31 elements), by 64-bit division: both on the small shapes.
      const auto all_types = [&] {
        run<float>(shape, modes[k]);
        run<double>(shape, modes[k]);
        run<__half>(shape, modes[k]);
        run<__nv_bfloat16>(shape, modes[k]);
        cases += 4;
      };
      if (large) {
        all_types();
      } else {
        for_each_index_path(all_types);
      }
    }
  }
  // BatchNorm1d with one sample per channel: eval only (training needs more than one value).
  if (only == nullptr || std::strstr("rows-n1-eval", only) != nullptr) {
    const Shape single{"rows-n1-eval", 1, 3, 1};
    for (const Mode& mode : {Mode{false, true, false, Affine::both, Grads::all}, Mode{false, true, true, Affine::weight, Grads::all}}) {
      run<float>(single, mode);
      run<double>(single, mode);
      run<__half>(single, mode);
      run<__nv_bfloat16>(single, mode);
      cases += 4;
    }
  }
  const std::vector<PooledShape> pooled_shapes = {
      {"pool-nchw-6x8", 2, 3, 6, 8, false, false},
      {"pool-nchw-7x9", 3, 5, 7, 9, false, false},        // odd: the last row and column in no window
      {"pool-nchw-14x14", 2, 4, 14, 14, false, false},
      {"pool-nchw-misaligned", 2, 3, 6, 6, false, true},
      {"pool-nhwc-c16", 2, 16, 6, 8, true, false},        // packs of 16 bytes (2 to 8 channels)
      {"pool-nhwc-c12", 2, 12, 5, 6, true, false},        // 16-bit: 12 is no multiple of 8, one channel a thread
      {"pool-nhwc-c3", 3, 3, 7, 7, true, false},
      {"pool-nhwc-c16-misaligned", 2, 16, 4, 6, true, true},  // the packs loaded element by element
  };
  for (const PooledShape& shape : pooled_shapes) {
    if (only != nullptr && std::strstr(shape.name, only) == nullptr) continue;
    for (bool training : {true, false}) {
      for_each_index_path([&] {
        run_pooled<float>(shape, training);
        run_pooled<double>(shape, training);
        run_pooled<__half>(shape, training);
        run_pooled<__nv_bfloat16>(shape, training);
        cases += 4;
      });
    }
  }
  std::printf("%d of %d checks failed (%d of them against the CPU kernels); %d cases, %ld launches, %ld CTAs emulated\n",
              failures, checks, cpu_failures, cases, emu::launches.load(), emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
