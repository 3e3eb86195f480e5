// reduction.cu's reduce_grad_kernel (the backward of sum, mean, var/std,
// amax/amin, max/min over a dim and the p-norms) through reduce_grad_cuda,
// emulated, against kernels/cpu/reduction.cpp's reduce_grad_cpu (linked by
// run_kernels.sh) bit for bit: the same arithmetic in the same accumulation
// type. Every kind: scale and index without x (as the front end passes them),
// var, equal (aux holding values of x, with ties counted), norm for p = 0, 1,
// 2, inf (ties and a NaN), 3 and 0.5 (pow), a zero norm; float32/64, float16,
// bfloat16; (outer, reduced, inner) with inner 1 and > 1 and enough elements
// for several CTAs; the index split by FastDivmod and by 64-bit division
// (force_64bit_index_for_testing). dx starts as 0xff bytes.
//   test_reduce_grad   (no arguments)
#include "emu_test.h"
#include "emu_reduction.inc"

#include <chrono>
#include <cmath>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

struct Shape {
  int64_t outer, reduced, inner;
};

struct Kind {
  ReduceGradKind kind;
  double p;  // norm only
  const char* name;
};

template <typename T>
void run(const Shape& s, const Kind& k) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  const int64_t outs = s.outer * s.inner, total = s.outer * s.reduced * s.inner;
  std::mt19937_64 engine(static_cast<uint64_t>(total * 7 + static_cast<int>(k.kind) * 13 + sizeof(T) +
                                               static_cast<int64_t>(k.p * 4)));
  std::normal_distribution<double> normal;
  const bool reads_x = k.kind != ReduceGradKind::scale && k.kind != ReduceGradKind::index;
  emu::Buffer<T> x(reads_x ? static_cast<size_t>(total) : 0, "x", 0, 0);
  // Small integers (ties for equal and the inf-norm) for those kinds, normal values otherwise.
  const bool ties = k.kind == ReduceGradKind::equal || (k.kind == ReduceGradKind::norm && std::isinf(k.p));
  for (size_t i = 0; i < x.n; ++i) {
    x[i] = from_double<T>(ties ? static_cast<double>(static_cast<int64_t>(engine() % 7) - 3) : 2 * normal(engine));
  }
  if (ties && x.n > 5) x[5] = from_double<T>(NAN);  // the inf-norm's gradient goes to NaNs too
  emu::Buffer<T> grad(static_cast<size_t>(outs), "grad", 0, 0);
  for (size_t i = 0; i < grad.n; ++i) grad[i] = from_double<T>(normal(engine));
  emu::Buffer<Acc> aux(static_cast<size_t>(outs), "aux", 0, 0), count(static_cast<size_t>(outs), "count", 0, 0);
  emu::Buffer<int64_t> indices(static_cast<size_t>(outs), "indices", 0, 0);
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t c = 0; c < s.inner; ++c) {
      const int64_t out = o * s.inner + c;
      indices[out] = static_cast<int64_t>(engine() % static_cast<uint64_t>(s.reduced));
      const auto at = [&](int64_t r) { return static_cast<Acc>(to_double(x[(o * s.reduced + r) * s.inner + c])); };
      switch (k.kind) {
        case ReduceGradKind::var: aux[out] = static_cast<Acc>(normal(engine)); break;  // the mean
        case ReduceGradKind::equal: {  // amax: the largest value and its ties
          Acc m = -INFINITY, n = 0;
          for (int64_t r = 0; r < s.reduced; ++r) m = std::max(m, at(r));
          for (int64_t r = 0; r < s.reduced; ++r) n += at(r) == m ? 1 : 0;
          aux[out] = m;
          count[out] = n;
          break;
        }
        case ReduceGradKind::norm: {
          Acc n = 0, m = 0, ties_of_max = 0;
          for (int64_t r = 0; r < s.reduced; ++r) {
            const Acc v = std::abs(at(r));
            n += std::pow(v, static_cast<Acc>(k.p == 0 || std::isinf(k.p) ? 1 : k.p));
            m = std::max(m, v);
          }
          for (int64_t r = 0; r < s.reduced; ++r) ties_of_max += std::abs(at(r)) == m ? 1 : 0;
          aux[out] = std::isinf(k.p) ? m : k.p == 0 ? n : std::pow(n, static_cast<Acc>(1 / k.p));
          count[out] = std::max<Acc>(ties_of_max, 1);
          if (out == 1) aux[out] = 0;  // a zero norm
          break;
        }
        default: break;
      }
    }
  }
  ReduceGradArgs args;
  args.kind = k.kind;
  args.dtype = emu_dtype<T>();
  args.x = reads_x ? x.data : nullptr;
  args.grad = grad.data;
  args.aux = aux.data;
  args.count = count.data;
  args.indices = indices.data;
  args.outer = s.outer;
  args.reduced = s.reduced;
  args.inner = s.inner;
  args.p = k.p;
  args.scale = k.kind == ReduceGradKind::var ? 2.0 / static_cast<double>(s.reduced - 1) : 1.0 / static_cast<double>(s.reduced);
  emu::Buffer<T> dx(static_cast<size_t>(total), "dx");
  args.dx = dx.data;
  reduce_grad_cuda(args, nullptr);
  std::vector<T> want(static_cast<size_t>(total));
  ReduceGradArgs cpu = args;
  cpu.dx = want.data();
  reduce_grad_cpu(cpu);

  long wrong = 0, first = -1;
  for (int64_t i = 0; i < total; ++i) {
    const bool both_nan = std::isnan(to_double(dx[i])) && std::isnan(to_double(want[i]));
    if (!both_nan && std::memcmp(&dx[i], &want[i], sizeof(T)) != 0 && wrong++ == 0) first = static_cast<long>(i);
  }
  ++checks;
  char label[160];
  std::snprintf(label, sizeof label, "%s %-9s (%ld, %ld, %ld)%s", name_of<T>(), k.name, static_cast<long>(s.outer),
                static_cast<long>(s.reduced), static_cast<long>(s.inner), force_64bit_index() ? " 64-bit index" : "");
  if (wrong > 0) {
    ++failures;
    std::printf("FAIL %s: %ld of %ld differ, first at %ld: %.9g vs %.9g\n", label, wrong, static_cast<long>(total),
                first, to_double(dx[first]), to_double(want[first]));
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s (%.2f s)\n", wrong == 0 ? "done" : "FAILED", label, seconds);
  std::fflush(stdout);
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const std::vector<Shape> shapes = {{1, 9, 1}, {3, 10, 7}, {2, 700, 1}, {5, 40, 13}};
  const std::vector<Kind> kinds = {
      {ReduceGradKind::scale, 0, "mean"},      {ReduceGradKind::var, 0, "var"},
      {ReduceGradKind::equal, 0, "amax"},      {ReduceGradKind::index, 0, "max(dim)"},
      {ReduceGradKind::norm, 0, "norm p0"},    {ReduceGradKind::norm, 1, "norm p1"},
      {ReduceGradKind::norm, 2, "norm p2"},    {ReduceGradKind::norm, INFINITY, "norm inf"},
      {ReduceGradKind::norm, 3, "norm p3"},    {ReduceGradKind::norm, 0.5, "norm p0.5"},
  };
  // The index split by FastDivmod (below 2^31 elements), then by 64-bit division (forced).
  for_each_index_path([&] {
    for (const Shape& s : shapes) {
      for (const Kind& k : kinds) {
        run<float>(s, k);
        run<double>(s, k);
        run<__half>(s, k);
        run<__nv_bfloat16>(s, k);
      }
    }
  });
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
