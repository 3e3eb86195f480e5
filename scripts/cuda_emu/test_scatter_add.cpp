// indexing.cu's scatter_add (gather's backward, torch.scatter_add_) through
// scatter_add_cuda (atomic adds: float32/64 unless deterministic, and the
// integers) and scatter_add_sorted_cuda (scatter_keys_kernel, the stable key
// sort through emu_cuda.h's host stand-in for cub::DeviceRadixSort, then
// scatter_runs_kernel: the deterministic path, and every 16-bit scatter),
// emulated. The sorted path is checked bit for bit against a host reference
// with its arithmetic (each destination: its start value plus the sum, in the
// index's row-major order, of the values naming it, accumulated in float
// (double for float64) and rounded once); the atomic path exactly for the
// integers and within the rounding of its adds for the floats (their order
// varies). Index shapes of rank 3 scattered along each dim; data larger than
// the index on other dims (its strides differ from the index's); values a
// view of a larger tensor; a transposed (non-contiguous) index; out-of-range
// indices, skipped, with the device error slot holding one of them; enough
// elements for several CTAs. Data starts as random values.
//   test_scatter_add   (no arguments)
#include "emu_test.h"
#include "emu_indexing.inc"
#include "index_error_check.h"

#include <array>
#include <chrono>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

using Dims = std::array<int64_t, 3>;

struct Case {
  Dims index;       // the index's (and the iteration's) shape
  int dim;          // the scattered dim
  int64_t size;     // data's size along dim
  Dims data_extra;  // data larger than the index by this on the other dims
  Dims values_extra;  // values a view of a tensor larger by this
  bool index_transposed;  // the index stored in (I2, I1, I0) order: strides not row-major
  bool bad;         // out-of-range indices among them
};

int64_t numel(const Dims& d) { return d[0] * d[1] * d[2]; }
Dims row_major(const Dims& d) { return {d[1] * d[2], d[2], 1}; }

template <typename T>
constexpr bool is_int = std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;

template <typename T>
DType emu_dtype_of() {
  if constexpr (std::is_same_v<T, int32_t>) return DType::i32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::i64;
  if constexpr (!is_int<T>) return emu_dtype<T>();
}

template <typename T>
T random_value(std::mt19937_64& engine) {
  if constexpr (is_int<T>) {
    return static_cast<T>(static_cast<int64_t>(engine() % 2001) - 1000);
  } else {
    return from_double<T>(std::uniform_real_distribution<double>(-2.0, 2.0)(engine));
  }
}

template <typename T>
double as_double(T x) {
  if constexpr (is_int<T>) return static_cast<double>(x); else return to_double(x);
}

template <typename T, typename I>
void run(const Case& c, bool sorted, DType index_dtype) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  Dims data_shape, values_shape;
  for (int d = 0; d < 3; ++d) {
    data_shape[d] = d == c.dim ? c.size : c.index[d] + c.data_extra[d];
    values_shape[d] = c.index[d] + c.values_extra[d];
  }
  std::mt19937_64 engine(static_cast<uint64_t>(numel(c.index) * 31 + c.dim * 7 + c.size + sizeof(T) * 3 + sizeof(I) +
                                               (sorted ? 1 : 0) + (c.bad ? 5 : 0)));
  emu::Buffer<T> data(static_cast<size_t>(numel(data_shape)), "data", 0, 0);
  std::vector<T> initial(data.n);
  for (size_t i = 0; i < data.n; ++i) initial[i] = data[i] = random_value<T>(engine);
  emu::Buffer<T> values(static_cast<size_t>(numel(values_shape)), "values", 0, 0);
  for (size_t i = 0; i < values.n; ++i) values[i] = random_value<T>(engine);
  // The index, row-major or stored transposed ((I2, I1, I0) in memory).
  const Dims index_strides = c.index_transposed ? Dims{1, c.index[0], c.index[0] * c.index[1]} : row_major(c.index);
  emu::Buffer<I> index(static_cast<size_t>(numel(c.index)), "index", 0, 0);
  std::vector<int64_t> bad_values;
  const Dims data_strides = row_major(data_shape), values_strides = row_major(values_shape);
  // Each destination: its start value, then the values naming it in the index's row-major order.
  std::vector<std::vector<size_t>> adds(data.n);
  int64_t linear = 0;
  for (int64_t i0 = 0; i0 < c.index[0]; ++i0) {
    for (int64_t i1 = 0; i1 < c.index[1]; ++i1) {
      for (int64_t i2 = 0; i2 < c.index[2]; ++i2, ++linear) {
        const Dims at{i0, i1, i2};
        int64_t v = static_cast<int64_t>(engine() % static_cast<uint64_t>(c.size));
        if (c.bad && linear % 7 == 4) v = linear % 2 == 0 ? -1 - linear % 3 : c.size + linear % 5;
        index[static_cast<size_t>(i0 * index_strides[0] + i1 * index_strides[1] + i2 * index_strides[2])] =
            static_cast<I>(v);
        if (v < 0 || v >= c.size) {
          bad_values.push_back(v);
          continue;
        }
        int64_t to = 0, from = 0;
        for (int d = 0; d < 3; ++d) {
          to += (d == c.dim ? v : at[d]) * data_strides[d];
          from += at[d] * values_strides[d];
        }
        adds[static_cast<size_t>(to)].push_back(static_cast<size_t>(from));
      }
    }
  }

  IndexArgs args;
  args.shape.ndim = 3;
  args.dim = c.dim;
  args.data_dim_size = c.size;
  args.data.data = data.data;
  args.data.dtype = emu_dtype_of<T>();
  args.index.data = index.data;
  args.index.dtype = index_dtype;
  args.values.data = values.data;
  args.values.dtype = emu_dtype_of<T>();
  for (int d = 0; d < 3; ++d) {
    args.shape.sizes[d] = c.index[d];
    args.data.strides[d] = data_strides[d];
    args.index.strides[d] = index_strides[d];
    args.values.strides[d] = values_strides[d];
  }
  const int64_t n = numel(c.index);
  std::unique_ptr<emu::Buffer<unsigned char>> workspace;
  if (sorted) {
    const size_t bytes = scatter_add_sorted_workspace_bytes(n);
    workspace = std::make_unique<emu::Buffer<unsigned char>>(bytes, "workspace", 0, 0xff, 64);
    scatter_add_sorted_cuda(args, static_cast<int64_t>(data.n), workspace->data, bytes, nullptr);
  } else {
    scatter_add_cuda(args, nullptr);
  }
  const IndexError error = index_error_cuda(0, nullptr);
  const IndexError cleared = index_error_cuda(0, nullptr);

  long wrong = 0, first_wrong = -1;
  double got_at = 0, want_at = 0;
  for (size_t e = 0; e < data.n; ++e) {
    bool ok;
    double want;
    if (sorted) {
      A sum = 0;
      for (size_t from : adds[e]) sum += static_cast<A>(to_double(values[from]));
      const T exact = adds[e].empty() ? initial[e] : from_double<T>(static_cast<double>(static_cast<A>(to_double(initial[e])) + sum));
      ok = std::memcmp(&data[e], &exact, sizeof(T)) == 0;
      want = as_double(exact);
    } else {
      // Integers exactly; floats within one rounding of T per add (of a running sum at most `bound`).
      double bound = std::abs(as_double(initial[e]));
      want = as_double(initial[e]);
      for (size_t from : adds[e]) {
        want += as_double(values[from]);
        bound += std::abs(as_double(values[from]));
      }
      const double allowed = is_int<T> ? 0.0 : 2 * roundoff<T>() * bound * static_cast<double>(adds[e].size());
      ok = std::abs(as_double(data[e]) - want) <= allowed;
    }
    if (!ok && wrong++ == 0) {
      first_wrong = static_cast<long>(e);
      got_at = as_double(data[e]);
      want_at = want;
    }
  }
  ++checks;
  char label[200];
  std::snprintf(label, sizeof label, "%-6s %s/%s index (%ld, %ld, %ld) dim %d size %ld%s%s%s%s", sorted ? "sorted" : "atomic",
                dtype_name(emu_dtype_of<T>()).data(), dtype_name(index_dtype).data(), static_cast<long>(c.index[0]),
                static_cast<long>(c.index[1]), static_cast<long>(c.index[2]), c.dim, static_cast<long>(c.size),
                c.data_extra != Dims{} ? " data larger" : "", c.values_extra != Dims{} ? " values a view" : "",
                c.index_transposed ? " index transposed" : "", c.bad ? " bad idx" : "");
  bool ok = wrong == 0;
  if (!ok) {
    std::printf("FAIL %s: %ld of %zu elements differ, first at %ld: %.9g vs %.9g\n", label, wrong, data.n, first_wrong,
                got_at, want_at);
  }
  if (!error_slot_ok(label, error, cleared, bad_values, c.size)) ok = false;
  if (!ok) {
    ++failures;
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s (%.2f s)\n", ok ? "done" : "FAILED", label, seconds);
  std::fflush(stdout);
}

template <typename I>
void run_types(const Case& c, DType index_dtype) {
  // The atomic path: what the front end sends there (float32/64 unless deterministic, int32, int64) and
  // the 16-bit instantiations it also has; the sorted path: the floating dtypes.
  run<float, I>(c, false, index_dtype);
  run<double, I>(c, false, index_dtype);
  run<int32_t, I>(c, false, index_dtype);
  run<int64_t, I>(c, false, index_dtype);
  run<__half, I>(c, false, index_dtype);
  run<__nv_bfloat16, I>(c, false, index_dtype);
  run<float, I>(c, true, index_dtype);
  run<double, I>(c, true, index_dtype);
  run<__half, I>(c, true, index_dtype);
  run<__nv_bfloat16, I>(c, true, index_dtype);
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const std::vector<Case> cases = {
      {{3, 40, 5}, 1, 7, {}, {}, false, false},           // long runs into few rows
      {{60, 4, 1}, 0, 9, {}, {}, false, true},            // dim 0, bad indices
      {{4, 3, 30}, 2, 11, {}, {1, 1, 3}, false, false},   // the last dim; values a view of a larger tensor
      {{2, 25, 3}, 1, 9, {1, 0, 3}, {}, true, false},     // data larger on the other dims; transposed index
      {{5, 7, 9}, 0, 5, {0, 2, 0}, {2, 0, 1}, true, true},  // all of it
      {{8, 300, 4}, 1, 50, {}, {}, false, false},         // 9600 elements: several CTAs
  };
  for (const Case& c : cases) {
    run_types<int32_t>(c, DType::i32);
    run_types<int64_t>(c, DType::i64);
  }
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
