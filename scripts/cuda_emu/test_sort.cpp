// sort.cu's topk through topk_cuda_workspace_bytes / topk_cuda (kernels/sort.h),
// emulated, against kernels/cpu/sort.cpp's topk_cpu (linked by run_kernels.sh),
// values and int64 indices bit for bit (NaN for NaN in the values).
// What is emulated: the workspace carving, init_kernel (per-row indices, the
// segment offsets and the keys with each NaN's sign cleared), take_kernel (the
// first k of each sorted row, values read from the input), and the calls'
// arguments. What is not: CUB's DeviceSegmentedRadixSort itself; emu_cuda.h
// stands in for it with a host stable sort in CUB's documented radix order
// (-NaN < -inf < ... < +inf < +NaN, -0.0 == +0.0), so these checks say that
// sort.cu drives CUB as documented and that the result is the CPU's topk order
// (ties by index; every NaN, either sign, above +inf; each NaN's bits kept).
// Cases: every dtype but bool (rejected by both: checked); rows x cols (1, 1),
// (1, 10), (3, 10) with k = cols, (5, 37) k = 1, (4, 100) k = 7, (20, 64) k = 20
// (init_kernel and take_kernel on several CTAs), (3, 700) k = 300, rows 0, k 0;
// largest and smallest; data with many ties, +-0.0, +-inf and NaN of both
// signs; a direct launch of init_kernel and take_kernel with 2 CTAs of 32
// threads (the grid-stride loops). Outputs and workspace start as 0xff bytes.
//   test_sort   (no arguments)
#include "emu_storage.h"
#include "emu_test.h"
#include "emu_sort.inc"

#include <chrono>
#include <random>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

long negative_nans = 0;  // in the inputs: the data must hold some for the checks to mean anything

void fill(Storage& s, uint64_t seed, bool specials) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal;
  const double ties[] = {-2, -1, -0.0, 0.0, 0.5, 1, 3};
  for (int64_t i = 0; i < s.count; ++i) {
    double v;
    if (!is_floating(s.dtype)) {
      v = static_cast<double>(engine() % 20);
      if (s.dtype != DType::u8) v -= 10;
      if (s.dtype == DType::i64 && engine() % 5 == 0) v *= 1e12;
    } else if (engine() % 3 == 0) {
      v = ties[engine() % std::size(ties)];
    } else {
      v = normal(engine);
    }
    if (specials && is_floating(s.dtype) && engine() % 13 == 0) {
      const double pick[] = {NAN, -NAN, INFINITY, -INFINITY};
      v = pick[engine() % 4];
    }
    put(s.dtype, s.at(i), v);
  }
}

void run(DType t, int64_t rows, int64_t cols, int64_t k, bool largest, bool specials) {
  Storage x(t, rows * cols, "x"), vg(t, rows * k, "values cuda"), vc(t, rows * k, "values cpu"),
      ig(DType::i64, rows * k, "indices cuda"), ic(DType::i64, rows * k, "indices cpu");
  fill(x, static_cast<uint64_t>(rows * 1000 + cols * 7 + k), specials);
  for (int64_t i = 0; i < x.count; ++i) {
    const double v = get(t, x.at(i));
    negative_nans += std::isnan(v) && std::signbit(v);
  }
  TopkArgs a;
  a.dtype = t;
  a.x = x.at(0);
  a.rows = rows;
  a.cols = cols;
  a.k = k;
  a.largest = largest;
  const size_t bytes = topk_cuda_workspace_bytes(a);
  emu::Buffer<unsigned char> workspace(bytes, "workspace");
  a.values = vg.at(0);
  a.indices = reinterpret_cast<int64_t*>(ig.at(0));
  topk_cuda(a, workspace.data, bytes, nullptr);
  a.values = vc.at(0);
  a.indices = reinterpret_cast<int64_t*>(ic.at(0));
  topk_cpu(a);
  char label[160];
  std::snprintf(label, sizeof label, "%-5s (%ld, %ld) k %ld %s%s", dtype_name(t).data(), static_cast<long>(rows),
                static_cast<long>(cols), static_cast<long>(k), largest ? "largest" : "smallest",
                specials ? " inf/nan" : "");
  exact_storage(label, "values cuda vs cpu", vg, vc);
  exact_storage(label, "indices cuda vs cpu", ig, ic);
}

// init_kernel and take_kernel with 2 CTAs of 32 threads over 9 rows of 31.
void small_grid() {
  const int64_t rows = 9, cols = 31, k = 13, items = rows * cols;
  emu::Buffer<int32_t> index(items, "index"), offsets(rows + 1, "offsets");
  emu::Buffer<float> x(items, "x"), keys(items, "keys"), values(rows * k, "values");
  for (int64_t i = 0; i < items; ++i) x[i] = i % 5 == 0 ? -NAN : static_cast<float>(i);
  ::emu::launch(::emu::Config(dim3(2), dim3(32)), "init_kernel (2 x 32)",
                [](auto&... a) { init_kernel<float>(a...); }, static_cast<const float*>(x.data), keys.data,
                index.data, offsets.data, rows, cols);
  ++checks;
  long bad = 0;
  for (int64_t i = 0; i < items; ++i) {
    bad += index[i] != i % cols;
    bad += i % 5 == 0 ? !(std::isnan(keys[i]) && !std::signbit(keys[i])) : keys[i] != x[i];
  }
  for (int64_t r = 0; r <= rows; ++r) bad += offsets[r] != r * cols;
  emu::Buffer<int64_t> indices(rows * k, "indices");
  for (int64_t i = 0; i < items; ++i) index[i] = static_cast<int32_t>(cols - 1 - i % cols);  // each row reversed
  ::emu::launch(::emu::Config(dim3(2), dim3(32)), "take_kernel (2 x 32)",
                [](auto&... a) { take_kernel<float>(a...); }, static_cast<const float*>(x.data),
                static_cast<const int32_t*>(index.data), rows, cols, k, values.data, indices.data);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const float want = x[r * cols + cols - 1 - j];
      bad += std::memcmp(&values[r * k + j], &want, sizeof(float)) != 0;
      bad += indices[r * k + j] != cols - 1 - j;
    }
  }
  if (bad > 0) {
    ++failures;
    std::printf("FAIL init_kernel / take_kernel with a grid of 2 x 32: %ld wrong\n", bad);
  }
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const auto start = std::chrono::steady_clock::now();
  const DType types[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};
  struct Shape {
    int64_t rows, cols, k;
  };
  const Shape shapes[] = {{1, 1, 1}, {1, 10, 3}, {3, 10, 10}, {5, 37, 1}, {4, 100, 7},
                          {20, 64, 20}, {3, 700, 300}, {0, 5, 2}, {3, 5, 0}};
  for (DType t : types) {
    for (const Shape& s : shapes) {
      for (bool largest : {true, false}) {
        run(t, s.rows, s.cols, s.k, largest, false);
        if (is_floating(t)) run(t, s.rows, s.cols, s.k, largest, true);
      }
    }
  }
  // bool: rejected by both entry points.
  {
    TopkArgs a;
    a.dtype = DType::b8;
    a.rows = 1;
    a.cols = 4;
    a.k = 2;
    int thrown = 0;
    try { (void)topk_cuda_workspace_bytes(a); } catch (const Error&) { ++thrown; }
    try { topk_cpu(a); } catch (const Error&) { ++thrown; }
    ++checks;
    if (thrown != 2) {
      ++failures;
      std::printf("FAIL topk of bool: %d of 2 entry points threw\n", thrown);
    }
  }
  small_grid();
  ++checks;
  if (negative_nans == 0) {
    ++failures;
    std::printf("FAIL the inputs held no NaN with its sign bit set\n");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.0f s; %d of %d checks failed; %ld launches, %ld CTAs emulated\n", seconds, failures, checks,
              emu::launches.load(), emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
