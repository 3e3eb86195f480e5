// norm.cu's layer norm (ln_forward, ln_grad_input, ln_grad_params_partial,
// ln_grad_params_finalize) through layer_norm_forward_cuda/backward_cuda,
// emulated, against a float64 reference: y, saved mean and rstd, dx, dweight,
// dbias; every output starts as NaN. Cases: float32/64, float16, bfloat16;
// affine off, weight only, weight and bias; widths that take the element path
// and the 16-byte vector path; one pointer at a time moved off 16 bytes;
// 130 rows for several dweight/dbias splits.
//   test_norm [cols]   (one width only)
#include "emu_test.h"
#include "emu_norm.inc"

#include <chrono>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

enum class Affine { none, weight, both };
// Which buffers start one element past a 16-byte boundary.
enum class Misalign { none, x_dy, y_dx, weight, dy };

struct Case {
  int64_t rows, cols;
  Affine affine;
  Misalign misalign;
};

template <typename T>
void run(const Case& c) {
  using A = typename Acc<T>::type;
  const auto start = std::chrono::steady_clock::now();
  const int64_t R = c.rows, C = c.cols, n = R * C;
  const bool has_weight = c.affine != Affine::none, has_bias = c.affine == Affine::both;
  const size_t off = sizeof(T);  // one element: aligned for T, not for 16-byte vectors
  const auto at = [&](Misalign m) { return c.misalign == m ? off : 0; };
  std::mt19937_64 engine(static_cast<uint64_t>(R * 7919 + C * 31 + static_cast<int>(c.affine)));
  std::normal_distribution<double> normal;

  emu::Buffer<T> x(n, "x", at(Misalign::x_dy), 0), dy(n, "dy", at(Misalign::x_dy) + at(Misalign::dy), 0);
  emu::Buffer<T> weight(has_weight ? C : 0, "weight", at(Misalign::weight), 0), bias(has_bias ? C : 0, "bias", 0, 0);
  std::vector<double> xv(n), dyv(n), wv(C, 1.0), bv(C, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = from_double<T>(2.0 * normal(engine) + 0.5);
    xv[i] = to_double(x[i]);
    dy[i] = from_double<T>(normal(engine));
    dyv[i] = to_double(dy[i]);
  }
  for (int64_t j = 0; j < C && has_weight; ++j) {
    weight[j] = from_double<T>(1.0 + 0.5 * normal(engine));
    wv[j] = to_double(weight[j]);
    if (has_bias) {
      bias[j] = from_double<T>(normal(engine));
      bv[j] = to_double(bias[j]);
    }
  }
  emu::Buffer<T> y(n, "y", at(Misalign::y_dx)), dx(n, "dx", at(Misalign::y_dx));
  emu::Buffer<A> mean(R, "save_mean"), rstd(R, "save_rstd");
  emu::Buffer<T> dweight(has_weight ? C : 0, "dweight"), dbias(has_bias ? C : 0, "dbias");

  LayerNormArgs args;
  args.rows = R;
  args.cols = C;
  args.dtype = emu_dtype<T>();
  args.eps = 1e-5;
  emu::Buffer<unsigned char> workspace(layer_norm_workspace_bytes(args), "workspace");
  layer_norm_forward_cuda(args, x.data, has_weight ? weight.data : nullptr, has_bias ? bias.data : nullptr, y.data,
                          mean.data, rstd.data, nullptr);
  layer_norm_backward_cuda(args, x.data, dy.data, has_weight ? weight.data : nullptr, mean.data, rstd.data, dx.data,
                           has_weight ? dweight.data : nullptr, has_bias ? dbias.data : nullptr, workspace.data,
                           nullptr);

  // float64 reference.
  std::vector<double> ref_y(n), ref_mean(R), ref_rstd(R), ref_dx(n), ref_dw(C, 0.0), ref_db(C, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    double sum = 0, squares = 0;
    for (int64_t j = 0; j < C; ++j) sum += xv[r * C + j];
    const double m = sum / C;
    for (int64_t j = 0; j < C; ++j) squares += (xv[r * C + j] - m) * (xv[r * C + j] - m);
    const double s = 1.0 / std::sqrt(squares / C + args.eps);
    ref_mean[r] = m;
    ref_rstd[r] = s;
    double mean_g = 0, mean_g_xhat = 0;
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = (xv[r * C + j] - m) * s, g = dyv[r * C + j] * wv[j];
      ref_y[r * C + j] = xhat * wv[j] + bv[j];
      mean_g += g / C;
      mean_g_xhat += g * xhat / C;
      ref_dw[j] += dyv[r * C + j] * xhat;
      ref_db[j] += dyv[r * C + j];
    }
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = (xv[r * C + j] - m) * s, g = dyv[r * C + j] * wv[j];
      ref_dx[r * C + j] = s * (g - mean_g - xhat * mean_g_xhat);
    }
  }
  const auto widen = [](const auto& buffer) {
    std::vector<double> out(buffer.n);
    for (size_t i = 0; i < buffer.n; ++i) out[i] = to_double(buffer[i]);
    return out;
  };
  const char* affine = c.affine == Affine::none ? "none" : c.affine == Affine::weight ? "w" : "w+b";
  const char* misalign = c.misalign == Misalign::none ? "aligned"
                         : c.misalign == Misalign::x_dy ? "x,dy+1"
                         : c.misalign == Misalign::y_dx ? "y,dx+1"
                         : c.misalign == Misalign::dy   ? "dy+1"
                                                        : "weight+1";
  // Forward and backward take the vector path when C fits whole vectors and their pointers are aligned.
  const bool whole = C % (16 / static_cast<int64_t>(sizeof(T))) == 0;
  const bool vectors = whole && c.misalign == Misalign::none;
  const bool vectors_forward = whole && (c.misalign == Misalign::none || c.misalign == Misalign::dy);
  char label[160];
  std::snprintf(label, sizeof label, "%-4s rows %3ld cols %4ld affine %-4s %-8s %-8s", name_of<T>(), R, C, affine,
                misalign, vectors ? "vectors" : vectors_forward ? "fwd vectors, bwd elements" : "elements");
  // The path norm.cu chose (row_vectors) must be the one this case means.
  const void* w = has_weight ? weight.data : nullptr;
  if (row_vectors<T>(C, {x.data, w, has_bias ? bias.data : nullptr, y.data}) != vectors_forward ||
      row_vectors<T>(C, {x.data, dy.data, w, dx.data}) != vectors) {
    ++failures;
    std::printf("FAIL %s: row_vectors differs from the case's path\n", label);
  }
  const double uT = roundoff<T>(), uA = roundoff<A>(), rtol = 2 * uT, atol = 128 * uA;
  double e_y = compare(label, "y", widen(y), ref_y, rtol, atol);
  double e_mean = compare(label, "save_mean", widen(mean), ref_mean, 0, atol);
  double e_rstd = compare(label, "save_rstd", widen(rstd), ref_rstd, atol, atol);
  double e_dx = compare(label, "dx", widen(dx), ref_dx, rtol, atol);
  double e_dw = has_weight ? compare(label, "dweight", widen(dweight), ref_dw, rtol, atol) : NAN;
  double e_db = has_bias ? compare(label, "dbias", widen(dbias), ref_db, rtol, atol) : NAN;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto text = [](double e) {
    char buffer[16];
    std::snprintf(buffer, sizeof buffer, std::isnan(e) ? "-" : "%.1e", e);
    return std::string(buffer);
  };
  std::printf("done %s  max err/scale: y %s mean %s rstd %s dx %s dw %s db %s (%.2f s)\n", label, text(e_y).c_str(),
              text(e_mean).c_str(), text(e_rstd).c_str(), text(e_dx).c_str(), text(e_dw).c_str(), text(e_db).c_str(),
              seconds);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  emu::install_fault_handler();
  const int64_t only = argc > 1 ? std::atoll(argv[1]) : -1;
  std::vector<Case> cases;
  // 2048: past the register kernels' 1024 float32 columns (the general vector
  // path), their limit in 16-bit types.
  for (int64_t cols : {1, 33, 67, 64, 768, 1024, 2048}) {
    if (only > 0 && cols != only) continue;
    for (int64_t rows : {1, 3, 17}) {
      for (Affine affine : {Affine::none, Affine::weight, Affine::both}) cases.push_back({rows, cols, affine, Misalign::none});
    }
    for (Misalign m : {Misalign::x_dy, Misalign::y_dx, Misalign::weight, Misalign::dy}) {
      cases.push_back({17, cols, Affine::both, m});
    }
    cases.push_back({130, cols, Affine::both, Misalign::none});  // 3 splits of the dweight/dbias partials
  }
  for (const Case& c : cases) {
    run<float>(c);
    run<double>(c);
    run<__half>(c);
    run<__nv_bfloat16>(c);
  }
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
