// Elementwise ops (core/ops/elementwise.cpp, kernels/*/elementwise*): values
// against hand-computed expectations, broadcasting, integer and 16-bit dtypes,
// error messages, in-place methods (version counter, autograd refusals),
// backward formulas, and CUDA-vs-CPU parity (skipped visibly without a GPU).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "kernels/elementwise.h"
#include "kernels/strided.h"
#include "kernels/cuda/runtime.h"
#include "tests/support/test_util.h"

namespace kiln {
namespace {

using doctest::Contains;

Tensor f32(const std::vector<float>& values, const Shape& shape) { return tensor<float>(values, shape); }

// A contiguous tensor as a kernel operand over its flat elements.
kernels::Operand dense_operand(const Tensor& t) {
  kernels::Operand operand;
  operand.data = t.data_ptr();
  operand.dtype = t.dtype();
  operand.strides[0] = 1;
  return operand;
}
Tensor f64(const std::vector<double>& values, const Shape& shape) { return tensor<double>(values, shape); }

// start, start + step, ... as `dtype` in `shape`, built without any op.
Tensor ramp(const Shape& shape, double start = 0, double step = 1, DType dtype = DType::f32) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = start + step * static_cast<double>(i);
  return tensor<double>(values, shape).to(dtype);
}

std::vector<double> doubles(const Tensor& t) { return t.to_vector<double>(); }

void check_values(const Tensor& actual, const std::vector<double>& expected, double rtol = 1e-6,
                  double atol = 1e-6) {
  std::vector<double> values = doubles(actual);
  REQUIRE(values.size() == expected.size());
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("element " << i);
    if (std::isnan(expected[i])) {
      CHECK(std::isnan(values[i]));
    } else if (std::isinf(expected[i])) {
      CHECK(values[i] == expected[i]);
    } else {
      CHECK(std::abs(values[i] - expected[i]) <= atol + rtol * std::abs(expected[i]));
    }
  }
}

using testing::error_of;

}  // namespace

// ---------------------------------------------------------------- values

TEST_CASE("elementwise: arithmetic values") {
  Tensor a = f32({1, 2, 3, 4}, {4});
  Tensor b = f32({0.5f, -1, 2, 8}, {4});
  check_values(add(a, b), {1.5, 1, 5, 12});
  check_values(add(a, b, 2.0), {2, 0, 7, 20});
  check_values(sub(a, b), {0.5, 3, 1, -4});
  check_values(sub(a, b, 0.5), {0.75, 2.5, 2, 0});
  check_values(mul(a, b), {0.5, -2, 6, 32});
  check_values(div(a, b), {2, -2, 1.5, 0.5});
  check_values(add(a, 1.5), {2.5, 3.5, 4.5, 5.5});
  check_values(mul(a, -2.0), {-2, -4, -6, -8});
  check_values(div(a, 4.0), {0.25, 0.5, 0.75, 1});
  check_values(maximum(a, b), {1, 2, 3, 8});
  check_values(minimum(a, b), {0.5, -1, 2, 4});
  check_values(neg(b), {-0.5, 1, -2, -8});
  check_values(abs(b), {0.5, 1, 2, 8});
  // operators
  check_values(a + b, {1.5, 1, 5, 12});
  check_values(a - b, {0.5, 3, 1, -4});
  check_values(a * b, {0.5, -2, 6, 32});
  check_values(a / b, {2, -2, 1.5, 0.5});
  check_values(-a, {-1, -2, -3, -4});
  check_values(a + 1.0, {2, 3, 4, 5});
  check_values(a - 1.0, {0, 1, 2, 3});
  check_values(a * 3.0, {3, 6, 9, 12});
  check_values(3.0 * a, {3, 6, 9, 12});
  check_values(a / 2.0, {0.5, 1, 1.5, 2});
  // NaN propagates through maximum/minimum (as torch)
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor with_nan = f32({nan, 1}, {2});
  Tensor ones2 = f32({0, nan}, {2});
  check_values(maximum(with_nan, ones2), {NAN, NAN});
  check_values(minimum(with_nan, ones2), {NAN, NAN});
}

TEST_CASE("elementwise: math functions and activations against hand-computed values") {
  Tensor x = f64({-2, -1, 0, 0.5, 1, 3}, {6});
  check_values(exp(x), {std::exp(-2.0), std::exp(-1.0), 1, std::exp(0.5), std::exp(1.0), std::exp(3.0)}, 1e-14);
  Tensor p = f64({0.25, 1, 4, 9}, {4});
  check_values(log(p), {std::log(0.25), 0, std::log(4.0), std::log(9.0)}, 1e-14);
  check_values(sqrt(p), {0.5, 1, 2, 3}, 1e-14);
  check_values(rsqrt(p), {2, 1, 0.5, 1.0 / 3}, 1e-14);
  check_values(pow(p, 2.0), {0.0625, 1, 16, 81}, 1e-14);
  check_values(pow(p, 0.5), {0.5, 1, 2, 3}, 1e-14);
  check_values(pow(p, -1.0), {4, 1, 0.25, 1.0 / 9}, 1e-14);
  check_values(pow(p, 0.0), {1, 1, 1, 1});
  check_values(pow(p, f64({1, 2, 0.5, -0.5}, {4})), {0.25, 1, 2, 1.0 / 3}, 1e-14);
  check_values(relu(x), {0, 0, 0, 0.5, 1, 3});
  check_values(sigmoid(f64({0, 2}, {2})), {0.5, 1 / (1 + std::exp(-2.0))}, 1e-14);
  check_values(tanh(f64({0, 0.5}, {2})), {0, 0.46211715726000974}, 1e-14);
  check_values(silu(f64({-1, 0, 1}, {3})), {-0.2689414213699951, 0, 0.7310585786300049}, 1e-14);
  // gelu: exact (erf) and the tanh approximation differ in the 4th digit.
  Tensor g = f64({-1, 0, 1, 2}, {4});
  check_values(gelu(g), {-0.15865525393145707, 0, 0.8413447460685429, 1.9544997361036416}, 1e-14);
  check_values(gelu(g, "tanh"), {-0.15880800939172324, 0, 0.8411919906082768, 1.954597694087775}, 1e-14);
  CHECK(std::abs(gelu(g).to_vector<double>()[2] - gelu(g, "tanh").to_vector<double>()[2]) > 1e-4);
  // large inputs saturate instead of overflowing
  check_values(sigmoid(f32({-100, 100}, {2})), {0, 1});
  check_values(silu(f32({-100, 100}, {2})), {0, 100});
  check_values(tanh(f32({-100, 100}, {2})), {-1, 1});
}

TEST_CASE("elementwise: clamp bounds") {
  Tensor x = f32({-3, -1, 0, 1, 3}, {5});
  check_values(clamp(x, -1.5, 2.0), {-1.5, -1, 0, 1, 2});
  check_values(clamp(x, 0.0, std::nullopt), {0, 0, 0, 1, 3});
  check_values(clamp(x, std::nullopt, 0.5), {-3, -1, 0, 0.5, 0.5});
  check_values(clamp(x, 2.0, 1.0), {1, 1, 1, 1, 1});  // min > max gives max everywhere (as torch)
  check_values(clamp(f32({NAN}, {1}), 0.0, 1.0), {NAN});
  Tensor ints = tensor<int32_t>({-5, 0, 2, 7}, {4});
  CHECK(clamp(ints, -1.5, 4.5).to_vector<int32_t>() == std::vector<int32_t>{-1, 0, 2, 4});
  CHECK(clamp(ints, std::nullopt, 1.0).to_vector<int32_t>() == std::vector<int32_t>{-5, 0, 1, 1});
  CHECK_THROWS_WITH_AS(clamp(x, std::nullopt, std::nullopt), Contains("at least one of min and max"), Error);
}

TEST_CASE("elementwise: where, comparisons, isfinite") {
  Tensor condition = tensor<uint8_t>({1, 0, 1}, {3}).to(DType::b8);
  Tensor a = f32({1, 2, 3}, {3});
  Tensor b = f32({10, 20, 30}, {3});
  check_values(where(condition, a, b), {1, 20, 3});
  // broadcast condition (2,1) against a (3) and a 0-d b
  Tensor column = tensor<uint8_t>({1, 0}, {2, 1}).to(DType::b8);
  Tensor w = where(column, a, scalar_tensor(-1.0));
  CHECK(w.shape() == Shape{2, 3});
  check_values(w, {1, 2, 3, -1, -1, -1});

  Tensor x = f32({1, 2, 3}, {3});
  Tensor y = f32({3, 2, 1}, {3});
  CHECK(eq(x, y).dtype() == DType::b8);
  CHECK(eq(x, y).to_vector<bool>() == std::vector<bool>{false, true, false});
  CHECK(ne(x, y).to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(lt(x, y).to_vector<bool>() == std::vector<bool>{true, false, false});
  CHECK(le(x, y).to_vector<bool>() == std::vector<bool>{true, true, false});
  CHECK(gt(x, y).to_vector<bool>() == std::vector<bool>{false, false, true});
  CHECK(ge(x, y).to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK(eq(x, 2.0).to_vector<bool>() == std::vector<bool>{false, true, false});
  CHECK(gt(x, 1.5).to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK(lt(x, 1.5).to_vector<bool>() == std::vector<bool>{true, false, false});
  // integer tensors compare exactly with non-integral scalars
  Tensor ints = tensor<int64_t>({0, 1, 2}, {3});
  CHECK(eq(ints, 0.5).to_vector<bool>() == std::vector<bool>{false, false, false});
  CHECK(gt(ints, 0.5).to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK(lt(tensor<uint8_t>({0, 200}, {2}), -1.0).to_vector<bool>() == std::vector<bool>{false, false});
  // bool tensors compare too
  CHECK(eq(condition, condition).to_vector<bool>() == std::vector<bool>{true, true, true});

  const float inf = std::numeric_limits<float>::infinity();
  Tensor special = f32({1, inf, -inf, NAN, -0.0f}, {5});
  CHECK(isfinite(special).to_vector<bool>() == std::vector<bool>{true, false, false, false, true});
  CHECK(isfinite(tensor<int32_t>({1, 2}, {2})).to_vector<bool>() == std::vector<bool>{true, true});
  CHECK(isfinite(special.to(DType::f16)).to_vector<bool>() == std::vector<bool>{true, false, false, false, true});
}

TEST_CASE("elementwise: cast converts dtype and carries the gradient back") {
  Tensor x = f32({1.5f, -2.75f, 3}, {3});
  Tensor as_int = cast(x, DType::i32);
  CHECK(as_int.dtype() == DType::i32);
  CHECK(as_int.to_vector<int32_t>() == std::vector<int32_t>{1, -2, 3});
  CHECK(cast(x, DType::f32).same(x));
  Tensor leaf = f32({1, 2}, {2}).requires_grad_();
  Tensor wide = cast(leaf, DType::f64);
  CHECK(wide.dtype() == DType::f64);
  CHECK(wide.grad_fn()->name() == "cast");
  mul(wide, f64({3, 4}, {2})).backward(f64({1, 1}, {2}));
  REQUIRE(leaf.grad().defined());
  CHECK(leaf.grad().dtype() == DType::f32);
  check_values(leaf.grad(), {3, 4});
  CHECK_FALSE(cast(leaf, DType::i64).requires_grad());
}

TEST_CASE("elementwise: a cast to bool is true for any nonzero value of the source type") {
  // Doubles below float's range, and int64 values, are nonzero as they are (torch: True).
  Tensor tiny = f64({1e-50, -1e-300, 0.0, -0.0, 5e-324}, {5});
  std::vector<bool> expected{true, true, false, false, true};
  Tensor as_bool = cast(tiny, DType::b8);
  for (size_t i = 0; i < expected.size(); ++i) CHECK(as_bool.to_vector<bool>()[i] == expected[i]);
  Tensor strided = cast(tiny.slice(0, 0, 5, 2), DType::b8);  // the element-by-element path too
  CHECK(strided.to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(cast(tensor<int64_t>({int64_t{1} << 62, 0}, {2}), DType::b8).to_vector<bool>() == std::vector<bool>{true, false});
}

// ---------------------------------------------------------------- broadcasting and layouts

TEST_CASE("elementwise: broadcasting shapes and values") {
  Tensor a = ramp({3, 1, 5});        // a[i][0][k] = 5i + k
  Tensor b = ramp({4, 5}, 0, 100);   // b[j][k] = 100 (5j + k)
  Tensor out = add(a, b);
  CHECK(out.shape() == Shape{3, 4, 5});
  std::vector<double> values = doubles(out);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 5; ++k) {
        CHECK(values[(i * 4 + j) * 5 + k] == (5 * i + k) + 100 * (5 * j + k));
      }
    }
  }
  CHECK(mul(scalar_tensor(2.0), ramp({2, 3})).shape() == Shape{2, 3});
  CHECK(add(ramp({0, 3}), ramp({3})).shape() == Shape{0, 3});
  CHECK(add(ramp({1}), ramp({0})).shape() == Shape{0});
  CHECK(gt(ramp({2, 1}), ramp({1, 3})).shape() == Shape{2, 3});
  CHECK_THROWS_WITH_AS(add(ramp({2, 3}), ramp({4})), Contains("add: shapes [2, 3] and [4] cannot be broadcast"),
                       Error);
  CHECK_THROWS_WITH_AS(mul(ramp({0, 3}), ramp({2, 3})), Contains("[0, 3] and [2, 3]"), Error);
}

TEST_CASE("elementwise: non-contiguous, offset and large inputs give the same values as contiguous ones") {
  Tensor base = ramp({64, 33}, -500, 0.5);
  Tensor transposed = base.t();  // (33, 64), strided
  Tensor reference = transposed.contiguous();
  // float32 exp and tanh take Eigen's vectorized path when dense, libm when strided.
  KILN_CHECK_CLOSE(exp(div(transposed, 100.0)), exp(div(reference, 100.0)), 1e-6, 0);
  KILN_CHECK_CLOSE(mul(transposed, transposed), mul(reference, reference), 0, 0);
  Tensor shifted = base.flatten().narrow(0, 1, 2000);  // offset by one element
  KILN_CHECK_CLOSE(relu(shifted), relu(shifted.contiguous()), 0, 0);
  // Above the OpenMP threshold, strided and contiguous.
  Tensor big = ramp({300, 700}, -1, 1e-5);
  Tensor big_t = big.t();
  KILN_CHECK_CLOSE(tanh(big_t), tanh(big_t.contiguous()), 1e-6, 1e-7);
  std::vector<double> sums = doubles(add(big, big));
  std::vector<double> expected = doubles(big);
  bool all_equal = true;
  for (size_t i = 0; i < sums.size(); ++i) all_equal = all_equal && sums[i] == 2 * expected[i];
  CHECK(all_equal);
}

namespace {
// The values of x.permute(dims).contiguous() for x = ramp(shape), by index arithmetic.
std::vector<double> permuted_ramp(const Shape& shape, const std::vector<int64_t>& dims) {
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> source_strides(static_cast<size_t>(rank), 1);
  for (int64_t d = rank - 2; d >= 0; --d) source_strides[d] = source_strides[d + 1] * shape[d + 1];
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);  // over the permuted shape
  for (double& value : values) {
    int64_t offset = 0;
    for (int64_t d = 0; d < rank; ++d) offset += index[d] * source_strides[dims[d]];
    value = static_cast<double>(offset);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++index[d] < shape[dims[d]]) break;
      index[d] = 0;
    }
  }
  return values;
}
}  // namespace

TEST_CASE("copy: transposes and permutes (copied tile by tile on the CPU) give every element, with and without a cast") {
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  // Tile edges (32) crossed and missed, above the OpenMP threshold, 3-D and 4-D
  // permutes (NCHW -> NHWC), and a source stride too small to tile.
  const std::vector<Case> cases = {{{67, 45}, {1, 0}},        {{32, 64}, {1, 0}},           {{513, 301}, {1, 0}},
                                   {{5, 37, 41}, {2, 0, 1}},  {{5, 37, 41}, {1, 2, 0}},     {{3, 40, 7, 9}, {0, 2, 3, 1}},
                                   {{6, 33, 35}, {0, 2, 1}},  {{100, 3}, {1, 0}}};
  for (const Case& c : cases) {
    INFO("shape " << shape_str(c.shape) << " dims " << c.dims.size());
    const std::vector<double> expected = permuted_ramp(c.shape, c.dims);
    Tensor x = ramp(c.shape);
    Tensor permuted = x.permute(c.dims);
    CHECK(doubles(permuted.contiguous()) == expected);
    CHECK(doubles(permuted.to(DType::f64)) == expected);  // a cast through the same strides
    // bfloat16 rounds these integers: against the contiguous (untiled) cast of the expected values.
    const std::vector<double> expected16 =
        doubles(tensor<double>(expected, {static_cast<int64_t>(expected.size())}).to(DType::bf16));
    CHECK(doubles(permuted.to(DType::bf16)) == expected16);
    CHECK(doubles(x.to(DType::bf16).permute(c.dims).contiguous()) == expected16);
    // 8-byte elements (no register transpose), same type and cast to float32.
    Tensor x64 = x.to(DType::i64);
    CHECK(doubles(x64.permute(c.dims).contiguous()) == expected);
    CHECK(doubles(x64.permute(c.dims).to(DType::f32)) == expected);
  }
  // The destination strided, the source dense: copy_ into a transposed view.
  Tensor storage = zeros({45, 67});
  Tensor source = ramp({67, 45});
  storage.t().copy_(source);
  CHECK(doubles(storage) == permuted_ramp({67, 45}, {1, 0}));
}

TEST_CASE("copy: CUDA transposes and permutes (shared-memory tiles) give every element, each element size [gpu]") {
  KILN_REQUIRE_GPU();
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  // Tile edges (32) crossed and missed, 3-D and 4-D permutes (NCHW <-> NHWC), several
  // rest indices, and a source stride under 64 bytes (the elementwise kernel instead).
  const std::vector<Case> cases = {{{67, 65}, {1, 0}},           {{513, 301}, {1, 0}},     {{5, 70, 41}, {2, 0, 1}},
                                   {{3, 70, 9, 8}, {0, 2, 3, 1}}, {{3, 9, 8, 70}, {0, 3, 1, 2}}, {{100, 3}, {1, 0}}};
  for (const Case& c : cases) {
    INFO("shape " << shape_str(c.shape));
    for (DType dtype : {DType::u8, DType::bf16, DType::f32, DType::i64}) {
      INFO(dtype_name(dtype));
      // Against the CPU's permute of the same values (checked by index arithmetic above).
      Tensor x = ramp(c.shape, 0, 1, DType::i64).to(dtype);  // i64 -> u8 wraps, defined
      const std::vector<double> want = doubles(x.permute(c.dims).contiguous());
      CHECK(doubles(x.cuda().permute(c.dims).contiguous().cpu()) == want);
      if (dtype == DType::f32 || dtype == DType::i64) CHECK(want == permuted_ramp(c.shape, c.dims));
    }
  }
}

TEST_CASE("copy: CUDA column slices into and out of wider rows (one 2-D copy) give every element, gaps kept [gpu]") {
  KILN_REQUIRE_GPU();
  for (DType dtype : {DType::u8, DType::bf16, DType::f32, DType::i64}) {
    INFO(dtype_name(dtype));
    const Tensor wide = ramp({37, 41}, 0, 1, DType::i64).to(dtype);  // i64 -> u8 wraps, defined
    // Out of wider rows: a narrowed last dim made contiguous.
    CHECK(doubles(wide.cuda().slice(1, 2, 39).contiguous().cpu()) == doubles(wide.slice(1, 2, 39).contiguous()));
    // Into wider rows: the columns outside the slice keep their values.
    const Tensor block = ramp({37, 37}, 100, 1, DType::i64).to(dtype);
    Tensor target = full({37, 41}, 7.0, {.dtype = dtype, .device = Device::cuda()});
    target.slice(1, 3, 40).copy_(block.cuda());
    Tensor expected = full({37, 41}, 7.0, {.dtype = dtype});
    expected.slice(1, 3, 40).copy_(block);
    CHECK(doubles(target.cpu()) == doubles(expected));
  }
}

TEST_CASE("elementwise: the dense fast path (float32; 16-bit widened to float) agrees with the strided path, inf and NaN included") {
  // (2, n): row 0 a sweep over [-20, 20], row 1 the special values.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values;
  for (int i = 0; i < 4000; ++i) values.push_back(-20.0f + 0.01f * static_cast<float>(i));
  std::vector<float> special = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-4f, -1e-4f, 88.0f, 89.0f, -88.0f, -104.0f,
                                inf, -inf, NAN, 1e30f, -1e30f};
  special.resize(4000, 0.5f);
  values.insert(values.end(), special.begin(), special.end());
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
  INFO(dtype_name(dtype));
  Tensor dense = f32(values, {2, 4000}).to(dtype);
  Tensor strided = dense.t().contiguous().t();  // same values, column-major
  REQUIRE_FALSE(strided.is_contiguous());
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }},
      {"sin", [](const Tensor& x) { return sin(x); }},
      {"cos", [](const Tensor& x) { return cos(x); }},
  };
  for (const auto& [name, fn] : ops) {
    INFO(std::string(name));
    // Both paths compute in float and round once: 16-bit results differ at
    // most where Eigen's and libm's float results straddle a rounding point.
    const testing::Tolerance tolerance = testing::parity_tolerance(dtype);
    KILN_CHECK_CLOSE(fn(dense), fn(strided), tolerance.rtol, tolerance.atol);
    // The backward kernels: dense operands take the packet path, strided ones libm.
    if (std::string(name) == "log") continue;  // NaN gradients on the negative sweep either way
    Tensor x_dense = dense.clone().requires_grad_();
    Tensor column_major = dense.t().contiguous().requires_grad_();  // x_strided is its transpose
    const Tensor x_strided = column_major.t();
    REQUIRE_FALSE(x_strided.is_contiguous());
    const Tensor seed = add(mul(dense, 0.1), 0.5);  // a dense upstream gradient
    fn(x_dense).backward(seed);
    fn(x_strided).backward(seed);
    KILN_CHECK_CLOSE(x_dense.grad(), column_major.grad().t(), tolerance.rtol, tolerance.atol);
  }
  }
}

TEST_CASE("elementwise: a dense kernel writing over its own input computes from the unchanged input") {
  // exp, sigmoid, silu and the activation backwards use their output as a
  // scratch first (kernels/cpu/dense_block.h); with out == an input the block
  // must still read the input as it was. Called at the kernel level: no op of
  // the front end runs these in place today.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values;
  for (int i = 0; i < 3000; ++i) values.push_back(-110.0f + 0.07f * static_cast<float>(i));
  values.push_back(-inf);
  const Shape shape = {static_cast<int64_t>(values.size())};
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    const Tensor x = f32(values, shape).to(dtype);
    for (auto [op, expected] : {std::pair{kernels::UnaryOp::exp, exp(x)}, std::pair{kernels::UnaryOp::sigmoid, sigmoid(x)},
                                std::pair{kernels::UnaryOp::silu, silu(x)}}) {
      INFO("unary op " << static_cast<int>(op));
      Tensor in_place = x.clone();
      const kernels::Operand operand = dense_operand(in_place);
      kernels::unary_cpu(op, kernels::IterShape{.ndim = 1, .sizes = {in_place.numel()}}, operand, operand, 0, 0);
      KILN_CHECK_CLOSE(in_place, expected, 0, 0);
    }
    // gelu's backward with the output over the upstream gradient (dout).
    const Tensor dout = add(mul(x, 0.01), 0.5);
    Tensor leaf = x.clone().requires_grad_();
    gelu(leaf).backward(dout);
    Tensor in_place = dout.clone();
    const kernels::Operand out_operand = dense_operand(in_place), x_operand = dense_operand(x);
    kernels::binary_cpu(kernels::BinaryOp::gelu_backward, kernels::IterShape{.ndim = 1, .sizes = {in_place.numel()}},
                        out_operand, out_operand, x_operand, 0, 0);
    KILN_CHECK_CLOSE(in_place, leaf.grad(), 0, 0);
  }
}

// ---------------------------------------------------------------- dtypes

TEST_CASE("elementwise: integer arithmetic, and floating-only ops refuse integers") {
  Tensor a = tensor<int64_t>({1, -2, 3}, {3});
  Tensor b = tensor<int64_t>({10, 20, 30}, {3});
  CHECK(add(a, b).to_vector<int64_t>() == std::vector<int64_t>{11, 18, 33});
  CHECK(add(a, b, 2).to_vector<int64_t>() == std::vector<int64_t>{21, 38, 63});
  CHECK(sub(a, b).to_vector<int64_t>() == std::vector<int64_t>{-9, -22, -27});
  CHECK(mul(a, b).to_vector<int64_t>() == std::vector<int64_t>{10, -40, 90});
  CHECK(maximum(a, b).to_vector<int64_t>() == std::vector<int64_t>{10, 20, 30});
  CHECK(relu(a).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 3});
  CHECK(abs(a).to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
  CHECK(neg(a).to_vector<int64_t>() == std::vector<int64_t>{-1, 2, -3});
  CHECK(mul(a, 3.0).to_vector<int64_t>() == std::vector<int64_t>{3, -6, 9});
  CHECK(add(a, -1.0).to_vector<int64_t>() == std::vector<int64_t>{0, -3, 2});
  // uint8 wraps like torch, also for alpha = -1
  Tensor u = tensor<uint8_t>({5, 250}, {2});
  CHECK(sub(u, tensor<uint8_t>({6, 10}, {2})).to_vector<uint8_t>() == std::vector<uint8_t>{255, 240});
  CHECK(add(u, tensor<uint8_t>({10, 10}, {2})).to_vector<uint8_t>() == std::vector<uint8_t>{15, 4});
  Tensor i32 = tensor<int32_t>({7}, {1});
  CHECK(mul(i32, i32).to_vector<int32_t>() == std::vector<int32_t>{49});

  CHECK_THROWS_WITH_AS(exp(a), Contains("exp: expected a floating tensor"), Error);
  CHECK_THROWS_WITH_AS(exp(a), Contains("int64"), Error);
  CHECK_THROWS_WITH_AS(div(a, b), Contains("div: expected a floating tensor"), Error);
  CHECK_THROWS_WITH_AS(sigmoid(tensor<int32_t>({}, {0})), Contains("sigmoid: expected a floating"), Error);
  CHECK_THROWS_WITH_AS(mul(a, 0.5), Contains("mul: scalar 0.5 is not an integer"), Error);
  CHECK_THROWS_WITH_AS(add(a, b, 0.5), Contains("alpha 0.5 is not an integer"), Error);
  Tensor flags = tensor<uint8_t>({1}, {1}).to(DType::b8);
  CHECK_THROWS_WITH_AS(add(flags, flags), Contains("add: expected a numeric tensor"), Error);
  CHECK_THROWS_WITH_AS(neg(flags), Contains("bool"), Error);
}

TEST_CASE("elementwise: float16 and bfloat16 results are within their tolerance of float32") {
  Tensor x = ramp({257}, -4, 1.0 / 32);
  Tensor y = ramp({257}, 0.5, 1.0 / 64);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"exp", [](const Tensor& a, const Tensor&) { return exp(a); }},
      {"log", [](const Tensor&, const Tensor& b) { return log(b); }},
      {"sqrt", [](const Tensor&, const Tensor& b) { return sqrt(b); }},
      {"gelu", [](const Tensor& a, const Tensor&) { return gelu(a); }},
      {"gelu tanh", [](const Tensor& a, const Tensor&) { return gelu(a, "tanh"); }},
      {"silu", [](const Tensor& a, const Tensor&) { return silu(a); }},
      {"sigmoid", [](const Tensor& a, const Tensor&) { return sigmoid(a); }},
      {"tanh", [](const Tensor& a, const Tensor&) { return tanh(a); }},
      {"pow", [](const Tensor&, const Tensor& b) { return pow(b, 1.5); }},
      {"clamp", [](const Tensor& a, const Tensor&) { return clamp(a, -1.0, 1.0); }},
  };
  for (const auto& [name, fn] : ops) {
    for (DType dtype : {DType::f16, DType::bf16}) {
      INFO(name << " in " << dtype_name(dtype));
      // Inputs rounded to the 16-bit dtype, so only the op's own rounding differs.
      Tensor xs = x.to(dtype), ys = y.to(dtype);
      Tensor low = fn(xs, ys);
      CHECK(low.dtype() == dtype);
      Tensor reference = fn(xs.to(DType::f32), ys.to(DType::f32));
      // One rounding of the result: half an ulp, relative 2^-11 (f16) or 2^-8 (bf16).
      const double rtol = dtype == DType::f16 ? 1e-3 : 8e-3;
      KILN_CHECK_CLOSE(low.to(DType::f32), reference, rtol, 1e-5);
    }
  }
}

// ---------------------------------------------------------------- errors

TEST_CASE("elementwise: error messages name the op, shapes, dtypes and devices") {
  Tensor a = ramp({2, 3});
  Tensor d = ramp({2, 3}, 0, 1, DType::f64);
  std::string message = error_of([&] { add(a, d); });
  CHECK(message.find("add") != std::string::npos);
  CHECK(message.find("same dtype") != std::string::npos);
  CHECK(message.find("float32") != std::string::npos);
  CHECK(message.find("float64") != std::string::npos);
  CHECK(message.find("[2, 3]") != std::string::npos);
  CHECK_THROWS_WITH_AS(where(a, a, a), Contains("where: expected a bool condition"), Error);
  CHECK_THROWS_WITH_AS(gelu(a, "fast"), Contains("gelu: approximate must be \"none\" or \"tanh\""), Error);
  CHECK_THROWS_WITH_AS(mul(a, Tensor()), Contains("mul: the second operand is an undefined tensor"), Error);
  CHECK_THROWS_WITH_AS(exp(Tensor()), Contains("exp: input is an undefined tensor"), Error);
  CHECK_THROWS_WITH_AS(eq(a, ramp({2, 3}, 0, 1, DType::i64)), Contains("eq: expected both tensors to have the same dtype"),
                       Error);
  if (cuda::is_available()) {
    message = error_of([&] { mul(a, a.cuda()); });
    CHECK(message.find("same device") != std::string::npos);
    CHECK(message.find("cpu") != std::string::npos);
    CHECK(message.find("cuda:0") != std::string::npos);
  } else {
    MESSAGE("SKIPPED (no GPU): the device-mismatch message needs a CUDA tensor");
  }
}

// ---------------------------------------------------------------- in-place

TEST_CASE("elementwise: in-place methods write self, broadcast other, and bump the version") {
  Tensor x = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  uint64_t version = x.version();
  x.add_(f32({10, 20, 30}, {3}));
  CHECK(x.version() > version);
  check_values(x, {11, 22, 33, 14, 25, 36});
  version = x.version();
  x.add_(f32({1, 1, 1, 1, 1, 1}, {2, 3}), -2.0);
  CHECK(x.version() > version);
  check_values(x, {9, 20, 31, 12, 23, 34});
  x.sub_(f32({9, 12}, {2, 1}));
  check_values(x, {0, 11, 22, 0, 11, 22});
  x.mul_(f32({2}, {1}));
  check_values(x, {0, 22, 44, 0, 22, 44});
  version = x.version();
  x.mul_(0.5);
  CHECK(x.version() > version);
  check_values(x, {0, 11, 22, 0, 11, 22});
  x.div_(scalar_tensor(11.0));
  check_values(x, {0, 1, 2, 0, 1, 2});
  x.sub_(scalar_tensor(1.0));
  version = x.version();
  x.relu_();
  CHECK(x.version() > version);
  check_values(x, {0, 0, 1, 0, 0, 1});
  x.add_(scalar_tensor(2.0)).clamp_(2.5, 2.75);
  check_values(x, {2.5, 2.5, 2.75, 2.5, 2.5, 2.75});

  // The other operand is converted to self's dtype (never floating into integer).
  Tensor acc = f32({1, 1}, {2});
  acc.add_(f64({0.5, 0.25}, {2}));
  check_values(acc, {1.5, 1.25});
  Tensor counts = tensor<int64_t>({1, 2}, {2});
  counts.add_(tensor<int32_t>({3, 4}, {2}));
  CHECK(counts.to_vector<int64_t>() == std::vector<int64_t>{4, 6});
  CHECK_THROWS_WITH_AS(counts.add_(f32({1, 1}, {2})), Contains("add_: cannot write the float32 result"), Error);

  // In-place through a view writes the base.
  Tensor base = ramp({3, 4});
  base.t().narrow(0, 1, 1).mul_(0.0);  // column 1
  check_values(base, {0, 0, 2, 3, 4, 0, 6, 7, 8, 0, 10, 11});

  CHECK_THROWS_WITH_AS(ramp({3}).add_(ramp({2, 3})),
                       Contains("add_: cannot broadcast other of shape [2, 3] into self of shape [3]"), Error);
  CHECK_THROWS_WITH_AS(ramp({1}).expand({4}).add_(ramp({4})), Contains("share one memory location"), Error);
}

TEST_CASE("elementwise: in-place on a tensor that requires grad is refused in grad mode") {
  Tensor w = ramp({3}).requires_grad_();
  w.set_name("weight");
  CHECK_THROWS_WITH_AS(w.add_(ramp({3})), Contains("add_: in-place write to a tensor that requires grad ('weight')"),
                       Error);
  CHECK_THROWS_WITH_AS(w.mul_(2.0), Contains("mul_: in-place write to a tensor that requires grad"), Error);
  CHECK_THROWS_WITH_AS(w.relu_(), Contains("relu_"), Error);
  CHECK_THROWS_WITH_AS(w.clamp_(0, 1), Contains("clamp_"), Error);
  Tensor plain = ramp({3});
  CHECK_THROWS_WITH_AS(plain.add_(w), Contains("add_: other requires grad"), Error);
  {
    NoGradGuard no_grad;  // optimizer-style update
    const uint64_t version = w.version();
    w.add_(ramp({3}), -0.5);
    CHECK(w.version() > version);
  }
  check_values(w.detach(), {0, 0.5, 1});
}

TEST_CASE("elementwise: a saved tensor modified in place makes backward throw") {
  Tensor x = f32({0.5f, 1.0f}, {2}).requires_grad_();
  Tensor y = exp(x);  // saves its output
  {
    NoGradGuard no_grad;
    y.add_(f32({1, 1}, {2}));
  }
  std::string message = error_of([&] { y.backward(f32({1, 1}, {2})); });
  CHECK(message.find("backward of 'exp'") != std::string::npos);
  CHECK(message.find("modified by an in-place operation") != std::string::npos);

  Tensor a = f32({1, 2}, {2}).requires_grad_();
  Tensor b = f32({3, 4}, {2});
  Tensor product = mul(a, b);  // saves b for a's gradient
  b.mul_(2.0);
  CHECK_THROWS_WITH_AS(product.backward(f32({1, 1}, {2})), Contains("backward of 'mul'"), Error);
}

// ---------------------------------------------------------------- backward

TEST_CASE("elementwise: backward formulas") {
  auto grad_of = [](const std::function<Tensor(const Tensor&)>& fn, const std::vector<double>& at) {
    Tensor x = f64(at, {static_cast<int64_t>(at.size())}).requires_grad_();
    fn(x).backward(f64(std::vector<double>(at.size(), 1.0), {static_cast<int64_t>(at.size())}));
    return x.grad();
  };
  check_values(grad_of([](const Tensor& x) { return relu(x); }, {-1, 2}), {0, 1});
  check_values(grad_of([](const Tensor& x) { return abs(x); }, {-1, 0, 2}), {-1, 0, 1});
  check_values(grad_of([](const Tensor& x) { return tanh(x); }, {0.5}), {1 - std::pow(std::tanh(0.5), 2)}, 1e-12);
  const double s = 1 / (1 + std::exp(-0.3));
  check_values(grad_of([](const Tensor& x) { return sigmoid(x); }, {0.3}), {s * (1 - s)}, 1e-12);
  check_values(grad_of([](const Tensor& x) { return silu(x); }, {0.3}), {s * (1 + 0.3 * (1 - s))}, 1e-12);
  // d/dx gelu(x) = Phi(x) + x phi(x)
  const double phi = std::exp(-0.5) / std::sqrt(2 * std::numbers::pi), cdf = 0.5 * (1 + std::erf(1 / std::sqrt(2.0)));
  check_values(grad_of([](const Tensor& x) { return gelu(x); }, {1}), {cdf + phi}, 1e-12);
  check_values(grad_of([](const Tensor& x) { return pow(x, 3.0); }, {2}), {12}, 1e-12);
  check_values(grad_of([](const Tensor& x) { return pow(x, 0.0); }, {0, 2}), {0, 0});
  check_values(grad_of([](const Tensor& x) { return sqrt(x); }, {4}), {0.25}, 1e-12);
  check_values(grad_of([](const Tensor& x) { return rsqrt(x); }, {4}), {-0.5 / 8}, 1e-12);
  check_values(grad_of([](const Tensor& x) { return log(x); }, {4}), {0.25}, 1e-12);
  check_values(grad_of([](const Tensor& x) { return clamp(x, 0.0, 1.0); }, {-1, 0, 0.5, 1, 2}), {0, 1, 1, 1, 0});
  check_values(grad_of([](const Tensor& x) { return maximum(x, f64({1, 1, 1}, {3})); }, {0, 1, 2}), {0, 0.5, 1});
  check_values(grad_of([](const Tensor& x) { return div(x, 4.0); }, {1}), {0.25});
  check_values(grad_of([](const Tensor& x) { return mul(x, -3.0); }, {1}), {-3});
  check_values(grad_of([](const Tensor& x) { return neg(x); }, {1}), {-1});
  check_values(grad_of([](const Tensor& x) { return sub(f64({0}, {1}), x, 2.0); }, {1}), {-2});
  // pow with a tensor exponent: d/de x^e = x^e log x, and 0 where x == 0
  Tensor base = f64({2, 0}, {2}).requires_grad_();
  Tensor exponent = f64({3, 2}, {2}).requires_grad_();
  pow(base, exponent).backward(f64({1, 1}, {2}));
  check_values(base.grad(), {12, 0}, 1e-12);
  check_values(exponent.grad(), {8 * std::log(2.0), 0}, 1e-12);
}

TEST_CASE("elementwise: backward undoes broadcasting and skips inputs that need no gradient") {
  Tensor a = ramp({3, 1, 5}, 1, 1, DType::f64).requires_grad_();
  Tensor b = ramp({4, 5}, 1, 1, DType::f64);
  Tensor out = mul(a, b);
  CHECK(out.grad_fn()->name() == "mul");
  out.backward(ones(out.shape(), {.dtype = DType::f64}));
  REQUIRE(a.grad().defined());
  CHECK(a.grad().shape() == Shape{3, 1, 5});
  // d/da sum(a * b) over the broadcast dim j: sum_j b[j][k] = sum_j (5j + k + 1)
  std::vector<double> expected;
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 5; ++k) expected.push_back(4 * (k + 1) + 5 * (0 + 1 + 2 + 3));
  }
  check_values(a.grad(), expected);
  CHECK_FALSE(b.grad().defined());

  Tensor c = scalar_tensor(2.0, {.dtype = DType::f64, .requires_grad = true});
  Tensor d = ramp({2, 3}, 0, 1, DType::f64).requires_grad_();
  add(d, c, 3.0).backward(ones({2, 3}, {.dtype = DType::f64}));
  CHECK(c.grad().shape() == Shape{});
  CHECK(c.grad().item<double>() == 18.0);
  check_values(d.grad(), {1, 1, 1, 1, 1, 1});

  Tensor cond = tensor<uint8_t>({1, 0, 1}, {3}).to(DType::b8);
  Tensor wa = ramp({3}, 0, 1, DType::f64).requires_grad_();
  Tensor wb = scalar_tensor(5.0, {.dtype = DType::f64, .requires_grad = true});
  where(cond, wa, wb).backward(f64({1, 2, 3}, {3}));
  check_values(wa.grad(), {1, 0, 3});
  CHECK(wb.grad().item<double>() == 2.0);

  // No gradient work (no graph) when nothing requires grad, or in no-grad mode.
  CHECK_FALSE(exp(ramp({2})).requires_grad());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(exp(wa).requires_grad());
  }
  CHECK_FALSE(gt(wa, 0.0).requires_grad());
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("elementwise: CUDA matches the CPU for every dtype and layout [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor a = ramp({3, 1, 37}, -2, 0.037);
  Tensor b = ramp({4, 37}, 0.5, 0.011);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"add", [](const Tensor& x, const Tensor& y) { return add(x, y, 0.5); }},
      {"sub", [](const Tensor& x, const Tensor& y) { return sub(x, y); }},
      {"mul", [](const Tensor& x, const Tensor& y) { return mul(x, y); }},
      {"div", [](const Tensor& x, const Tensor& y) { return div(x, y); }},
      {"maximum", [](const Tensor& x, const Tensor& y) { return maximum(x, y); }},
      {"pow", [](const Tensor& x, const Tensor& y) { return pow(y, x); }},
      {"exp", [](const Tensor& x, const Tensor&) { return exp(x); }},
      {"log", [](const Tensor&, const Tensor& y) { return log(y); }},
      {"rsqrt", [](const Tensor&, const Tensor& y) { return rsqrt(y); }},
      {"gelu", [](const Tensor& x, const Tensor&) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x, const Tensor&) { return gelu(x, "tanh"); }},
      {"silu", [](const Tensor& x, const Tensor&) { return silu(x); }},
      {"sigmoid", [](const Tensor& x, const Tensor&) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x, const Tensor&) { return tanh(x); }},
      {"clamp", [](const Tensor& x, const Tensor&) { return clamp(x, -1.0, 0.5); }},
      {"where", [](const Tensor& x, const Tensor& y) { return where(gt(x, 0.0), x, y); }},
      {"lt", [](const Tensor& x, const Tensor& y) { return cast(lt(x, y), x.dtype()); }},
  };
  for (const auto& [name, fn] : ops) {
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      INFO(name << " in " << dtype_name(dtype));
      const testing::Tolerance tolerance = testing::parity_tolerance(dtype);
      Tensor ca = a.to(dtype), cb = b.to(dtype);
      KILN_CHECK_CLOSE(fn(ca.cuda(), cb.cuda()).cpu(), fn(ca, cb), tolerance.rtol, tolerance.atol);
      // strided and misaligned (offset by one element) operands; the offset is
      // taken on the device (copying a CPU view to the GPU would align it), so
      // the kernels' scalar path for unaligned pointers runs
      Tensor wide = ramp({37, 9}, -1, 0.01, dtype);
      Tensor strided = wide.t();
      Tensor misaligned_store = ramp({1 + 4 * 37}, -1, 0.013, dtype);
      Tensor misaligned = misaligned_store.narrow(0, 1, 4 * 37).view({4, 37});
      Tensor misaligned_gpu = misaligned_store.cuda().narrow(0, 1, 4 * 37).view({4, 37});
      REQUIRE(reinterpret_cast<uintptr_t>(misaligned_gpu.data_ptr()) % 16 != 0);
      KILN_CHECK_CLOSE(fn(strided.cuda(), strided.cuda()).cpu(), fn(strided, strided), tolerance.rtol,
                       tolerance.atol);
      KILN_CHECK_CLOSE(fn(misaligned_gpu, cb.cuda()).cpu(), fn(misaligned, cb), tolerance.rtol, tolerance.atol);
      KILN_CHECK_CLOSE(fn(cb.cuda(), misaligned_gpu).cpu(), fn(cb, misaligned), tolerance.rtol, tolerance.atol);
    }
  }
  // integers
  Tensor i = tensor<int64_t>({-3, 0, 7, 100000}, {4});
  CHECK(mul(i.cuda(), i.cuda()).cpu().to_vector<int64_t>() == mul(i, i).to_vector<int64_t>());
  CHECK(clamp(i.cuda(), 0.0, 50.0).cpu().to_vector<int64_t>() == std::vector<int64_t>{0, 0, 7, 50});
  CHECK(eq(i.cuda(), 7.0).cpu().to_vector<bool>() == std::vector<bool>{false, false, true, false});
}

TEST_CASE("elementwise: CUDA backward kernels and in-place ops match the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.5); }},
      {"pow", [](const Tensor& x) { return pow(abs(x), 1.5); }},
  };
  for (const auto& [name, fn] : ops) {
    INFO(name);
    Tensor cpu_x = ramp({1031}, -3, 0.00583).requires_grad_();
    Tensor gpu_x = ramp({1031}, -3, 0.00583).cuda().requires_grad_();
    Tensor seed = ramp({1031}, 1, -0.0013);
    fn(cpu_x).backward(seed);
    fn(gpu_x).backward(seed.cuda());
    KILN_CHECK_CLOSE(gpu_x.grad().cpu(), cpu_x.grad(), 1e-5, 1e-6);
  }
  Tensor x = ramp({4, 37}, -1, 0.01).cuda();
  x.add_(ramp({37}).cuda(), 0.5).mul_(2.0).relu_().clamp_(0, 20);
  Tensor reference = ramp({4, 37}, -1, 0.01);
  reference.add_(ramp({37}), 0.5).mul_(2.0).relu_().clamp_(0, 20);
  KILN_CHECK_CLOSE(x.cpu(), reference, 1e-6, 1e-6);
}

// The CUDA strided kernels' index split (kernels/strided.h): exact quotients
// for every dividend below 2^31, and the same offsets as the 64-bit split.
TEST_CASE("elementwise: FastDivmod divides exactly below 2^31 and fast_offsets_of equals offsets_of") {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 2000; ++d) divisors.push_back(d);
  for (int k = 1; k <= 31; ++k) {
    const uint32_t p = uint32_t{1} << k;
    for (const uint32_t d : {p - 1, p, p + 1}) {
      if (d >= 1 && d <= (uint32_t{1} << 31)) divisors.push_back(d);
    }
  }
  std::mt19937_64 engine(7);
  for (int i = 0; i < 2000; ++i) divisors.push_back(static_cast<uint32_t>(engine() % (uint64_t{1} << 31)) + 1);
  constexpr uint32_t kLimit = (uint32_t{1} << 31) - 1;  // the largest dividend
  int64_t wrong = 0, checked = 0;
  for (const uint32_t d : divisors) {
    const kernels::FastDivmod divider(d);
    std::vector<uint32_t> dividends = {0,      1,          d - 1, d, kLimit, kLimit - 1, kLimit - kLimit % d,
                                       kLimit - kLimit % d - 1};
    if (d <= kLimit / 2) dividends.insert(dividends.end(), {2 * d - 1, 2 * d, 2 * d + 1});
    for (int i = 0; i < 200; ++i) dividends.push_back(static_cast<uint32_t>(engine() % (uint64_t{kLimit} + 1)));
    for (const uint32_t n : dividends) {
      if (n > kLimit) continue;
      ++checked;
      if (divider.div(n) != n / d) {
        if (++wrong <= 5) {
          MESSAGE("FastDivmod(" << d << ").div(" << n << ") = " << divider.div(n) << ", want " << n / d);
        }
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(checked > 800000);  // about 4,100 divisors x 211 dividends
  CHECK_THROWS_AS(kernels::FastDivmod(0), Error);
  CHECK_THROWS_AS(kernels::FastDivmod((uint32_t{1} << 31) + 1), Error);
  // Offsets over a 4-D shape with negative-free, broadcast (0) and large strides.
  kernels::IterShape shape;
  shape.ndim = 4;
  const int64_t sizes[4] = {3, 5, 7, 11};
  for (int d = 0; d < 4; ++d) shape.sizes[d] = sizes[d];
  kernels::Operand ops[2];
  const int64_t strides0[4] = {1000003, 0, 77, 1}, strides1[4] = {1, 3, 15, 105};
  for (int d = 0; d < 4; ++d) {
    ops[0].strides[d] = strides0[d];
    ops[1].strides[d] = strides1[d];
  }
  const kernels::FastIterShape fast = kernels::fast_iter_shape(shape);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    int64_t want[2], got[2];
    kernels::offsets_of(i, shape, ops, 2, want);
    kernels::fast_offsets_of(static_cast<uint32_t>(i), fast, ops, 2, got);
    mismatches += want[0] != got[0] || want[1] != got[1];
  }
  CHECK(mismatches == 0);
  kernels::IterShape huge;
  huge.ndim = 2;
  huge.sizes[0] = int64_t{1} << 16;
  huge.sizes[1] = int64_t{1} << 15;  // 2^31 elements: 64-bit indexing
  CHECK_THROWS_AS(kernels::fast_iter_shape(huge), Error);
}

// A float32 residual plus a 16-bit branch under CUDA autocast: one kernel
// (kernels/elementwise.h, is_mixed_add), equal to the CPU's cast-then-add.
TEST_CASE("elementwise: CUDA adds float32 and 16-bit tensors under autocast as the cast would [gpu]") {
  KILN_REQUIRE_GPU();
  for (const DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    const Tensor residual = ramp({3, 1031}, -2, 0.0017), branch = ramp({3, 1031}, 1.5, -0.0023).to(low);
    const Tensor row = ramp({1031}, 0.25, 0.0011).to(low);
    const Tensor want = add(sub(residual, branch.to(DType::f32), 0.5), row.to(DType::f32));
    Tensor residual_g = residual.cuda().requires_grad_(), branch_g = branch.cuda().requires_grad_();
    Tensor got;
    {
      AutocastGuard autocast(DeviceType::cuda, low);
      // Dense, then a broadcast row. alpha 0.5 makes alpha * b exact, so an FMA rounds as the CPU does.
      got = add(sub(residual_g, branch_g, 0.5), row.cuda());
    }
    CHECK(got.dtype() == DType::f32);
    CHECK(got.cpu().to_vector<float>() == want.to_vector<float>());
    const Tensor seed = ramp({3, 1031}, 0.5, 0.0007);
    got.backward(seed.cuda());
    CHECK(residual_g.grad().dtype() == DType::f32);
    CHECK(branch_g.grad().dtype() == low);
    CHECK(residual_g.grad().cpu().to_vector<float>() == seed.to_vector<float>());
    CHECK(branch_g.grad().cpu().to(DType::f32).to_vector<float>() ==
          mul(seed, -0.5).to(low).to(DType::f32).to_vector<float>());
  }
}

TEST_CASE("elementwise: CUDA copy converts between every pair of dtypes, and fill [gpu]") {
  KILN_REQUIRE_GPU();
  const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                     DType::i32, DType::i64, DType::u8,  DType::b8};
  Tensor values = f32({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
                       24, 25, 26, 27, 28, 29, 30, 31, 32},
                      {33});
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      Tensor source = values.to(from);
      KILN_CHECK_CLOSE(source.cuda().to(to).cpu(), source.to(to), 0, 0);
      // strided source and destination
      Tensor strided = source.view({3, 11}).t();
      Tensor destination = empty({3, 11}, {.dtype = to, .device = Device::cuda()}).t();
      destination.copy_(strided.cuda());
      KILN_CHECK_CLOSE(destination.cpu(), strided.to(to), 0, 0);
    }
  }
  for (DType dtype : dtypes) {
    INFO(dtype_name(dtype));
    KILN_CHECK_CLOSE(full({1031}, 3.0, {.dtype = dtype, .device = Device::cuda()}).cpu(),
                     full({1031}, 3.0, {.dtype = dtype}), 0, 0);
    KILN_CHECK_CLOSE(zeros({1031}, {.dtype = dtype, .device = Device::cuda()}).cpu(), zeros({1031}, {.dtype = dtype}),
                     0, 0);
  }
  Tensor negative_zero = full({5}, -0.0, {.device = Device::cuda()}).cpu();
  CHECK(std::signbit(negative_zero.to_vector<float>()[0]));
}

}  // namespace kiln
