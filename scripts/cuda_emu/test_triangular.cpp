// triangular.cu's triangular_kernel (tril / triu) through triangular_cuda
// (kernels/triangular.h), emulated, against kernels/cpu/triangular.cpp's
// triangular_cpu (linked by run_kernels.sh), bit for bit: both copy kept
// elements and write T(0) / T{} (all-zero bytes) elsewhere, so NaN payloads and
// -0.0 must survive. Every dtype (f32, f64, f16, bf16, i32, i64, u8, bool);
// shapes square, wide, tall, a single row/column, 1 x 1, batches, 0-size
// (batch, rows or cols 0: nothing written, the output keeps its poison), more
// elements than one CTA covers (17 x 300 x 37: several CTAs) and than the grid
// covers in one pass (a direct launch with 3 CTAs of 64 threads: the
// grid-stride loop); diagonals from below -rows to above cols; in place
// (out == x). Outputs start as 0xff bytes.
//   test_triangular   (no arguments)
#include "emu_storage.h"
#include "emu_test.h"
#include "emu_triangular.inc"

#include <chrono>
#include <random>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

struct Shape {
  int64_t batch, rows, cols;
};

void fill(Storage& s, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < s.count; ++i) {
    double v = is_floating(s.dtype) ? normal(engine) : static_cast<double>(engine() % 100 + 1);
    if (s.dtype == DType::b8) v = 1;  // all true: a kept false would not show
    if (is_floating(s.dtype) && engine() % 11 == 0) v = engine() % 2 ? NAN : -0.0;
    put(s.dtype, s.at(i), v);
  }
}

void run(DType t, const Shape& s, int64_t diagonal, bool upper, bool in_place) {
  const int64_t n = s.batch * s.rows * s.cols;
  Storage x(t, n, "x"), g(t, n, "out cuda"), c(t, n, "out cpu");
  fill(x, static_cast<uint64_t>(n * 131 + diagonal * 7 + upper));
  TriangularArgs args;
  args.dtype = t;
  args.batch = s.batch;
  args.rows = s.rows;
  args.cols = s.cols;
  args.diagonal = diagonal;
  args.upper = upper;
  if (in_place) {
    std::memcpy(g.at(0), x.at(0), static_cast<size_t>(n) * dtype_size(t));
    std::memcpy(c.at(0), x.at(0), static_cast<size_t>(n) * dtype_size(t));
  }
  args.x = in_place ? g.at(0) : x.at(0);
  args.out = g.at(0);
  triangular_cuda(args, nullptr);
  args.x = in_place ? c.at(0) : x.at(0);
  args.out = c.at(0);
  triangular_cpu(args);
  char label[160];
  std::snprintf(label, sizeof label, "%-5s %s (%ld, %ld, %ld) diagonal %ld%s", dtype_name(t).data(),
                upper ? "triu" : "tril", static_cast<long>(s.batch), static_cast<long>(s.rows),
                static_cast<long>(s.cols), static_cast<long>(diagonal), in_place ? " in place" : "");
  exact_storage(label, "cuda vs cpu", g, c);
  // An independent check of what is kept: x where col - row <= / >= diagonal, else zero bytes.
  ++checks;
  long bad = 0;
  const size_t size = dtype_size(t);
  const unsigned char zero[8] = {};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t col = i % s.cols, row = i / s.cols % s.rows;
    const bool keep = upper ? col - row >= diagonal : col - row <= diagonal;
    if (std::memcmp(g.at(i), keep ? x.at(i) : zero, size) != 0) ++bad;
  }
  if (bad > 0) {
    ++failures;
    std::printf("FAIL %s: %ld elements not x / zero as the diagonal says\n", label, bad);
  }
}

// The grid-stride loop: 3 CTAs of 64 threads over 5 x 7 x 9 elements.
void small_grid(DType t) {
  dispatch_all(t, "small grid", [&]<typename T>() {
    using N = typename Native<T>::type;
    const int64_t n = 5 * 7 * 9;
    Storage x(t, n, "x"), g(t, n, "out cuda"), c(t, n, "out cpu");
    fill(x, 5);
    TriangularArgs args;
    args.dtype = t;
    args.batch = 5;
    args.rows = 7;
    args.cols = 9;
    args.diagonal = 1;
    args.x = x.at(0);
    args.out = c.at(0);
    triangular_cpu(args);
    args.out = g.at(0);
    ::emu::launch(::emu::Config(dim3(3), dim3(64)), "triangular_kernel (3 x 64)",
                  [](auto&... a) { triangular_kernel<N>(a...); }, static_cast<const TriangularArgs>(args));
    exact_storage(std::string(dtype_name(t)) + " tril (5, 7, 9) diagonal 1", "grid 3 x 64 vs cpu", g, c);
  });
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const auto start = std::chrono::steady_clock::now();
  const DType types[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::b8};
  const Shape shapes[] = {{1, 5, 5}, {1, 3, 8}, {2, 8, 3}, {1, 1, 9}, {3, 9, 1}, {1, 1, 1},
                          {4, 6, 7}, {0, 3, 3}, {2, 0, 4}, {2, 4, 0}, {17, 300, 37}};
  for (DType t : types) {
    for (const Shape& s : shapes) {
      const bool big = s.batch * s.rows * s.cols > 10000;
      for (int64_t diagonal : {int64_t{0}, int64_t{1}, int64_t{-1}, int64_t{2}, -s.rows - 1, s.cols + 1}) {
        if (big && diagonal != 1 && diagonal != -1) continue;
        for (bool upper : {false, true}) run(t, s, diagonal, upper, false);
      }
      if (!big) run(t, s, -1, true, true);
    }
    small_grid(t);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.0f s; %d of %d checks failed; %ld launches, %ld CTAs emulated\n", seconds, failures, checks,
              emu::launches.load(), emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
