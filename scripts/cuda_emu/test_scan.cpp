// scan.cu's cumsum_kernel through cumsum_cuda (kernels/scan.h), emulated,
// against kernels/cpu/scan.cpp's cumsum_cpu (linked by run_kernels.sh), bit for
// bit: both sum each line in order in the same type (float for f32/f16/bf16,
// double for f64, int64 for integers and bool, whose output is int64) and
// round each prefix once. NaN matches NaN (16-bit NaN payloads differ), but
// not the 0xff poison. Every dtype; lines of (outer, length, inner) with
// inner 1 (contiguous lines) and > 1 (strided), lengths 1, 2, 7, 300 (f16
// overflows to inf, bf16 rounds), more lines than one CTA (600 x 3 x 1, 2 x 5
// x 300) and than the grid covers in one pass (a direct launch with 2 CTAs of
// 32 threads: the grid-stride loop), forward and reverse, 0-size (outer,
// length or inner 0: nothing written), inf/NaN/-0 in the data, in place
// (out == x, as the front end never does but the kernel allows). Outputs
// start as 0xff bytes.
//   test_scan   (no arguments)
#include "emu_storage.h"
#include "emu_test.h"
#include "emu_scan.inc"

#include <chrono>
#include <random>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

struct Shape {
  int64_t outer, length, inner;
};

DType out_dtype_of(DType t) { return is_floating(t) ? t : DType::i64; }

void fill(Storage& s, uint64_t seed, bool specials) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < s.count; ++i) {
    double v;
    if (!is_floating(s.dtype)) {
      v = static_cast<double>(engine() % 200);
      if (s.dtype == DType::i32 || s.dtype == DType::i64) v -= 100;
      if (s.dtype == DType::i64 && engine() % 7 == 0) v *= 1e12;  // beyond float's integers
    } else {
      v = 3 * normal(engine) + 0.1;
      if (specials && engine() % 23 == 0) {
        const double pick[] = {NAN, INFINITY, -INFINITY, -0.0, 6e4};
        v = pick[engine() % 5];
      }
    }
    put(s.dtype, s.at(i), v);
  }
}

ScanArgs args_for(DType t, const Shape& s, bool reverse) {
  ScanArgs a;
  a.dtype = t;
  a.out_dtype = out_dtype_of(t);
  a.outer = s.outer;
  a.length = s.length;
  a.inner = s.inner;
  a.reverse = reverse;
  return a;
}

void run(DType t, const Shape& s, bool reverse, bool specials, bool in_place) {
  const int64_t n = s.outer * s.length * s.inner;
  const DType out_t = out_dtype_of(t);
  Storage x(t, n, "x"), g(out_t, n, "out cuda"), c(out_t, n, "out cpu");
  fill(x, static_cast<uint64_t>(n * 7 + s.inner + reverse), specials);
  ScanArgs a = args_for(t, s, reverse);
  if (in_place) {
    std::memcpy(g.at(0), x.at(0), static_cast<size_t>(n) * dtype_size(t));
    std::memcpy(c.at(0), x.at(0), static_cast<size_t>(n) * dtype_size(t));
  }
  a.x = in_place ? g.at(0) : x.at(0);
  a.out = g.at(0);
  cumsum_cuda(a, nullptr);
  a.x = in_place ? c.at(0) : x.at(0);
  a.out = c.at(0);
  cumsum_cpu(a);
  char label[160];
  std::snprintf(label, sizeof label, "%-5s -> %-5s (%ld, %ld, %ld)%s%s%s", dtype_name(t).data(),
                dtype_name(out_t).data(), static_cast<long>(s.outer), static_cast<long>(s.length),
                static_cast<long>(s.inner), reverse ? " reverse" : "", specials ? " inf/nan" : "",
                in_place ? " in place" : "");
  exact_storage(label, "cuda vs cpu", g, c);
  // The last prefix of each line, for the integers: the sum itself (an order-independent check).
  if (!is_floating(t) && s.length > 0) {
    ++checks;
    long bad = 0;
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t i = 0; i < s.inner; ++i) {
        int64_t sum = 0;
        for (int64_t l = 0; l < s.length; ++l) {
          sum += static_cast<int64_t>(get(t, x.at((o * s.length + l) * s.inner + i)));
        }
        const int64_t last = reverse ? 0 : s.length - 1;
        int64_t got;
        std::memcpy(&got, g.at((o * s.length + last) * s.inner + i), 8);
        if (got != sum) ++bad;
      }
    }
    if (bad > 0) {
      ++failures;
      std::printf("FAIL %s: %ld line totals wrong\n", label, bad);
    }
  }
}

// The grid-stride loop: 2 CTAs of 32 threads over 200 lines.
void small_grid(DType t) {
  dispatch_all(t, "small grid", [&]<typename T>() {
    using N = typename Native<T>::type;
    const Shape s{40, 6, 5};
    const int64_t n = s.outer * s.length * s.inner;
    const DType out_t = out_dtype_of(t);
    Storage x(t, n, "x"), g(out_t, n, "out cuda"), c(out_t, n, "out cpu");
    fill(x, 3, false);
    ScanArgs a = args_for(t, s, false);
    a.x = x.at(0);
    a.out = c.at(0);
    cumsum_cpu(a);
    a.out = g.at(0);
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      ::emu::launch(::emu::Config(dim3(2), dim3(32)), "cumsum_kernel (2 x 32)",
                    [](auto&... v) { cumsum_kernel<N, N>(v...); }, a);
    } else {
      ::emu::launch(::emu::Config(dim3(2), dim3(32)), "cumsum_kernel (2 x 32)",
                    [](auto&... v) { cumsum_kernel<N, int64_t>(v...); }, a);
    }
    exact_storage(std::string(dtype_name(t)) + " (40, 6, 5)", "grid 2 x 32 vs cpu", g, c);
  });
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const auto start = std::chrono::steady_clock::now();
  const DType types[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::b8};
  const Shape shapes[] = {{1, 1, 1}, {1, 7, 1}, {3, 2, 1}, {2, 7, 3},   {1, 300, 1}, {4, 300, 2},
                          {600, 3, 1}, {2, 5, 300}, {0, 4, 2}, {3, 0, 2}, {3, 4, 0}};
  for (DType t : types) {
    for (const Shape& s : shapes) {
      for (bool reverse : {false, true}) {
        run(t, s, reverse, false, false);
        if (is_floating(t)) run(t, s, reverse, true, false);
      }
    }
    if (is_floating(t)) run(t, {2, 7, 3}, false, false, true);  // in place: out has x's dtype
    small_grid(t);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.0f s; %d of %d checks failed; %ld launches, %ld CTAs emulated\n", seconds, failures, checks,
              emu::launches.load(), emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
