// Op-table rows of the elementwise family (core/ops/elementwise.cpp). Every row
// has a broadcast sample ((3,1,5) with (4,5)), an odd size (1031 elements, not
// a multiple of any block or vector width) and an empty tensor ((0,3)).
#include <algorithm>
#include <cmath>
#include <random>

#include "core/ops.h"
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {

using Inputs = std::vector<Tensor>;

// Normal samples mapped through `transform`, one tensor per shape of the sample.
Inputs mapped_inputs(const OpSample& sample, DType dtype, uint64_t seed, double (*transform)(double)) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal;
  Inputs inputs;
  for (const Shape& shape : sample.shapes) {
    std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
    for (double& v : values) v = transform(normal(engine));
    inputs.push_back(tensor<double>(values, shape).to(dtype));
  }
  return inputs;
}

// In [0.5, 2.5): log, sqrt, rsqrt and pow are smooth there.
double positive(double v) { return 0.5 + std::fmod(std::abs(v), 2.0); }
// |v| in [0.5, 2.5) with the sign of v: denominators away from 0.
double away_from_zero(double v) { return std::copysign(positive(v), v); }
// Small integers in [-3, 3] (as floats), so that comparisons see ties.
double small_integer(double v) { return std::clamp(std::round(v * 2.0), -3.0, 3.0); }

std::vector<OpSample> unary_samples() {
  return {{{{4, 5}}, "2-d"}, {{{2, 3, 4}}, "3-d"}, {{{1031}}, "odd size"}, {{{0, 3}}, "empty"}};
}

std::vector<OpSample> binary_samples() {
  return {{{{4, 5}, {4, 5}}, "same shape"},
          {{{3, 1, 5}, {4, 5}}, "broadcast"},
          {{{}, {2, 3}}, "0-d with 2-d"},
          {{{1031}, {1031}}, "odd size"},
          {{{0, 3}, {0, 3}}, "empty"}};
}

OpInfo unary_row(std::string name, std::function<Tensor(const Tensor&)> f) {
  OpInfo row;
  row.name = std::move(name);
  row.fn = [f = std::move(f)](const Inputs& in) { return f(in[0]); };
  row.samples = unary_samples();
  return row;
}

OpInfo binary_row(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f) {
  OpInfo row;
  row.name = std::move(name);
  row.fn = [f = std::move(f)](const Inputs& in) { return f(in[0], in[1]); };
  row.samples = binary_samples();
  return row;
}

OpInfo with_inputs(OpInfo row, double (*transform)(double)) {
  row.make_inputs = [transform](const OpSample& sample, DType dtype, uint64_t seed) {
    return mapped_inputs(sample, dtype, seed, transform);
  };
  return row;
}

OpInfo comparison_row(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f) {
  OpInfo row = with_inputs(binary_row(std::move(name), std::move(f)), small_integer);
  row.differentiable = false;
  return row;
}

OpInfo scalar_comparison_row(std::string name, std::function<Tensor(const Tensor&)> f) {
  OpInfo row = with_inputs(unary_row(std::move(name), std::move(f)), small_integer);
  row.differentiable = false;
  return row;
}

}  // namespace

std::vector<OpInfo> elementwise_op_infos() {
  std::vector<OpInfo> rows;
  // --- arithmetic
  rows.push_back(binary_row("add", [](const Tensor& a, const Tensor& b) { return add(a, b); }));
  rows.push_back(binary_row("add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, -0.75); }));
  rows.push_back(binary_row("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }));
  rows.push_back(binary_row("sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 2.5); }));
  rows.push_back(binary_row("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }));
  rows.push_back(with_inputs(binary_row("div", [](const Tensor& a, const Tensor& b) { return div(a, b); }),
                             away_from_zero));
  rows.push_back(unary_row("add scalar", [](const Tensor& x) { return add(x, 1.5); }));
  rows.push_back(unary_row("mul scalar", [](const Tensor& x) { return mul(x, -2.25); }));
  rows.push_back(unary_row("div scalar", [](const Tensor& x) { return div(x, 3.0); }));
  rows.push_back(binary_row("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }));
  rows.push_back(binary_row("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }));
  rows.push_back(unary_row("neg", [](const Tensor& x) { return neg(x); }));
  rows.push_back(unary_row("abs", [](const Tensor& x) { return abs(x); }));
  // --- math functions
  rows.push_back(unary_row("exp", [](const Tensor& x) { return exp(x); }));
  rows.push_back(with_inputs(unary_row("log", [](const Tensor& x) { return log(x); }), positive));
  rows.push_back(with_inputs(unary_row("sqrt", [](const Tensor& x) { return sqrt(x); }), positive));
  rows.push_back(with_inputs(unary_row("rsqrt", [](const Tensor& x) { return rsqrt(x); }), positive));
  rows.push_back(with_inputs(unary_row("pow", [](const Tensor& x) { return pow(x, 2.5); }), positive));
  rows.push_back(unary_row("pow square", [](const Tensor& x) { return pow(x, 2.0); }));
  rows.push_back(
      with_inputs(binary_row("pow tensor", [](const Tensor& x, const Tensor& e) { return pow(x, e); }), positive));
  // --- activations
  rows.push_back(unary_row("relu", [](const Tensor& x) { return relu(x); }));
  rows.push_back(unary_row("gelu", [](const Tensor& x) { return gelu(x); }));
  rows.push_back(unary_row("gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }));
  rows.push_back(unary_row("silu", [](const Tensor& x) { return silu(x); }));
  rows.push_back(unary_row("sigmoid", [](const Tensor& x) { return sigmoid(x); }));
  rows.push_back(unary_row("tanh", [](const Tensor& x) { return tanh(x); }));
  rows.push_back(unary_row("sin", [](const Tensor& x) { return sin(x); }));
  rows.push_back(unary_row("cos", [](const Tensor& x) { return cos(x); }));
  rows.push_back(unary_row("clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }));
  rows.push_back(unary_row("clamp min_only", [](const Tensor& x) { return clamp(x, 0.25, std::nullopt); }));
  // --- where: a bool condition (first input) and two values
  {
    OpInfo row;
    row.name = "where";
    row.fn = [](const Inputs& in) { return where(in[0], in[1], in[2]); };
    row.samples = {{{{4, 5}, {4, 5}, {4, 5}}, "same shape"},
                   {{{3, 1, 5}, {4, 5}, {5}}, "broadcast"},
                   {{{1031}, {1031}, {1031}}, "odd size"},
                   {{{0, 3}, {0, 3}, {3}}, "empty"}};
    row.make_inputs = [](const OpSample& sample, DType dtype, uint64_t seed) {
      Inputs inputs = mapped_inputs(sample, dtype, seed, [](double v) { return v; });
      inputs[0] = gt(inputs[0], 0.0);
      return inputs;
    };
    rows.push_back(std::move(row));
  }
  // --- masked_fill: the input and a bool mask that broadcasts to it
  {
    OpInfo row;
    row.name = "masked_fill";
    row.fn = [](const Inputs& in) { return masked_fill(in[0], in[1], -1.5); };
    row.samples = {{{{4, 5}, {4, 5}}, "same shape"}, {{{2, 3, 5}, {3, 1}}, "broadcast mask"}, {{{0, 3}, {3}}, "empty"}};
    row.make_inputs = [](const OpSample& sample, DType dtype, uint64_t seed) {
      Inputs inputs = mapped_inputs(sample, dtype, seed, [](double v) { return v; });
      inputs[1] = gt(inputs[1], 0.0);
      return inputs;
    };
    row.grad_inputs = {0};
    rows.push_back(std::move(row));
  }
  // --- comparisons (no gradient)
  rows.push_back(comparison_row("eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }));
  rows.push_back(comparison_row("ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }));
  rows.push_back(comparison_row("lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }));
  rows.push_back(comparison_row("le", [](const Tensor& a, const Tensor& b) { return le(a, b); }));
  rows.push_back(comparison_row("gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }));
  rows.push_back(comparison_row("ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }));
  rows.push_back(scalar_comparison_row("eq scalar", [](const Tensor& x) { return eq(x, 1.0); }));
  rows.push_back(scalar_comparison_row("gt scalar", [](const Tensor& x) { return gt(x, -1.0); }));
  rows.push_back(scalar_comparison_row("lt scalar", [](const Tensor& x) { return lt(x, 0.5); }));
  {
    OpInfo row = unary_row("isfinite", [](const Tensor& x) { return isfinite(div(x, x)); });  // 0/0 = NaN
    row.differentiable = false;
    row.make_inputs = [](const OpSample& sample, DType dtype, uint64_t seed) {
      return mapped_inputs(sample, dtype, seed, small_integer);
    };
    rows.push_back(std::move(row));
  }
  // --- cast: to float64 (differentiable; exact from every floating dtype) and to int32
  rows.push_back(unary_row("cast float64", [](const Tensor& x) { return cast(x, DType::f64); }));
  {
    OpInfo row = unary_row("cast int32", [](const Tensor& x) { return cast(mul(x, 3.0), DType::i32); });
    row.differentiable = false;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace kiln::testing
