// Placeholders for the elementwise ops not written yet: each throws. The owner of
// core/ops/elementwise.cpp removes an entry when the real op lands, and this file
// when none is left.
#include "core/ops.h"

namespace kiln {

Tensor add(const Tensor&, const Tensor&, double) { KILN_THROW("add: not implemented yet"); }
Tensor sub(const Tensor&, const Tensor&, double) { KILN_THROW("sub: not implemented yet"); }
Tensor mul(const Tensor&, const Tensor&) { KILN_THROW("mul: not implemented yet"); }
Tensor div(const Tensor&, const Tensor&) { KILN_THROW("div: not implemented yet"); }
Tensor add(const Tensor&, double) { KILN_THROW("add: not implemented yet"); }
Tensor mul(const Tensor&, double) { KILN_THROW("mul: not implemented yet"); }
Tensor div(const Tensor&, double) { KILN_THROW("div: not implemented yet"); }
Tensor maximum(const Tensor&, const Tensor&) { KILN_THROW("maximum: not implemented yet"); }
Tensor minimum(const Tensor&, const Tensor&) { KILN_THROW("minimum: not implemented yet"); }
Tensor neg(const Tensor&) { KILN_THROW("neg: not implemented yet"); }
Tensor exp(const Tensor&) { KILN_THROW("exp: not implemented yet"); }
Tensor log(const Tensor&) { KILN_THROW("log: not implemented yet"); }
Tensor sqrt(const Tensor&) { KILN_THROW("sqrt: not implemented yet"); }
Tensor rsqrt(const Tensor&) { KILN_THROW("rsqrt: not implemented yet"); }
Tensor abs(const Tensor&) { KILN_THROW("abs: not implemented yet"); }
Tensor pow(const Tensor&, double) { KILN_THROW("pow: not implemented yet"); }
Tensor pow(const Tensor&, const Tensor&) { KILN_THROW("pow: not implemented yet"); }
Tensor relu(const Tensor&) { KILN_THROW("relu: not implemented yet"); }
Tensor gelu(const Tensor&, const std::string&) { KILN_THROW("gelu: not implemented yet"); }
Tensor silu(const Tensor&) { KILN_THROW("silu: not implemented yet"); }
Tensor sigmoid(const Tensor&) { KILN_THROW("sigmoid: not implemented yet"); }
Tensor tanh(const Tensor&) { KILN_THROW("tanh: not implemented yet"); }
Tensor clamp(const Tensor&, std::optional<double>, std::optional<double>) { KILN_THROW("clamp: not implemented yet"); }
Tensor where(const Tensor&, const Tensor&, const Tensor&) { KILN_THROW("where: not implemented yet"); }
Tensor eq(const Tensor&, const Tensor&) { KILN_THROW("eq: not implemented yet"); }
Tensor ne(const Tensor&, const Tensor&) { KILN_THROW("ne: not implemented yet"); }
Tensor lt(const Tensor&, const Tensor&) { KILN_THROW("lt: not implemented yet"); }
Tensor le(const Tensor&, const Tensor&) { KILN_THROW("le: not implemented yet"); }
Tensor gt(const Tensor&, const Tensor&) { KILN_THROW("gt: not implemented yet"); }
Tensor ge(const Tensor&, const Tensor&) { KILN_THROW("ge: not implemented yet"); }
Tensor eq(const Tensor&, double) { KILN_THROW("eq: not implemented yet"); }
Tensor gt(const Tensor&, double) { KILN_THROW("gt: not implemented yet"); }
Tensor lt(const Tensor&, double) { KILN_THROW("lt: not implemented yet"); }
Tensor isfinite(const Tensor&) { KILN_THROW("isfinite: not implemented yet"); }
Tensor cast(const Tensor&, DType) { KILN_THROW("cast: not implemented yet"); }
Tensor operator+(const Tensor&, const Tensor&) { KILN_THROW("operator+: not implemented yet"); }
Tensor operator-(const Tensor&, const Tensor&) { KILN_THROW("operator-: not implemented yet"); }
Tensor operator*(const Tensor&, const Tensor&) { KILN_THROW("operator*: not implemented yet"); }
Tensor operator/(const Tensor&, const Tensor&) { KILN_THROW("operator/: not implemented yet"); }
Tensor operator-(const Tensor&) { KILN_THROW("operator-: not implemented yet"); }
Tensor operator+(const Tensor&, double) { KILN_THROW("operator+: not implemented yet"); }
Tensor operator-(const Tensor&, double) { KILN_THROW("operator-: not implemented yet"); }
Tensor operator*(const Tensor&, double) { KILN_THROW("operator*: not implemented yet"); }
Tensor operator/(const Tensor&, double) { KILN_THROW("operator/: not implemented yet"); }
Tensor operator*(double, const Tensor&) { KILN_THROW("operator*: not implemented yet"); }
Tensor& Tensor::add_(const Tensor&, double) { KILN_THROW("add_: not implemented yet"); }
Tensor& Tensor::sub_(const Tensor&) { KILN_THROW("sub_: not implemented yet"); }
Tensor& Tensor::mul_(const Tensor&) { KILN_THROW("mul_: not implemented yet"); }
Tensor& Tensor::mul_(double) { KILN_THROW("mul_: not implemented yet"); }
Tensor& Tensor::div_(const Tensor&) { KILN_THROW("div_: not implemented yet"); }
Tensor& Tensor::clamp_(double, double) { KILN_THROW("clamp_: not implemented yet"); }
Tensor& Tensor::relu_() { KILN_THROW("relu_: not implemented yet"); }

}  // namespace kiln
