// indexing.cu's sorted index_add (the backward of embedding and index_select)
// through index_add_sorted_cuda, emulated: index_keys_kernel, the stable key
// sort (emu_cuda.h's host stand-in for cub::DeviceRadixSort), then
// index_add_runs_kernel for rows narrower than kRowAddMin or
// index_add_rows_kernel (a warp per destination row, 16-byte vectors when the
// rows allow) for wider ones. Checked bit for bit against a host reference
// with the kernels' arithmetic: each destination element is its start value
// plus the sum, in index order, of the value rows its indices name,
// accumulated in float (double for float64) and rounded once. Data starts as
// zeros (what the backward passes) or as random values (index_add adds);
// indices repeat (long runs) and some are out of range (skipped, and the
// device error slot holds one of them). Float32, float64, float16, bfloat16;
// int32 and int64 indices; outer 1 and 3; widths on both kernels' paths;
// data or values one element off 16 bytes (the scalar rows path).
//   test_index_add [width]   (one width only)
#include "emu_test.h"
#include "emu_indexing.inc"
#include "index_error_check.h"

#include <algorithm>
#include <chrono>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {


struct Case {
  int64_t outer, count, size, inner;
  bool bad;       // out-of-range indices among them
  bool start;     // data starts as random values (else zeros)
  int misalign;   // 0 none, 1 data base, 2 values base: one element past 16 bytes
};

template <typename T, typename I>
void run(const Case& c, DType index_dtype) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto start = std::chrono::steady_clock::now();
  const int64_t O = c.outer, N = c.count, V = c.size, D = c.inner;
  std::mt19937_64 engine(static_cast<uint64_t>(D * 131 + N * 7 + V + O * 3 + c.misalign + sizeof(T) * 17 +
                                               sizeof(I) + (c.bad ? 5 : 0) + (c.start ? 11 : 0)));
  std::uniform_real_distribution<double> uniform(-2.0, 2.0);
  emu::Buffer<T> data(static_cast<size_t>(O * V * D), "data", c.misalign == 1 ? sizeof(T) : 0, 0);
  std::vector<T> initial(data.n);
  for (size_t i = 0; i < data.n; ++i) {
    data[i] = c.start ? from_double<T>(uniform(engine)) : from_double<T>(0.0);
    initial[i] = data[i];
  }
  emu::Buffer<T> values(static_cast<size_t>(O * N * D), "values", c.misalign == 2 ? sizeof(T) : 0);
  for (size_t i = 0; i < values.n; ++i) values[i] = from_double<T>(uniform(engine));
  emu::Buffer<I> index(static_cast<size_t>(N), "index", 0, 0);
  std::vector<int64_t> bad_values;
  for (int64_t n = 0; n < N; ++n) {
    // Small vocabularies repeat every index many times: runs of many rows.
    int64_t v = static_cast<int64_t>(engine() % static_cast<uint64_t>(V));
    if (c.bad && n % 5 == 3) v = n % 2 == 0 ? -1 - n : V + n;
    index[n] = static_cast<I>(v);
    if (v < 0 || v >= V) bad_values.push_back(v);
  }

  IndexAddArgs args;
  args.data = data.data;
  args.values = values.data;
  args.index = index.data;
  args.dtype = emu_dtype<T>();
  args.index_dtype = index_dtype;
  args.outer = O;
  args.count = N;
  args.inner = D;
  args.data_dim_size = V;
  const size_t bytes = index_add_sorted_workspace_bytes(N);
  emu::Buffer<unsigned char> workspace(bytes, "workspace", 0, 0xff, 64);
  index_add_sorted_cuda(args, workspace.data, bytes, nullptr);
  const IndexError error = index_error_cuda(0, nullptr);
  const IndexError cleared = index_error_cuda(0, nullptr);

  long wrong = 0, first_wrong = -1;
  for (int64_t a = 0; a < O; ++a) {
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t b = 0; b < D; ++b) {
        const size_t at = static_cast<size_t>((a * V + v) * D + b);
        A sum = 0;
        bool named = false;
        for (int64_t n = 0; n < N; ++n) {
          if (static_cast<int64_t>(index[n]) != v) continue;
          named = true;
          sum += static_cast<A>(to_double(values[static_cast<size_t>((a * N + n) * D + b)]));
        }
        // Rows no index names are left as they were.
        const T want = named ? from_double<T>(static_cast<double>(static_cast<A>(to_double(initial[at])) + sum))
                             : initial[at];
        if (std::memcmp(&data[at], &want, sizeof(T)) != 0 && wrong++ == 0) first_wrong = static_cast<long>(at);
      }
    }
  }
  ++checks;
  const bool vectors = D * static_cast<int64_t>(sizeof(T)) % 16 == 0 && c.misalign == 0;
  char label[200];
  std::snprintf(label, sizeof label, "%s/%s outer %ld count %3ld size %3ld inner %3ld %-7s %-6s %-13s %s", name_of<T>(),
                dtype_name(index_dtype).data(), static_cast<long>(O), static_cast<long>(N), static_cast<long>(V),
                static_cast<long>(D), c.bad ? "bad idx" : "", c.start ? "adds" : "zeros",
                c.misalign == 0 ? "aligned" : c.misalign == 1 ? "data+1 elem" : "values+1 elem",
                D < 32 ? "runs kernel" : vectors ? "rows/vectors" : "rows/elements");
  bool ok = wrong == 0;
  if (!ok) std::printf("FAIL %s: %ld of %zu elements differ, first at %ld\n", label, wrong, data.n, first_wrong);
  if (!error_slot_ok(label, error, cleared, bad_values, V)) ok = false;
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
  run<float, I>(c, index_dtype);
  run<double, I>(c, index_dtype);
  run<__half, I>(c, index_dtype);
  run<__nv_bfloat16, I>(c, index_dtype);
}

}  // namespace

int main(int argc, char** argv) {
  emu::install_fault_handler();
  const int64_t only = argc > 1 ? std::atoll(argv[1]) : -1;
  std::vector<Case> cases;
  for (int64_t width : {5, 31, 32, 33, 40, 64, 768}) {
    if (only > 0 && width != only) continue;
    cases.push_back({1, 50, 7, width, false, false, 0});   // an embedding's backward: long runs
    cases.push_back({1, 37, 60, width, true, false, 0});   // bad indices, short runs
    cases.push_back({1, 24, 5, width, false, true, 1});    // adds into data; data one element off
    cases.push_back({3, 19, 6, width, true, true, 2});     // index_select dim 1; values one element off
    cases.push_back({2, 1, 3, width, false, true, 0});     // one index
  }
  for (const Case& c : cases) {
    run_types<int32_t>(c, DType::i32);
    run_types<int64_t>(c, DType::i64);
  }
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
