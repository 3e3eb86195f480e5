// Reductions: hand-computed values, dtype rules, layouts, determinism, error
// paths, gradients, and CUDA-vs-CPU parity (skipped visibly without a GPU).
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/support/op_info.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

Tensor f64(const std::vector<double>& v, const Shape& shape) { return tensor<double>(v, shape); }

// arange(n) as float64 of `shape`.
Tensor iota(const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return f64(v, shape);
}

void check_values(const Tensor& t, const std::vector<double>& expected, double tol = 1e-12) {
  std::vector<double> got = values(t);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected[i])) {
      CHECK_MESSAGE(std::isnan(got[i]), "element " << i << ": got " << got[i] << ", expected NaN");
    } else {
      CHECK_MESSAGE(std::abs(got[i] - expected[i]) <= tol * (1 + std::abs(expected[i])),
                    "element " << i << ": got " << got[i] << ", expected " << expected[i]);
    }
  }
}

// Normal values of `shape` in `dtype` from a fixed seed (host generated).
Tensor random(const Shape& shape, DType dtype = DType::f32, uint64_t seed = 5) {
  return default_inputs(OpSample{{shape}, ""}, dtype, seed)[0];
}

std::vector<double> grad_of(const Tensor& x, const Tensor& out) {
  x.set_grad(Tensor());
  out.backward(ones_like(out));
  return values(x.grad());
}

}  // namespace

TEST_CASE("sum: all dims, one dim, keepdim, negative dims") {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor all_sum = sum(x);
  CHECK(all_sum.shape() == Shape{});
  check_values(all_sum, {21});
  check_values(sum(x, {0}), {5, 7, 9});
  check_values(sum(x, {1}), {6, 15});
  check_values(sum(x, {-1}), {6, 15});
  CHECK(sum(x, {1}, true).shape() == Shape{2, 1});
  CHECK(sum(x, {0, 1}, true).shape() == Shape{1, 1});
  check_values(sum(x, {0, 1}), {21});
}

TEST_CASE("sum: a middle dim, non-adjacent dims, a permuted input, an odd size") {
  Tensor x = iota({2, 3, 4});
  std::vector<double> v = values(x);
  std::vector<double> middle(8, 0.0), outer_inner(3, 0.0);
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 3; ++b) {
      for (int c = 0; c < 4; ++c) {
        middle[a * 4 + c] += v[a * 12 + b * 4 + c];
        outer_inner[b] += v[a * 12 + b * 4 + c];
      }
    }
  }
  check_values(sum(x, {1}), middle);
  check_values(sum(x, {0, 2}), outer_inner);
  check_values(sum(x, {2, 0}, true), outer_inner);
  CHECK(sum(x, {0, 2}, true).shape() == Shape{1, 3, 1});
  // A transposed view reduces without a copy and keeps its values.
  Tensor t = x.transpose(0, 2);  // (4, 3, 2)
  std::vector<double> expected(12, 0.0);
  for (int c = 0; c < 4; ++c) {
    for (int b = 0; b < 3; ++b) {
      for (int a = 0; a < 2; ++a) expected[c * 3 + b] += v[a * 12 + b * 4 + c];
    }
  }
  Tensor reduced = sum(t, {2});
  CHECK(reduced.shape() == Shape{4, 3});
  check_values(reduced, expected);
  // A sliced (not permutation-dense) input.
  Tensor sliced = x.slice(2, 0, 4, 2);  // (2, 3, 2)
  check_values(sum(sliced, {}), {v[0] + v[2] + v[4] + v[6] + v[8] + v[10] + v[12] + v[14] + v[16] + v[18] + v[20] + v[22]});
  // (7, 1031): rows longer than a leaf block, odd sizes.
  Tensor odd = iota({7, 1031});
  std::vector<double> rows(7, 0.0), cols(1031, 0.0);
  for (int r = 0; r < 7; ++r) {
    for (int c = 0; c < 1031; ++c) {
      rows[r] += r * 1031 + c;
      cols[c] += r * 1031 + c;
    }
  }
  check_values(sum(odd, {1}), rows);
  check_values(sum(odd, {0}), cols);
}

TEST_CASE("sum: dtypes, empty reductions, accumulation precision") {
  Tensor ints = tensor<int64_t>({1, 2, 3, 4}, {2, 2});
  CHECK(sum(ints).dtype() == DType::i64);
  CHECK(sum(ints).item<int64_t>() == 10);
  Tensor flags = tensor<uint8_t>({1, 0, 1}, {3}).to(DType::b8);
  CHECK(sum(flags).dtype() == DType::i64);
  CHECK(sum(flags).item<int64_t>() == 2);
  CHECK(sum(tensor<int32_t>({7, -2}, {2})).item<int64_t>() == 5);

  Tensor empty_rows = zeros({0, 3});
  Tensor s = sum(empty_rows, {0});
  CHECK(s.shape() == Shape{3});
  check_values(s, {0, 0, 0});
  CHECK(sum(empty_rows, {1}).shape() == Shape{0});
  CHECK(std::isnan(mean(empty_rows, {0}).to_vector<float>()[0]));

  // 4096 ones in float16: a float16 accumulator would stop at 2048.
  CHECK(sum(ones({4096}, {.dtype = DType::f16})).item<float>() == 4096.0f);
  CHECK(sum(ones({64, 4096}, {.dtype = DType::bf16}), {1}).to_vector<float>()[63] == 4096.0f);
  // One million 0.1f values: pairwise float summation stays within a few ulps.
  Tensor tenths = full({1000000}, 0.1, {.dtype = DType::f32});
  const double exact = 1000000.0 * static_cast<double>(0.1f);
  CHECK(std::abs(sum(tenths).item<float>() - exact) / exact < 1e-6);
  Tensor column = full({1000000, 3}, 0.1, {.dtype = DType::f32});
  CHECK(std::abs(sum(column, {0}).to_vector<float>()[2] - exact) / exact < 1e-6);
}

TEST_CASE("sum: the result does not depend on the number of threads") {
  Tensor x = random({3, 200001});
  Tensor y = random({200001, 5});
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> a1 = sum(x, {1}).to_vector<float>(), b1 = sum(y, {0}).to_vector<float>();
  std::vector<float> c1 = sum(x).to_vector<float>();
  omp_set_num_threads(std::max(threads, 4));
  std::vector<float> a2 = sum(x, {1}).to_vector<float>(), b2 = sum(y, {0}).to_vector<float>();
  std::vector<float> c2 = sum(x).to_vector<float>();
  omp_set_num_threads(threads);
  CHECK(a1 == a2);
  CHECK(b1 == b2);
  CHECK(c1 == c2);
}

TEST_CASE("mean and var: unbiased and biased") {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  check_values(mean(x), {3.5});
  check_values(mean(x, {1}), {2, 5});
  Tensor v = f64({1, 2, 3, 4}, {4});
  check_values(var(v), {5.0 / 3.0});
  check_values(var(v, {}, 0), {1.25});
  check_values(var(x, {1}), {1, 1});
  check_values(var(x, {0}, 0), {2.25, 2.25, 2.25});
  CHECK(var(x, {0}, 1, true).shape() == Shape{1, 3});
  check_values(var(f64({5}, {1})), {std::nan("")});  // one element, correction 1: 0 / 0
  Tensor big = full({10000}, 1e4, {.dtype = DType::f32});
  CHECK(var(big).item<float>() == 0.0f);  // two-pass: no cancellation
}

TEST_CASE("amax, amin, max, min: values, NaN, ties") {
  Tensor x = f64({1, 3, 3, 2, 2, 1}, {2, 3});
  check_values(amax(x), {3});
  check_values(amax(x, {1}), {3, 2});
  check_values(amin(x, {0}), {1, 2, 1});
  check_values(max(x), {3});
  check_values(min(x), {1});
  ValuesIndices mx = max(x, 1);
  check_values(mx.values, {3, 2});
  CHECK(mx.indices.dtype() == DType::i64);
  CHECK(mx.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  ValuesIndices mn = min(x, 1, true);
  CHECK(mn.values.shape() == Shape{2, 1});
  CHECK(mn.indices.to_vector<int64_t>() == std::vector<int64_t>{0, 2});
  CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(argmax(x, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0});
  CHECK(argmax(x, -1, true).shape() == Shape{2, 1});
  Tensor ints = tensor<int32_t>({4, -7, 9}, {3});
  CHECK(amax(ints).item<int32_t>() == 9);
  CHECK(amin(ints).item<int32_t>() == -7);
  const double nan = std::nan("");
  Tensor with_nan = f64({1, nan, 5, nan}, {4});
  CHECK(std::isnan(amax(with_nan).item<double>()));
  CHECK(std::isnan(amin(with_nan).item<double>()));
  CHECK(argmax(with_nan, 0).item<int64_t>() == 1);
  // Long rows and a middle dim (several leaf blocks, odd sizes).
  Tensor odd = iota({7, 1031});
  CHECK(argmax(odd, 1).to_vector<int64_t>() == std::vector<int64_t>(7, 1030));
  check_values(amin(odd, {0}).slice(0, 0, 2), {0, 1});
  Tensor middle = iota({3, 5, 2});
  CHECK(argmax(middle, 1).to_vector<int64_t>() == std::vector<int64_t>(6, 4));
}

TEST_CASE("norm: p = 1, 2, inf, -inf, 0, general, over dims") {
  Tensor x = f64({3, -4, 0, 12}, {2, 2});
  check_values(norm(x), {13});
  check_values(norm(x, 1), {19});
  check_values(norm(x, std::numeric_limits<double>::infinity()), {12});
  check_values(norm(x, -std::numeric_limits<double>::infinity()), {0});
  check_values(norm(x, 0), {3});
  check_values(norm(x, 3), {std::cbrt(27.0 + 64.0 + 1728.0)});
  check_values(norm(x, 2, {1}), {5, 12});
  check_values(norm(x, 1, {0}, true), {3, 16});
  CHECK(norm(x, 1, {0}, true).shape() == Shape{1, 2});
  check_values(norm(zeros({0}, {.dtype = DType::f64})), {0});
}

TEST_CASE("all: nonzero over every element, any dtype") {
  CHECK(all(f64({1, 2, 3}, {3})).item<bool>());
  CHECK_FALSE(all(f64({1, 0, 3}, {3})).item<bool>());
  CHECK(all(f64({1, std::nan(""), 3}, {3})).item<bool>());  // NaN is nonzero
  CHECK(all(f64({1, 2, 3}, {3})).dtype() == DType::b8);
  CHECK(all(f64({1, 2, 3}, {3})).shape() == Shape{});
  CHECK(all(zeros({0})).item<bool>());
  CHECK(all(tensor<uint8_t>({1, 1}, {2}).to(DType::b8)).item<bool>());
  CHECK_FALSE(all(tensor<uint8_t>({1, 0}, {2}).to(DType::b8)).item<bool>());
  CHECK_FALSE(all(tensor<int64_t>({5, 0, 2}, {3})).item<bool>());
  Tensor big = ones({3, 100000}, {.dtype = DType::f16});
  CHECK(all(big).item<bool>());
  {
    NoGradGuard no_grad;
    big.narrow(1, 77777, 1).narrow(0, 2, 1).fill_(0);
  }
  CHECK_FALSE(all(big).item<bool>());
}

TEST_CASE("reductions: error paths") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(sum(x, {2}), doctest::Contains("out of range"), Error);
  CHECK_THROWS_WITH_AS(sum(x, {-3}), doctest::Contains("sum: dim -3"), Error);
  CHECK_THROWS_WITH_AS(sum(x, {1, -1}), doctest::Contains("appears more than once"), Error);
  CHECK_THROWS_WITH_AS(mean(tensor<int64_t>({1, 2}, {2})), doctest::Contains("mean: expected a floating input"),
                       Error);
  CHECK_THROWS_WITH_AS(var(tensor<int64_t>({1, 2}, {2})), doctest::Contains("var: expected a floating"), Error);
  CHECK_THROWS_WITH_AS(norm(tensor<int32_t>({1, 2}, {2})), doctest::Contains("int32"), Error);
  CHECK_THROWS_WITH_AS(amax(zeros({0, 3}), {0}), doctest::Contains("amax: cannot reduce over a dim of size 0"),
                       Error);
  CHECK_THROWS_WITH_AS(max(zeros({0})), doctest::Contains("max: cannot reduce"), Error);
  CHECK_THROWS_WITH_AS(argmax(x, 5), doctest::Contains("argmax: dim 5 is out of range"), Error);
  CHECK_THROWS_WITH_AS(var(x, {}, -1), doctest::Contains("correction"), Error);
}

TEST_CASE("reductions: hand-computed gradients") {
  Tensor x = f64({1, 3, 3, 2, 2, 1}, {2, 3}).requires_grad_();
  check_values(tensor<double>(grad_of(x, sum(x, {1})), {6}), {1, 1, 1, 1, 1, 1});
  check_values(tensor<double>(grad_of(x, mean(x, {0})), {6}), {0.5, 0.5, 0.5, 0.5, 0.5, 0.5});
  // amax: ties share the gradient evenly.
  check_values(tensor<double>(grad_of(x, amax(x, {1})), {6}), {0, 0.5, 0.5, 0.5, 0.5, 0});
  check_values(tensor<double>(grad_of(x, max(x)), {6}), {0, 0.5, 0.5, 0, 0, 0});
  check_values(tensor<double>(grad_of(x, amin(x)), {6}), {0.5, 0, 0, 0, 0, 0.5});
  // max over a dim: all of it to the selected (first) index.
  check_values(tensor<double>(grad_of(x, max(x, 1).values), {6}), {0, 1, 0, 1, 0, 0});
  check_values(tensor<double>(grad_of(x, min(x, 0, true).values), {6}), {1, 0, 0, 0, 1, 1});
  // var: 2 (x - mean) / (n - correction); row means 7/3 and 5/3.
  check_values(tensor<double>(grad_of(x, var(x, {1})), {6}), {-4.0 / 3, 2.0 / 3, 2.0 / 3, 1.0 / 3, 1.0 / 3, -2.0 / 3});
  Tensor y = f64({3, -4, 0, 4}, {4}).requires_grad_();
  check_values(tensor<double>(grad_of(y, norm(y)), {4}), {3.0 / std::sqrt(41.0), -4.0 / std::sqrt(41.0), 0, 4.0 / std::sqrt(41.0)});
  check_values(tensor<double>(grad_of(y, norm(y, 1)), {4}), {1, -1, 0, 1});
  check_values(tensor<double>(grad_of(y, norm(y, std::numeric_limits<double>::infinity())), {4}),
               {0, -0.5, 0, 0.5});
  Tensor z = zeros({3}, {.dtype = DType::f64}).requires_grad_();
  check_values(tensor<double>(grad_of(z, norm(z)), {3}), {0, 0, 0});  // torch's subgradient at 0
}

TEST_CASE("reductions: float64 gradcheck on layouts the op table does not cover") {
  Tensor x = random({3, 4, 5}, DType::f64).requires_grad_();
  Tensor permuted = random({5, 4, 3}, DType::f64).permute({2, 1, 0}).detach().requires_grad_();
  for (const Tensor& input : {x, permuted}) {
    INFO("contiguous: " << input.is_contiguous());
    CHECK(gradcheck([](const std::vector<Tensor>& in) { return sum(in[0], {0, 2}); }, {input}) == "");
    CHECK(gradcheck([](const std::vector<Tensor>& in) { return mean(in[0], {1}, true); }, {input}) == "");
    CHECK(gradcheck([](const std::vector<Tensor>& in) { return var(in[0], {0, 2}, 0); }, {input}) == "");
    CHECK(gradcheck([](const std::vector<Tensor>& in) { return amax(in[0], {2, 0}); }, {input}) == "");
    CHECK(gradcheck([](const std::vector<Tensor>& in) { return min(in[0], 1).values; }, {input}) == "");
    CHECK(gradcheck([](const std::vector<Tensor>& in) { return norm(in[0], 3, {1}); }, {input}) == "");
    CHECK(gradcheck([](const std::vector<Tensor>& in) { return norm(in[0], 1.5, {0, 1}); }, {input}) == "");
  }
}

TEST_CASE("reductions: CUDA matches the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  // {5, 4096} over dim -1: rows of whole 16-byte vectors (the vector path with
  // several rows); the others reach it only as one row (dims {}).
  const std::vector<Shape> shapes = {{7, 1031}, {3, 200001}, {5, 4096}, {4097, 3}, {2, 3, 5, 7}, {1}, {0, 3}};
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const Shape& shape : shapes) {
      INFO("dtype " << dtype_name(dtype) << " shape " << shape_str(shape));
      Tensor x = random(shape, dtype);
      Tensor xg = x.cuda();
      const Tolerance tol = parity_tolerance(dtype);
      const double rtol = dtype == DType::f32 ? 1e-5 : tol.rtol;
      std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {-1}};
      if (shape.size() == 4) dim_sets.push_back({0, 2});
      for (const auto& dims : dim_sets) {
        INFO("dims " << shape_str(dims));
        KILN_CHECK_CLOSE(sum(xg, dims).cpu(), sum(x, dims), rtol, 1e-3);
        KILN_CHECK_CLOSE(mean(xg, dims).cpu(), mean(x, dims), rtol, 1e-4);
        KILN_CHECK_CLOSE(var(xg, dims).cpu(), var(x, dims), rtol, 1e-4);
        KILN_CHECK_CLOSE(norm(xg, 2, dims).cpu(), norm(x, 2, dims), rtol, 1e-4);
        KILN_CHECK_CLOSE(norm(xg, 1, dims).cpu(), norm(x, 1, dims), rtol, 1e-3);
        KILN_CHECK_CLOSE(norm(xg, 3, dims).cpu(), norm(x, 3, dims), rtol, 1e-4);
        if (x.numel() > 0) {
          KILN_CHECK_CLOSE(amax(xg, dims).cpu(), amax(x, dims), 0, 0);
          KILN_CHECK_CLOSE(amin(xg, dims).cpu(), amin(x, dims), 0, 0);
          KILN_CHECK_CLOSE(norm(xg, std::numeric_limits<double>::infinity(), dims).cpu(),
                           norm(x, std::numeric_limits<double>::infinity(), dims), 0, 0);
        }
      }
      if (x.numel() > 0) {
        ValuesIndices g = max(xg, -1), c = max(x, -1);
        KILN_CHECK_CLOSE(g.values.cpu(), c.values, 0, 0);
        CHECK(g.indices.cpu().to_vector<int64_t>() == c.indices.to_vector<int64_t>());
        CHECK(argmax(xg, 0).cpu().to_vector<int64_t>() == argmax(x, 0).to_vector<int64_t>());
      }
      CHECK(all(xg).item<bool>() == all(x).item<bool>());
    }
  }
  // Ties and NaN on the device pick the first index, as on the CPU.
  Tensor ties = tensor<double>({1, 3, 3, std::nan(""), 2, std::nan("")}, {2, 3}).cuda();
  CHECK(argmax(ties, 1).cpu().to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK_FALSE(all(tensor<double>({1, 0}, {2}).cuda()).item<bool>());
  // Deterministic: the same bits twice.
  Tensor big = random({1 << 22}).cuda();
  CHECK(sum(big).item<float>() == sum(big).item<float>());
}

TEST_CASE("reductions: CUDA gradients match the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor x = random({6, 37, 5}, DType::f64);
  auto grads = [](Tensor input, int which) {
    input = input.detach().requires_grad_();
    Tensor out;
    switch (which) {
      case 0: out = mean(input, {1}); break;
      case 1: out = var(input, {0, 2}); break;
      case 2: out = amax(input, {1}); break;
      case 3: out = max(input, 2).values; break;
      case 4: out = norm(input, 2, {1}); break;
      case 5: out = norm(input, std::numeric_limits<double>::infinity(), {2}); break;
      default: out = norm(input, 3, {}); break;
    }
    out.backward(ones_like(out));
    return input.grad().cpu();
  };
  for (int which = 0; which < 7; ++which) {
    INFO("case " << which);
    const Tensor fast = grads(x.cuda(), which);
    KILN_CHECK_CLOSE(fast, grads(x, which), 1e-10, 1e-12);
    // The backward kernel's 64-bit index path (tensors of 2^31 elements or more): the same bits.
    const Force64BitIndex force;
    KILN_CHECK_CLOSE(grads(x.cuda(), which), fast, 0.0, 0.0);
  }
}

}  // namespace kiln::testing
