// reduction.cu's reduce_kernel / reduce_partials_kernel through the public
// entry (reduce_cuda_workspace_bytes, reduce_cuda; kernels/reduction.h),
// emulated, against kernels/cpu/reduction.cpp's reduce_cpu (linked by
// run_kernels.sh). The plan reads the multiprocessor count from
// cuda::device_properties: 132 in the emulation (an H100 SXM), so the chunked
// two-kernel path runs where it would on that GPU (each case prints its
// chunks and whether it took the 16-byte vector path; plan_launch is compared
// with the expected choice where the file has Geometry::vectors).
//
// Data and what must match:
//   exact   nonzero integers in [-3, 3] (floats) / [-1000, 1000] (int32/64): every
//           float sum and sum of squares is exact whatever the order, so sum and
//           norm p=2 must equal the CPU's bit for bit (a skipped or doubled
//           element shows); amax/amin/max_index/min_index (many ties: the first
//           index) and integer sums bit for bit; mean and var (divisions) within
//           the tolerance below.
//   normal  2 N(0,1) + 0.3: sum, mean, var (and its mean in aux), norm within
//           |gpu - cpu| <= ulp_out(|cpu|) + 32 u_acc S, S = sum|x| (sum), sum|x|/n
//           (mean), the result (var, norm); u_acc = 2^-24 (float accumulation
//           of f16/bf16/f32) or 2^-53 (f64). Extrema and indices bit for bit.
//   nan     exact data with NaNs at two rows of output 0 and the last row of the
//           last output: amax/amin NaN there, indices the first NaN.
//   all     exact data (true) and a copy with zeros placed in some outputs.
// Shapes (outer, reduced, inner): (1, N, 1) for N in 1, 7, 8, 9, 1000, 4096,
// 100003, 262147; (3, 4096, 1), (6, 40, 1) (vectors, outer > 1), (5, 13, 1)
// (scalar: 13 rows are no whole vectors), (4, 64, 3) (inner > 1), and the
// input moved one element off 16 bytes for (1, 1000, 1) and (3, 4096, 1).
// Outputs start as 0xff bytes; buffers sit between guard pages.
//   test_reduction [N]   ((1, N, 1) only)
#include "emu_test.h"
#include "emu_reduction.inc"

#include <chrono>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

struct Shape {
  int64_t outer, reduced, inner;
  bool offset;  // input base one element past 16 bytes
};

template <typename T>
constexpr bool is_float = std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename T>
double to_d(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

template <typename T>
T from_d(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
int significand_bits() {
  if constexpr (std::is_same_v<T, Half>) return 11;
  if constexpr (std::is_same_v<T, BFloat16>) return 8;
  if constexpr (std::is_same_v<T, float>) return 24;
  return 53;
}

// One unit in the last place of T at |v| (normal range).
template <typename T>
double ulp_of(double v) {
  if (v == 0 || !std::isfinite(v)) return 0;
  int e;
  std::frexp(v, &e);
  return std::ldexp(1.0, e - significand_bits<T>());
}

const char* kind_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::sum: return "sum";
    case ReduceKind::mean: return "mean";
    case ReduceKind::var: return "var";
    case ReduceKind::amax: return "amax";
    case ReduceKind::amin: return "amin";
    case ReduceKind::norm: return "norm2";
    case ReduceKind::all: return "all";
    case ReduceKind::max_index: return "max_index";
    case ReduceKind::min_index: return "min_index";
    default: return "?";
  }
}

int64_t chunked_cases = 0, vector_cases = 0, vector_chunked_cases = 0, plan_checks = 0;
double worst_sum_error = 0;  // max |gpu - cpu| / (u_acc S) over the tolerance cases

template <typename G>
constexpr bool has_vectors = requires(const G& g) { g.vectors; };  // Geometry::vectors: the vector path's flag

template <typename G>
bool plan_vectors(const G& g) {
  if constexpr (has_vectors<G>) {
    return g.vectors;
  } else {
    return false;
  }
}

enum class Data { exact, normal, nan, all_zeros };
const char* data_name(Data d) {
  switch (d) {
    case Data::exact: return "exact";
    case Data::normal: return "normal";
    case Data::nan: return "nan";
    case Data::all_zeros: return "zeros";
  }
  return "?";
}

template <typename T>
void run(const Shape& s, ReduceKind kind, Data data) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, std::conditional_t<is_float<T>, float, int64_t>>;
  const auto start = std::chrono::steady_clock::now();
  const DType dtype = dtype_of<T>::value;
  const int64_t O = s.outer, N = s.reduced, I = s.inner, n = O * N * I, outputs = O * I;
  std::mt19937_64 engine(static_cast<uint64_t>(O * 1000003 + N * 31 + I * 7 + static_cast<int>(data) + sizeof(T)));
  std::normal_distribution<double> normal;

  emu::Buffer<T> x(n, "x", s.offset ? sizeof(T) : 0, 0);
  std::vector<double> xv(n);
  for (int64_t i = 0; i < n; ++i) {
    double v;
    if (data == Data::normal) {
      v = 2.0 * normal(engine) + 0.3;
    } else if constexpr (is_float<T>) {
      v = static_cast<double>(engine() % 3 + 1) * (engine() % 2 ? 1 : -1);
    } else {
      v = static_cast<double>(static_cast<int64_t>(engine() % 2001) - 1000);
      if (v == 0) v = 1;
    }
    x[i] = from_d<T>(v);
    xv[i] = to_d(x[i]);
  }
  const auto at = [&](int64_t o, int64_t r, int64_t c) { return (o * N + r) * I + c; };
  if (data == Data::nan) {
    if constexpr (is_float<T>) {
      for (int64_t r : {N / 3, (2 * N) / 3}) x[at(0, r, 0)] = from_d<T>(NAN);
      x[at(O - 1, N - 1, I - 1)] = from_d<T>(NAN);
    }
  }
  if (data == Data::all_zeros) {
    // Output 0: a zero in the middle; odd outputs: a zero in the last row; the rest all nonzero.
    x[at(0, N / 2, 0)] = from_d<T>(0);
    for (int64_t i = 1; i < outputs; i += 2) x[at(i / I, N - 1, i % I)] = from_d<T>(0);
  }
  std::vector<T> host(x.data, x.data + n);

  DType out_dtype = dtype;
  if (kind == ReduceKind::sum && !is_float<T>) out_dtype = DType::i64;
  if (kind == ReduceKind::all) out_dtype = DType::b8;
  const size_t out_size = dtype_size(out_dtype);
  const bool has_index = kind == ReduceKind::max_index || kind == ReduceKind::min_index;
  const bool has_aux = kind == ReduceKind::var;

  emu::Buffer<unsigned char> out(outputs * out_size, "out");
  emu::Buffer<int64_t> indices(has_index ? outputs : 0, "indices");
  emu::Buffer<Acc> aux(has_aux ? outputs : 0, "aux");
  ReduceArgs a;
  a.kind = kind;
  a.in_dtype = dtype;
  a.out_dtype = out_dtype;
  a.in = x.data;
  a.out = out.data;
  a.indices = has_index ? indices.data : nullptr;
  a.aux = has_aux ? aux.data : nullptr;
  a.outer = O;
  a.reduced = N;
  a.inner = I;
  a.p = 2.0;
  a.correction = 1;

  const LaunchPlan plan = plan_launch(a);
  const int64_t width = 16 / static_cast<int64_t>(sizeof(T));
  const bool vectors_expected = I == 1 && !s.offset && (O == 1 || N % width == 0);
  const int64_t bytes = reduce_cuda_workspace_bytes(a);
  emu::Buffer<unsigned char> workspace(static_cast<size_t>(bytes), "workspace");
  reduce_cuda(a, bytes > 0 ? workspace.data : nullptr, nullptr);

  std::vector<unsigned char> want(outputs * out_size, 0xee);
  std::vector<int64_t> want_indices(outputs, -7);
  std::vector<Acc> want_aux(outputs);
  ReduceArgs c = a;
  c.in = host.data();
  c.out = want.data();
  c.indices = has_index ? want_indices.data() : nullptr;
  c.aux = has_aux ? want_aux.data() : nullptr;
  reduce_cpu(c);

  char label[200];
  std::snprintf(label, sizeof label, "%-9s %-4s %-6s (%ld, %6ld, %ld)%s  chunks %3ld %s", kind_name(kind),
                dtype_name(dtype).data(), data_name(data), static_cast<long>(O), static_cast<long>(N),
                static_cast<long>(I), s.offset ? " +1 elem" : "        ", static_cast<long>(plan.geometry.chunks),
                plan_vectors(plan.geometry) ? "vectors" : "scalar ");
  bool ok = true;
  if (has_vectors<Geometry>) {
    ++plan_checks;
    if (plan_vectors(plan.geometry) != vectors_expected) {
      ok = false;
      std::printf("FAIL %s: plan_launch chose vectors %d, expected %d\n", label, plan_vectors(plan.geometry),
                  vectors_expected);
    }
  }
  chunked_cases += plan.geometry.chunks > 1;
  vector_cases += plan_vectors(plan.geometry);
  vector_chunked_cases += plan_vectors(plan.geometry) && plan.geometry.chunks > 1;

  // What must be bit-exact, and the tolerance scale S of each output otherwise.
  const bool exact = kind == ReduceKind::amax || kind == ReduceKind::amin || has_index || kind == ReduceKind::all ||
                     !is_float<T> ||
                     (data == Data::exact && (kind == ReduceKind::sum || kind == ReduceKind::norm));
  const double u_acc = std::is_same_v<Acc, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  double worst = 0;
  long bad = 0;
  for (int64_t i = 0; i < outputs; ++i) {
    const int64_t o = i / I, col = i % I;
    const unsigned char* g = out.data + i * out_size;
    const unsigned char* w = want.data() + i * out_size;
    double gv, wv;
    if (out_dtype == DType::b8) {
      gv = *g, wv = *w;
    } else if (out_dtype == DType::i64) {
      gv = static_cast<double>(*reinterpret_cast<const int64_t*>(g));
      wv = static_cast<double>(*reinterpret_cast<const int64_t*>(w));
    } else {
      gv = to_d(*reinterpret_cast<const T*>(g));
      wv = to_d(*reinterpret_cast<const T*>(w));
    }
    const bool both_nan = std::isnan(gv) && std::isnan(wv);
    bool same;
    if (exact) {
      same = both_nan || std::memcmp(g, w, out_size) == 0;
    } else {
      double S = 0;
      for (int64_t r = 0; r < N; ++r) S += std::abs(xv[at(o, r, col)]);
      if (kind == ReduceKind::mean) S /= static_cast<double>(N);
      if (kind == ReduceKind::var || kind == ReduceKind::norm) S = std::abs(wv);
      const double error = std::abs(gv - wv);
      const double allowed = ulp_of<T>(std::max(std::abs(gv), std::abs(wv))) + 32 * u_acc * S;
      same = both_nan || gv == wv || error <= allowed;
      if (!both_nan && S > 0) {
        const double e = std::max(0.0, error - ulp_of<T>(std::max(std::abs(gv), std::abs(wv)))) / (u_acc * S);
        worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
      }
      if (has_aux) {  // var's mean
        double Sm = 0;
        for (int64_t r = 0; r < N; ++r) Sm += std::abs(xv[at(o, r, col)]);
        Sm /= static_cast<double>(N);
        const double em = std::abs(static_cast<double>(aux[i]) - static_cast<double>(want_aux[i]));
        if (!(em <= 32 * u_acc * Sm + 2 * u_acc * std::abs(static_cast<double>(want_aux[i])))) {
          same = false;
          std::printf("  aux (mean) at %ld: %.17g vs %.17g\n", static_cast<long>(i), static_cast<double>(aux[i]),
                      static_cast<double>(want_aux[i]));
        }
      }
    }
    if (has_index && indices[i] != want_indices[i]) same = false;
    if (!same) {
      if (bad++ < 3) {
        std::printf("  %s output %ld: %.17g vs %.17g", label, static_cast<long>(i), gv, wv);
        if (has_index) std::printf(", index %ld vs %ld", static_cast<long>(indices[i]), static_cast<long>(want_indices[i]));
        std::printf("\n");
      }
    }
  }
  if (!exact) worst_sum_error = std::max(worst_sum_error, worst);
  if (bad > 0) {
    ok = false;
    std::printf("FAIL %s: %ld of %ld outputs differ\n", label, bad, static_cast<long>(outputs));
  }
  ++checks;
  if (!ok) {
    ++failures;
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (exact) {
    std::printf("%s %s  bit-exact (%.2f s)\n", ok ? "done" : "FAILED", label, seconds);
  } else {
    std::printf("%s %s  err %.2f u_acc S (%.2f s)\n", ok ? "done" : "FAILED", label, worst, seconds);
  }
  std::fflush(stdout);
}

template <typename T>
void run_shape(const Shape& s) {
  using K = ReduceKind;
  if constexpr (is_float<T>) {
    for (K k : {K::sum, K::mean, K::var, K::amax, K::amin, K::max_index, K::min_index, K::norm}) run<T>(s, k, Data::exact);
    for (K k : {K::sum, K::mean, K::var, K::amax, K::amin, K::max_index, K::min_index, K::norm}) run<T>(s, k, Data::normal);
    for (K k : {K::amax, K::amin, K::max_index, K::min_index}) run<T>(s, k, Data::nan);
  } else {
    for (K k : {K::sum, K::amax, K::amin, K::max_index, K::min_index}) run<T>(s, k, Data::exact);
  }
  run<T>(s, K::all, Data::exact);
  run<T>(s, K::all, Data::all_zeros);
}

}  // namespace

int main(int argc, char** argv) {
  emu::install_fault_handler();
  std::vector<Shape> shapes;
  if (argc > 1) {
    shapes.push_back({1, std::atoll(argv[1]), 1, false});
  } else {
    for (int64_t N : {1, 7, 8, 9, 1000, 4096, 100003, 262147}) shapes.push_back({1, N, 1, false});
    shapes.push_back({3, 4096, 1, false});
    shapes.push_back({6, 40, 1, false});
    shapes.push_back({5, 13, 1, false});
    shapes.push_back({4, 64, 3, false});
    shapes.push_back({1, 1000, 1, true});
    shapes.push_back({3, 4096, 1, true});
  }
  for (const Shape& s : shapes) {
    run_shape<float>(s);
    run_shape<double>(s);
    run_shape<Half>(s);
    run_shape<BFloat16>(s);
    run_shape<int32_t>(s);
    run_shape<int64_t>(s);
  }
  std::printf("cases: %ld chunked (two kernels), %ld on the vector path, %ld both; plan's vector choice checked in %ld\n",
              static_cast<long>(chunked_cases), static_cast<long>(vector_cases), static_cast<long>(vector_chunked_cases),
              static_cast<long>(plan_checks));
  std::printf("largest sum/mean/var/norm error beyond an output ulp: %.2f u_acc S (allowed 32)\n", worst_sum_error);
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
