// softmax.cu's and cross_entropy.cu's launch paths, emulated, against a float64 reference: softmax
// and log-softmax forward and backward, cross-entropy forward and backward.
// Widths that take every path (sub-warp, warp and block rows in registers,
// rows streamed twice; cross-entropy's warp, 128- and 512-thread groups),
// buffers on a 16-byte line, all one element off it, and off by different
// amounts (no 16-byte packs); rows with -inf (masked) columns, an all -inf
// row, logits offset by 1000 (label smoothing's sum), ignored and bad targets,
// class weights, label smoothing, per-row and scalar gradients, a divisor.
// Every output starts as NaN.
//   bash scripts/cuda_emu/run_kernels.sh softmax_paths [cols]   (cols: one width only)
#include "emu_test.h"

#include "emu_softmax.inc"
#include "emu_cross_entropy.inc"
#include "softmax_check.h"

#include <chrono>
#include <climits>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

// Offsets (in elements) of the buffers from a 16-byte line.
enum class Misalign { none, all, apart };

const char* name_of(Misalign m) { return m == Misalign::none ? "lined" : m == Misalign::all ? "off" : "apart"; }

template <typename T>
size_t offset(Misalign m, int which) {
  if (m == Misalign::none) return 0;
  if (m == Misalign::all) return sizeof(T);
  return which % 2 == 0 ? 0 : sizeof(T);  // every other buffer moved: rows start at different offsets
}

// compare() with non-finite references (masked columns, empty rows, an
// infinite smoothing sum) matched exactly and left out of the error scale.
double check(const std::string& label, const char* what, std::vector<double> got, std::vector<double> want,
             double rtol, double atol) {
  long wrong = 0, at = -1;
  double got_at = 0, want_at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isfinite(want[i])) continue;
    if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))) {
      ++wrong;
      at = static_cast<long>(i);
      got_at = got[i];
      want_at = want[i];
    }
    got[i] = want[i] = 0;
  }
  if (wrong > 0) {
    ++failures;
    std::printf("FAIL %s %s: %ld non-finite references differ; at %ld: %.9g vs %.9g\n", label.c_str(), what, wrong, at,
                got_at, want_at);
  }
  return compare(label, what, got, want, rtol, atol);
}

template <typename A>
double acc_roundoff() {
  return std::is_same_v<A, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
}

template <typename T>
void run_softmax(int64_t R, int64_t C, bool log, Misalign mis) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 engine(static_cast<uint64_t>(R * 31 + C + log));
  std::normal_distribution<double> normal;
  const int64_t n = R * C;
  emu::Buffer<T> x(n, "x", offset<T>(mis, 0), 0), y(n, "y", offset<T>(mis, 1));
  emu::Buffer<T> dy(n, "dy", offset<T>(mis, 2), 0), dx(n, "dx", offset<T>(mis, 3));
  std::vector<double> xv(n), dyv(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / C, c = i % C;
    double v = 3.0 * normal(engine);
    if (R > 2 && r == 1 && c % 3 == 0) v = -INFINITY;  // masked columns
    if (R > 2 && r == 2) v = -INFINITY;                // a row with nothing: NaN
    x[i] = from_double<T>(v);
    xv[i] = to_double(x[i]);
    dy[i] = from_double<T>(normal(engine));
    dyv[i] = to_double(dy[i]);
  }
  launch_softmax_and_grad(x, y, dy, dx, R, C, log);
  const std::vector<double> got_y = values_of(y), got_dx = values_of(dx);
  std::vector<double> ref_y, ref_dx;
  softmax_reference(xv, dyv, got_y, R, C, log, ref_y, ref_dx);
  char label[160];
  std::snprintf(label, sizeof label, "%-4s %-11s rows %3ld cols %5ld %s", name_of<T>(), log ? "log_softmax" : "softmax",
                R, C, name_of(mis));
  // Sums over up to 50257 columns: a few ulps of A per term at worst.
  const double rtol = 2 * roundoff<T>(), atol = 128 * acc_roundoff<A>();
  const double e_y = check(label, "y", got_y, ref_y, rtol, atol);
  const double e_dx = check(label, "dx", got_dx, ref_dx, rtol, 4 * atol);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %s  max err/scale: y %.1e dx %.1e (%.2f s)\n", label, e_y, e_dx, seconds);
}

struct LossCase {
  bool weighted;
  double smoothing;
  bool per_row_grad;
  bool divisor;
};

template <typename T>
void run_cross_entropy(int64_t C, const LossCase& k, Misalign mis) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  const int64_t R = 8;
  std::mt19937_64 engine(static_cast<uint64_t>(C * 7 + k.weighted + k.smoothing * 100 + k.per_row_grad));
  std::normal_distribution<double> normal;
  emu::Buffer<T> logits(R * C, "logits", offset<T>(mis, 0), 0), dlogits(R * C, "dlogits", offset<T>(mis, 1));
  emu::Buffer<T> weight(k.weighted ? C : 0, "weight", 0, 0);
  emu::Buffer<A> grad_scale(R, "grad", 0, 0);  // the loss's gradient, in Acc (kernels/softmax.h)
  emu::Buffer<int64_t> target(R, "target", 0, 0), bad(1, "bad_target", 0, 0);
  emu::Buffer<A> loss(R, "loss"), row_weight(R, "row_weight"), lse(R, "lse");
  emu::Buffer<A> weight_sum(1, "weight_sum", 0, 0), total_weight(1, "total_weight", 0, 0);
  // -100 ignored; C + 3 and -5 bad; row 6 has masked (-inf) logits, row 7 logits near 1000.
  const int64_t targets[R] = {0, C - 1, -100, C + 3, C / 2, -5, (C / 2) | 1, C / 3};
  std::vector<double> xv(R * C), wv(C, 1.0);
  for (int64_t i = 0; i < R * C; ++i) {
    const int64_t r = i / C, c = i % C;
    double v = 2.0 * normal(engine);
    if (r == 6 && c % 4 == 0 && c != targets[6] && C > 1) v = -INFINITY;
    if (r == 7) v += 1000.0;
    logits[i] = from_double<T>(v);
    xv[i] = to_double(logits[i]);
  }
  double W = 0;
  for (int64_t c = 0; c < C; ++c) {
    if (k.weighted) {
      weight[c] = from_double<T>(0.5 + std::abs(normal(engine)));
      wv[c] = to_double(weight[c]);
    }
    W += wv[c];
  }
  weight_sum[0] = static_cast<A>(W);
  total_weight[0] = static_cast<A>(3.5);
  for (int64_t r = 0; r < R; ++r) {
    target[r] = targets[r];
    grad_scale[r] = static_cast<A>(k.per_row_grad ? 0.5 + 0.25 * static_cast<double>(r) : 1.25);
  }
  bad[0] = LLONG_MIN;
  CrossEntropyArgs args;
  args.dtype = emu_dtype<T>();
  args.logits = logits.data;
  args.target = target.data;
  args.weight = k.weighted ? weight.data : nullptr;
  args.rows = R;
  args.classes = C;
  args.label_smoothing = k.smoothing;
  args.loss = loss.data;
  args.row_weight = row_weight.data;
  args.lse = lse.data;
  args.bad_target = bad.data;
  cross_entropy_cuda(args, nullptr);
  CrossEntropyGradArgs grad;
  grad.dtype = args.dtype;
  grad.logits = logits.data;
  grad.target = target.data;
  grad.weight = args.weight;
  grad.lse = lse.data;
  grad.grad = grad_scale.data;
  grad.per_row_grad = k.per_row_grad;
  grad.total_weight = k.divisor ? total_weight.data : nullptr;
  grad.weight_sum = k.weighted ? weight_sum.data : nullptr;
  grad.rows = R;
  grad.classes = C;
  grad.label_smoothing = k.smoothing;
  grad.dlogits = dlogits.data;
  cross_entropy_grad_cuda(grad, nullptr);

  std::vector<double> ref_loss(R), ref_rw(R), ref_lse(R), ref_d(R * C, 0.0), got_loss(R), got_rw(R), got_lse(R),
      got_d(R * C);
  const double ls = k.smoothing, divisor = k.divisor ? 3.5 : 1.0;
  for (int64_t r = 0; r < R; ++r) {
    got_loss[r] = loss[r];
    got_rw[r] = row_weight[r];
    got_lse[r] = lse[r];
    const int64_t t = targets[r];
    if (t == -100 || t < 0 || t >= C) {
      ref_loss[r] = t == -100 ? 0.0 : NAN;
      ref_rw[r] = ref_lse[r] = 0;
      continue;
    }
    double m = -INFINITY, s = 0, smooth = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xv[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(xv[r * C + c] - m);
    const double L = m + std::log(s);
    for (int64_t c = 0; c < C; ++c) smooth += wv[c] * (L - xv[r * C + c]);  // +inf with a masked column
    ref_loss[r] = (1 - ls) * wv[t] * (L - xv[r * C + t]) + (ls != 0 ? ls / C * smooth : 0.0);
    ref_rw[r] = wv[t];
    ref_lse[r] = L;
    const double g = static_cast<double>(grad_scale[k.per_row_grad ? r : 0]) / divisor;
    for (int64_t c = 0; c < C; ++c) {
      const double p = std::exp(xv[r * C + c] - L);
      ref_d[r * C + c] = g * ((1 - ls) * wv[t] * (p - (c == t ? 1.0 : 0.0)) + ls / C * (p * W - wv[c]));
    }
  }
  for (int64_t i = 0; i < R * C; ++i) got_d[i] = to_double(dlogits[i]);
  char label[160];
  std::snprintf(label, sizeof label, "%-4s cross_entropy classes %5ld %-8s ls %.1f %-7s %-7s %s", name_of<T>(), C,
                k.weighted ? "weighted" : "", k.smoothing, k.per_row_grad ? "per-row" : "scalar",
                k.divisor ? "divisor" : "", name_of(mis));
  const double rtol = 2 * roundoff<T>(), atol = 128 * acc_roundoff<A>();
  // loss and lse are Acc values: relative to each value (the row near 1000 sets the scale).
  const double e_loss = check(label, "loss", got_loss, ref_loss, atol, atol);
  check(label, "row_weight", got_rw, ref_rw, 0, 0);
  const double e_lse = check(label, "lse", got_lse, ref_lse, atol, atol);
  const double e_d = check(label, "dlogits", got_d, ref_d, rtol, 4 * atol);
  ++checks;
  bool reported = false;  // the first bad target to arrive wins
  for (int64_t t : targets) reported = reported || (t != -100 && (t < 0 || t >= C) && bad[0] == t);
  if (!reported) {
    ++failures;
    std::printf("FAIL %s: bad_target %ld\n", label, static_cast<long>(bad[0]));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %s  max err/scale: loss %.1e lse %.1e dlogits %.1e (%.2f s)\n", label, e_loss, e_lse, e_d,
              seconds);
}

template <typename T>
void run_all(int64_t only) {
  const LossCase loss_cases[] = {{false, 0.0, false, false},
                                 {true, 0.0, true, true},
                                 {false, 0.1, false, true},
                                 {true, 0.1, true, false}};
  for (int64_t cols : {1, 3, 31, 33, 100, 200, 400, 1023, 1024, 1025, 4096, 20000, 50257}) {
    if (only > 0 && cols != only) continue;
    // Enough rows for several blocks of sub-warp rows when rows are short.
    const int64_t rows = cols <= 100 ? 130 : cols <= 1025 ? 9 : 3;
    for (Misalign mis : {Misalign::none, Misalign::all, Misalign::apart}) {
      for (bool log : {false, true}) run_softmax<T>(rows, cols, log, mis);
      for (const LossCase& k : loss_cases) {
        if (mis == Misalign::apart && (k.weighted || k.smoothing != 0)) continue;
        run_cross_entropy<T>(cols, k, mis);
      }
    }
  }
}

int main(int argc, char** argv) {
  emu::install_fault_handler();
  const int64_t only = argc > 1 ? std::atoll(argv[1]) : -1;
  run_all<float>(only);
  run_all<double>(only);
  run_all<__half>(only);
  run_all<__nv_bfloat16>(only);
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
