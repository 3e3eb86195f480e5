// indexing.cu's row gather (gather_rows_kernel: embedding / index_select
// forward, one warp per row, 16-byte vectors when aligned) and, for rows
// shorter than 8, gather_kernel, through gather_cuda, emulated. Checked bit
// for bit against a host gather: every output element written (the output
// starts as 0xff bytes), bad indices (negative, >= size) zero-fill their row
// and raise the device error slot, which index_error_cuda reads and clears;
// no access outside the buffers (guard pages and canaries).
//   test_indexing [width]   (one row width only)
#include "emu_test.h"
#include "emu_indexing.inc"
#include "index_error_check.h"

#include <algorithm>
#include <chrono>
#include <limits>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

struct Case {
  int64_t outer;     // 0: embedding (V, D)[index] -> (N, D); -1: index_select dim 0 of (V, 3, D), whose
                     // last two dims coalesce (rows of 3 D); else index_select dim 1 of (outer, V, D)
  int64_t width;     // D
  int64_t pitch;     // data's row stride (>= D; > D: a view whose rows need not be aligned)
  bool bad;          // index values out of range included
  int misalign;      // 0 none, 1 data base, 2 values base: one element past 16 bytes
};

template <typename E, typename I>
void run(const Case& c, DType dtype, DType index_dtype) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t V = 23, N = 19, O = c.outer <= 0 ? 1 : c.outer, H = c.outer < 0 ? 3 : 1, D = c.width, P = c.pitch;
  std::mt19937_64 engine(static_cast<uint64_t>(D * 131 + P + O * 7 + (c.bad ? 1 : 0) + c.misalign * 3 + sizeof(E)));
  emu::Buffer<E> data(static_cast<size_t>(O * V * H * P), "data", c.misalign == 1 ? sizeof(E) : 0, 0);
  for (size_t i = 0; i < data.n; ++i) {
    // Never all ones: an element the kernel left unwritten (0xff...) cannot pass for data.
    data[i] = static_cast<E>(engine() & (std::numeric_limits<E>::max() >> 1));
  }
  emu::Buffer<I> index(N, "index", 0, 0);
  std::vector<int64_t> bad_values;
  for (int64_t n = 0; n < N; ++n) {
    int64_t v = static_cast<int64_t>(engine() % V);
    if (c.bad && n % 6 == 2) v = (n / 6) % 3 == 0 ? -1 : (n / 6) % 3 == 1 ? V : V + 1000;
    index[n] = static_cast<I>(v);
    if (v < 0 || v >= V) bad_values.push_back(v);
  }
  emu::Buffer<E> values(static_cast<size_t>(O * N * H * D), "values", c.misalign == 2 ? sizeof(E) : 0);

  IndexArgs args;
  args.dim = c.outer <= 0 ? 0 : 1;
  args.data_dim_size = V;
  args.data.data = data.data;
  args.data.dtype = dtype;
  args.index.data = index.data;
  args.index.dtype = index_dtype;
  args.values.data = values.data;
  args.values.dtype = dtype;
  if (c.outer == 0) {
    args.shape.ndim = 2;
    args.shape.sizes[0] = N;
    args.shape.sizes[1] = D;
    const int64_t ds[] = {P, 1}, is[] = {1, 0}, vs[] = {D, 1};
    for (int d = 0; d < 2; ++d) {
      args.data.strides[d] = ds[d];
      args.index.strides[d] = is[d];
      args.values.strides[d] = vs[d];
    }
  } else if (c.outer < 0) {
    args.shape.ndim = 3;
    args.shape.sizes[0] = N;
    args.shape.sizes[1] = H;
    args.shape.sizes[2] = D;
    const int64_t ds[] = {H * P, P, 1}, is[] = {1, 0, 0}, vs[] = {H * D, D, 1};
    for (int d = 0; d < 3; ++d) {
      args.data.strides[d] = ds[d];
      args.index.strides[d] = is[d];
      args.values.strides[d] = vs[d];
    }
  } else {
    args.shape.ndim = 3;
    args.shape.sizes[0] = O;
    args.shape.sizes[1] = N;
    args.shape.sizes[2] = D;
    const int64_t ds[] = {V * P, P, 1}, is[] = {0, 1, 0}, vs[] = {N * D, D, 1};
    for (int d = 0; d < 3; ++d) {
      args.data.strides[d] = ds[d];
      args.index.strides[d] = is[d];
      args.values.strides[d] = vs[d];
    }
  }
  gather_cuda(args, nullptr);
  const IndexError error = index_error_cuda(0, nullptr);
  const IndexError cleared = index_error_cuda(0, nullptr);

  const auto aligned = [](int64_t elements) { return elements * static_cast<int64_t>(sizeof(E)) % 16 == 0; };
  // Rows of D (of 3 D when the dims coalesce, pitch == width), or of D at pitch P (no coalescing).
  const int64_t row = H > 1 && P == D ? H * D : D;
  const bool rows = row >= 8;
  const bool vectors = rows && aligned(row) && aligned(P) && c.misalign == 0 &&
                       (O == 1 || (aligned(V * P) && aligned(N * D))) && (H == 1 || aligned(H * P));
  // The path the production code chose (row_gather is in indexing.cu) must be the one this case means.
  const RowGather chosen = row_gather(flatten_args(args), sizeof(E), args);
  char label[160];
  std::snprintf(label, sizeof label, "%s/%s %-13s D %3ld pitch %3ld %-7s %-12s %s", dtype_name(dtype).data(),
                dtype_name(index_dtype).data(), c.outer == 0 ? "embedding" : c.outer < 0 ? "index_select0" : "index_select1", D, P,
                c.bad ? "bad idx" : "", c.misalign == 0 ? "aligned" : c.misalign == 1 ? "data+1 elem" : "values+1 elem",
                !rows ? "gather_kernel" : vectors ? "rows/vectors" : "rows/elements");
  long wrong = 0, first_wrong = -1;
  for (int64_t o = 0; o < O; ++o) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t v = static_cast<int64_t>(index[n]);
      for (int64_t j = 0; j < H * D; ++j) {
        const int64_t h = j / D, k = j % D;
        const E want = v >= 0 && v < V ? data[((o * V + v) * H + h) * P + k] : E{0};
        const size_t at = static_cast<size_t>((o * N + n) * H * D + j);
        if (std::memcmp(&values[at], &want, sizeof(E)) != 0) {
          if (wrong++ == 0) first_wrong = static_cast<long>(at);
        }
      }
    }
  }
  ++checks;
  bool ok = wrong == 0;
  if (chosen.rows != rows || chosen.vectors != vectors) {
    ok = false;
    std::printf("FAIL %s: the kernel took rows %d vectors %d\n", label, chosen.rows, chosen.vectors);
  }
  if (!ok) std::printf("FAIL %s: %ld of %zu elements differ, first at %ld\n", label, wrong, values.n, first_wrong);
  if (!error_slot_ok(label, error, cleared, bad_values, V)) ok = false;
  if (!ok) {
    ++failures;
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s  %s (%.2f s)\n", ok ? "done" : "FAILED", label,
              error.found ? ("error slot: " + std::to_string(error.value)).c_str() : "no error", seconds);
  std::fflush(stdout);
}

template <typename I>
void run_sizes(const Case& c, DType index_dtype) {
  run<uint8_t, I>(c, DType::u8, index_dtype);
  run<uint16_t, I>(c, DType::f16, index_dtype);
  run<uint32_t, I>(c, DType::f32, index_dtype);
  run<uint64_t, I>(c, DType::f64, index_dtype);
}

int main(int argc, char** argv) {
  emu::install_fault_handler();
  const int64_t only = argc > 1 ? std::atoll(argv[1]) : -1;
  std::vector<Case> cases;
  for (int64_t width : {67, 64, 768, 5}) {
    if (only > 0 && width != only) continue;
    cases.push_back({0, width, width, false, 0});
    cases.push_back({0, width, width, true, 0});
    cases.push_back({0, width, width, true, 1});
    cases.push_back({0, width, width, false, 2});
    cases.push_back({0, width, width + 2, true, 0});
    cases.push_back({3, width, width, true, 0});
    cases.push_back({2, width, width + 1, false, 2});
    cases.push_back({-1, width, width, true, 0});
    cases.push_back({-1, width, width + 8, false, 1});
  }
  for (const Case& c : cases) {
    run_sizes<int32_t>(c, DType::i32);
    run_sizes<int64_t>(c, DType::i64);
  }
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
