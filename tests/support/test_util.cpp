#include "tests/support/test_util.h"

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include "tests/support/op_info.h"

namespace kiln::testing {

bool require_gpus(int count) {
  const std::string name = doctest::getContextOptions()->currentTest->m_name;
  const std::string marker = count == 1 ? "[gpu]" : "[gpu" + std::to_string(count) + "]";
  if (name.find(marker) == std::string::npos) {
    FAIL("a test case that needs " << std::to_string(count) << std::string(count == 1 ? " GPU" : " GPUs") << " must have \"" << marker
                                    << "\" in its name (the GPU kit selects GPU cases by name): \"" << name << "\"");
  }
  const cuda::Availability& cuda = cuda::availability();
  if (cuda.unusable) FAIL("CUDA is unusable here, so this GPU case cannot run: " << cuda.problem);
  if (cuda.device_count >= count) return true;
  if (count == 1) {
    MESSAGE("SKIPPED (no GPU: " << cuda.problem << "): " << name);
  } else {
    MESSAGE("SKIPPED (needs " << count << " GPUs, " << cuda.device_count << " present): " << name);
  }
  return false;
}

std::filesystem::path source_root() {
  if (const char* configured = std::getenv("KILN_SOURCE_DIR"); configured != nullptr && *configured != '\0') {
    return configured;
  }
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

Tolerance parity_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f16: return {1e-3, 1e-5};
    case DType::bf16: return {1.6e-2, 1e-5};
    case DType::f64: return {1e-7, 1e-7};
    default: return {1.3e-6, 1e-5};
  }
}

std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (!actual.defined() || !expected.defined()) {
    return actual.defined() == expected.defined() ? "" : "one tensor is undefined";
  }
  if (actual.shape() != expected.shape()) {
    return "shape " + shape_str(actual.shape()) + " != expected " + shape_str(expected.shape());
  }
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  double worst_excess = 0;
  int64_t worst = -1, mismatches = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    const bool same_inf = std::isinf(a[i]) && std::isinf(e[i]) && (a[i] > 0) == (e[i] > 0);
    if (both_nan || same_inf) continue;
    const double error = std::abs(a[i] - e[i]);
    const double allowed = atol + rtol * std::abs(e[i]);
    if (!(error <= allowed)) {
      ++mismatches;
      const double excess = std::isnan(error) ? INFINITY : error - allowed;
      if (worst < 0 || excess > worst_excess) {
        worst_excess = excess;
        worst = static_cast<int64_t>(i);
      }
    }
  }
  if (mismatches == 0) return "";
  std::ostringstream out;
  out.precision(10);
  out << mismatches << " of " << a.size() << " elements differ (rtol " << rtol << ", atol " << atol
      << "); worst at flat index " << worst << ": " << a[worst] << " vs expected " << e[worst];
  return out.str();
}

namespace {
// Storage offset (in elements, from data_ptr) of logical element `index`.
int64_t strided_offset(const Tensor& x, int64_t index) {
  int64_t offset = 0;
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    const int64_t size = x.shape()[d];
    offset += (index % size) * x.strides()[d];
    index /= size;
  }
  return offset;
}

double weighted_sum(const Tensor& out, const std::vector<double>& weights) {
  std::vector<double> values = out.to_vector<double>();
  double total = 0;
  for (size_t i = 0; i < values.size(); ++i) total += values[i] * weights[i];
  return total;
}
}  // namespace

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      double eps, double atol, double rtol) {
  for (const Tensor& input : inputs) {
    if (input.defined() && input.requires_grad()) {
      if (input.dtype() != DType::f64) return "gradcheck needs float64 inputs";
      input.set_grad(Tensor());
    }
  }
  Tensor out = fn(inputs);
  if (!out.requires_grad()) return "the output does not require grad";
  std::mt19937_64 engine(1234);
  std::normal_distribution<double> normal;
  std::vector<double> weights(static_cast<size_t>(out.numel()));
  for (double& w : weights) w = normal(engine);
  out.backward(tensor<double>(weights, out.shape()));

  std::ostringstream report;
  report.precision(10);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& input = inputs[k];
    if (!input.defined() || !input.requires_grad()) continue;
    Tensor analytic_grad = input.grad();
    std::vector<double> analytic = analytic_grad.defined() ? analytic_grad.to_vector<double>()
                                                           : std::vector<double>(input.numel(), 0.0);
    double* base = static_cast<double*>(input.data_ptr());
    for (int64_t j = 0; j < input.numel(); ++j) {
      double* element = base + strided_offset(input, j);
      const double original = *element;
      double plus, minus;
      {
        NoGradGuard no_grad;
        *element = original + eps;
        plus = weighted_sum(fn(inputs), weights);
        *element = original - eps;
        minus = weighted_sum(fn(inputs), weights);
        *element = original;
      }
      const double numeric = (plus - minus) / (2 * eps);
      const double error = std::abs(analytic[j] - numeric);
      if (!(error <= atol + rtol * std::abs(numeric))) {
        report << "input " << k << " element " << j << ": analytic " << analytic[j] << " vs numeric " << numeric;
        return report.str();
      }
    }
  }
  return "";
}

Tensor non_contiguous_copy(const Tensor& x) {
  if (x.dim() < 2) return x;
  Tensor stored = x.transpose(-1, -2).contiguous();  // values of x^T, dense
  Tensor view = stored.transpose(-1, -2);            // same values as x, non-contiguous
  if (x.requires_grad()) view = view.detach().requires_grad_(true);
  return view;
}

std::vector<Tensor> default_inputs(const OpSample& sample, DType dtype, uint64_t seed) {
  std::vector<Tensor> inputs;
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal;
  for (const Shape& shape : sample.shapes) {
    std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
    for (double& v : values) v = normal(engine);
    inputs.push_back(tensor<double>(values, shape).to(dtype));
  }
  return inputs;
}

}  // namespace kiln::testing
