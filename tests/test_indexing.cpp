// Indexing and joining/splitting ops (core/ops/indexing.cpp, core/ops/shape.cpp):
// hand-computed values, error messages, gradient accumulation over repeated
// indices, determinism, and CUDA parity (skipped visibly without a GPU). The
// op table (tests/ops_indexing.cpp, tests/ops_shape.cpp) adds gradcheck.
#include <omp.h>

#include <algorithm>
#include <random>

#include "kernels/indexing.h"
#include "tests/support/op_info.h"
#include "tests/support/test_util.h"

namespace kiln::testing {

namespace {

using Floats = std::vector<float>;
using Longs = std::vector<int64_t>;

Tensor floats(const Floats& values, const Shape& shape) { return tensor<float>(values, shape); }
Tensor longs(const Longs& values, const Shape& shape) { return tensor<int64_t>(values, shape); }

void check_error(const std::function<void()>& body, const std::vector<std::string>& words) {
  const std::string message = error_of(body);
  for (const std::string& word : words) {
    CHECK_MESSAGE(message.find(word) != std::string::npos, "expected '" << word << "' in: " << message);
  }
}

Tensor random_floats(const Shape& shape, uint64_t seed) {
  return default_inputs(OpSample{{shape}, ""}, DType::f32, seed)[0];
}

Tensor random_indices(const Shape& shape, int64_t bound, uint64_t seed, DType dtype = DType::i64) {
  std::mt19937_64 engine(seed);
  Longs values(static_cast<size_t>(shape_numel(shape)));
  for (int64_t& v : values) v = static_cast<int64_t>(engine() % static_cast<uint64_t>(bound));
  return longs(values, shape).to(dtype);
}

struct DeterministicGuard {
  explicit DeterministicGuard(bool enabled) : previous(deterministic_algorithms_enabled()) {
    set_deterministic_algorithms(enabled);
  }
  ~DeterministicGuard() { set_deterministic_algorithms(previous); }
  bool previous;
};

struct AnomalyGuard {
  AnomalyGuard() : previous(anomaly_mode_enabled()) { set_detect_anomaly(true); }
  ~AnomalyGuard() { set_detect_anomaly(previous); }
  bool previous;
};

}  // namespace

// ---------------------------------------------------------------- values

TEST_CASE("index_select: hand-computed values on dims 0, 1 and -1, int64 and int32 indices") {
  Tensor x = floats({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  Tensor rows = index_select(x, 0, longs({2, 0, 2}, {3}));
  CHECK(rows.shape() == Shape{3, 3});
  CHECK(rows.to_vector<float>() == Floats{7, 8, 9, 1, 2, 3, 7, 8, 9});
  Tensor cols = index_select(x, 1, tensor<int32_t>({1, 1}, {2}));
  CHECK(cols.shape() == Shape{3, 2});
  CHECK(cols.to_vector<float>() == Floats{2, 2, 5, 5, 8, 8});
  CHECK(index_select(x, -1, longs({2}, {1})).to_vector<float>() == Floats{3, 6, 9});
  // Non-contiguous input: x^T.
  CHECK(index_select(x.t(), 0, longs({1}, {1})).to_vector<float>() == Floats{2, 5, 8});
  Tensor none = index_select(x, 0, longs({}, {0}));
  CHECK(none.shape() == Shape{0, 3});
}

TEST_CASE("gather: torch's documentation example, dims 1 and 0") {
  Tensor x = floats({1, 2, 3, 4}, {2, 2});
  Tensor by_column = gather(x, 1, longs({0, 0, 1, 0}, {2, 2}));
  CHECK(by_column.to_vector<float>() == Floats{1, 1, 4, 3});
  // An index smaller than x on the other dim and longer on the gathered dim.
  Tensor by_row = gather(x, 0, longs({1, 0, 1}, {3, 1}));
  CHECK(by_row.shape() == Shape{3, 1});
  CHECK(by_row.to_vector<float>() == Floats{3, 1, 3});
}

TEST_CASE("scatter_add: torch's documentation examples; the input is not modified") {
  Tensor x = zeros({3, 5});
  Tensor src = ones({2, 5});
  Tensor one_row = scatter_add(x, 0, longs({0, 1, 2, 0, 0}, {1, 5}), src);
  CHECK(one_row.to_vector<float>() == Floats{1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0});
  Tensor two_rows = scatter_add(x, 0, longs({0, 1, 2, 0, 0, 0, 1, 2, 2, 2}, {2, 5}), src);
  CHECK(two_rows.to_vector<float>() == Floats{2, 0, 0, 1, 1, 0, 2, 0, 0, 0, 0, 0, 2, 1, 1});
  CHECK(x.to_vector<float>() == Floats(15, 0.0f));
  // Along the last dim, onto a non-zero input, int32 index, integer dtype.
  Tensor counts = scatter_add(tensor<int64_t>({10, 20}, {1, 2}), 1, tensor<int32_t>({1, 1, 0}, {1, 3}),
                              tensor<int64_t>({1, 2, 3}, {1, 3}));
  CHECK(counts.to_vector<int64_t>() == Longs{13, 23});
}

TEST_CASE("embedding: indices of any shape give rows of the weight") {
  Tensor weight = floats({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor out = embedding(weight, longs({0, 2, 2, 1}, {2, 2}));
  CHECK(out.shape() == Shape{2, 2, 2});
  CHECK(out.to_vector<float>() == Floats{0, 1, 20, 21, 20, 21, 10, 11});
  Tensor single = embedding(weight, longs({1}, {}));
  CHECK(single.shape() == Shape{2});
  CHECK(single.to_vector<float>() == Floats{10, 11});
}

TEST_CASE("cat, stack, split, chunk: hand-computed values") {
  Tensor a = floats({1, 2, 3, 4}, {2, 2});
  Tensor b = floats({5, 6}, {2, 1});
  Tensor joined = cat({a, b}, 1);
  CHECK(joined.shape() == Shape{2, 3});
  CHECK(joined.to_vector<float>() == Floats{1, 2, 5, 3, 4, 6});
  CHECK(cat({a, a.t()}, 0).to_vector<float>() == Floats{1, 2, 3, 4, 1, 3, 2, 4});
  Tensor stacked = stack({a, a}, 2);
  CHECK(stacked.shape() == Shape{2, 2, 2});
  CHECK(stacked.to_vector<float>() == Floats{1, 1, 2, 2, 3, 3, 4, 4});

  Tensor x = arange(7, {.dtype = DType::f32});
  std::vector<Tensor> pieces = split(x, 3);
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[2].to_vector<float>() == Floats{6});
  std::vector<Tensor> sized = split(x, std::vector<int64_t>{1, 0, 6});
  REQUIRE(sized.size() == 3);
  CHECK(sized[1].numel() == 0);
  CHECK(sized[2].to_vector<float>() == Floats{1, 2, 3, 4, 5, 6});
  std::vector<Tensor> chunks = chunk(x, 3);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].to_vector<float>() == Floats{0, 1, 2});
  CHECK(chunks[2].to_vector<float>() == Floats{6});
  CHECK(chunk(arange(2, {.dtype = DType::f32}), 3).size() == 2);  // torch: fewer pieces than chunks
  CHECK(chunk(zeros({0, 2}), 3).size() == 3);
  // Pieces are views: they share x's storage.
  CHECK(pieces[1].storage().get() == x.storage().get());
  CHECK(pieces[1].offset() == 3);
}

TEST_CASE("cat: legacy (0,) tensors are skipped whatever the rank of the others") {
  Tensor a = floats({1, 2, 3, 4}, {2, 2});
  Tensor empty_1d = zeros({0});
  Tensor out = cat({empty_1d, a, empty_1d}, 1);
  CHECK(out.shape() == Shape{2, 2});
  CHECK(out.to_vector<float>() == Floats{1, 2, 3, 4});
  CHECK(cat({empty_1d, empty_1d}).shape() == Shape{0});
  Tensor leaf = zeros({0}).requires_grad_();
  Tensor w = a.detach().requires_grad_();
  cat({w, leaf}, 0).backward(ones({2, 2}));
  REQUIRE(leaf.grad().defined());
  CHECK(leaf.grad().shape() == Shape{0});
  CHECK(w.grad().to_vector<float>() == Floats{1, 1, 1, 1});
}

// ---------------------------------------------------------------- gradients

TEST_CASE("repeated indices accumulate gradient") {
  SUBCASE("index_select") {
    Tensor x = zeros({3, 2}).requires_grad_();
    index_select(x, 0, longs({1, 1, 1, 0}, {4})).backward(floats({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}));
    CHECK(x.grad().to_vector<float>() == Floats{7, 8, 9, 12, 0, 0});
  }
  SUBCASE("embedding") {
    Tensor weight = zeros({4, 1}).requires_grad_();
    embedding(weight, longs({3, 3, 0, 3}, {2, 2})).backward(floats({1, 2, 3, 4}, {2, 2, 1}));
    CHECK(weight.grad().to_vector<float>() == Floats{3, 0, 0, 7});
  }
  SUBCASE("gather") {
    Tensor x = zeros({2, 3}).requires_grad_();
    gather(x, 1, longs({2, 2, 2, 0, 1, 0}, {2, 3})).backward(floats({1, 2, 3, 4, 5, 6}, {2, 3}));
    CHECK(x.grad().to_vector<float>() == Floats{0, 0, 6, 10, 5, 0});
  }
  SUBCASE("scatter_add: src gets gather(grad), x gets grad") {
    Tensor x = zeros({3}).requires_grad_();
    Tensor src = zeros({4}).requires_grad_();
    scatter_add(x, 0, longs({2, 2, 0}, {3}), src).backward(floats({10, 20, 30}, {3}));
    CHECK(x.grad().to_vector<float>() == Floats{10, 20, 30});
    CHECK(src.grad().to_vector<float>() == Floats{30, 30, 10, 0});  // src[3] is not indexed
  }
  SUBCASE("float16 index_add accumulates in float32") {
    // 3000 ones: adding 1 to a float16 2048 rounds back to 2048, a float32 sum does not.
    Tensor weight = zeros({2, 1}, {.dtype = DType::f16}).requires_grad_();
    embedding(weight, zeros({3000}, {.dtype = DType::i64})).backward(ones({3000, 1}, {.dtype = DType::f16}));
    CHECK(weight.grad().to_vector<float>() == Floats{3000, 0});
  }
}

TEST_CASE("the CPU scatter does not depend on the thread count") {
  Tensor x = random_floats({64, 600}, 1);
  Tensor index = random_indices({512, 600}, 64, 2);
  Tensor src = random_floats({512, 600}, 3);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> serial = scatter_add(x, 0, index, src).to_vector<float>();
  omp_set_num_threads(4);
  std::vector<float> parallel = scatter_add(x, 0, index, src).to_vector<float>();
  omp_set_num_threads(threads);
  CHECK(serial == parallel);
}

TEST_CASE("deterministic switch: the CPU ops run and give the same bits") {
  Tensor x = random_floats({50, 8}, 4);
  Tensor index = random_indices({400}, 50, 5);
  auto run = [&]() {
    Tensor leaf = x.detach().requires_grad_();
    index_select(leaf, 0, index).backward(random_floats({400, 8}, 6));
    Tensor by_gather = x.detach().requires_grad_();
    gather(by_gather, 0, random_indices({90, 8}, 50, 7)).backward(random_floats({90, 8}, 8));
    std::vector<float> bits = leaf.grad().to_vector<float>();
    std::vector<float> more = by_gather.grad().to_vector<float>();
    bits.insert(bits.end(), more.begin(), more.end());
    return bits;
  };
  const std::vector<float> free_run = run();
  DeterministicGuard deterministic(true);
  std::vector<float> deterministic_run;
  CHECK_NOTHROW(deterministic_run = run());
  CHECK(deterministic_run == free_run);
}

// ---------------------------------------------------------------- errors

TEST_CASE("errors: an out-of-range index names the op, the dim, the value and the size") {
  Tensor x = zeros({3, 4});
  check_error([&] { index_select(x, 0, longs({0, 5}, {2})); }, {"index_select", "index 5", "dim 0", "size 3"});
  check_error([&] { index_select(x, 1, tensor<int32_t>({-1}, {1})); }, {"index_select", "index -1", "dim 1", "size 4"});
  check_error([&] { gather(x, 1, longs({4}, {1, 1})); }, {"gather", "index 4", "dim 1", "size 4"});
  check_error([&] { scatter_add(x, 0, longs({3}, {1, 1}), ones({1, 1})); },
              {"scatter_add", "index 3", "dim 0", "size 3"});
  check_error([&] { embedding(x, longs({1, 7}, {2})); }, {"embedding", "index 7", "dim 0", "size 3"});
  check_error([&] { embedding(x, longs({-2}, {1, 1})); }, {"embedding", "index -2", "dim 0", "size 3"});
}

TEST_CASE("errors: index dtype, ranks and shapes") {
  Tensor x = zeros({3, 4});
  check_error([&] { index_select(x, 0, zeros({2})); }, {"index_select", "int32 or int64", "float32"});
  check_error([&] { gather(x, 0, zeros({1, 1}, {.dtype = DType::u8})); }, {"gather", "int32 or int64", "uint8"});
  check_error([&] { embedding(x, zeros({2}, {.dtype = DType::f64})); }, {"embedding", "int32 or int64", "float64"});
  check_error([&] { gather(x, 0, longs({0, 1}, {2})); }, {"gather", "same number of dims", "[2]", "[3, 4]"});
  check_error([&] { gather(x, 0, longs({0, 0, 0, 0, 0}, {1, 5})); }, {"gather", "[1, 5]", "[3, 4]", "dim 1"});
  check_error([&] { scatter_add(x, 0, longs({0}, {1, 1}), zeros({1})); },
              {"scatter_add", "same number of dims", "src"});
  check_error([&] { scatter_add(x, 0, longs({0, 0}, {1, 2}), zeros({1, 1})); }, {"scatter_add", "src", "[1, 1]"});
  check_error([&] { scatter_add(x, 0, longs({0}, {1, 1}), zeros({1, 1}, {.dtype = DType::f64})); },
              {"scatter_add", "float32", "float64"});
  const Tensor flags = zeros({2}, {.dtype = DType::b8});
  check_error([&] { scatter_add(flags, 0, longs({0}, {1}), flags.narrow(0, 0, 1)); }, {"scatter_add", "bool"});
  check_error([&] { index_select(x, 0, longs({0, 0}, {1, 2})); }, {"index_select", "1-D", "[1, 2]"});
  check_error([&] { index_select(x, 2, longs({0}, {1})); }, {"index_select", "dim 2"});
  check_error([&] { embedding(zeros({3}), longs({0}, {1})); }, {"embedding", "2-D", "[3]"});
}

TEST_CASE("errors: cat, stack, split and chunk") {
  Tensor a = zeros({2, 3});
  check_error([&] { cat({a, zeros({2, 4})}, 0); }, {"cat", "tensor 1", "[2, 4]", "[2, 3]", "dim 1"});
  check_error([&] { cat({a, a, zeros({2, 3}, {.dtype = DType::f64})}, 0); },
              {"cat", "tensor 2", "float64", "float32"});
  check_error([&] { cat({a, zeros({2, 3, 1})}, 0); }, {"cat", "tensor 1", "3 dims"});
  check_error([&] { cat({}, 0); }, {"cat", "non-empty"});
  check_error([&] { cat({zeros({})}, 0); }, {"cat", "zero-dimensional"});
  check_error([&] { cat({a, a}, 2); }, {"cat", "dim 2"});
  check_error([&] { stack({a, zeros({3, 2})}); }, {"stack", "tensor 1", "[3, 2]", "[2, 3]"});
  check_error([&] { split(a, std::vector<int64_t>{1, 1}, 1); }, {"split", "sum to 2", "size 3"});
  check_error([&] { split(a, 0, 0); }, {"split", "positive"});
  check_error([&] { chunk(a, 0, 0); }, {"chunk", "positive"});
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("CUDA: indexing ops match the CPU on large repeated indices [gpu]") {
  KILN_REQUIRE_GPU();
  // Width 67: rows copied element by element; 64: rows copied in 16-byte vectors (gather_rows_kernel).
  for (int64_t width : {67, 64}) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (DType index_dtype : {DType::i64, DType::i32}) {
      INFO("dtype " << dtype_name(dtype) << ", index " << dtype_name(index_dtype) << ", width " << width);
      const Tolerance tolerance = parity_tolerance(dtype);
      const Tensor weight = random_floats({1000, width}, 21).to(dtype);
      const Tensor index = random_indices({5000}, 1000, 22, index_dtype);
      const Tensor grad = random_floats({5000, width}, 23).to(dtype);
      for (int64_t dim : {0, 1}) {
        Tensor x = dim == 0 ? weight : weight.t();
        Tensor cpu_leaf = x.detach().requires_grad_(), gpu_leaf = x.cuda().detach().requires_grad_();
        Tensor cpu_out = index_select(cpu_leaf, dim, index);
        Tensor gpu_out = index_select(gpu_leaf, dim, index.cuda());
        KILN_CHECK_CLOSE(gpu_out.cpu(), cpu_out, 0.0, 0.0);
        Tensor seed = dim == 0 ? grad : grad.t();
        cpu_out.backward(seed);
        gpu_out.backward(seed.cuda());
        KILN_CHECK_CLOSE(gpu_leaf.grad().cpu(), cpu_leaf.grad(), tolerance.rtol * 4, tolerance.atol * 4);
      }
      Tensor cpu_weight = weight.detach().requires_grad_(), gpu_weight = weight.cuda().detach().requires_grad_();
      Tensor tokens = index.reshape({50, 100});
      KILN_CHECK_CLOSE(embedding(gpu_weight, tokens.cuda()).cpu(), embedding(cpu_weight, tokens), 0.0, 0.0);
      embedding(cpu_weight, tokens).backward(grad.reshape({50, 100, width}));
      embedding(gpu_weight, tokens.cuda()).backward(grad.reshape({50, 100, width}).cuda());
      KILN_CHECK_CLOSE(gpu_weight.grad().cpu(), cpu_weight.grad(), tolerance.rtol * 4, tolerance.atol * 4);

      const Tensor gather_index = random_indices({3000, width}, 1000, 24, index_dtype);
      const Tensor src = random_floats({3000, width}, 25).to(dtype);
      Tensor cpu_x = weight.detach().requires_grad_(), gpu_x = weight.cuda().detach().requires_grad_();
      Tensor cpu_gathered = gather(cpu_x, 0, gather_index);
      Tensor gpu_gathered = gather(gpu_x, 0, gather_index.cuda());
      KILN_CHECK_CLOSE(gpu_gathered.cpu(), cpu_gathered, 0.0, 0.0);
      cpu_gathered.backward(src);
      gpu_gathered.backward(src.cuda());
      KILN_CHECK_CLOSE(gpu_x.grad().cpu(), cpu_x.grad(), tolerance.rtol * 4, tolerance.atol * 4);
      KILN_CHECK_CLOSE(scatter_add(weight.cuda(), 0, gather_index.cuda(), src.cuda()).cpu(),
                       scatter_add(weight, 0, gather_index, src), tolerance.rtol * 4, tolerance.atol * 4);
    }
  }
  }
  // Integer scatter (atomics, exact) and integer gather.
  Tensor counts = scatter_add(zeros({10}, {.dtype = DType::i64}).cuda(), 0, random_indices({5000}, 10, 26).cuda(),
                              ones({5000}, {.dtype = DType::i64}).cuda());
  CHECK(counts.cpu().to_vector<int64_t>() ==
        scatter_add(zeros({10}, {.dtype = DType::i64}), 0, random_indices({5000}, 10, 26),
                    ones({5000}, {.dtype = DType::i64}))
            .to_vector<int64_t>());
}

TEST_CASE("CUDA: deterministic mode gives the same bits on every run [gpu]") {
  KILN_REQUIRE_GPU();
  DeterministicGuard deterministic(true);
  const Tensor x = random_floats({300, 40}, 31).cuda();
  const Tensor index = random_indices({20000, 40}, 300, 32).cuda();
  const Tensor grad = random_floats({20000, 40}, 33).cuda();
  auto run = [&]() {
    Tensor leaf = x.detach().requires_grad_();
    gather(leaf, 0, index).backward(grad);
    return leaf.grad().cpu().to_vector<float>();
  };
  const std::vector<float> first = run();
  CHECK(run() == first);
  CHECK(run() == first);
}

TEST_CASE("CUDA: an out-of-range index sets the device flag; anomaly mode throws [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor x = ones({3, 2}).cuda();
  Tensor bad = longs({0, 9}, {2}).cuda();
  Tensor out = index_select(x, 0, bad);  // asynchronous: no throw
  const kernels::IndexError error = kernels::index_error_cuda(0, cuda::current_stream(0));
  CHECK(error.found);
  CHECK(error.value == 9);
  CHECK(error.size == 3);
  CHECK(out.cpu().to_vector<float>() == Floats{1, 1, 0, 0});
  CHECK_FALSE(kernels::index_error_cuda(0, cuda::current_stream(0)).found);  // reading clears it
  // Rows of 8 floats (32 bytes) take the vector row copy: the bad row is zeros there too.
  Tensor wide = ones({3, 8}).cuda();
  Tensor wide_out = index_select(wide, 0, bad);
  const kernels::IndexError wide_error = kernels::index_error_cuda(0, cuda::current_stream(0));
  CHECK(wide_error.found);
  CHECK(wide_error.value == 9);
  std::vector<float> expected(16, 0.0f);
  std::fill(expected.begin(), expected.begin() + 8, 1.0f);
  CHECK(wide_out.cpu().to_vector<float>() == expected);
  AnomalyGuard anomaly;
  check_error([&] { index_select(x, 0, bad); }, {"index_select", "index 9", "dim 0", "size 3"});
}

TEST_CASE("CUDA: cat, stack and split on the GPU match the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor a = random_floats({4, 5}, 41), b = random_floats({4, 3}, 42);
  KILN_CHECK_CLOSE(cat({a.cuda(), b.cuda()}, 1).cpu(), cat({a, b}, 1), 0.0, 0.0);
  KILN_CHECK_CLOSE(stack({a.cuda(), a.t().contiguous().t().cuda()}, 1).cpu(), stack({a, a}, 1), 0.0, 0.0);
  Tensor leaf = a.cuda().detach().requires_grad_();
  std::vector<Tensor> pieces = split(leaf, 3, 0);
  cat({pieces[1], pieces[0]}, 0).backward(ones({4, 5}).cuda());
  CHECK(leaf.grad().cpu().to_vector<float>() == Floats(20, 1.0f));
  check_error([&] { cat({a.cuda(), b}, 1); }, {"cat", "tensor 1", "cpu"});
}

}  // namespace kiln::testing
