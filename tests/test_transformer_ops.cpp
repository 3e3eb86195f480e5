// The ops transformer code needs besides attention: masked_fill, tril/triu,
// sin/cos, cumsum, topk, multinomial, rms_norm. Semantics as torch's, checked
// on values whose answers are known; CUDA against the CPU.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/generator.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "tests/support/test_util.h"

namespace kiln::testing {

using doctest::Contains;

TEST_CASE("tril and triu keep torch's triangles, for any diagonal and batch") {
  const Tensor x = add(arange(0, 12, 1, {.dtype = DType::f32}).reshape({3, 4}), 1.0);
  CHECK(tril(x).to_vector<float>() == std::vector<float>{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  CHECK(triu(x).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});
  CHECK(tril(x, 1).to_vector<float>() == std::vector<float>{1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});
  CHECK(triu(x, -1).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12});
  CHECK(sum(tril(x, -3)).item<float>() == 0.0f);
  // A causal mask, as GPT code builds it: tril(ones(T, T)) as bool.
  const Tensor causal = gt(tril(ones({3, 3}, {.dtype = DType::i64})), 0.0);
  CHECK(causal.to_vector<bool>() == std::vector<bool>{true, false, false, true, true, false, true, true, true});
  const Tensor batch = ones({2, 2, 2});
  CHECK(tril(batch).to_vector<float>() == std::vector<float>{1, 0, 1, 1, 1, 0, 1, 1});
  CHECK(error_of([] { tril(ones({3})); }).find("tril: expected a tensor of at least 2 dims") != std::string::npos);
}

TEST_CASE("masked_fill fills where the mask is true and passes the gradient elsewhere") {
  Tensor x = arange(0, 6, 1, {.dtype = DType::f64}).reshape({2, 3}).requires_grad_();
  const Tensor mask = tensor<uint8_t>({1, 0, 1}, {3}).to(DType::b8);  // broadcast over rows
  Tensor y = masked_fill(x, mask, -1e9);
  CHECK(y.to_vector<double>() == std::vector<double>{-1e9, 1, -1e9, -1e9, 4, -1e9});
  sum(y).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0, 1, 0});
  CHECK(error_of([&] { masked_fill(x, ones({3}), 0.0); }).find("the mask must be bool") != std::string::npos);
  CHECK(error_of([&] { masked_fill(x, gt(ones({2, 2, 3}), 0.0), 0.0); }).find("does not broadcast to the input's shape") !=
        std::string::npos);
}

TEST_CASE("sin and cos stay accurate for the large arguments of position encodings") {
  std::vector<double> values;
  for (int i = 0; i < 4096; ++i) values.push_back(i * 2.37 - 3000.0);
  const Tensor x = tensor<double>(values, {4096});
  const Tensor s32 = sin(x.to(DType::f32)).to(DType::f64), c32 = cos(x.to(DType::f32)).to(DType::f64);
  // Against the float64 functions of the float32-rounded argument.
  const Tensor rounded = x.to(DType::f32).to(DType::f64);
  KILN_CHECK_CLOSE(s32, sin(rounded), 0, 2e-6);
  KILN_CHECK_CLOSE(c32, cos(rounded), 0, 2e-6);
  CHECK(sin(zeros({})).item<float>() == 0.0f);
  CHECK(cos(zeros({})).item<float>() == 1.0f);
}

TEST_CASE("cumsum runs along a dim, gives int64 for integers, and its gradient is the reversed sum") {
  const Tensor x = tensor<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor along_rows = cumsum(x, 1);
  CHECK(along_rows.dtype() == DType::i64);
  CHECK(along_rows.to_vector<int64_t>() == std::vector<int64_t>{1, 3, 6, 4, 9, 15});
  CHECK(cumsum(x, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 5, 7, 9});
  CHECK(cumsum(gt(x, 2.0), 1).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 1, 2, 3});
  Tensor f = tensor<double>({1, 2, 3}, {3}).requires_grad_();
  Tensor y = cumsum(f, 0);
  sum(mul(y, tensor<double>({1, 10, 100}, {3}))).backward();
  CHECK(f.grad().to_vector<double>() == std::vector<double>{111, 110, 100});
  CHECK(error_of([&] { cumsum(f, 1); }).find("cumsum") != std::string::npos);
}

TEST_CASE("topk orders values, breaks ties to the lower index, puts NaN first, and gives gradients to the chosen") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = tensor<double>({3, 1, 3, nan, 2, -1}, {6});
  ValuesIndices top = topk(x, 3);
  CHECK(top.indices.to_vector<int64_t>() == std::vector<int64_t>{3, 0, 2});
  const std::vector<double> values = top.values.to_vector<double>();
  CHECK(std::isnan(values[0]));
  CHECK(values[1] == 3);
  CHECK(values[2] == 3);
  const ValuesIndices bottom = topk(x, 2, 0, /*largest=*/false);
  CHECK(bottom.indices.to_vector<int64_t>() == std::vector<int64_t>{5, 1});
  // Along dim 0 of a matrix.
  const Tensor m = tensor<float>({1, 9, 5, 7, 3, 8}, {3, 2});
  const ValuesIndices columns = topk(m, 2, 0);
  CHECK(columns.values.shape() == Shape{2, 2});
  CHECK(columns.values.to_vector<float>() == std::vector<float>{5, 9, 3, 8});
  CHECK(columns.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 2, 2});
  Tensor g = tensor<double>({0.5, 2, -1, 4}, {4}).requires_grad_();
  sum(topk(g, 2).values).backward();
  CHECK(g.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 1});
  CHECK(topk(g, 0).values.numel() == 0);
  CHECK(error_of([&] { topk(g, 5); }).find("topk: k = 5 is out of range for dim 0 of size 4") != std::string::npos);
}

TEST_CASE("multinomial draws in proportion to the weights, without repeats unless asked") {
  manual_seed(11);
  const Tensor weights = tensor<float>({1, 0, 3, 6}, {4});
  std::map<int64_t, int> counts;
  const Tensor draws = multinomial(weights.unsqueeze(0).expand({4000, 4}).contiguous(), 1);
  for (int64_t i : draws.to_vector<int64_t>()) ++counts[i];
  CHECK(counts[1] == 0);  // weight 0 is never drawn
  CHECK(counts[0] == doctest::Approx(400).epsilon(0.2));
  CHECK(counts[2] == doctest::Approx(1200).epsilon(0.1));
  CHECK(counts[3] == doctest::Approx(2400).epsilon(0.07));
  // Without replacement: every nonzero category once.
  const std::vector<int64_t> all = multinomial(weights, 3).to_vector<int64_t>();
  CHECK(std::set<int64_t>(all.begin(), all.end()) == std::set<int64_t>{0, 2, 3});
  // With replacement, more samples than categories.
  const Tensor many = multinomial(tensor<float>({0, 1}, {2}), 5, /*replacement=*/true);
  CHECK(many.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1, 1});
  // The same seed, the same draws.
  manual_seed(5);
  const Tensor a = multinomial(weights, 2);
  manual_seed(5);
  CHECK(multinomial(weights, 2).to_vector<int64_t>() == a.to_vector<int64_t>());
  CHECK(error_of([&] { multinomial(tensor<float>({1, -1}, {2}), 1); }).find("1 weights are negative") != std::string::npos);
  CHECK(error_of([&] { multinomial(tensor<float>({0, 0}, {2}), 1); }).find("sums to 0") != std::string::npos);
  CHECK(error_of([&] { multinomial(weights, 4); }).find("only 3 nonzero weights") != std::string::npos);
  CHECK(error_of([&] { multinomial(weights, 5); }).find("cannot draw 5 samples without replacement from 4") !=
        std::string::npos);
}

TEST_CASE("rms_norm divides by the root mean square and scales by the weight") {
  const Tensor x = tensor<double>({3, 4, 0, 0}, {2, 2});
  const Tensor y = rms_norm(x, {2}, tensor<double>({1, 2}, {2}), 0.0);
  // Row 0: rms = sqrt((9 + 16) / 2); row 1 is zeros (0 / sqrt(eps) with eps 0 would be NaN: default eps keeps 0).
  CHECK(y.to_vector<double>()[0] == doctest::Approx(3 / std::sqrt(12.5)));
  CHECK(y.to_vector<double>()[1] == doctest::Approx(2 * 4 / std::sqrt(12.5)));
  CHECK(rms_norm(x, {2}).to_vector<double>()[3] == 0.0);
  CHECK(rms_norm(x.to(DType::bf16), {2}).dtype() == DType::bf16);
  CHECK(error_of([&] { rms_norm(x, {3}); }).find("is not the end of the input's shape") != std::string::npos);
}

TEST_CASE("the transformer ops on CUDA match the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  const Tensor x = tensor<double>(random_values(3 * 1031, 40), {3, 1031});
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    INFO(dtype_name(dtype));
    const Tensor xc = x.to(dtype), xg = x.to(Device::cuda(), dtype);
    const Tolerance tol = parity_tolerance(dtype);
    KILN_CHECK_CLOSE(cumsum(xg, 1).cpu(), cumsum(xc, 1), 0, 0);  // the same order of additions
    KILN_CHECK_CLOSE(tril(xg.narrow(1, 0, 7).reshape({3, 7}), 1).cpu(), tril(xc.narrow(1, 0, 7).reshape({3, 7}), 1), 0, 0);
    const ValuesIndices top_gpu = topk(xg, 50, 1), top_cpu = topk(xc, 50, 1);
    CHECK(top_gpu.indices.cpu().to_vector<int64_t>() == top_cpu.indices.to_vector<int64_t>());
    KILN_CHECK_CLOSE(top_gpu.values.cpu(), top_cpu.values, 0, 0);
    const ValuesIndices low_gpu = topk(xg, 5, 1, false), low_cpu = topk(xc, 5, 1, false);
    CHECK(low_gpu.indices.cpu().to_vector<int64_t>() == low_cpu.indices.to_vector<int64_t>());
    KILN_CHECK_CLOSE(sin(xg).cpu(), sin(xc), tol.rtol, tol.atol);
    KILN_CHECK_CLOSE(cos(xg).cpu(), cos(xc), tol.rtol, tol.atol);
    KILN_CHECK_CLOSE(masked_fill(xg, gt(xg, 0.5), 7.0).cpu(), masked_fill(xc, gt(xc, 0.5), 7.0), 0, 0);
  }
  CHECK(cumsum(tensor<int32_t>({1, 2, 3}, {3}).cuda(), 0).cpu().to_vector<int64_t>() == std::vector<int64_t>{1, 3, 6});
  // NaN of either sign above +inf, as on the CPU (CUB's own radix order puts a negative NaN below -inf);
  // -0.0 and +0.0 tie, the lower index first.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor specials = tensor<double>({1, -nan, -inf, 0.0, nan, -0.0, inf, -2}, {1, 8});
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    INFO(dtype_name(dtype));
    const Tensor sc = specials.to(dtype), sg = specials.to(Device::cuda(), dtype);
    CHECK(std::signbit(sc.to_vector<double>()[1]));  // the negative NaN survives the conversion
    for (bool largest : {true, false}) {
      const ValuesIndices gpu = topk(sg, 8, 1, largest), cpu = topk(sc, 8, 1, largest);
      CHECK(gpu.indices.cpu().to_vector<int64_t>() == cpu.indices.to_vector<int64_t>());
      const std::vector<double> gpu_values = gpu.values.cpu().to_vector<double>();
      const std::vector<double> cpu_values = cpu.values.to_vector<double>();
      for (size_t i = 0; i < cpu_values.size(); ++i) CHECK(std::signbit(gpu_values[i]) == std::signbit(cpu_values[i]));
    }
  }
  // multinomial: the same races on the same generator state give the same draws.
  const Tensor weights = abs(x.to(DType::f32));
  manual_seed(8);
  const Tensor cpu_draws = multinomial(weights, 4);
  manual_seed(8);
  const Tensor gpu_draws = multinomial(weights.cuda(), 4);
  CHECK(gpu_draws.cpu().to_vector<int64_t>() == cpu_draws.to_vector<int64_t>());
}

}  // namespace kiln::testing
