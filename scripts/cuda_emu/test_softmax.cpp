// The emulator's own check: softmax.cu's softmax_kernel (softmax and
// log-softmax), softmax_grad_kernel, cross_entropy_kernel and
// cross_entropy_grad_kernel (now in cross_entropy.cu) passed on an H200
// (kiln's [gpu] parity tests, at f518d36: run it with EMU_REV=f518d36), so a
// failure there is the emulator's, not the kernel's.
// Against a float64 reference, outputs starting as NaN, rows of 1 to 1000
// (blocks of 32 to 512 threads in that version). Uses only softmax.h's API.
//   test_softmax [cols]   (one width only)
#include "emu_test.h"
#include "emu_softmax.inc"
#include "emu_cross_entropy.inc"
#include "softmax_check.h"

#include <chrono>
#include <climits>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

template <typename T>
void run_softmax(int64_t R, int64_t C, bool log) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 engine(static_cast<uint64_t>(R * 31 + C + log));
  std::normal_distribution<double> normal;
  const int64_t n = R * C;
  emu::Buffer<T> x(n, "x", 0, 0), dy(n, "dy", 0, 0), y(n, "y"), dx(n, "dx");
  std::vector<double> xv(n), dyv(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = from_double<T>(3.0 * normal(engine));
    xv[i] = to_double(x[i]);
    dy[i] = from_double<T>(normal(engine));
    dyv[i] = to_double(dy[i]);
  }
  launch_softmax_and_grad(x, y, dy, dx, R, C, log);
  const std::vector<double> got_y = values_of(y), got_dx = values_of(dx);
  std::vector<double> ref_y, ref_dx;
  softmax_reference(xv, dyv, got_y, R, C, log, ref_y, ref_dx);
  char label[120];
  std::snprintf(label, sizeof label, "%-4s %-11s rows %ld cols %4ld", name_of<T>(), log ? "log_softmax" : "softmax",
                R, C);
  const double rtol = 2 * roundoff<T>(), atol = 128 * roundoff<A>();
  const double e_y = compare(label, "y", got_y, ref_y, rtol, atol);
  const double e_dx = compare(label, "dx", got_dx, ref_dx, rtol, 4 * atol);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %s  max err/scale: y %.1e dx %.1e (%.2f s)\n", label, e_y, e_dx, seconds);
}

template <typename T>
void run_cross_entropy(int64_t C, bool weighted, double smoothing) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  const int64_t R = 6;
  std::mt19937_64 engine(static_cast<uint64_t>(C * 7 + weighted + smoothing * 100));
  std::normal_distribution<double> normal;
  emu::Buffer<T> logits(R * C, "logits", 0, 0), weight(weighted ? C : 0, "weight", 0, 0);
  emu::Buffer<A> grad_scale(1, "grad", 0, 0);  // the loss's gradient, in Acc (kernels/softmax.h)
  emu::Buffer<int64_t> target(R, "target", 0, 0), bad(1, "bad_target", 0, 0);
  emu::Buffer<A> loss(R, "loss"), row_weight(R, "row_weight"), lse(R, "lse"), weight_sum(1, "weight_sum", 0, 0);
  emu::Buffer<T> dlogits(R * C, "dlogits");
  std::vector<double> xv(R * C), wv(C, 1.0);
  for (int64_t i = 0; i < R * C; ++i) {
    logits[i] = from_double<T>(2.0 * normal(engine));
    xv[i] = to_double(logits[i]);
  }
  double W = 0;
  for (int64_t c = 0; c < C; ++c) {
    if (weighted) {
      weight[c] = from_double<T>(0.5 + std::abs(normal(engine)));
      wv[c] = to_double(weight[c]);
    }
    W += wv[c];
  }
  weight_sum[0] = static_cast<A>(W);
  const int64_t targets[R] = {0, C - 1, -100, C + 3, (C / 2), -5};  // -100 ignored; C + 3 and -5 bad
  for (int64_t r = 0; r < R; ++r) target[r] = targets[r];
  bad[0] = LLONG_MIN;
  grad_scale[0] = static_cast<A>(1.25);
  CrossEntropyArgs args;
  args.dtype = emu_dtype<T>();
  args.logits = logits.data;
  args.target = target.data;
  args.weight = weighted ? weight.data : nullptr;
  args.rows = R;
  args.classes = C;
  args.label_smoothing = smoothing;
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
  grad.weight_sum = weighted ? weight_sum.data : nullptr;
  grad.rows = R;
  grad.classes = C;
  grad.label_smoothing = smoothing;
  grad.dlogits = dlogits.data;
  cross_entropy_grad_cuda(grad, nullptr);

  std::vector<double> ref_loss(R), ref_rw(R), ref_lse(R), ref_d(R * C, 0.0), got_loss(R), got_rw(R), got_lse(R),
      got_d(R * C);
  const double g = static_cast<double>(grad_scale[0]), ls = smoothing;
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
    for (int64_t c = 0; c < C; ++c) smooth += wv[c] * (L - xv[r * C + c]);
    ref_loss[r] = (1 - ls) * wv[t] * (L - xv[r * C + t]) + ls / C * smooth;
    ref_rw[r] = wv[t];
    ref_lse[r] = L;
    for (int64_t c = 0; c < C; ++c) {
      const double p = std::exp(xv[r * C + c] - L);
      ref_d[r * C + c] = g * ((1 - ls) * wv[t] * (p - (c == t ? 1.0 : 0.0)) + ls / C * (p * W - wv[c]));
    }
  }
  for (int64_t i = 0; i < R * C; ++i) got_d[i] = to_double(dlogits[i]);
  char label[120];
  std::snprintf(label, sizeof label, "%-4s cross_entropy classes %4ld %-8s smoothing %.1f", name_of<T>(), C,
                weighted ? "weighted" : "", smoothing);
  const double rtol = 2 * roundoff<T>(), atol = 128 * roundoff<A>();
  const double e_loss = compare(label, "loss", got_loss, ref_loss, atol, atol);
  compare(label, "row_weight", got_rw, ref_rw, 0, 0);
  const double e_lse = compare(label, "lse", got_lse, ref_lse, atol, atol);
  const double e_d = compare(label, "dlogits", got_d, ref_d, rtol, 4 * atol);
  ++checks;
  if (bad[0] != C + 3 && bad[0] != -5) {
    ++failures;
    std::printf("FAIL %s: bad_target %ld\n", label, static_cast<long>(bad[0]));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %s  max err/scale: loss %.1e lse %.1e dlogits %.1e, bad_target %ld (%.2f s)\n", label, e_loss,
              e_lse, e_d, static_cast<long>(bad[0]), seconds);
}

template <typename T>
void run_all(int64_t only) {
  for (int64_t cols : {1, 33, 100, 1000}) {
    if (only > 0 && cols != only) continue;
    for (bool log : {false, true}) run_softmax<T>(3, cols, log);
    for (bool weighted : {false, true}) {
      for (double smoothing : {0.0, 0.1}) {
        run_cross_entropy<T>(cols, weighted, smoothing);
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
