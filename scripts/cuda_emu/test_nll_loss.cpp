// cross_entropy.cu's nll_loss_kernel and nll_loss_grad_kernel through
// nll_loss_cuda / nll_loss_grad_cuda, emulated, against kernels/cpu/softmax.cpp's
// nll_loss_cpu / nll_loss_grad_cpu (linked by run_kernels.sh) bit for bit: the
// loss and weight of every row, the gradient of every element (outputs start as
// NaN). (n, classes, inner) with inner 1 and > 1 (a 2-D loss), enough rows and
// elements for several CTAs; no class weights and random ones; per-row and
// scalar gradients, with and without a divisor; targets equal to ignore_index
// (-100, or a class, 2), and out of range: CUDA gives those rows a NaN loss,
// weight 0 and a zero gradient and stores one of their values in bad_target,
// where the CPU throws (its reference treats them as ignored). The gradient
// kernel's index split by FastDivmod and by 64-bit division (forced).
//   test_nll_loss   (no arguments)
#include "emu_test.h"

#include "emu_softmax.inc"
#include "emu_cross_entropy.inc"

#include <chrono>
#include <climits>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

struct Case {
  int64_t n, classes, inner;
  bool weighted, per_row_grad, divisor, bad;
  int64_t ignore_index;
};

template <typename T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
void run(const Case& c) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  const int64_t rows = c.n * c.inner, total = rows * c.classes;
  std::mt19937_64 engine(static_cast<uint64_t>(total * 13 + c.classes + sizeof(T) + (c.weighted ? 3 : 0) +
                                               (c.bad ? 7 : 0) + (c.per_row_grad ? 1 : 0)));
  std::uniform_real_distribution<double> uniform(-4.0, 0.0), positive(0.1, 2.0);
  emu::Buffer<T> log_probs(static_cast<size_t>(total), "log_probs", 0, 0);
  for (size_t i = 0; i < log_probs.n; ++i) log_probs[i] = from_double<T>(uniform(engine));
  emu::Buffer<T> weight(c.weighted ? static_cast<size_t>(c.classes) : 0, "weight", 0, 0);
  for (size_t i = 0; i < weight.n; ++i) weight[i] = from_double<T>(positive(engine));
  emu::Buffer<int64_t> target(static_cast<size_t>(rows), "target", 0, 0);
  std::vector<int64_t> cpu_target(target.n), bad_values;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = static_cast<int64_t>(engine() % static_cast<uint64_t>(c.classes));
    if (r % 9 == 5) t = c.ignore_index;
    if (c.bad && r % 11 == 7) t = r % 2 == 0 ? c.classes + r % 4 : -1 - r % 3;
    target[r] = t;
    const bool bad = t != c.ignore_index && (t < 0 || t >= c.classes);
    if (bad) bad_values.push_back(t);
    cpu_target[r] = bad ? c.ignore_index : t;  // the CPU throws on them; CUDA zeroes their gradient as if ignored
  }

  NllLossArgs fa;
  fa.dtype = emu_dtype<T>();
  fa.log_probs = log_probs.data;
  fa.target = target.data;
  fa.weight = c.weighted ? weight.data : nullptr;
  fa.n = c.n;
  fa.classes = c.classes;
  fa.inner = c.inner;
  fa.ignore_index = c.ignore_index;
  emu::Buffer<A> loss(static_cast<size_t>(rows), "loss"), row_weight(static_cast<size_t>(rows), "row_weight");
  emu::Buffer<int64_t> bad_target(1, "bad_target", 0, 0);
  bad_target[0] = LLONG_MIN;
  fa.loss = loss.data;
  fa.row_weight = row_weight.data;
  fa.bad_target = bad_target.data;
  nll_loss_cuda(fa, nullptr);

  NllLossArgs ca = fa;
  std::vector<A> cpu_loss(loss.n), cpu_row_weight(loss.n);
  ca.target = cpu_target.data();
  ca.loss = cpu_loss.data();
  ca.row_weight = cpu_row_weight.data();
  ca.bad_target = nullptr;
  nll_loss_cpu(ca);

  // The gradient: per row or one value, over total_weight (the forward's weight sum) or not.
  emu::Buffer<T> grad(c.per_row_grad ? static_cast<size_t>(rows) : 1, "grad", 0, 0);
  for (size_t i = 0; i < grad.n; ++i) grad[i] = from_double<T>(positive(engine));
  emu::Buffer<A> total_weight(1, "total_weight", 0, 0);
  A sum = 0;
  for (A w : cpu_row_weight) sum += w;
  total_weight[0] = sum > 0 ? sum : A(1);
  NllLossGradArgs ga;
  ga.dtype = fa.dtype;
  ga.target = target.data;
  ga.weight = fa.weight;
  ga.grad = grad.data;
  ga.per_row_grad = c.per_row_grad;
  ga.total_weight = c.divisor ? total_weight.data : nullptr;
  ga.n = c.n;
  ga.classes = c.classes;
  ga.inner = c.inner;
  ga.ignore_index = c.ignore_index;
  emu::Buffer<T> dlp(static_cast<size_t>(total), "dlog_probs");
  ga.dlog_probs = dlp.data;
  nll_loss_grad_cuda(ga, nullptr);
  NllLossGradArgs gc = ga;
  std::vector<T> cpu_dlp(dlp.n);
  gc.target = cpu_target.data();
  gc.dlog_probs = cpu_dlp.data();
  nll_loss_grad_cpu(gc);

  long wrong = 0;
  std::string first;
  const auto note = [&](const char* what, int64_t at) {
    if (wrong++ == 0) first = std::string(what) + " at " + std::to_string(at);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const bool bad = target[r] != c.ignore_index && (target[r] < 0 || target[r] >= c.classes);
    if (bad ? !std::isnan(loss[r]) : !same_bits(loss[r], cpu_loss[r])) note("loss", r);
    if (!same_bits(row_weight[r], cpu_row_weight[r])) note("row_weight", r);
  }
  for (int64_t k = 0; k < total; ++k) {
    if (!same_bits(dlp[k], cpu_dlp[k])) note("dlog_probs", k);
  }
  const bool slot_ok = bad_values.empty() ? bad_target[0] == LLONG_MIN
                                          : std::find(bad_values.begin(), bad_values.end(), bad_target[0]) != bad_values.end();
  if (!slot_ok) note("bad_target", 0);
  ++checks;
  char label[200];
  std::snprintf(label, sizeof label, "%s n %ld classes %ld inner %ld%s%s%s%s ignore %ld%s", name_of<T>(),
                static_cast<long>(c.n), static_cast<long>(c.classes), static_cast<long>(c.inner),
                c.weighted ? " weighted" : "", c.per_row_grad ? " per-row grad" : " scalar grad",
                c.divisor ? " / total_weight" : "", c.bad ? " bad targets" : "", static_cast<long>(c.ignore_index),
                force_64bit_index() ? " 64-bit index" : "");
  if (wrong > 0) {
    ++failures;
    std::printf("FAIL %s: %ld wrong, first: %s\n", label, wrong, first.c_str());
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s (%.2f s)\n", wrong == 0 ? "done" : "FAILED", label, seconds);
  std::fflush(stdout);
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const std::vector<Case> cases = {
      {37, 10, 1, false, false, true, false, -100},   // mean reduction: scalar grad over the weight sum
      {37, 10, 1, true, false, true, true, -100},     // class weights, bad targets
      {5, 7, 13, true, true, false, false, 2},        // a 2-D loss, reduction none; an ignored class
      {300, 3, 1, false, true, false, true, -100},    // several CTAs of rows
      {40, 100, 3, true, false, true, true, 0},       // 12000 gradient elements; class 0 ignored
  };
  // The gradient's index split by FastDivmod (below 2^31 elements), then by 64-bit division (forced).
  for_each_index_path([&] {
    for (const Case& c : cases) {
      run<float>(c);
      run<double>(c);
      run<__half>(c);
      run<__nv_bfloat16>(c);
    }
  });
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
